"""What a person watching a run sees between step lines.

Start-up takes a minute or more (GGUF conversion once, loading, LoRA,
compilation), so each phase ends with one line saying what it did and how
long it took. Long loops (training steps, eval batches) draw a progress bar
with an ETA on a terminal; when stdout is a pipe or a file the bar is off, so
logs hold only the step lines.
"""

from __future__ import annotations

import os
import sys
import time

from absl import logging
import tqdm


def _process_start() -> float:
  """time.monotonic() at this process's start (Linux), else at this import."""
  try:
    with open("/proc/self/stat") as f:
      # Field 22, after the parenthesised command name: start time in clock ticks since boot.
      started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
      uptime = float(f.read().split()[0])
    age = uptime - started_ticks / os.sysconf("SC_CLK_TCK")
  except (OSError, ValueError, IndexError):
    age = 0.0
  return time.monotonic() - max(0.0, age)


_START = _process_start()


def seconds_since_start() -> float:
  return time.monotonic() - _START


class Phases:
  """Logs the end of each start-up phase with its duration."""

  def __init__(self):
    self._last = time.monotonic()

  def done(self, what: str) -> float:
    """Logs `what (X.X s; T s since start)`; returns X, the phase's seconds."""
    now = time.monotonic()
    seconds = now - self._last
    logging.info("%s (%.1f s; %.0f s since start)", what, seconds, now - _START)
    self._last = now
    return seconds


def interactive(stream=None) -> bool:
  """Whether `stream` (stdout by default) is a terminal a person watches."""
  stream = sys.stdout if stream is None else stream
  isatty = getattr(stream, "isatty", None)
  return bool(isatty and isatty())


def progress(total: int, desc: str, unit: str, *, initial: int = 0,
             enabled: bool = True, stream=None) -> tqdm.tqdm:
  """A progress bar with an ETA, drawn only on an interactive stdout.

  `enabled=False` (e.g. every process of a multi-process run but the first)
  turns it off wherever it would draw. It writes to stderr, beside the log.
  """
  return tqdm.tqdm(
      total=total, initial=initial, desc=desc, unit=unit, leave=False,
      dynamic_ncols=True, file=sys.stderr,
      disable=not (enabled and interactive(stream)),
  )


def step_reporter(phases: Phases, max_steps: int, first_step: int, enabled: bool):
  """`on_step(step)` for a training loop: moves a step bar, and times the
  first step (it compiles every program of a step) as the last start-up phase."""
  bar = progress(max_steps, "train", "step", initial=first_step, enabled=enabled)
  last_step = first_step  # a disabled bar does not count

  def on_step(step: int) -> None:
    nonlocal last_step
    if step <= last_step:
      return
    if last_step == first_step:
      phases.done(f"step {step}: the first step, compilation included")
    bar.update(step - last_step)
    last_step = step
    if step >= max_steps:
      bar.close()

  return on_step
