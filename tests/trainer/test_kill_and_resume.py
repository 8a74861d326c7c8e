"""Kill and resume: the trainer binary, SIGKILLed at random moments (also
while a checkpoint is being written) and restarted until done, ends with
weights, optimizer slots, global step and input position bitwise equal to
an uninterrupted run's. SIGTERM and SIGINT stop it gracefully at the step
under way. `make test` runs 2 kills and a SIGTERM stop over 12 steps; the
slow variants (`make test-slow`) 8 kills over 40 steps and a SIGINT stop.
Every run sets trainer.max_steps to its steps (harness.Overrides), so the
learning rate decays to 0 only at the last step and the weights compared
change to the end."""

import os
import random
import signal
import time

import pytest

from tests.trainer import kill_resume_harness as harness

SPL = 2  # steps per loop: a checkpoint every 2 steps
STEPS = 12  # make test's runs: kills aimed at steps 4 and 6, a stop at 2 or later


def _Reference(tmp_path_factory, max_steps):
  logdir = str(tmp_path_factory.mktemp(f'reference{max_steps}'))
  harness.RunToEnd(harness.TrainerArgs(logdir, max_steps, SPL))
  return logdir


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  return _Reference(tmp_path_factory, STEPS)


def _Writing(ckpt_dir):
  """Whether a save is under way: its temporary files exist."""
  try:
    return any('_temp' in n or n.startswith('checkpoint.tmp') for n in os.listdir(ckpt_dir))
  except FileNotFoundError:
    return False


def _KillOnce(logdir, max_steps, during_write, rng, report):
  """Starts the trainer and SIGKILLs it while a checkpoint is written or at
  a random moment after a random progress line; returns False if it
  finished first."""
  ckpt_dir = os.path.join(logdir, 'checkpoints')
  child = harness.Child(harness.TrainerArgs(logdir, max_steps, SPL))
  try:
    restored = child.WaitFor(lambda: any(l.startswith(('Restored', 'step ')) for l in child.lines),
                             timeout_s=300)
    assert restored or child.process.poll() is not None, child.lines
    # The save after the progress line of a random step ahead, or a random
    # moment after that line.
    target = child.RestoredStep() + SPL * rng.randint(1, 3)
    child.WaitFor(lambda: child.LastStep() >= target, timeout_s=300, poll_s=0.0005)
    if during_write:
      caught = child.WaitFor(lambda: _Writing(ckpt_dir), timeout_s=60, poll_s=0.0005)
    else:
      time.sleep(rng.uniform(0, 0.05))  # within the next loop of fast steps
      caught = child.process.poll() is None
    child.Kill()
  finally:
    child.Kill()
  report['restores'] += [l for l in child.lines if l.startswith(('Restored', 'Checkpoint',
                                                                 'Removed', 'Fell'))]
  if not caught or (child.LastStep() >= max_steps and not during_write):
    return False
  report['kills'] += 1
  report['during_write'] += int(during_write and _Writing(ckpt_dir))
  report['started'].append(child.RestoredStep())
  report['reached'].append(child.LastStep())
  return True


