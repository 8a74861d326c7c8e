"""--mode=worker: a task of --cluster_spec serving a client's cells
(docs/several_machines.md)."""

import os

from trainer.cluster import cluster_run
from trainer import run_context
from trainer.run_context import UserError


def Run(ctx: run_context.RunContext) -> None:
  """Serves until killed."""
  options = ctx.options
  try:
    cluster_run.RunWorker(options.cluster_spec, options.task, os.environ,
                          options.worker_threads, options.trust_cluster_network)
  except ValueError as e:
    raise UserError(str(e)) from None
