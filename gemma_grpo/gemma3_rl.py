"""Tunix's Gemma-3 with the entry points RL needs that it lacks.

* `decode_only_last_token`: Tunix's sampler asks for it (when the model's
  signature has it) so the prefill computes logits for the last prompt
  position only. Without it a prefill of 8 prompts x 256 tokens materialises
  8 x 256 x 262,144 float32 logits (2 GiB) to keep one row per prompt.
* `return_hidden` / `hidden_states`: the final-norm activations, so
  log-probabilities can be computed for completion positions only, in
  vocabulary chunks. It goes through `__call__` because that is the one
  method Qwix intercepts to apply LoRA: a separate forward method would
  silently run the base model without the adapters.
* `empty_cache`: a zeroed KV cache for prefilling prompts once (the shared-
  prompt log-prob pass and the rollout engine both start from one).

Same parameters, same paths, same checkpoints as Tunix's class: a loaded
model is converted by swapping its graph definition, without copying.
"""

from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp
from tunix.models.gemma3 import model as gemma3

from gemma_grpo import seam

seam.check_versions()  # Tunix/Qwix internals below: other versions stop here (seam.py)


class Gemma3(gemma3.Gemma3):
  """Tunix's Gemma3, plus last-token-only decoding and hidden states."""

  def empty_cache(self, batch: int, slots: int) -> dict:
    """A zeroed KV cache in Tunix's layout ([B, S, K, H] per layer), writing from slot 0."""
    cfg = self.config
    dtype = self.embedder.input_embedding.value.dtype
    shape = (batch, slots, cfg.num_kv_heads, cfg.head_dim)
    return {
        f"layer_{i}": {
            "k": jnp.zeros(shape, dtype),
            "v": jnp.zeros(shape, dtype),
            # The default int (not int32): Tunix indexes the cache with it.
            "end_index": jnp.zeros((batch,), int),
        }
        for i in range(cfg.num_layers)
    }

  def hidden_states(
      self,
      tokens_BxL: jax.Array,
      positions_BxL: jax.Array,
      attention_mask_BxLxL: jax.Array,
  ) -> jax.Array:
    """Final-norm activations [B, L, D] of a cache-free forward pass."""
    hidden_BxLxD, _ = self(
        tokens_BxL, positions_BxL, None, attention_mask_BxLxL, return_hidden=True
    )
    return hidden_BxLxD

  def __call__(
      self,
      last_tokens,
      positions=None,
      cache=None,
      attention_mask=None,
      output_hidden_states: bool = False,
      *,
      images=None,
      decode_only_last_token: bool = False,
      return_hidden: bool = False,
  ):
    if not (decode_only_last_token or return_hidden) or images is not None or output_hidden_states:
      return super().__call__(
          last_tokens, positions, cache, attention_mask, output_hidden_states,
          images=images,
      )
    new_cache = None if cache is None else {}
    x = self._encode_and_get_inputs(tokens=last_tokens)
    for i, layer in enumerate(self.layers):
      name = f"layer_{i}"
      layer_cache, x = layer(x, positions, cache[name] if cache else None, attention_mask)
      if cache is not None:
        new_cache[name] = layer_cache
    if return_hidden:
      return self.final_norm(x), new_cache
    x = self.final_norm(x[:, -1:])
    return self.embedder.decode(x), new_cache


def convert(model: gemma3.Gemma3) -> Gemma3:
  """`model` as our subclass, sharing its parameter arrays."""
  if isinstance(model, Gemma3):
    return model
  abstract = nnx.eval_shape(lambda: Gemma3(model.config, rngs=nnx.Rngs(0)))
  return nnx.merge(nnx.graphdef(abstract), nnx.state(model))
