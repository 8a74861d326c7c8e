"""Tests of the parallel text input."""

import numpy as np
import pytest

from lingvo_pipe.tasks.mt import input_generator as mt_input


def _Input(**kwargs):
  p = mt_input.ParallelTextInput.Params().Set(batch_size=4, src_len=8, tgt_len=6,
                                         num_synthetic=50)
  return p.Set(**kwargs).Instantiate()


def test_synthetic_targets_reverse_the_sources():
  for src, tgt in mt_input.SyntheticPairs(20, seed=3):
    assert tgt == src[::-1] and src.replace(b' ', b'').isalpha()


def test_batches_from_files(tmp_path):
  (tmp_path / 'src.txt').write_bytes(b'hello world\nab\ncd\nef\n')
  (tmp_path / 'tgt.txt').write_bytes(b'hallo welt\nAB\nCD\nEF\n')
  batch = next(iter(_Input(split='eval', source_file_pattern=str(tmp_path / 'src.txt'),
                           target_file_pattern=str(tmp_path / 'tgt.txt')).Dataset()))
  np.testing.assert_array_equal(batch.src_ids[0], list(b'hello wo'))
  np.testing.assert_array_equal(batch.labels[0], list(b'hallo') + [mt_input.EOS])
  np.testing.assert_array_equal(batch.tgt_ids[0], [mt_input.BOS] + list(b'hallo'))
  np.testing.assert_array_equal(batch.labels[1], list(b'AB') + [mt_input.EOS, 0, 0, 0])
  np.testing.assert_array_equal(batch.tgt_paddings[1], [0, 0, 0, 1, 1, 1])
  np.testing.assert_array_equal(batch.src_paddings[1], [0, 0, 1, 1, 1, 1, 1, 1])


def test_train_draws_by_seed_and_eval_differs_from_train():
  first = [next(iter(_Input(seed=s).Dataset())).src_ids.numpy() for s in (1, 1, 2)]
  np.testing.assert_array_equal(first[0], first[1])
  assert not np.array_equal(first[0], first[2])
  train, dev = _Input(), _Input(split='eval')
  assert not np.array_equal(train.src[:5], dev.src[:5])


def test_bad_inputs(tmp_path):
  (tmp_path / 'a.txt').write_bytes(b'x\n' * 10)
  (tmp_path / 'b.txt').write_bytes(b'y\n' * 9)
  with pytest.raises(ValueError, match='have 10 and 9 lines'):
    _Input(source_file_pattern=str(tmp_path / 'a.txt'),
           target_file_pattern=str(tmp_path / 'b.txt'))
  with pytest.raises(FileNotFoundError, match='No file matches'):
    _Input(source_file_pattern=str(tmp_path / 'none*'),
           target_file_pattern=str(tmp_path / 'b.txt'))
  with pytest.raises(ValueError, match='fewer than one batch'):
    _Input(num_synthetic=2, batch_size=8, split='train')
