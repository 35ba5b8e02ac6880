"""Tunix's trainers with the model donated to their jitted step.

Tunix's PeftTrainer jits its step donating only the optimizer, so XLA cannot
alias the model's buffers: every step writes each model variable, the frozen
base included, to fresh buffers while the old ones are still alive (1.07 GB
for Gemma-3-270M in float32), just when the step's temporaries peak. With
the model donated the frozen weights pass through in place. Anything else
that held the model's arrays (a reference model sharing the base) holds
deleted buffers after a step and must be pointed at the model's new ones.

The step can also be compiled ahead of its first call, in a thread beside the
first rollout (`precompile_train_step`): otherwise the first update traces,
lowers and compiles it (or loads it from the persistent cache) only after the
rollout, which for the 270M was most of a warm first step's extra time.
"""

from __future__ import annotations

import functools
import threading

from absl import logging
from flax import nnx
import jax
from jax.interpreters import pxla
import numpy as np
from tunix.rl import trainer as rl_trainer
from tunix.sft import peft_trainer
from tunix.sft import sharding_utils

from gemma_grpo import seam

seam.check_versions()  # Tunix/Qwix internals below: other versions stop here (seam.py)


class _DonatesModel:
  """Overrides PeftTrainer.jit_train_and_eval_step; the rest is Tunix's."""

  _precompiling: threading.Thread | None = None
  _train_step_jit = None  # the nnx.jit under _jitted_train_step_fn

  def jit_train_and_eval_step(self, skip_jit: bool = False, cache_nnx_graph: bool = False):
    if self._precompiling is not None:
      # Its compiled program is in JAX's caches once it ends; calling before
      # would compile the step a second time.
      self._precompiling.join()
      self._precompiling = None
    if skip_jit or self._jitted_train_step_fn is not None:
      return super().jit_train_and_eval_step(skip_jit, cache_nnx_graph)
    # Tunix's construction, with the model among the donated arguments.
    self._shard_optimizer(pxla.thread_resources.env.physical_mesh)
    train_step = jit_train_step(self)
    self._train_step_jit = train_step
    eval_step = nnx.jit(self.create_eval_step_fn())
    bind = nnx.cached_partial if cache_nnx_graph else functools.partial
    # Tunix's train() reads `.func.jitted_fn` of what this returns.
    self._jitted_train_step_fn = functools.partial(bind(train_step, self.model, self.optimizer))
    self._jitted_eval_step_fn = functools.partial(bind(eval_step, self.model))
    return self._jitted_train_step_fn, self._jitted_eval_step_fn

  def precompile_train_step(self, example) -> None:
    """Starts compiling the train step for `example`'s shapes in a thread.

    Call under the trainer's mesh. `example` is a train example whose shapes,
    dtypes and structure are those of the first real one (its values are not
    read); it is prepared and sharded as PeftTrainer.train does. The first
    call of the step waits for the thread; a mismatched example only means
    that call compiles as it would have anyway.
    """
    self.jit_train_and_eval_step(cache_nnx_graph=True)  # as PeftTrainer.train calls it
    example = sharding_utils.shard_input(self._prepare_inputs(example),
                                         self.config.data_sharding_axis)
    mesh = pxla.thread_resources.env.physical_mesh  # the mesh context is per thread
    train_step, model, optimizer = self._train_step_jit, self.model, self.optimizer

    def compile_step():
      try:
        with mesh:
          train_step.lower(model, optimizer, example).compile()
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("compiling the train step ahead failed (%s: %s); it compiles"
                        " at its first call instead", type(e).__name__, str(e)[:200])

    self._precompiling = threading.Thread(target=compile_step, name="precompile-train-step")
    self._precompiling.start()


def jit_train_step(trainer):
  """The trainer's step, jitted with the model and the optimizer donated.

  Called as step(model, optimizer, example); what `train` runs and `plan` lowers.
  """
  return nnx.jit(trainer.create_train_step_fn(), donate_argnames=("model", "optimizer"))


class PeftTrainer(_DonatesModel, peft_trainer.PeftTrainer):
  """Tunix's supervised LoRA trainer, model donated."""


class RLTrainer(_DonatesModel, rl_trainer.Trainer):
  """Tunix's RL actor trainer, model donated, its batch global across processes."""

  def _prepare_inputs(self, input_data):
    # Every process holds the whole batch (the learner builds it from rollouts
    # gathered to every process). Tunix's shard_input would take local arrays
    # for this process's share of a larger batch, or, once the reference's
    # log-probs arrive global, leave the whole batch unsharded: one layout for
    # the example compiled ahead and another for the real step, which then
    # compiled a second time. Laid out here as shard_input lays out one
    # process's batch, both are the same program.
    if jax.process_count() == 1:
      return input_data
    return global_batch(input_data, pxla.thread_resources.env.physical_mesh,
                        self.config.data_sharding_axis)


def global_batch(tree, mesh, data_axis):
  """`tree`'s arrays as global arrays on `mesh`, split on `data_axis` where they divide.

  Each process must hold the same values: a local array is read whole on every
  process, and a global one is only moved to the new layout.
  """
  def place(x):
    if not isinstance(x, (jax.Array, np.ndarray)):
      return x
    sharding = sharding_utils.get_sharding(x, mesh=mesh, pspec=jax.sharding.PartitionSpec(*data_axis))
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      return jax.device_put(x, sharding)
    values = np.asarray(x)
    return jax.make_array_from_callback(values.shape, sharding, lambda index: values[index])

  return jax.tree.map(place, tree)