def _KillAndResume(tmp_path, reference, max_steps, kills, seed):
  rng = random.Random(seed)
  logdir = str(tmp_path / 'killed')
  report = {'kills': 0, 'during_write': 0, 'started': [], 'reached': [], 'restores': []}
  for i in range(kills):
    _KillOnce(logdir, max_steps, during_write=(i % 2 == 1), rng=rng, report=report)
  final = harness.RunToEnd(harness.TrainerArgs(logdir, max_steps, SPL))
  report['restores'] += [l for l in final.lines if l.startswith(('Restored', 'Checkpoint',
                                                                 'Removed', 'Fell'))]
  starts = report['started'][1:] + [final.RestoredStep()]
  lost = [r - s for r, s in zip(report['reached'], starts)]
  print(f"kills survived: {report['kills']} ({report['during_write']} while a checkpoint "
        f'was being written); progress lines before each kill reached steps '
        f'{report["reached"]}, the next run restored steps {starts}; steps lost per '
        f'kill {lost}')
  assert all(l >= 0 for l in lost), lost  # never restored past what was done
  # No restart ever met a partial or damaged checkpoint.
  assert not [l for l in report['restores'] if l.startswith(('Checkpoint', 'Fell'))], report
  assert report['kills'] >= kills - 1, report
  assert not [n for n in os.listdir(os.path.join(logdir, 'checkpoints')) if '_temp' in n
              or n.startswith('checkpoint.tmp')]
  ckpt = f'checkpoints/ckpt-{max_steps}'
  harness.AssertBitwiseEqual(harness.CheckpointTensors(os.path.join(reference, ckpt)),
                             harness.CheckpointTensors(os.path.join(logdir, ckpt)))
  assert (harness.NextBatch(reference, max_steps, SPL) ==
          harness.NextBatch(logdir, max_steps, SPL)).all()
  return report


def test_kill_and_resume_short(tmp_path, reference):
  _KillAndResume(tmp_path, reference, STEPS, kills=2, seed=7)  # aims at steps 4, then 2 ahead
  # The weights still change after TINY's own trainer.max_steps=8 (where its
  # learning rate would reach 0), so the comparison at the last step covers
  # them, not only the optimizer state.
  middle, last = (harness.CheckpointTensors(os.path.join(reference, f'checkpoints/ckpt-{s}'))
                  for s in (8, STEPS))
  weights = [k for k in last if k.startswith('model/') and '.OPTIMIZER_SLOT' not in k]
  assert weights and all(middle[k].tobytes() != last[k].tobytes() for k in weights), [
      k for k in weights if middle[k].tobytes() == last[k].tobytes()]


@pytest.mark.slow  # make test runs test_kill_and_resume_short (2 kills).
def test_kill_and_resume_long(tmp_path, tmp_path_factory):
  report = _KillAndResume(tmp_path, _Reference(tmp_path_factory, 40), 40, kills=8, seed=2)
  assert report['during_write'] >= 1, report


@pytest.mark.parametrize('signum', [
    signal.SIGTERM,
    # make test stops by SIGTERM; both signals share one handler.
    pytest.param(signal.SIGINT, marks=pytest.mark.slow)])
def test_graceful_stop_saves_the_step_reached_and_resumes(tmp_path, reference, signum):
  logdir = str(tmp_path / 'stopped')
  child = harness.Child(harness.TrainerArgs(logdir, STEPS, SPL))
  try:
    assert child.WaitFor(lambda: child.LastStep() >= 2, timeout_s=300), child.lines
    sent = time.monotonic()
    child.Signal(signum)
    code = child.Wait(120)
    delay = time.monotonic() - sent
  finally:
    child.Kill()
  stopped = [l for l in child.lines if l.startswith('Stopped by')]
  assert code == 128 + signum, (code, child.lines, child.Stderr())
  assert len(stopped) == 1 and signal.Signals(signum).name in stopped[0], child.lines
  step = int(stopped[0].split(' at step ')[1].split(';')[0])
  assert 2 <= step < STEPS
  assert stopped[0].endswith(f'ckpt-{step}. Run the same command to resume.')
  print(f'graceful stop by {signal.Signals(signum).name}: signal to exit {delay:.2f} s, '
        f'stopped at step {step}')
  assert delay < 60  # the grace period (generous: the machine is shared)
  resumed = harness.RunToEnd(harness.TrainerArgs(logdir, STEPS, SPL))
  assert any(l.startswith('Restored') and l.endswith(f'at step {step}.')
             for l in resumed.lines), resumed.lines
  ckpt = f'checkpoints/ckpt-{STEPS}'
  harness.AssertBitwiseEqual(harness.CheckpointTensors(os.path.join(reference, ckpt)),
                             harness.CheckpointTensors(os.path.join(logdir, ckpt)))
