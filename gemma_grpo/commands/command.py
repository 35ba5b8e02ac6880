"""What the training commands (`train`, `sft`) share: arguments, exit codes, epilogues.

  PROG --config FILE [--workdir DIR] [--config.section.key=value ...]

Exit codes: 0 done; 2 bad input (errors.EXIT_BAD_INPUT: one `error:` line per
problem), or the work directory is in use by another trainer; 3 NaN/Inf in
training (the last good checkpoint is kept); 4 another process of a
multi-process run failed or vanished (distributed.EXIT_PEER_FAILED); 5 a
reward function raised (the last good checkpoint is kept); 128+N stopped by
signal N after checkpointing (143 for SIGTERM, 130 for SIGINT): rerun to
resume.
"""

from __future__ import annotations

import argparse
import gc
import os
import pathlib
import signal
import sys
from typing import Callable

import ml_collections

from gemma_grpo import config as config_lib
from gemma_grpo import errors
from gemma_grpo import storage
from gemma_grpo.config import settings
from gemma_grpo.runtime import distributed
from gemma_grpo.runtime import metrics as metrics_lib
from gemma_grpo.runtime import workdir_lock
from gemma_grpo.tasks import rewards


def freeze_loaded_modules() -> None:
  """Exempts what is loaded so far (JAX, Tunix and the rest) from garbage collection.

  A full collection walks every tracked object, hundreds of thousands once
  those libraries are in, and Tunix forces one when it builds the RL cluster
  and when it reports memory; frozen objects are not walked. The frozen objects are modules and what they hold for the
  life of the process.
  """
  gc.freeze()


def default_workdir(config_path: str) -> str:
  """runs/<config file name>: where a run goes without --workdir."""
  return os.path.join("runs", pathlib.Path(config_path).stem)


def main(argv: list[str] | None, *, prog: str, doc: str,
         run: Callable[[ml_collections.ConfigDict, str], int]) -> int:
  """`PROG --config FILE [--workdir DIR] [--config.x.y=v ...]` -> run(c, workdir).

  Everything that needs no device is checked before JAX starts (the config is
  validated here, once); bad input exits 2 with one line per problem.
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  parser = argparse.ArgumentParser(
      prog=prog, description=doc.splitlines()[0],
      epilog="Override any config key with --config.section.key=value.",
  )
  parser.add_argument("--config", required=True, help="config file, e.g. configs/gemma3_270m.py")
  parser.add_argument("--workdir", help="run directory or gs:// URL (default runs/<config name>)")
  distributed.add_flags(parser)
  with errors.exit_on_user_error():
    known, rest = parser.parse_known_args(argv)
    rank = distributed.resolve_rank(known)
    c = config_lib.load(known.config)
    leftover = config_lib.apply_overrides(c, rest)
    if leftover:
      parser.error(f"unrecognized arguments: {' '.join(leftover)}")
    config_lib.validate(c)
    rewards.check(settings.RewardSettings.from_config(c.rewards))
    distributed.initialize(rank)
    metrics_lib.configure_logging()
    with distributed.failures_reported():
      workdir = known.workdir or default_workdir(known.config)
      distributed.check_same(
          "the config or --workdir", c.to_json_best_effort(sort_keys=True) + workdir,
          "start every process with the same --config, overrides and --workdir")
      # Process 0 holds the lease for all; a refusal there stops every process.
      with workdir_lock.held(storage.path(workdir), take=distributed.is_chief()) as lease:
        if lease is not None:
          distributed.before_hard_exit(lease.release)
        try:
          code = run(c, workdir)
        except KeyboardInterrupt:
          print("interrupted (second Ctrl-C): no checkpoint was written for the"
                " step in progress", file=sys.stderr, flush=True)
          code = 128 + signal.SIGINT
    return distributed.finish(code)
