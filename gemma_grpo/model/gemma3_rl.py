"""Tunix's Gemma-3 with the entry points RL needs that it lacks.

* `decode_only_last_token`: Tunix's sampler asks for it (when the model's
  signature has it) so the prefill computes logits for the last prompt
  position only. Without it a prefill materialises float32 logits over the
  whole vocabulary at every prompt position, to keep one row per prompt.
* `return_hidden` / `hidden_states`: the final-norm activations, so
  log-probabilities can be computed for completion positions only, in
  vocabulary chunks. It goes through `__call__` because that is the one
  method Qwix intercepts to apply LoRA: a separate forward method would
  silently run the base model without the adapters.
* `empty_cache`: a zeroed KV cache for prefilling prompts once (the shared-
  prompt log-prob pass and the rollout engine both start from one).
* On those entry points the feed-forward of a LoRA policy runs here, not
  through Qwix: `lora_dot` is Qwix's `x·W + (x·A)·B·scale` with a backward
  pass written out. Autodiff of Qwix's form leaves XLA:CPU contracting the
  token axes of the [tokens, F] gate/up gradient against the small x·A,
  which it does by writing that gradient transposed in a strided loop
  fusion, the largest of the update's copies. Written out, every gradient
  dot reads its large operand in place (BENCHMARKS.md, "The update's
  gradient program", measures both). Needs `lora_scale`
  (alpha / r) on the model, which lora.apply sets; without it Qwix's path
  runs. Seam touch 10 (seam/tunix_gemma3.py).
* The feed-forward's backward pass recomputes its forward from the block's
  input instead of keeping the [tokens, F] intermediates of every layer,
  which nearly halves the update's temporaries at no measured cost in time
  (BENCHMARKS.md, "The update's gradient program"). jax.checkpoint does not
  do this on XLA:CPU, which merges the recomputation back into the forward.
* `matmul_dtype` (model.matmul_dtype, set by model_loading): "bfloat16"
  casts the operands of the feed-forward's frozen products (forward and
  input gradient) to bfloat16 and accumulates in float32; the adapters,
  attention, norms and every other operation stay in the parameters' dtype.
  CPUs with AMX or AVX512_BF16 run such products several times faster than
  float32 ones (BENCHMARKS.md, "Mixed-precision products"). With it the
  feed-forward runs here for models without adapters too (the reference).

Same parameters, same paths, same checkpoints as Tunix's class: a loaded
model is converted by swapping its graph definition, without copying.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp
from tunix.models.gemma3 import model as gemma3
from tunix.utils import sharding_utils

from gemma_grpo.seam import tunix_gemma3


def positions_and_mask(tokens_BxL: jax.Array, pad_id: int):
  """The model's inputs for left-padded tokens: positions that skip the padding, and the causal mask that hides it.

  The rollout engine, the log-prob pass and SFT all feed batches this way.
  """
  valid_BxL = tokens_BxL != pad_id
  positions_BxL = jnp.maximum(jnp.cumsum(valid_BxL, axis=-1) - 1, 0)
  length = tokens_BxL.shape[1]
  causal_LxL = jnp.tril(jnp.ones((length, length), dtype=jnp.bool_))
  mask_BxLxL = causal_LxL[None] & valid_BxL[:, None, :]
  return positions_BxL, mask_BxLxL


class Gemma3(gemma3.Gemma3):
  """Tunix's Gemma3, plus last-token-only decoding and hidden states."""

  # The operand dtype of the large products ("bfloat16", config.MATMUL_DTYPES); None
  # computes them in the parameters' dtype. An attribute, like lora_scale,
  # so it travels with the graph definition into every jitted pass.
  matmul_dtype: str | None = None

  def empty_cache(self, batch: int, slots: int) -> dict:
    """A zeroed KV cache in Tunix's layout ([B, S, K, H] per layer), writing from slot 0."""
    cfg = self.config
    dtype = self.embedder.input_embedding.get_value().dtype
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
    x = tunix_gemma3.embed_tokens(self, last_tokens)
    lora_scale = getattr(self, "lora_scale", None)
    no_remat = self.config.remat_config == gemma3.RematConfig.NONE
    for i, layer in enumerate(self.layers):
      name = f"layer_{i}"
      layer_cache = cache[name] if cache else None
      if no_remat and _feed_forward_runs_here(layer.mlp, lora_scale, self.matmul_dtype):
        layer_cache, x = _decoder_layer(layer, x, positions, layer_cache, attention_mask,
                                        lora_scale, self.matmul_dtype)
      else:
        layer_cache, x = layer(x, positions, layer_cache, attention_mask)
      if cache is not None:
        new_cache[name] = layer_cache
    if return_hidden:
      return self.final_norm(x), new_cache
    x = self.final_norm(x[:, -1:])
    return self.embedder.decode(x), new_cache


