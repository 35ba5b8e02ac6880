"""How a training run ends early: its exit code, and the line saying what it kept.

The codes are the CLI's (gemma_grpo/commands/command.py lists them all) and
the Python API's `TrainingStopped.exit_code`.
"""

from __future__ import annotations

import signal
import sys

from etils import epath

EXIT_NONFINITE = 3  # NaN/Inf in training; the last good checkpoint is kept
EXIT_REWARD_FUNCTION = 5  # a reward function raised; the last good checkpoint is kept


def stopped(stop, checkpoint_dir: epath.Path, step: int) -> int:
  """The epilogue of a run stopped by a signal: where its checkpoint is; the exit code."""
  name = signal.Signals(stop.signum).name
  saved = sorted(int(p.name) for p in checkpoint_dir.iterdir() if p.name.isdigit()) if checkpoint_dir.is_dir() else []
  if step and saved and saved[-1] == step:
    where = f"checkpoint step {step} saved in {checkpoint_dir}"
  elif saved:
    where = f"latest checkpoint is step {saved[-1]} in {checkpoint_dir}"
  else:
    where = "no checkpoint yet"
  print(f"{name}: stopped after step {step}; {where}; rerun the same command"
        " to resume.", file=sys.stderr, flush=True)
  return 128 + stop.signum
