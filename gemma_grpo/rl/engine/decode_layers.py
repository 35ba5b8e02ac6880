"""The decoder layers for one-token decode steps: merged weights and one layer's step.

Before decoding, the engine merges the adapters into one copy of the
projection weights (W + (alpha / r)·A·B, the policy's own weights up to
rounding), each laid out [out, in] for the decode dots
(decode_dots.project): [N·H, D] queries, [2·K·H, D] keys and values,
[D, N·H] output, [2·F, D] gate and up, [D, F] down. The copy, as large as
the projections themselves, lives for one `generate` call. The caches keep
keys slots-minor ([K, H, S] per row or prompt) and values [K, S, H], the
layouts in which XLA:CPU's attention dots read them fastest.

Shapes: B rows, U distinct prompts of R rows each, P prompt width, T new
tokens, S = P + T, L layers, D model width, N query heads, K key/value
heads, G = N / K, M = R·G, H head width, F MLP width.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp
from tunix.models.gemma3 import model as gemma3

from gemma_grpo.model import lora
from gemma_grpo.rl.engine import decode_dots
from gemma_grpo.seam import tunix_gemma3


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LayerWeights:
  """One decoder layer's weights, adapters merged, laid out for decoding."""

  attn_norm_D: jax.Array
  query_NHxD: jax.Array
  key_value_2KHxD: jax.Array
  query_norm_H: jax.Array
  key_norm_H: jax.Array
  out_DxNH: jax.Array
  post_attn_norm_D: jax.Array
  ffw_norm_D: jax.Array
  gate_up_2FxD: jax.Array
  down_DxF: jax.Array
  post_ffw_norm_D: jax.Array


@dataclasses.dataclass(frozen=True)
class LayerShape:
  """What a decode step needs to know about a layer besides its weights."""

  num_heads: int
  num_kv_heads: int
  head_dim: int
  query_scale: float
  rope_base: float
  rope_scale: float
  window: int | None  # sliding-window width in cache slots; None = global


def _merged(module, name: str, scale: float) -> jax.Array:
  """`module.<name>` plus scale·A·B of its adapter, if it has one."""
  weight = getattr(module, name).get_value()
  a = getattr(module, f"{name}_lora_a", None)
  if a is None:
    return weight
  b = getattr(module, f"{name}_lora_b")
  delta = lora.lora_delta(module, name, a.get_value(), b.get_value())
  return weight + (scale * delta).astype(weight.dtype)


def layer_shape(layer) -> LayerShape:
  attn = layer.attn
  local = attn.attn_type == gemma3.AttentionType.LOCAL_SLIDING
  return LayerShape(
      num_heads=attn.num_heads, num_kv_heads=attn.num_kv_heads, head_dim=attn.head_dim,
      query_scale=float(attn.query_pre_attn_scalar),
      rope_base=float(attn.rope_base_frequency), rope_scale=float(attn.rope_scale_factor),
      window=attn.sliding_window_size if local else None,
  )


def decode_weights(model, lora_scale: float, dtype=jnp.float32) -> list[LayerWeights]:
  """Every layer's weights with the adapters merged, in decode layouts.

  The projections are merged in the model's dtype, then rounded to `dtype`;
  norm scales keep the model's dtype.
  """
  layers = []
  for layer in model.layers:
    attn, mlp = layer.attn, layer.mlp
    if attn.use_qkv_einsum:
      raise NotImplementedError("fused qkv_einsum (Gemma-3 uses q_einsum + kv_einsum)")
    q_NxDxH = _merged(attn.q_einsum, "w", lora_scale)
    kv_2xKxDxH = _merged(attn.kv_einsum, "w", lora_scale)
    out_NxHxD = _merged(attn.attn_vec_einsum, "w", lora_scale)
    n, d, h = q_NxDxH.shape
    layers.append(LayerWeights(
        attn_norm_D=layer.pre_attention_norm.scale.get_value(),
        query_NHxD=q_NxDxH.transpose(0, 2, 1).reshape(n * h, d).astype(dtype),
        key_value_2KHxD=kv_2xKxDxH.transpose(0, 1, 3, 2).reshape(-1, d).astype(dtype),
        query_norm_H=tunix_gemma3.query_norm_scale(attn),
        key_norm_H=tunix_gemma3.key_norm_scale(attn),
        out_DxNH=out_NxHxD.reshape(n * h, d).T.astype(dtype),
        post_attn_norm_D=layer.post_attention_norm.scale.get_value(),
        ffw_norm_D=layer.pre_ffw_norm.scale.get_value(),
        gate_up_2FxD=jnp.concatenate([_merged(mlp.gate_proj, "kernel", lora_scale),
                                      _merged(mlp.up_proj, "kernel", lora_scale)],
                                     axis=1).T.astype(dtype),
        down_DxF=_merged(mlp.down_proj, "kernel", lora_scale).T.astype(dtype),
        post_ffw_norm_D=layer.post_ffw_norm.scale.get_value(),
    ))
  return layers


