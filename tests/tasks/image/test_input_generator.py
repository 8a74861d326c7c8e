"""Tests of the CIFAR-10 binary reader and generated images."""

import numpy as np
import pytest

from lingvo_pipe.tasks.image import input_generator as image_input


def _WriteCifar(path, labels, seed=0):
  rng = np.random.RandomState(seed)
  pixels = rng.randint(0, 256, (len(labels), 3, 32, 32)).astype(np.uint8)
  records = np.concatenate([np.array(labels, np.uint8)[:, None],
                            pixels.reshape(len(labels), -1)], axis=1)
  records.tofile(path)
  return pixels


def test_reads_binary_records_as_nhwc(tmp_path):
  pixels = _WriteCifar(tmp_path / 'data_batch_1.bin', [3, 7, 1])
  images, labels = image_input.ReadCifarBinary(str(tmp_path / 'data_batch_*.bin'))
  assert labels.tolist() == [3, 7, 1]
  assert images.shape == (3, 32, 32, 3)
  np.testing.assert_array_equal(images[1, 5, 9], pixels[1, :, 5, 9])


def test_eval_batches_in_order_scaled(tmp_path):
  _WriteCifar(tmp_path / 'test_batch.bin', list(range(10)) * 2)
  batch = next(iter(image_input.CifarInput.Params().Set(
      file_pattern=str(tmp_path / 'test_batch.bin'), split='eval',
      batch_size=4).Instantiate().Dataset()))
  assert batch.labels.numpy().tolist() == [0, 1, 2, 3]
  assert batch.images.shape == (4, 32, 32, 3)
  assert -1.0 <= batch.images.numpy().min() and batch.images.numpy().max() <= 1.0


def test_generated_images_depend_on_the_class():
  images, labels = image_input.SyntheticImages(400, 16, 10, seed=1)
  assert images.shape == (400, 16, 16, 3) and set(labels) == set(range(10))
  mean_red = [images[labels == c, :, :, 0].mean() for c in (0, 1)]
  mean_green = [images[labels == c, :, :, 1].mean() for c in (0, 1)]
  assert mean_red[0] > mean_red[1] + 20 and mean_green[1] > mean_green[0] + 20


def test_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match='No CIFAR-10 binary file matches'):
    image_input.ReadCifarBinary(str(tmp_path / 'none*.bin'))
  (tmp_path / 'bad.bin').write_bytes(b'x' * 100)
  with pytest.raises(ValueError, match='not a multiple of the 3073-byte'):
    image_input.ReadCifarBinary(str(tmp_path / 'bad.bin'))
  with pytest.raises(ValueError, match='fewer than one batch'):
    image_input.CifarInput.Params().Set(num_synthetic=4, batch_size=8).Instantiate()
