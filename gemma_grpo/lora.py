"""Qwix LoRA on Gemma-3's attention einsums and MLP projections."""

from __future__ import annotations

import ml_collections

from gemma_grpo import errors
from gemma_grpo import mesh as mesh_lib


def _probe_inputs(mesh) -> dict:
  """A one-token batch for Qwix's tracing pass, divisible by the fsdp axis."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  batch = max(2, mesh.shape["fsdp"])
  return {
      "last_tokens": jnp.ones((batch, 1), jnp.int32),
      "positions": jnp.zeros((batch, 1), jnp.int32),
      "cache": None,
      "attention_mask": jnp.ones((batch, 1, 1), jnp.bool_),
  }


def num_lora_params(model) -> int:
  import jax  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top

  return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam)))


def apply(base, c: ml_collections.ConfigDict, mesh):
  """The LoRA policy for `base`, sharded on `mesh`.

  Qwix returns a clone of the base model with adapters. The frozen base weights
  are then pointed back into `base`, so the reference policy (`base`) and the
  actor share one copy of them instead of two.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  import qwix  # pylint: disable=g-import-not-at-top

  provider = qwix.LoraProvider(
      module_path=f".*({c.targets})", rank=c.rank, alpha=c.alpha
  )
  with jax.set_mesh(mesh):
    actor = qwix.apply_lora_to_model(
        base, provider, rngs=nnx.Rngs(c.seed), **_probe_inputs(mesh)
    )
  actor = mesh_lib.shard_model(actor, mesh)
  if num_lora_params(actor) == 0:
    raise errors.UserError(
        f"lora.targets={c.targets!r} matched no module of this model"
    )
  share_frozen_weights(base, actor)
  return actor


def share_frozen_weights(base, actor) -> None:
  """Makes `base` hold the very arrays the actor uses for its frozen weights."""
  from flax import nnx  # pylint: disable=g-import-not-at-top

  frozen = nnx.state(actor, nnx.Not(nnx.LoRAParam))
  nnx.update(base, frozen)
