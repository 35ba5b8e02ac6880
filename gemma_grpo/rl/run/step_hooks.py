"""What happens between training steps: checks, checkpoints, evals.

Tunix's trainer calls `on_train_end` after each `update_actor`, i.e. after
every micro-batch; the step's update is complete once `train_steps` has moved
on. That is the one safe point where the parameters are known, so checkpoints
are written from here (never by Tunix's own policy) and only after the
parameters are checked to be finite: a NaN can stop a run, but it can never
overwrite the last good checkpoint.
"""

from __future__ import annotations

import math
import time
from typing import Callable

from tunix.sft import hooks as tunix_hooks

from gemma_grpo.runtime import guards
from gemma_grpo.runtime import metrics as metrics_lib


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
      stop: guards.StopSignal,
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
      raise guards.NonFiniteError(f"step {train_step}: loss is {float(train_loss)}")

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
    if not guards.params_are_finite(train_ctx.model):
      raise guards.NonFiniteError(
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
