"""--mode=decode, --mode=export and decoding in train_and_eval, end to end:
the trainer binary in subprocesses, the export loaded by a process that
does not import the project."""

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe import model_registry
from lingvo_pipe.tasks.mt import bleu
from lingvo_pipe.tasks.mt import input_generator as mt_input
from trainer import decoder
from trainer import experiment_params
from trainer import loop

from tests.trainer import in_process
from tests.trainer import summaries
from tests.trainer import your_experiment

MT = 'mt.ReverseBytesGPipe'
TINY_LM = 'lm.StdlibBytesTiny'
# Short training (make test): 400 steps, then greedy decoding of 2 dev
# batches scored with add-one smoothing (few 4-grams in 64 sentences).
MT_STEPS = 400
# A learning rate of 5e-3 warming up over 100 steps: at the experiment's
# 2e-3 warming up over 50, BLEU was 5.44, 0.44 above what the check asks.
# One micro-batch on the experiment's four cells: a step costs 0.09 s, not
# 0.2 s at M=4 (what is checked here is training, decoding and export, not
# the schedule). The curve is steep here: BLEU 3.95 at 200 steps, 6.47 at
# 300 (23.94 at 300 with M=4, where float sums differ).
MT_OVERRIDES = ('task.model.pipeline.num_micro_batches=1; '
                'trainer.steps_per_loop=100; trainer.eval_steps=1; trainer.warmup_steps=100; '
                'trainer.learning_rate=5e-3; '
                f'trainer.decode_steps=2; trainer.decode_interval_steps={MT_STEPS}; '
                'task.beam_size=1; '
                "task.bleu_smoothing=enum('lingvo_pipe.tasks.mt.bleu.Smoothing', 'ADD_ONE')")


def _Run(*flags, check=True):
  return in_process.Run(*flags, check=check)


@pytest.fixture(scope='module')
def mt_run(tmp_path_factory):
  """An mt experiment trained MT_STEPS steps by train_and_eval, which
  decodes at the end (decode_interval_steps): (logdir, stdout)."""
  logdir = str(tmp_path_factory.mktemp('mt'))
  result = _Run('--model=' + MT, '--mode=train_and_eval', '--logdir=' + logdir,
                f'--max_steps={MT_STEPS}', '--model_params_override=' + MT_OVERRIDES)
  return logdir, result.stdout


def _UntrainedBleu(tmp_path):
  """BLEU of the same experiment at its initial weights, decoded in this
  process on the same dev batches."""
  params = experiment_params.ExperimentParams(model_registry.GetExperiment(MT))
  experiment_params.ApplyOverrides(params, MT_OVERRIDES)
  trainer_obj = loop.Trainer(params, str(tmp_path), log=lambda _: None)
  dec = decoder.Decoder(trainer_obj, log=lambda _: None)
  return trainer_obj.task.DecodeMetrics(dec.Decode())['bleu']


def test_brief_training_lifts_bleu_far_above_an_untrained_model(mt_run, tmp_path):
  logdir, stdout = mt_run
  match = re.search(rf'decode at step {MT_STEPS}: 64 examples  bleu ([0-9.]+)', stdout)
  assert match, stdout
  trained = float(match.group(1))
  untrained = _UntrainedBleu(tmp_path)
  # Measured: untrained 0.00, trained 37.73 (400 steps; 52 at 600 steps
  # with beam 4, unsmoothed, on 128 sentences).
  assert trained > untrained + 5.0, (trained, untrained)
  assert summaries.Scalars(logdir, 'decode')['bleu'] == [(MT_STEPS, pytest.approx(trained, abs=0.01))]
  lines = open(os.path.join(logdir, f'decode_{MT_STEPS}.txt'), encoding='utf-8').read().splitlines()
  assert len(lines) == 64
  # The file is detokenized text: the BLEU of its lines is the one reported.
  refs = [mt_input.ParallelTextInput.Params().Set(split='eval', batch_size=32, src_len=24,
                                                  tgt_len=24).Instantiate().labels[i]
          for i in range(64)]
  refs = [bytes(r[r > mt_input.EOS].astype(np.uint8)).decode() for r in refs]
  assert bleu.CorpusBleu(lines, refs, bleu.Smoothing.ADD_ONE) == pytest.approx(trained, abs=0.01)


_LOADER = textwrap.dedent('''
    import sys
    import numpy as np
    import tensorflow as tf
    tf.config.set_soft_device_placement(False)  # a baked-in CPU:3 would fail
    model = tf.saved_model.load(sys.argv[1])
    out = model.signatures['serving_default'](src_ids=tf.constant(np.load(sys.argv[2])))
    np.save(sys.argv[3], out['ids'].numpy())
    ours = [m for m in sys.modules if m.split('.')[0] in ('lingvo_pipe', 'trainer', 'model_params', 'tests')]
    print('project modules:', ours)
''')


