"""Tunix's trainers with the model donated to their jitted step.

Tunix's PeftTrainer jits its step donating only the optimizer, so XLA cannot
alias the model's buffers: every step writes each model variable, the frozen
base included, to fresh buffers while the old ones are still alive (1.07 GB
for Gemma-3-270M in float32), just when the step's temporaries peak. With
the model donated the frozen weights pass through in place. Anything else
that held the model's arrays (a reference model sharing the base) holds
deleted buffers after a step and must be pointed at the model's new ones.
"""

from __future__ import annotations

import functools

from flax import nnx
from jax.interpreters import pxla
from tunix.rl import trainer as rl_trainer
from tunix.sft import peft_trainer

from gemma_grpo import seam

seam.check_versions()  # Tunix/Qwix internals below: other versions stop here (seam.py)


class _DonatesModel:
  """Overrides PeftTrainer.jit_train_and_eval_step; the rest is Tunix's."""

  def jit_train_and_eval_step(self, skip_jit: bool = False, cache_nnx_graph: bool = False):
    if skip_jit or self._jitted_train_step_fn is not None:
      return super().jit_train_and_eval_step(skip_jit, cache_nnx_graph)
    # Tunix's construction, with the model among the donated arguments.
    self._shard_optimizer(pxla.thread_resources.env.physical_mesh)
    train_step = nnx.jit(self.create_train_step_fn(), donate_argnames=("model", "optimizer"))
    eval_step = nnx.jit(self.create_eval_step_fn())
    bind = nnx.cached_partial if cache_nnx_graph else functools.partial
    # Tunix's train() reads `.func.jitted_fn` of what this returns.
    self._jitted_train_step_fn = functools.partial(bind(train_step, self.model, self.optimizer))
    self._jitted_eval_step_fn = functools.partial(bind(eval_step, self.model))
    return self._jitted_train_step_fn, self._jitted_eval_step_fn


class PeftTrainer(_DonatesModel, peft_trainer.PeftTrainer):
  """Tunix's supervised LoRA trainer, model donated."""


class RLTrainer(_DonatesModel, rl_trainer.Trainer):
  """Tunix's RL actor trainer, model donated."""
