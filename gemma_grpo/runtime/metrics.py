"""Where training metrics go: TensorBoard, metrics.jsonl and the console.

`Writer` is plugged into Tunix as a metrics-logger backend, so every scalar
Tunix records (rewards per function, completion lengths, loss, KL, learning
rate, ...) arrives here, plus our own (eval/, perf/). Only process 0 writes.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import pathlib
import sys
from typing import Sequence

from absl import logging as absl_logging
import numpy as np
from tqdm import auto

from gemma_grpo import storage

_CONSOLE_KEYS = (
    ("reward", "rewards/train/sum"),
    ("loss", "actor/train/loss"),
    ("kl", "actor/train/kl"),
    ("grad", "actor/train/grad_norm"),
    ("len", "completions/train/mean_length"),
    ("entropy", "actor/train/entropy"),
    ("zero-std", "diagnostics/train/zero_std_frac"),
    ("lr", "actor/train/learning_rate"),
    ("s/step", "perf/train/step_seconds"),
)
LEARNING_RATE = "actor/train/learning_rate"
_CONSOLE_EVAL_KEYS = ("eval/accuracy", "eval/format_accuracy")
_NOT_REWARD_FUNCTIONS = ("sum", "mean", "min", "max")


def tunix_step(event: str, step: int) -> int:
  """The 1-based training step a Tunix scalar belongs to.

  Tunix logs trainer scalars (actor/...) with the number of updates done, but
  rollout-side scalars (rewards/..., completions/...) with the global step
  counter as it was *before* that update; one step behind.
  """
  return step if event.startswith("actor/") else step + 1


class Writer:
  """A Tunix logging backend (`log_scalar`, `close`) that also takes our scalars."""

  def __init__(self, logdir: str | pathlib.Path, *, flush_every_steps: int,
               max_steps: int, is_chief: bool = True, console=sys.stdout,
               learning_rates: Sequence[float] | None = None):
    self._is_chief = is_chief
    # Update i's rate at [i - 1], computed before training: a schedule
    # evaluated on the host at each step compiles small JAX programs mid-run
    # (tests/test_train.py fails on any compilation after the first step).
    self._rates = None if learning_rates is None else list(learning_rates)
    self._rows: dict[int, dict[str, float]] = collections.defaultdict(dict)
    self._max_steps = max_steps
    self._flush_every = flush_every_steps
    self._console = console
    self._tb = None
    self._jsonl = None
    if is_chief:
      # Deferred: the CLI imports this module before it checks the config.
      import tensorboardX  # pylint: disable=g-import-not-at-top

      logdir = storage.path(logdir)
      logdir.mkdir(parents=True, exist_ok=True)
      # tensorboardX writes gs:// itself (google-cloud-storage).
      self._tb = tensorboardX.SummaryWriter(os.fspath(logdir))
      self._jsonl = storage.AppendFile(logdir / "metrics.jsonl")

  # Tunix backend protocol (jax.monitoring listener signature).
  def log_scalar(self, event: str, value, step: int | None = None, **unused):
    if step is None or event.startswith("/"):
      return  # JAX/Orbax internals, not training metrics
    if event == LEARNING_RATE and self._rates is not None:
      # Tunix reads the rate from the optimizer a step late, i.e. the next
      # step's; log the rate update `step` actually used.
      value = self._rates[min(max(int(step) - 1, 0), len(self._rates) - 1)]
    self.scalar(event, value, tunix_step(event, int(step)))

  def scalar(self, name: str, value, step: int) -> None:
    value = float(np.asarray(value))
    self._rows[step][name] = value
    if self._tb is not None:
      self._tb.add_scalar(name, value, step)

  def scalars(self, values: dict[str, float], step: int) -> None:
    for name, value in values.items():
      self.scalar(name, value, step)

  def finish_through(self, step: int) -> None:
    """Writes the rows of every step <= `step` (their metrics are all in).

    Tunix reports a step's trainer metrics during the next step, so the
    training loop calls this with the previous step.
    """
    for done in sorted(s for s in self._rows if s <= step):
      self._finish(done)

  def _finish(self, step: int) -> None:
    row = self._rows.pop(step, {})
    if not self._is_chief:
      return
    self._jsonl.write(json.dumps({"step": step, **row}, sort_keys=True) + "\n")
    if step % self._flush_every == 0 or step == self._max_steps:
      self._jsonl.flush()
      self._tb.flush()
    if self._console is not None:
      _print(self._console, console_line(step, self._max_steps, row))

  def close(self) -> None:
    for step in sorted(self._rows):
      self._finish(step)
    if self._tb is not None:
      self._tb.close()
      self._tb = None
    if self._jsonl is not None:
      self._jsonl.close()
      self._jsonl = None


def console_line(step: int, max_steps: int, row: dict[str, float]) -> str:
  parts = [f"step {step}/{max_steps}"]
  for label, key in _CONSOLE_KEYS:
    if key in row and math.isfinite(row[key]):
      parts.append(f"{label} {row[key]:.4g}")
  per_fn = [
      f"{k.rsplit('/', 1)[1]} {v:.3g}" for k, v in sorted(row.items())
      if k.startswith("rewards/train/")
      and k.rsplit("/", 1)[1] not in _NOT_REWARD_FUNCTIONS
  ]
  if per_fn:
    parts.append("[" + ", ".join(per_fn) + "]")
  evals = [f"{k} {row[k]:.3g}" for k in _CONSOLE_EVAL_KEYS if k in row]
  parts.extend(evals)
  return " | ".join(parts)


def _print(stream, line: str) -> None:
  auto.tqdm.write(line, file=stream)


def read_jsonl(path: str | pathlib.Path) -> list[dict]:
  """Rows of a run's metrics.jsonl, last write of each step wins."""
  rows = {}

  for line in storage.path(path).read_text().splitlines():
    if line.strip():
      row = json.loads(line)
      rows[row["step"]] = row
  return [rows[s] for s in sorted(rows)]


def configure_logging() -> None:
  """INFO lines from gemma-grpo, WARNING and above from every library.

  Orbax and Tunix log several INFO lines per checkpoint and step, which would
  bury the one line per step a user wants to read.
  """
  absl_logging.set_verbosity(absl_logging.INFO)
  package = str(pathlib.Path(__file__).parents[1])  # gemma_grpo/, every layer

  def keep(record: logging.LogRecord) -> bool:
    if record.getMessage().startswith(_MISLEADING_ABSL_WARNING):
      return False
    return record.levelno >= logging.WARNING or record.pathname.startswith(package)

  logging.getLogger("absl").addFilter(keep)
  # gcsfs asks for the bucket's type with a storage-control client, and warns
  # once per file system when that client has no credentials of its own; the
  # request is optional (it then uses the plain GCS API) and the run is fine.
  logging.getLogger("gcsfs").addFilter(
      lambda r: not r.getMessage().startswith("Could not determine bucket type"))
  # transformers warns at import that PyTorch is missing; we only use its
  # tokenizers and configs, which need no PyTorch.
  logging.getLogger("transformers").addFilter(
      lambda r: not r.getMessage().startswith("PyTorch was not found"))


# Tunix's memory report skips CPU devices with this warning on every step
# ("... You might be missing jax[tpu] dependency"): wrong advice on CPU and GPU.
_MISLEADING_ABSL_WARNING = "Skipping non-TPU device"
