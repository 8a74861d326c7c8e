"""The bfloat16 language-model experiment trains as well as float32."""

from lingvo_pipe import model_registry
from trainer import experiment_params
from trainer import loop

# Steps of training; the tiny model starts at ln(256) = 5.55 nats per byte.
NUM_STEPS = 40
# After NUM_STEPS the bfloat16 run's held-out loss is within MARGIN (relative)
# of the float32 run's, and both have learned (below LEARNED nats).
MARGIN = 0.05
LEARNED = 4.5


def _EvalLossAfterTraining(key: str, logdir: str) -> float:
  params = experiment_params.ExperimentParams(model_registry.GetExperiment(key))
  params.trainer.Set(max_steps=NUM_STEPS, steps_per_loop=NUM_STEPS // 2,
                     eval_steps=4, warmup_steps=4)
  trainer = loop.Trainer(params, logdir, log=lambda _: None)
  trainer.Train(NUM_STEPS)
  return trainer.Eval('dev')['loss']


def test_bfloat16_lm_loss_within_margin_of_float32(tmp_path):
  f32 = _EvalLossAfterTraining('lm.StdlibBytesTiny', str(tmp_path / 'f32'))
  bf16 = _EvalLossAfterTraining('lm.StdlibBytesTinyBf16', str(tmp_path / 'bf16'))
  assert f32 < LEARNED and bf16 < LEARNED, (f32, bf16)
  assert abs(bf16 - f32) <= MARGIN * f32, (f32, bf16)
