"""The stop request ends a loop of steps_per_loop steps between two steps
(set from another thread, as signals.GracefulStop's watcher does), with a
checkpoint at the step reached; the delay is measured."""

import threading
import time

from lingvo_pipe import model_registry
from trainer import experiment_params
from trainer import loop


def test_stop_request_interrupts_a_long_loop(tmp_path):
  params = experiment_params.ExperimentParams(model_registry.GetExperiment('lm.StdlibBytesTiny'))
  params.trainer.Set(steps_per_loop=100_000, max_steps=100_000)
  trainer = loop.Trainer(params, str(tmp_path), log=lambda _: None)
  requested = {}

  def RequestStopAfterStep3():
    while int(trainer.global_step.numpy()) < 3:
      time.sleep(0.005)
    requested['step'] = int(trainer.global_step.numpy())
    requested['time'] = time.perf_counter()
    trainer.stop_requested.assign(True)
    requested['after'] = int(trainer.global_step.numpy())

  thread = threading.Thread(target=RequestStopAfterStep3, daemon=True)
  thread.start()
  done = trainer.Train(100_000)
  delay = time.perf_counter() - requested['time']
  thread.join()
  step = int(trainer.global_step.numpy())
  print(f'stop request to checkpoint saved: {delay:.3f} s; requested at step '
        f"{requested['step']}, stopped at {step}")
  assert not done
  # At most the step under way when the request was set is finished.
  assert requested['step'] <= step <= requested['after'] + 1, (requested, step)
  assert trainer.manager.latest_checkpoint.endswith(f'ckpt-{step}')
  assert trainer.Train(100_000) is False  # still requested: returns at once
  assert int(trainer.global_step.numpy()) == step