def _feed_forward_runs_here(mlp, lora_scale: float | None, matmul_dtype: str | None) -> bool:
  adapted = any(hasattr(linear, "kernel_lora_a")
                for linear in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
  # An adapted projection needs Qwix's scale; without it Qwix's own path runs.
  return lora_scale is not None if adapted else matmul_dtype is not None


def _decoder_layer(layer, x, positions, cache, attention_mask, lora_scale: float | None,
                   matmul_dtype: str | None):
  """Tunix's DecoderLayer.block with the feed-forward of `_feed_forward`."""
  cache, attn_output = layer.attn(layer.pre_attention_norm(x), positions, cache, attention_mask)
  attn_output = layer.post_attention_norm(attn_output) + x
  outputs = _feed_forward(layer.mlp, layer.pre_ffw_norm(attn_output), lora_scale, matmul_dtype)
  return cache, layer.post_ffw_norm(outputs) + attn_output


class _FeedForwardStatics(NamedTuple):
  adapted: tuple[bool, bool, bool]  # gate, up, down: which projections have an adapter
  lora_scale: float | None
  matmul_dtype: str | None
  act_btf: tuple  # Tunix's sharding of the [B, T, F] activations


def _feed_forward(mlp, x_BxTxD, lora_scale: float | None, matmul_dtype: str | None):
  """Tunix's FeedForward (gelu(x·Wg) * x·Wu)·Wd, recomputed in the backward pass."""
  projections = (mlp.gate_proj, mlp.up_proj, mlp.down_proj)
  adapted = tuple(hasattr(linear, "kernel_lora_a") for linear in projections)
  weights = []
  for linear, has_adapter in zip(projections, adapted):
    weights.append(linear.kernel.get_value())
    if has_adapter:
      weights += [linear.kernel_lora_a.get_value(), linear.kernel_lora_b.get_value()]
  statics = _FeedForwardStatics(adapted, lora_scale, matmul_dtype,
                                tuple(mlp.config.shd_config.act_btf))
  return _recomputed_feed_forward(statics, x_BxTxD, tuple(weights))


def _feed_forward_math(statics: _FeedForwardStatics, x_BxTxD, weights: tuple):
  remaining = iter(weights)

  def project(x, has_adapter: bool):
    kernel = next(remaining)
    if has_adapter:
      return lora_dot(x, kernel, next(remaining), next(remaining), statics.lora_scale,
                      statics.matmul_dtype)
    return jnp.einsum("...i,io->...o", operand(x, statics.matmul_dtype),
                      operand(kernel, statics.matmul_dtype),
                      preferred_element_type=jnp.result_type(x, kernel))

  gate_adapted, up_adapted, down_adapted = statics.adapted
  gate_BxTxF = project(x_BxTxD, gate_adapted)
  up_BxTxF = project(x_BxTxD, up_adapted)
  activations_BxTxF = sharding_utils.shard(nnx.gelu(gate_BxTxF) * up_BxTxF, statics.act_btf)
  return project(activations_BxTxF, down_adapted)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _recomputed_feed_forward(statics: _FeedForwardStatics, x_BxTxD, weights: tuple):
  return _feed_forward_math(statics, x_BxTxD, weights)


def _recomputed_feed_forward_fwd(statics, x, weights):
  # Only the input is kept for the backward pass: saving the [B, T, F]
  # intermediates (gate, up, gelu, their product) of all layers was most of
  # the update's temporaries (bench/update_step.py).
  flags = tuple(() if w.perturbed else None for w in weights)
  values = tuple(w.value for w in weights)
  return _feed_forward_math(statics, x.value, values), (x.value, values, flags)


def _recomputed_feed_forward_bwd(statics, residuals, dy_BxTxD):
  x_BxTxD, weights, flags = residuals
  if isinstance(dy_BxTxD, jax.custom_derivatives.SymbolicZero):
    return None, tuple(None for _ in weights)
  # The recomputation must read something that exists only in the backward
  # pass: XLA:CPU drops optimization barriers (the prevent_cse of
  # jax.checkpoint) and then merges an identical recomputed product with the
  # forward's, which keeps the intermediates alive after all. Adding dy * 0
  # (not folded for floats, as NaN * 0 is NaN) makes the products differ.
  x_BxTxD = x_BxTxD + (dy_BxTxD * 0).astype(x_BxTxD.dtype)
  wanted = [i for i, flag in enumerate(flags) if flag is not None]

  def forward(x, *differentiated):
    all_weights = list(weights)
    for i, w in zip(wanted, differentiated):
      all_weights[i] = w
    return _feed_forward_math(statics, x, tuple(all_weights))

  _, vjp = jax.vjp(forward, x_BxTxD, *(weights[i] for i in wanted))
  dx, *differentiated = vjp(dy_BxTxD)
  grads = [None] * len(weights)
  for i, g in zip(wanted, differentiated):
    grads[i] = g
  return dx, tuple(grads)


_recomputed_feed_forward.defvjp(_recomputed_feed_forward_fwd, _recomputed_feed_forward_bwd,
                                symbolic_zeros=True)


def operand(x, matmul_dtype: str | None):
  """`x` as an operand of a large product: cast to `matmul_dtype` ("bfloat16"), or as is."""
  return x if matmul_dtype is None else x.astype(matmul_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def lora_dot(x_BxTxI, w_IxO, a_IxR, b_RxO, scale: float, matmul_dtype: str | None = None):
  """x·W + (x·A)·B·scale, Qwix's LoRA dot_general for a kernel W [in, out].

  With `matmul_dtype`, x·W (and its input gradient dy·Wᵀ) multiplies operands
  cast to it, accumulating in x's dtype; the adapters' products do not.
  """
  return _lora_dot_forward(x_BxTxI, w_IxO, a_IxR, b_RxO, scale, matmul_dtype)[0]


def _lora_dot_forward(x_BxTxI, w_IxO, a_IxR, b_RxO, scale, matmul_dtype):
  dtype = jnp.result_type(x_BxTxI, w_IxO)
  x_BxTxI, w_IxO = x_BxTxI.astype(dtype), w_IxO.astype(dtype)
  xa_BxTxR = jnp.einsum("bti,ir->btr", x_BxTxI, a_IxR)
  xw_BxTxO = jnp.einsum("bti,io->bto", operand(x_BxTxI, matmul_dtype),
                        operand(w_IxO, matmul_dtype), preferred_element_type=dtype)
  y_BxTxO = xw_BxTxO + jnp.einsum("btr,ro->bto", xa_BxTxR, b_RxO) * scale
  return y_BxTxO, xa_BxTxR


def _lora_dot_fwd(x, w, a, b, scale, matmul_dtype):
  # symbolic_zeros=True: each argument says whether it is differentiated, so
  # the frozen W's gradient (a full [in, out] product) is computed only if asked.
  y_BxTxO, xa_BxTxR = _lora_dot_forward(x.value, w.value, a.value, b.value, scale, matmul_dtype)
  # Residual pytrees keep None/() apart: the flags stay static in bwd.
  wants_dx_dw = (() if x.perturbed else None, () if w.perturbed else None)
  return y_BxTxO, (x.value, w.value, a.value, b.value, xa_BxTxR, wants_dx_dw)


def _lora_dot_bwd(scale, matmul_dtype, residuals, dy_BxTxO):
  x_BxTxI, w_IxO, a_IxR, b_RxO, xa_BxTxR, (wants_dx, wants_dw) = residuals
  if isinstance(dy_BxTxO, jax.custom_derivatives.SymbolicZero):
    return None, None, None, None
  dy_BxTxO = dy_BxTxO.astype(jnp.result_type(x_BxTxI, w_IxO))
  dyb_BxTxR = jnp.einsum("bto,ro->btr", dy_BxTxO, b_RxO) * scale
  dx = dw = None
  if wants_dx is not None:
    dx = (jnp.einsum("bto,io->bti", operand(dy_BxTxO, matmul_dtype),
                     operand(w_IxO, matmul_dtype), preferred_element_type=dy_BxTxO.dtype)
          + jnp.einsum("btr,ir->bti", dyb_BxTxR, a_IxR)).astype(x_BxTxI.dtype)
  if wants_dw is not None:
    dw = jnp.einsum("bti,bto->io", x_BxTxI, dy_BxTxO).astype(w_IxO.dtype)
  # Only the rank-sized operands are transposed (token axes last), so each
  # contraction reads its large [B, T, in] or [B, T, out] operand in place.
  da = jnp.einsum("rbt,bti->ri", jnp.transpose(dyb_BxTxR, (2, 0, 1)), x_BxTxI).T
  db = jnp.einsum("rbt,bto->ro", jnp.transpose(xa_BxTxR, (2, 0, 1)), dy_BxTxO) * scale
  return dx, dw, da.astype(a_IxR.dtype), db.astype(b_RxO.dtype)


lora_dot.defvjp(_lora_dot_fwd, _lora_dot_bwd, symbolic_zeros=True)


def convert(model: gemma3.Gemma3) -> Gemma3:
  """`model` as our subclass, sharing its parameter arrays."""
  if isinstance(model, Gemma3):
    return model
  abstract = nnx.eval_shape(lambda: Gemma3(model.config, rngs=nnx.Rngs(0)))
  return nnx.merge(nnx.graphdef(abstract), nnx.state(model))