def rms_norm(x, scale):
  # Tunix's RMSNorm (Gemma stores scale - 1).
  normed = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + 1e-6)
  return normed * (1 + scale)


def completion_cache(prompt_cache, rows: int, new_tokens: int):
  """Zeroed keys [L, rows, K, H, T] and values [L, rows, K, T, H] for the completions' tokens,
  in the prompt cache's dtype."""
  layers, _, kv_heads, head_dim, _ = prompt_cache[0].shape
  dtype = prompt_cache[0].dtype
  return (jnp.zeros((layers, rows, kv_heads, head_dim, new_tokens), dtype),
          jnp.zeros((layers, rows, kv_heads, new_tokens, head_dim), dtype))


def first_tokens(first_R, first_logp_R, *, new_tokens: int, with_logps: bool):
  """[R, T] tokens and [R, T] (or [R, 1] without with_logps) log-probs, the prefill's in slot 0."""
  tokens_RxT = jnp.zeros((first_R.shape[0], new_tokens), jnp.int32).at[:, 0].set(first_R)
  logps_RxT = jnp.zeros((first_R.shape[0], new_tokens if with_logps else 1), jnp.float32)
  return tokens_RxT, logps_RxT.at[:, 0].set(first_logp_R)


class SlotRows(NamedTuple):
  """Where continuous batching's rows sit (continuous.decode_slots): row b's
  prompt is in prompt slot prompt_slot_B[b], its query heads in lane
  place_B[b] of the prompt slots' lanes (Q·lanes where the row idles)."""

  prompt_slot_B: jax.Array
  place_B: jax.Array
  lanes: int  # rows_per_prompt


