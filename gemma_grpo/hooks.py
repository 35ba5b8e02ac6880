"""What happens between training steps: checks, checkpoints, evals, signals.

Tunix's trainer calls `on_train_end` after each `update_actor`, i.e. after
every micro-batch; the step's update is complete once `train_steps` has moved
on. That is the one safe point where the parameters are known, so checkpoints
are written from here (never by Tunix's own policy) and only after the
parameters are checked to be finite: a NaN can stop a run, but it can never
overwrite the last good checkpoint.
"""

from __future__ import annotations

import functools
import math
import signal
import time
from typing import Callable, Iterable, Iterator, Sequence

from absl import logging
import jax
import jax.numpy as jnp
from flax import nnx
import numpy as np
from tunix.sft import hooks as tunix_hooks

from gemma_grpo import distributed
from gemma_grpo import metrics as metrics_lib


class NonFiniteError(RuntimeError):
  """Training produced NaN or Inf; the message names the step."""


class RewardFunctionError(RuntimeError):
  """A reward function raised; the message names it and the step.

  The function's own exception is the __cause__, for its frames.
  """


class StopSignal:
  """SIGTERM/SIGINT ask training to stop at the next safe point.

  TPU VMs are preempted with SIGTERM. The first signal lets the current step
  finish and be checkpointed; a second SIGINT interrupts at once.
  """

  def __init__(self):
    self.signum: int | None = None
    self._previous = {}

  @property
  def requested(self) -> bool:
    return self.signum is not None

  def _handle(self, signum, frame):
    del frame
    if self.signum is not None and signum == signal.SIGINT:
      raise KeyboardInterrupt
    self.signum = signum
    logging.warning(
        "%s received: finishing the current step, then checkpointing and"
        " exiting (press Ctrl-C again to abort now)",
        signal.Signals(signum).name,
    )

  def install(self) -> "StopSignal":
    for sig in (signal.SIGTERM, signal.SIGINT):
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def uninstall(self) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous.clear()

  def agree(self) -> bool:
    """Whether to stop, the same in every process: a stop asked of any one.

    A signal reaches the processes of a run at slightly different times; they
    must still stop after the same step, or one would wait in a collective
    the others never join. A collective itself: every process calls it at the
    same points (each step's end and each batch drawn). The answer is latched
    into `signum` so later local checks agree too.
    """
    signum = distributed.largest(self.signum or 0)
    if signum and self.signum is None:
      self.signum = signum
    return bool(signum)

  def guard(self, batches: Iterable) -> Iterator:
    """Yields batches until a stop is agreed; Tunix then ends the run.

    Tunix draws a step's whole batch before its rollout, so a stop lands
    between steps, never inside one.
    """
    for batch in batches:
      if self.agree():
        return
      yield batch


def params_are_finite(model) -> bool:
  """True when every trainable (LoRA) parameter is finite.

  Reduced on the devices: the parameters may span other processes' devices,
  whose values this process cannot fetch; the answer is replicated.
  """
  return bool(_all_finite(nnx.state(model, nnx.LoRAParam)))


@jax.jit
def _all_finite(tree) -> jax.Array:
  checks = [jnp.isfinite(x).all() for x in jax.tree.leaves(tree)]
  return jnp.stack(checks).all() if checks else jnp.array(True)


def finite_rewards(reward_fns: Sequence[Callable], current_step: Callable[[], int]) -> list[Callable]:
  """Reward functions that raise NonFiniteError instead of returning NaN/Inf.

  Tunix sums the functions with np.nansum, so a NaN from one function would
  silently count as 0 and an Inf would poison the advantages. Our rewards are
  total and finite; a user-supplied one may not be. The wrapper keeps the
  name and signature Tunix inspects.
  """

  def checked(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
      try:
        values = fn(*args, **kwargs)
      except Exception as e:  # pylint: disable=broad-exception-caught
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise RewardFunctionError(
            f"step {current_step()}: reward function {fn.__name__} raised"
            f" {type(e).__name__}: {first}") from e
      array = np.asarray(values, dtype=np.float64).reshape(-1)
      bad = np.flatnonzero(~np.isfinite(array))
      if bad.size:
        raise NonFiniteError(
            f"step {current_step()}: reward function {fn.__name__} returned"
            f" {array[bad[0]]} for completion {bad[0]} ({bad.size} of"
            f" {array.size} non-finite); rewards must be finite floats"
        )
      return values

    return wrapper

  return [checked(fn) for fn in reward_fns]


class RunHooks(tunix_hooks.TrainingHooks):
  """Per-step checks, checkpointing, timing and in-training evaluation."""

  def __init__(
      self,
      *,
      writer: metrics_lib.Writer,
      max_steps: int,
      checkpoint_every: int,
      eval_every: int,
      evaluate: Callable[[int], dict[str, float]] | None,
      stop: StopSignal,
      save: Callable[[object, int], None] | None = None,
      updates_per_batch: int = 1,
      on_step: Callable[[int], None] | None = None,
  ):
    self._writer = writer
    self._on_step = on_step
    # A batch's rollout metrics reach the writer after its last update.
    self._updates_per_batch = updates_per_batch
    self._max_steps = max_steps
    self._checkpoint_every = checkpoint_every
    self._eval_every = eval_every
    self._evaluate = evaluate
    self._stop = stop
    self._save = save or save_checkpoint
    self._last_time = None
    self._done_step: int | None = None
    self._train_start = time.perf_counter()
    self.last_good_step: int | None = None

  def on_train_start(self, train_ctx):
    # Tunix calls this once the step's rollout and reference pass are done.
    self._train_start = time.perf_counter()
    if self._last_time is None:
      self._last_time = self._train_start
    if self._done_step is None:
      self._done_step = train_ctx.train_steps

  def on_train_step_start(self, train_ctx):
    pass

  def on_train_step_end(self, train_ctx, train_step, train_loss):
    # Called one step late by Tunix, with the loss of `train_step`.
    if train_loss is not None and not math.isfinite(float(train_loss)):
      raise NonFiniteError(f"step {train_step}: loss is {float(train_loss)}")

  def on_eval_step_start(self, train_ctx):
    pass

  def on_eval_step_end(self, train_ctx, eval_loss):
    pass

  def on_train_end(self, train_ctx):
    step = train_ctx.train_steps
    if step == self._done_step:
      return  # a micro-batch of a step still accumulating gradients
    self._done_step = step
    now = time.perf_counter()
    if self._last_time is not None:
      self._writer.scalar("perf/train/step_seconds", now - self._last_time, step)
    self._writer.scalar("perf/train/update_seconds", now - self._train_start, step)
    if not params_are_finite(train_ctx.model):
      raise NonFiniteError(
          f"step {step}: LoRA parameters became NaN/Inf (the loss or gradient"
          " norm overflowed)"
      )
    last = step >= self._max_steps
    if self._stop.agree() or last or step % self._checkpoint_every == 0:
      self._save(train_ctx, step)
      self.last_good_step = step
    if self._evaluate is not None and self._eval_every and (
        step % self._eval_every == 0 or last
    ):
      self._writer.scalars(self._evaluate(step), step)
    self._writer.finish_through(step - self._updates_per_batch)
    if self._on_step is not None:
      self._on_step(step)
    self._last_time = time.perf_counter()


def save_checkpoint(trainer, step: int) -> None:
  """Saves the LoRA parameters and optimizer state of `trainer` as `step`."""
  trainer.checkpoint_manager.save(
      step,
      trainer.model,
      trainer.optimizer,
      save_only_lora_params=True,
      force=True,
      custom_metadata=trainer.custom_checkpoint_metadata(),
  )
