"""Tunix's trainers with the model donated to their jitted step (seam.tunix_trainer).

Donating the model lets the frozen base pass through the step in place
instead of being written out again every step; the step can also be compiled
ahead of its first call, beside the first rollout (`precompile_train_step`).
The RL trainer also lays out a batch that every process holds whole as one
global array (`global_batch`).
"""

from __future__ import annotations

import jax
import numpy as np
from tunix.rl import trainer as rl_trainer
from tunix.sft import peft_trainer
from tunix.sft import sharding_utils

from gemma_grpo.seam import jax_mesh
from gemma_grpo.seam import tunix_trainer

class PeftTrainer(tunix_trainer.DonatesModel, peft_trainer.PeftTrainer):
  """Tunix's supervised LoRA trainer, model donated."""


class RLTrainer(tunix_trainer.DonatesModel, rl_trainer.Trainer):
  """Tunix's RL actor trainer, model donated, its batch global across processes."""

  def prepare_inputs(self, input_data):
    # Every process holds the whole batch (the learner builds it from rollouts
    # gathered to every process). Tunix's shard_input would take local arrays
    # for this process's share of a larger batch, or, once the reference's
    # log-probs arrive global, leave the whole batch unsharded: one layout for
    # the example compiled ahead and another for the real step, which then
    # compiled a second time. Laid out here as shard_input lays out one
    # process's batch, both are the same program.
    if jax.process_count() == 1:
      return input_data
    return global_batch(input_data, jax_mesh.current_mesh(), self.config.data_sharding_axis)


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