def decode_layer(w: LayerWeights, shape: LayerShape, layer: int, x_BxD, position_B, t,
                 prompt_cache, valid_UxP, keys_LxBxKxHxT, values_LxBxKxTxH,
                 rows: SlotRows | None = None):
  """One token per row through one layer; writes its key/value at completion slot `t`.

  Attention reads two caches. The prompt's keys and values are held once
  per distinct prompt (`prompt_cache`: [L, U, K, H, P] keys, [L, U, K, P, H]
  values, written by the prefill and only read here): the R rows of a prompt
  attend to them with one dot whose rows are all their query heads, instead
  of R dots over R copies. The completion's are per row ([L, B, K, H, T]
  keys, [L, B, K, T, H] values); one softmax spans both.

  Each cache is one array across layers: XLA:CPU then updates the
  completion's in place inside the decode loop, where per-layer arrays were
  copied four times per token. Keys are stored slots-minor ([H, S] per row):
  XLA:CPU's query-key dot reads that layout faster (bench/studies/engine_ab.py,
  docs/results/engine_ab/).

  With `rows` (continuous batching: rows are slots, each holding any
  sample of any prompt, started at any step) `t` is per row ([B]: each row's
  own completion slot) and `prompt_cache`, `valid_UxP` hold the prompt
  slots' prompts (U = Q; _decode_rows_attention).
  """
  batch = x_BxD.shape[0]
  prompt_keys_LxUxKxHxP, prompt_values_LxUxKxPxH = prompt_cache
  prompts, prompt_width = valid_UxP.shape
  rows_per_prompt = batch // prompts
  n, k, h = shape.num_heads, shape.num_kv_heads, shape.head_dim
  heads = n // k
  normed_BxD = rms_norm(x_BxD, w.attn_norm_D)
  query_BxNxH = decode_dots.project(normed_BxD, w.query_NHxD).reshape(batch, n, h)
  kv_Bx2xKxH = decode_dots.project(normed_BxD, w.key_value_2KHxD).reshape(batch, 2, k, h)
  query_BxNxH = rms_norm(query_BxNxH, w.query_norm_H)
  new_key_BxKxH = rms_norm(kv_Bx2xKxH[:, 0], w.key_norm_H)
  rope = functools.partial(gemma3.apply_rope, head_dim=h, base_frequency=shape.rope_base,
                           scale_factor=shape.rope_scale)
  query_BxNxH = rope(query_BxNxH[:, None], position_B[:, None])[:, 0] * shape.query_scale
  new_key_BxKxH = rope(new_key_BxKxH[:, None], position_B[:, None])[:, 0]
  dtype = keys_LxBxKxHxT.dtype
  query_BxKxGxH = query_BxNxH.reshape(batch, k, heads, h)
  if rows is not None:
    return _decode_rows_attention(w, shape, layer, x_BxD, query_BxKxGxH, new_key_BxKxH,
                                  kv_Bx2xKxH[:, 1], t, prompt_cache, valid_UxP,
                                  keys_LxBxKxHxT, values_LxBxKxTxH, rows)
  keys_LxBxKxHxT = jax.lax.dynamic_update_slice(
      keys_LxBxKxHxT, new_key_BxKxH[None, :, :, :, None].astype(dtype), (layer, 0, 0, 0, t))
  values_LxBxKxTxH = jax.lax.dynamic_update_slice(
      values_LxBxKxTxH, kv_Bx2xKxH[None, :, 1, :, None].astype(dtype), (layer, 0, 0, t, 0))

  # Which slots the token sees: its own and earlier ones, within the window.
  slot = prompt_width + t  # the token's position in the prompt-then-completion sequence
  prompt_visible_UxP = valid_UxP
  new_visible_T = jnp.arange(keys_LxBxKxHxT.shape[-1]) <= t
  if shape.window is not None:
    prompt_visible_UxP &= jnp.arange(prompt_width) > slot - shape.window
    new_visible_T &= prompt_width + jnp.arange(keys_LxBxKxHxT.shape[-1]) > slot - shape.window

  def by_prompt(x_BxKxGxZ):  # [B, K, G, Z] -> [U, K, M, Z]: a prompt's rows together
    z = x_BxKxGxZ.shape[-1]
    return (x_BxKxGxZ.reshape(prompts, rows_per_prompt, k, heads, z).transpose(0, 2, 1, 3, 4)
            .reshape(prompts, k, rows_per_prompt * heads, z))

  def by_row(x_UxKxMxZ):  # the inverse of by_prompt
    z = x_UxKxMxZ.shape[-1]
    return (x_UxKxMxZ.reshape(prompts, k, rows_per_prompt, heads, z).transpose(0, 2, 1, 3, 4)
            .reshape(batch, k, heads, z))

  prompt_logits_UxKxMxP = jnp.einsum("ukmh,ukhp->ukmp", by_prompt(query_BxKxGxH),
                                     prompt_keys_LxUxKxHxP[layer])
  prompt_logits_UxKxMxP = jnp.where(prompt_visible_UxP[:, None, None, :], prompt_logits_UxKxMxP,
                                    gemma3.K_MASK)
  new_logits_BxKxGxT = jnp.einsum("bkgh,bkht->bkgt", query_BxKxGxH, keys_LxBxKxHxT[layer])
  new_logits_BxKxGxT = jnp.where(new_visible_T, new_logits_BxKxGxT, gemma3.K_MASK)
  probs_BxKxGxS = jax.nn.softmax(
      jnp.concatenate([by_row(prompt_logits_UxKxMxP), new_logits_BxKxGxT], axis=-1), axis=-1)
  probs_BxKxGxS = probs_BxKxGxS.astype(values_LxBxKxTxH.dtype)
  attended_BxKxGxH = (
      by_row(jnp.einsum("ukmp,ukph->ukmh", by_prompt(probs_BxKxGxS[..., :prompt_width]),
                        prompt_values_LxUxKxPxH[layer]))
      + jnp.einsum("bkgt,bkth->bkgh", probs_BxKxGxS[..., prompt_width:], values_LxBxKxTxH[layer]))
  return _output_and_mlp(w, x_BxD, attended_BxKxGxH), keys_LxBxKxHxT, values_LxBxKxTxH


def _output_and_mlp(w: LayerWeights, x_BxD, attended_BxKxGxH):
  """The rest of the layer after attention: output projection, then the MLP."""
  batch = x_BxD.shape[0]
  attended_BxNH = attended_BxKxGxH.reshape(batch, -1)
  x_BxD = x_BxD + rms_norm(decode_dots.project(attended_BxNH, w.out_DxNH), w.post_attn_norm_D)

  gate_up_Bx2F = decode_dots.project(rms_norm(x_BxD, w.ffw_norm_D), w.gate_up_2FxD)
  gate_BxF, up_BxF = jnp.split(gate_up_Bx2F, 2, axis=-1)
  return x_BxD + rms_norm(decode_dots.project(nnx.gelu(gate_BxF) * up_BxF, w.down_DxF),
                          w.post_ffw_norm_D)