def test_export_loads_without_the_project_and_reproduces_the_decoder(mt_run, tmp_path):
  logdir, _ = mt_run
  result = _Run('--model=' + MT, '--mode=export', '--logdir=' + logdir,
                '--model_params_override=' + MT_OVERRIDES)
  export_dir = os.path.join(logdir, 'export', str(MT_STEPS))
  assert f'Exported {export_dir}' in result.stdout
  with open(os.path.join(export_dir, 'saved_model.pb'), 'rb') as f:
    assert b'device:CPU:' not in f.read()
  src = mt_input.ParallelTextInput.Params().Set(split='eval', batch_size=32, src_len=24,
                                                tgt_len=24).Instantiate().src[:32]
  np.save(tmp_path / 'src.npy', src)
  (tmp_path / 'load.py').write_text(_LOADER)
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
  env['TF_CPP_MIN_LOG_LEVEL'] = '3'
  # Its own directory, no PYTHONPATH, one CPU device (the model used 4).
  loaded = subprocess.run([sys.executable, 'load.py', export_dir, 'src.npy', 'ids.npy'],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
  assert loaded.returncode == 0, loaded.stderr[-3000:]
  assert 'project modules: []' in loaded.stdout
  ids = np.load(tmp_path / 'ids.npy')
  texts = [bytes(row[:np.argmax(np.append(row, mt_input.EOS) == mt_input.EOS)].astype(np.uint8)
                 ).decode('utf-8', 'replace') for row in ids]
  decoded = open(os.path.join(logdir, f'decode_{MT_STEPS}.txt'), encoding='utf-8').read().splitlines()
  assert texts == decoded[:32]


def test_lm_decoder_samples_from_a_prompt(tmp_path):
  # In this process (the binary's decode path is the mt tests'): the tiny
  # LM at its initial weights, 3 samples of 40 bytes with the cache.
  params = experiment_params.ExperimentParams(model_registry.GetExperiment(TINY_LM))
  experiment_params.ApplyOverrides(params, 'task.num_samples=3; task.sample_bytes=40; task.top_k=20')
  lines = []
  dec = decoder.Decoder(loop.Trainer(params, str(tmp_path), log=lines.append), log=lines.append)
  assert dec.Run('def main(') == {}
  assert 'decode at step 0: 3 examples' in lines[-1]
  text = (tmp_path / 'decode_0_prompt.txt').read_text(encoding='utf-8', errors='replace')
  assert text.count('--- prompt ---\ndef main(\n--- sample ---\n') == 3


# make test trains 400 steps (test_brief_training_...); this trains longer
# and decodes as the experiment does: beam 4, unsmoothed BLEU, 4 dev batches.
@pytest.mark.slow
def test_longer_mt_training_reaches_a_high_unsmoothed_bleu(tmp_path):
  result = _Run('--model=' + MT, '--mode=train_and_eval', f'--logdir={tmp_path}',
                '--max_steps=800', '--model_params_override=trainer.steps_per_loop=200; '
                'trainer.eval_steps=1; trainer.decode_steps=4; trainer.decode_interval_steps=400')
  bleus = [float(b) for b in re.findall(r'decode at step \d+: 128 examples  bleu ([0-9.]+)',
                                        result.stdout)]
  # Measured: 52.3 at step 600 (beam 4, 128 sentences).
  assert len(bleus) == 2 and bleus[1] > 40.0 and bleus[1] > bleus[0], result.stdout


# make test runs the first two; the other two are the same checks on other
# (model, mode) pairs. USER is the walk-through's experiment (your_experiment.md)
# with a task that does not implement DecodingTask.
USER = your_experiment.KEY


@pytest.mark.parametrize('model,mode,message', [
    (MT, 'decode', 'No checkpoint in'),
    (USER, 'export', 'has no decoder'),
    pytest.param(MT, 'export', 'No checkpoint in', marks=pytest.mark.slow),
    pytest.param(USER, 'decode', 'has no decoder', marks=pytest.mark.slow),
])
def test_decode_and_export_errors_are_one_line(model, mode, message, tmp_path):
  logdir = tmp_path / 'run'
  flags = ('--model=' + model, '--mode=' + mode, f'--logdir={logdir}')
  if model == USER:
    module = your_experiment.WriteModule(tmp_path)
    task = 'class MlpClassifierTask(base_layer.BaseLayer, decoding.DecodingTask):'
    assert task in module.read_text()
    module.write_text(module.read_text().replace(
        task, task.replace(', decoding.DecodingTask', '')))
    result = your_experiment.RunTrainerInProcess(tmp_path, *flags, check=False)
  else:
    result = _Run(*flags, check=False)
  assert result.returncode == 2
  assert 'Traceback' not in result.stderr
  lines = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert len(lines) == 1 and message in lines[0], result.stderr
  assert not logdir.exists()  # nothing written


@pytest.mark.parametrize('loop_min_micro_batches', [0, 2])
def test_lm_export_scores_as_the_model_does(loop_min_micro_batches, tmp_path):
  """In this process: the tiny LM at its initial weights (global step 0),
  its pipeline unrolled, or one loop per device (the SavedModel then
  holds the loops and their queues)."""
  from trainer import export  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import eval_mode  # pylint: disable=g-import-not-at-top
  params = experiment_params.ExperimentParams(model_registry.GetExperiment(TINY_LM))
  params.task.stack.pipeline.loop_min_micro_batches = loop_min_micro_batches
  trainer_obj = loop.Trainer(params, str(tmp_path), log=lambda _: None)
  export_dir = export.Export(trainer_obj)
  assert export_dir == str(tmp_path / 'export' / '0')
  serve = tf.saved_model.load(export_dir).signatures['serving_default']
  ids = np.random.RandomState(0).randint(0, 256, [3, 16]).astype(np.int32)
  out = serve(ids=tf.constant(ids))
  task = trainer_obj.task
  padded = np.concatenate([ids, np.zeros([1, 16], np.int32)])  # batch_size 4
  with eval_mode.EvalMode():
    logits = task.stack.FProp(task.theta.stack, padded, tf.zeros([4, 16]), padded).logits[:3]
  np.testing.assert_allclose(out['log_probs'].numpy(), tf.nn.log_softmax(logits).numpy(),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(out['next_ids'].numpy(),
                                np.argmax(out['log_probs'].numpy()[:, -1], axis=-1))
  with pytest.raises(tf.errors.InvalidArgumentError, match='at most 4 rows'):
    serve(ids=tf.zeros([5, 16], tf.int32))
