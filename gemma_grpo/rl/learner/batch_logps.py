"""Log-probs of a rolled-out batch outside the update: the reference's and the old policy's.

Both passes run the same jitted program over micro-batches of whole groups,
each laid out on the mesh's fsdp axis as Tunix lays out a train example.
"""

from __future__ import annotations

import functools

from flax import nnx
import jax
import jax.numpy as jnp
from tunix.sft import sharding_utils

from gemma_grpo.rl.learner import losses
from gemma_grpo.seam import jax_mesh

DATA_AXES = ("fsdp",)  # the batch axis, as the cluster's training config shards it


# The reference (and old-policy) log-prob pass: `gemma-grpo plan` lowers it too.
@functools.partial(jax.jit, static_argnames=("pad_id", "eos_id", "temperature",
                                             "group_size"))
def logps_program(graphdef, state, prompt_ids, completion_ids, pad_id, eos_id,
                  temperature, group_size):
  return losses.per_token_logps_and_entropy(
      nnx.merge(graphdef, state), prompt_ids, completion_ids, pad_id, eos_id, temperature,
      group_size)[0]


def sampling_logps(model, prompt_ids_BxP, completion_ids_BxT, pad_id: int, eos_id: int,
                   temperature: float, group_size: int) -> jax.Array:
  """[B, T] log-probs of the completion tokens at the sampling temperature."""
  # A pure jax.jit over the split model: nnx.jit would return fresh copies of
  # every weight and so end the actor/reference sharing of the frozen ones.
  graphdef, state = nnx.split(model)
  return logps_program(graphdef, state, prompt_ids_BxP, completion_ids_BxT, pad_id, eos_id,
                       temperature, group_size)


def micro_batched_logps(model, mesh, prompt_ids_BxP, completion_ids_BxT, *, micro_batch: int,
                        pad_id: int, eos_id: int, temperature: float,
                        group_size: int) -> jax.Array:
  """sampling_logps of the batch, `micro_batch` rows (whole groups) at a time, on `mesh`.

  Micro-batches bound the pass's activations; each is sharded over the data
  axis under `mesh` (the model's role's mesh) before its pass.
  """
  rows = len(prompt_ids_BxP)
  with jax_mesh.tunix_mesh(mesh):
    return jnp.concatenate([
        sampling_logps(model, *sharding_utils.shard_input(
            (prompt_ids_BxP[s:s + micro_batch], completion_ids_BxT[s:s + micro_batch]),
            DATA_AXES), pad_id, eos_id, temperature, group_size)
        for s in range(0, rows, micro_batch)
    ])
