"""Tests of the byte-level LM input."""

import numpy as np
import pytest

from lingvo_pipe.tasks.lm import input_generator as lm_input


def _Input(tmp_path, split='train', text=b'abcdefghij' * 50, seq_len=8, **kwargs):
  path = tmp_path / 'corpus.txt'
  path.write_bytes(text)
  return lm_input.ByteLmInput.Params().Set(
      file_pattern=str(path), split=split, batch_size=4, seq_len=seq_len,
      **kwargs).Instantiate()


def test_labels_are_the_next_bytes(tmp_path):
  batch = next(iter(_Input(tmp_path).Dataset()))
  ids, labels = batch.ids.numpy(), batch.labels.numpy()
  assert ids.shape == labels.shape == (4, 8)
  np.testing.assert_array_equal(ids[:, 1:], labels[:, :-1])
  for row in ids:  # a window of the text
    assert bytes(row.astype(np.uint8)) in b'abcdefghij' * 50


def test_eval_tiles_the_text_in_order(tmp_path):
  batch = next(iter(_Input(tmp_path, split='eval').Dataset()))
  assert bytes(batch.ids.numpy()[0].astype(np.uint8)) == b'abcdefgh'
  assert bytes(batch.ids.numpy()[1].astype(np.uint8)) == b'ijabcdef'


def test_train_order_depends_on_the_seed_only(tmp_path):
  first = [next(iter(_Input(tmp_path, seed=s).Dataset())).ids.numpy() for s in (1, 1, 2)]
  np.testing.assert_array_equal(first[0], first[1])
  assert not np.array_equal(first[0], first[2])


def test_stdlib_split_is_disjoint_and_nonempty():
  train = lm_input.ByteLmInput.Params().Set(max_bytes=10_000).Instantiate()
  dev = lm_input.ByteLmInput.Params().Set(split='eval', max_bytes=10_000).Instantiate()
  assert train.files and dev.files
  assert not set(train.files) & set(dev.files)


def test_missing_files_and_too_little_text(tmp_path):
  with pytest.raises(FileNotFoundError, match='No file matches'):
    lm_input.ByteLmInput.Params().Set(
        file_pattern=str(tmp_path / 'none*.txt')).Instantiate()
  with pytest.raises(ValueError, match='fewer than one batch'):
    _Input(tmp_path, text=b'short')
  with pytest.raises(ValueError, match="split must be 'train' or 'eval'"):
    _Input(tmp_path, split='dev')


def test_train_windows_cover_the_whole_corpus(tmp_path):
  text = np.random.RandomState(0).randint(0, 256, 50_000).astype(np.uint8).tobytes()
  dataset = _Input(tmp_path, text=text, seq_len=16).Dataset()
  starts = [text.find(bytes(row.astype(np.uint8)))
            for batch in dataset.take(50) for row in batch.ids.numpy()]
  assert min(starts) >= 0
  assert np.mean(starts) > 0.35 * len(text) and max(starts) > 0.9 * len(text)