def _decode_rows_attention(w: LayerWeights, shape: LayerShape, layer: int, x_BxD, query_BxKxGxH,
                           new_key_BxKxH, new_value_BxKxH, t_B, prompt_cache, valid_QxP,
                           keys_LxBxKxHxT, values_LxBxKxTxH, rows: SlotRows):
  """decode_layer for rows that each sit at their own slot t_B[b], in a lane of a prompt slot.

  `prompt_cache` holds Q prompt slots' keys and values ([L, Q, K, H, P] and
  [L, Q, K, P, H], copied in by continuous.decode_slots). Each row's query
  heads go to its lane of its prompt slot, so the rows of one prompt attend
  to it in one dot, as lockstep's do (the same dot, rows_per_prompt lanes
  by G heads against P slots), and each prompt is read once a step. Each
  row writes its key and value at its own completion slot (a scatter, in
  place in the decode loop); slots past t_B[b] may hold an earlier sample's:
  the mask hides them.
  """
  batch = x_BxD.shape[0]
  prompt_keys_LxQxKxHxP, prompt_values_LxQxKxPxH = prompt_cache
  num_slots, prompt_width = valid_QxP.shape
  _, k, heads, _ = query_BxKxGxH.shape
  lanes = rows.lanes
  new_tokens = keys_LxBxKxHxT.shape[-1]
  dtype = keys_LxBxKxHxT.dtype
  rows_B = jnp.arange(batch)
  keys_LxBxKxHxT = keys_LxBxKxHxT.at[layer, rows_B, :, :, t_B].set(new_key_BxKxH.astype(dtype))
  values_LxBxKxTxH = values_LxBxKxTxH.at[layer, rows_B, :, t_B, :].set(
      new_value_BxKxH.astype(dtype))

  slot_B = prompt_width + t_B  # each token's position in its prompt-then-completion sequence
  prompt_visible_BxP = valid_QxP[rows.prompt_slot_B]
  new_visible_BxT = jnp.arange(new_tokens)[None, :] <= t_B[:, None]
  if shape.window is not None:
    prompt_visible_BxP &= jnp.arange(prompt_width)[None, :] > slot_B[:, None] - shape.window
    new_visible_BxT &= (prompt_width + jnp.arange(new_tokens))[None, :] > (
        slot_B[:, None] - shape.window)

  def by_prompt(x_BxKxGxZ):  # [B, K, G, Z] -> [Q, K, lanes·G, Z]: each row in its lane, else 0
    z = x_BxKxGxZ.shape[-1]
    placed = jnp.zeros((num_slots * lanes, k, heads, z), x_BxKxGxZ.dtype).at[rows.place_B].set(
        x_BxKxGxZ, mode="drop")
    return (placed.reshape(num_slots, lanes, k, heads, z).transpose(0, 2, 1, 3, 4)
            .reshape(num_slots, k, lanes * heads, z))

  def by_row(x_QxKxMxZ):  # the inverse of by_prompt (an idle row reads some lane)
    z = x_QxKxMxZ.shape[-1]
    flat = (x_QxKxMxZ.reshape(num_slots, k, lanes, heads, z).transpose(0, 2, 1, 3, 4)
            .reshape(num_slots * lanes, k, heads, z))
    return flat[jnp.minimum(rows.place_B, num_slots * lanes - 1)]

  prompt_logits_BxKxGxP = by_row(jnp.einsum("ukmh,ukhp->ukmp", by_prompt(query_BxKxGxH),
                                            prompt_keys_LxQxKxHxP[layer]))
  prompt_logits_BxKxGxP = jnp.where(prompt_visible_BxP[:, None, None, :], prompt_logits_BxKxGxP,
                                    gemma3.K_MASK)
  new_logits_BxKxGxT = jnp.einsum("bkgh,bkht->bkgt", query_BxKxGxH, keys_LxBxKxHxT[layer])
  new_logits_BxKxGxT = jnp.where(new_visible_BxT[:, None, None, :], new_logits_BxKxGxT,
                                 gemma3.K_MASK)
  probs_BxKxGxS = jax.nn.softmax(
      jnp.concatenate([prompt_logits_BxKxGxP, new_logits_BxKxGxT], axis=-1), axis=-1)
  probs_BxKxGxS = probs_BxKxGxS.astype(values_LxBxKxTxH.dtype)
  attended_BxKxGxH = (
      by_row(jnp.einsum("ukmp,ukph->ukmh", by_prompt(probs_BxKxGxS[..., :prompt_width]),
                        prompt_values_LxQxKxPxH[layer]))
      + jnp.einsum("bkgt,bkth->bkgh", probs_BxKxGxS[..., prompt_width:], values_LxBxKxTxH[layer]))
  return _output_and_mlp(w, x_BxD, attended_BxKxGxH), keys_LxBxKxHxT, values_LxBxKxTxH
