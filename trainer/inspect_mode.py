"""--mode=inspect_params (the full params text) and --mode=inspect_model
(per cell: device, parameter bytes, FLOPs, activation bytes, layers; then
the planner's table)."""

from trainer import inspection
from trainer import run_context
from trainer.run_context import UserError


def Run(ctx: run_context.RunContext) -> None:
  """Prints the params text or the model's plan; trains nothing."""
  if ctx.options.mode == 'inspect_params':
    print(ctx.params.ToText(), end='')
    return
  budget_mb = ctx.options.planner_budget_mb
  if budget_mb <= 0:
    raise UserError(f'--planner_budget_mb={budget_mb} must be > 0: the memory '
                    'of each device in MiB, e.g. 16384.')
  tasks = len(ctx.cluster.Tasks()) if ctx.cluster else 0
  try:
    task = None
    if inspection.NeedsBuild(ctx.params.task):
      # The task makes its pipeline's layers in its constructor: build it
      # (variables included) to read them. With a cluster, the plan names
      # the workers' devices; the task is built on local ones.
      if ctx.cluster is None:
        ctx.ConfigureDevices()
      else:
        ctx.ConfigureLocalDevices()
      task = ctx.params.task.Instantiate()
    plan = inspection.ModelPlan(ctx.params.task, budget_mb << 20,
                                inspection.OptimizerSlots(ctx.params.trainer.optimizer),
                                cluster_tasks=tasks, task=task)
  except (TypeError, ValueError) as e:
    raise UserError(str(e)) from None
  print(plan)
