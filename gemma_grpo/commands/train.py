"""GRPO training: `python -m gemma_grpo.train --config configs/gemma3_270m.py`.

Builds the model, LoRA policy, data and a Tunix RLCluster (actor, reference,
and an in-process rollout: gemma_grpo.rl.engine.rollout, or Tunix's vanilla sampler with
rollout.engine=tunix) and runs the chosen GRPO-family learner. Rerunning the same
command resumes from the latest checkpoint in the work directory, data
position and sampling keys included, so an interrupted run continues exactly
as the uninterrupted one would have.

Arguments and exit codes: gemma_grpo.commands.command (shared with `sft`);
the run itself: gemma_grpo.rl.run.training_run.
"""

from __future__ import annotations

import os
import sys

import ml_collections

from gemma_grpo.commands import command
from gemma_grpo.config import settings

def train(c: ml_collections.ConfigDict, workdir: str | os.PathLike) -> int:
  """Trains a validated config until `c.train.max_steps`; returns the exit code."""
  # JAX and Tunix load only now, once the config is known to be good.
  from gemma_grpo.rl.run import training_run  # pylint: disable=g-import-not-at-top

  command.freeze_loaded_modules()
  return training_run.train(settings.from_config(c), workdir)


def main(argv: list[str] | None = None) -> int:
  """`python -m gemma_grpo.train --config FILE [--workdir DIR] [--config.x.y=v ...]`."""
  return command.main(argv, prog="gemma-grpo train", doc=__doc__, run=train)


if __name__ == "__main__":
  sys.exit(main())
