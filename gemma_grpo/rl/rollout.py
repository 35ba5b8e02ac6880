"""The GRPO rollout engine: each prompt prefilled once, decoding on merged weights.

Tunix's vanilla sampler prefills every row of a batch, although GRPO's R rows
of a group share one prompt, and on XLA:CPU its decode step spends more time
moving memory than computing: the attention einsums' weights are re-laid out
at every token (XLA assigns layouts after hoisting loop invariants) and the
KV cache, laid out [B, S, K, H], is copied around the attention dots.

This engine (a Tunix `BaseRollout`, plugged into the RLCluster as its rollout
engine) instead
- prefills each distinct prompt once with the LoRA policy itself and keeps
  that prompt's keys and values once: while decoding, the R rows of a group
  attend to them together, in one dot whose rows are all their query heads,
  and only the completions' keys and values are held per row;
- before decoding, merges the adapters into one float copy of the projection
  weights (W + (alpha / r)·A·B, the policy's own weights up to rounding),
  each laid out [out, in] for the decode dots (`_project`): [N·H, D]
  queries, [2·K·H, D] keys and values, [D, N·H] output, [2·F, D] gate and
  up, [D, F] down. The copy (0.4 GB for Gemma-3-270M in float32) lives for
  one `generate` call;
- keeps the caches' keys slots-minor ([K, H, S] per row or prompt) and values
  [K, S, H], the layouts in which XLA:CPU's attention dots read them fastest.

`decode_dtype="bfloat16"` (rollout.decode_dtype) holds that copy and a copy
of the LM head (the tied embedding, 671 MB of the 270M's float32 bytes) in
bfloat16 for the decode loop: each dot reads half the bytes and, on CPUs with
AVX512_BF16, runs as a bfloat16 dot accumulated in float32. Prefill, the
trainer and the reference pass stay in the model's own dtype, so the samples
come from a policy that differs from the trained one by bfloat16 rounding;
`return_logprobs` gives the decode loop's own log-probabilities of the drawn
tokens: the learner divides by them in the importance ratio (the sampler is
the behaviour policy); BENCHMARKS.md, "Decode in bfloat16", measures the difference.

The float32 LM head (the tied embedding, 671 MB for the 270M) is the largest
read of a decode step. With top-k sampling or greedy decoding only the k
largest logits matter, so by default (`screen_lm_head="auto"`: on accelerators and on CPUs with
bfloat16 matrix units, where it measured faster) a bfloat16 copy of the head ranks
the vocabulary, the best few hundred candidates are rescored from the
float32 head, and an error bound proves the float32 top-k is among them;
where it cannot, that step computes the whole float32 head. Tokens are drawn
from the float32 logits either way (`_screened_top`).

Sampling follows Tunix's sampler: temperature, then top-k, then top-p over the
sorted top-k; greedy when temperature is 0 or top_p is None. Completions stop
at the first stop token (excluded from the returned tokens) or at
`max_tokens_to_generate`.

With tools (`tool_runner`), completions are multi-turn: the decode loop
pauses where a row may have closed a tool call, the host runs it, and the
result's tokens are fed into the row's next slots (multi_turn.py). Without
tools the loop is traced exactly as the one-turn loop.

Shapes: B rows, U distinct prompts of R rows each, P prompt width, T new
tokens, S = P + T, D model width, N query heads, K key/value heads, G = N / K,
M = R·G, H head width, F MLP width, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
from tunix.generate import tokenizer_adapter
from tunix.models.gemma3 import model as gemma3
from tunix.rl.rollout import base_rollout

from gemma_grpo.runtime import distributed
from gemma_grpo.model import gemma3_rl
from gemma_grpo.rl import logprobs
from gemma_grpo.model import lora
from gemma_grpo.rl import multi_turn
from gemma_grpo import seam
from gemma_grpo.tasks import tools as tools_lib

seam.check_versions()  # Tunix/Qwix internals below: other versions stop here (seam.py)


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


DECODE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
SCREEN_SETTINGS = ("auto", "on", "off")  # rollout.screen_lm_head; see _screened_top
# The CPUs on which the screen measured faster: x86 with AMX. Without AMX a
# bfloat16 head reads no faster than the float32 one, so the screen only adds
# work (BENCHMARKS.md, "The LM head's screen in decode").
_SCREEN_CPU_FLAGS = ("amx_bf16",)


def screen_pays_off(cpuinfo: str = "/proc/cpuinfo") -> bool:
  """Whether "auto" screens the LM head here: on a CPU whose /proc/cpuinfo lists
  a bfloat16 matrix unit (_SCREEN_CPU_FLAGS), where it measured faster, and on
  accelerators, whose matrix units take bfloat16 natively (not measured: no
  accelerator was lent to this project's benchmarks)."""
  if jax.default_backend() != "cpu":
    return True
  try:
    with open(cpuinfo, encoding="utf-8") as f:
      flags = set(" ".join(line for line in f if line.startswith(("flags", "Features"))).split())
  except OSError:
    return False
  return any(flag in flags for flag in _SCREEN_CPU_FLAGS)


def _project(x_BxI, w_OxI):
  """x @ w.T for decode's few rows, accumulated in float32, in x's dtype.

  Weights are laid out [out, in]. XLA:CPU's float32 dot writing [B, O]
  reads them well below the streaming rate, writing [O, B] near it; the
  barrier keeps XLA from folding the transpose back into the dot. A
  bfloat16 weight is fastest writing [B, O] directly. Both beat the
  [in, out] layout (BENCHMARKS.md, "The LM head in decode, and attention";
  bench/studies/decode_dots.py). The LM head has its own `_head_logits`.
  """
  x_BxI, dtype = x_BxI.astype(w_OxI.dtype), x_BxI.dtype
  if w_OxI.dtype != jnp.float32:
    return jnp.einsum("bi,oi->bo", x_BxI, w_OxI, preferred_element_type=jnp.float32).astype(dtype)
  y_OxB = jnp.einsum("bi,oi->ob", x_BxI, w_OxI)
  return jax.lax.optimization_barrier(y_OxB).T.astype(dtype)


def _head_logits(normed_BxD, head_VxD):
  """float32 logits of the LM head [V, D], written [V, B] behind a barrier in any dtype.

  In float32 this is _project's form. Unlike the layers' bfloat16
  projections, the head's 262,144 outputs are faster written
  vocabulary-major in bfloat16 too (BENCHMARKS.md, "Decode in bfloat16" and
  "The LM head in decode, and attention"). The screen and the float32 head
  both go through here.
  """
  logits_VxB = jnp.einsum("bi,vi->vb", normed_BxD.astype(head_VxD.dtype), head_VxD,
                          preferred_element_type=jnp.float32)
  return jax.lax.optimization_barrier(logits_VxB).T


def _merged(module, name: str, scale: float) -> jax.Array:
  """`module.<name>` plus scale·A·B of its adapter, if it has one."""
  weight = getattr(module, name).value
  a = getattr(module, f"{name}_lora_a", None)
  if a is None:
    return weight
  b = getattr(module, f"{name}_lora_b")
  delta = lora.lora_delta(module, name, a.value, b.value)
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
        attn_norm_D=layer.pre_attention_norm.scale.value,
        query_NHxD=q_NxDxH.transpose(0, 2, 1).reshape(n * h, d).astype(dtype),
        key_value_2KHxD=kv_2xKxDxH.transpose(0, 1, 3, 2).reshape(-1, d).astype(dtype),
        query_norm_H=attn._query_norm.scale.value,  # pylint: disable=protected-access
        key_norm_H=attn._key_norm.scale.value,  # pylint: disable=protected-access
        out_DxNH=out_NxHxD.reshape(n * h, d).T.astype(dtype),
        post_attn_norm_D=layer.post_attention_norm.scale.value,
        ffw_norm_D=layer.pre_ffw_norm.scale.value,
        gate_up_2FxD=jnp.concatenate([_merged(mlp.gate_proj, "kernel", lora_scale),
                                      _merged(mlp.up_proj, "kernel", lora_scale)],
                                     axis=1).T.astype(dtype),
        down_DxF=_merged(mlp.down_proj, "kernel", lora_scale).T.astype(dtype),
        post_ffw_norm_D=layer.post_ffw_norm.scale.value,
    ))
  return layers


def _rms_norm(x, scale):
  # Tunix's RMSNorm (Gemma stores scale - 1).
  normed = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + 1e-6)
  return normed * (1 + scale)


def _decode_layer(w: LayerWeights, shape: LayerShape, layer: int, x_BxD, position_B, t,
                  prompt_cache, valid_UxP, keys_LxBxKxHxT, values_LxBxKxTxH):
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
  """
  batch = x_BxD.shape[0]
  prompt_keys_LxUxKxHxP, prompt_values_LxUxKxPxH = prompt_cache
  prompts, width = valid_UxP.shape
  rows_per_prompt = batch // prompts
  n, k, h = shape.num_heads, shape.num_kv_heads, shape.head_dim
  heads = n // k
  normed_BxD = _rms_norm(x_BxD, w.attn_norm_D)
  query_BxNxH = _project(normed_BxD, w.query_NHxD).reshape(batch, n, h)
  kv_Bx2xKxH = _project(normed_BxD, w.key_value_2KHxD).reshape(batch, 2, k, h)
  query_BxNxH = _rms_norm(query_BxNxH, w.query_norm_H)
  new_key_BxKxH = _rms_norm(kv_Bx2xKxH[:, 0], w.key_norm_H)
  rope = functools.partial(gemma3.apply_rope, head_dim=h, base_frequency=shape.rope_base,
                           scale_factor=shape.rope_scale)
  query_BxNxH = rope(query_BxNxH[:, None], position_B[:, None])[:, 0] * shape.query_scale
  new_key_BxKxH = rope(new_key_BxKxH[:, None], position_B[:, None])[:, 0]
  dtype = keys_LxBxKxHxT.dtype
  keys_LxBxKxHxT = jax.lax.dynamic_update_slice(
      keys_LxBxKxHxT, new_key_BxKxH[None, :, :, :, None].astype(dtype), (layer, 0, 0, 0, t))
  values_LxBxKxTxH = jax.lax.dynamic_update_slice(
      values_LxBxKxTxH, kv_Bx2xKxH[None, :, 1, :, None].astype(dtype), (layer, 0, 0, t, 0))

  # Which slots the token sees: its own and earlier ones, within the window.
  slot = width + t  # the token's position in the prompt-then-completion sequence
  prompt_visible_UxP = valid_UxP
  new_visible_T = jnp.arange(keys_LxBxKxHxT.shape[-1]) <= t
  if shape.window is not None:
    prompt_visible_UxP &= jnp.arange(width) > slot - shape.window
    new_visible_T &= width + jnp.arange(keys_LxBxKxHxT.shape[-1]) > slot - shape.window

  def by_prompt(x_BxKxGxZ):  # [B, K, G, Z] -> [U, K, M, Z]: a prompt's rows together
    z = x_BxKxGxZ.shape[-1]
    return (x_BxKxGxZ.reshape(prompts, rows_per_prompt, k, heads, z).transpose(0, 2, 1, 3, 4)
            .reshape(prompts, k, rows_per_prompt * heads, z))

  def by_row(x_UxKxMxZ):  # the inverse of by_prompt
    z = x_UxKxMxZ.shape[-1]
    return (x_UxKxMxZ.reshape(prompts, k, rows_per_prompt, heads, z).transpose(0, 2, 1, 3, 4)
            .reshape(batch, k, heads, z))

  query_BxKxGxH = query_BxNxH.reshape(batch, k, heads, h)
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
      by_row(jnp.einsum("ukmp,ukph->ukmh", by_prompt(probs_BxKxGxS[..., :width]),
                        prompt_values_LxUxKxPxH[layer]))
      + jnp.einsum("bkgt,bkth->bkgh", probs_BxKxGxS[..., width:], values_LxBxKxTxH[layer]))
  attended_BxNH = attended_BxKxGxH.reshape(batch, n * h)
  x_BxD = x_BxD + _rms_norm(_project(attended_BxNH, w.out_DxNH), w.post_attn_norm_D)

  gate_up_Bx2F = _project(_rms_norm(x_BxD, w.ffw_norm_D), w.gate_up_2FxD)
  gate_BxF, up_BxF = jnp.split(gate_up_Bx2F, 2, axis=-1)
  x_BxD = x_BxD + _rms_norm(_project(nnx.gelu(gate_BxF) * up_BxF, w.down_DxF), w.post_ffw_norm_D)
  return x_BxD, keys_LxBxKxHxT, values_LxBxKxTxH


@dataclasses.dataclass(frozen=True)
class Sampling:
  """Token choice; hashable, so one compiled decode loop per setting."""

  greedy: bool
  temperature: float
  top_k: int | None
  top_p: float


def sample_tokens(logits_BxV, key, sampling: Sampling):
  """Tunix's choice rule: argmax, or temperature -> top-k -> top-p -> draw."""
  if sampling.greedy:
    return jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
  logits_BxV = logits_BxV.astype(jnp.float32) / sampling.temperature
  if sampling.top_p >= 1.0 and not sampling.top_k:
    return jax.random.categorical(key, logits_BxV).astype(jnp.int32)
  top_logits_BxK, top_ids_BxK = top_k(logits_BxV, sampling.top_k or logits_BxV.shape[-1])
  return _draw_from_top(top_logits_BxK, top_ids_BxK, key, sampling)


def top_k(x_BxV, k: int):
  """`jax.lax.top_k(x_BxV, k)`, ties and order included, through vocabulary blocks.

  The k best blocks by their maxima hold the k best entries (see
  _screen_candidates); ties between block maxima go to the lower block, and
  the kept blocks are read in vocabulary order, so ties between entries go
  to the lower id, as top_k's do. Where the vocabulary is not whole blocks,
  or has fewer than 4k of them, plain top_k.
  """
  batch, vocab = x_BxV.shape
  if vocab % SCREEN_BLOCK or vocab // SCREEN_BLOCK < 4 * k:
    return jax.lax.top_k(x_BxV, k)
  blocks_BxNxC = x_BxV.reshape(batch, vocab // SCREEN_BLOCK, SCREEN_BLOCK)
  _, block_BxK = jax.lax.top_k(blocks_BxNxC.max(axis=-1), k)
  block_BxK = jnp.sort(block_BxK, axis=-1)
  kept_BxKC = jnp.take_along_axis(blocks_BxNxC, block_BxK[..., None], axis=1).reshape(batch, -1)
  top_BxK, at_BxK = jax.lax.top_k(kept_BxKC, k)
  ids_BxK = (jnp.take_along_axis(block_BxK, at_BxK // SCREEN_BLOCK, axis=-1) * SCREEN_BLOCK
             + at_BxK % SCREEN_BLOCK)
  return top_BxK, ids_BxK


def _draw_from_top(top_logits_BxK, top_ids_BxK, key, sampling: Sampling):
  """Top-p over the sorted top-k logits (already divided by the temperature), then a draw."""
  probs_BxK = jax.nn.softmax(top_logits_BxK, axis=-1)
  beyond_p_BxK = jnp.cumsum(probs_BxK, axis=-1) - probs_BxK > sampling.top_p
  top_logits_BxK = jnp.where(beyond_p_BxK, -jnp.inf, top_logits_BxK)
  pick_B = jax.random.categorical(key, top_logits_BxK)
  return jnp.take_along_axis(top_ids_BxK, pick_B[:, None], axis=-1)[:, 0].astype(jnp.int32)


SCREEN_MIN_WIDTH = 256  # candidates the screen keeps, at least; see screen_width


def screen_width(sampling: Sampling, vocab_size: int) -> int:
  """Candidates the bfloat16 screen keeps for `sampling`; 0 where it cannot help.

  The exact top-k must lie among them and be provably so (`_screened_top`).
  Too few candidates leave steps unproved, each of which then computes the
  whole head; SCREEN_MIN_WIDTH leaves almost none for k = 50
  (bench/studies/lm_head_screen.py counts them; docs/results/lm_head_screen).
  Sampling from the whole vocabulary (no top-k) needs every logit, so it
  gets no screen.
  """
  k = 1 if sampling.greedy else sampling.top_k
  if not k:
    return 0
  width = max(SCREEN_MIN_WIDTH, 4 * k)
  return width if 4 * width <= vocab_size else 0


def screen_error_bound(normed_BxD, head_norm_max):
  """Per row, the most any token's screen logit can differ from its float32 logit.

  The screen rounds both factors to bfloat16 (relative error u = 2^-8 each,
  so |h~e~ - he| <= (2u + u^2)|h||e| per term) and sums in float32; the
  candidates are rescored in float32, in another order than the full head.
  With D terms, float32 summation adds at most D·2^-24 of sum|h||e| each
  time; 4·D·2^-24 covers the screen, the rescoring and the full head they
  are compared with. Cauchy-Schwarz: sum|h||e| <= ||h|| max_v ||e_v||.
  """
  d = normed_BxD.shape[-1]
  factor = 2.0 ** -7 + 2.0 ** -16 + 4 * d * 2.0 ** -24
  return factor * jnp.linalg.norm(normed_BxD.astype(jnp.float32), axis=-1) * head_norm_max


SCREEN_BLOCK = 64  # vocabulary block of _screen_candidates


def _screen_candidates(screen_BxV, width: int):
  """Per row, the ids of the `width` largest screen logits (in no set
  order), and a bound that every other token's screen logit is at most.

  Blockwise, because XLA:CPU's top_k over the whole vocabulary is slow:
  the `width` best blocks by their maxima hold every one of the `width` best tokens (each such block's
  maximum is at least the width-th best token, and at most `width` blocks
  can hold one), so the best `width` of those blocks' tokens are the
  vocabulary's. Tokens outside those blocks are at most the width-th block
  maximum; the rest at most the least candidate.
  """
  batch, vocab = screen_BxV.shape
  if vocab % SCREEN_BLOCK or vocab // SCREEN_BLOCK < width:
    top_BxW, candidates_BxW = jax.lax.top_k(screen_BxV, width)
    # The min, not the last column: reading that makes XLA:CPU sort the
    # whole vocabulary instead.
    return jnp.min(top_BxW, axis=-1), candidates_BxW
  blocks_BxNxC = screen_BxV.reshape(batch, vocab // SCREEN_BLOCK, SCREEN_BLOCK)
  block_max_BxW, block_BxW = jax.lax.top_k(blocks_BxNxC.max(axis=-1), width)
  kept_BxWC = jnp.take_along_axis(blocks_BxNxC, block_BxW[..., None], axis=1).reshape(batch, -1)
  top_BxW, at_BxW = jax.lax.top_k(kept_BxWC, width)
  candidates_BxW = (jnp.take_along_axis(block_BxW, at_BxW // SCREEN_BLOCK, axis=-1) * SCREEN_BLOCK
                    + at_BxW % SCREEN_BLOCK)
  beyond_B = jnp.maximum(jnp.min(block_max_BxW, axis=-1), jnp.min(top_BxW, axis=-1))
  return beyond_B, candidates_BxW


def _screened_top(normed_BxD, head_VxD, screen_VxD, head_norm_max, k: int, width: int,
                  temperature: float):
  """The k largest float32 head logits / temperature and their ids, sorted, as
  `jax.lax.top_k(_project(normed, head) / temperature, k)` gives them up to
  float32 rounding; and whether the screen proved them.

  A bfloat16 copy of the head (half the bytes) ranks the vocabulary; the
  `width` best are rescored exactly from the float32 head's rows. If the
  k-th rescored logit exceeds every other token's screen logit by more
  than the screen's error bound, no token outside the candidates can be in
  the top k: the result is the float32 head's. Otherwise (a row whose
  logits are flat beyond the candidates) this step computes the whole
  float32 head, as without the screen.
  """
  # Written [V, B] (_head_logits), the faster form for the head's outputs.
  beyond_B, candidates_BxW = _screen_candidates(_head_logits(normed_BxD, screen_VxD), width)
  exact_BxW = jnp.einsum("bd,bwd->bw", normed_BxD, head_VxD[candidates_BxW])
  top_BxK, at_BxK = jax.lax.top_k(exact_BxW, k)
  margin_B = screen_error_bound(normed_BxD, head_norm_max)
  proved = jnp.all(top_BxK[:, -1] > beyond_B + margin_B)

  def from_candidates():
    return top_BxK / temperature, jnp.take_along_axis(candidates_BxW, at_BxK, axis=-1)

  def from_full_head():
    top_BxK, ids_BxK = jax.lax.top_k(_head_logits(normed_BxD, head_VxD) / temperature, k)
    return top_BxK, ids_BxK

  top_BxK, ids_BxK = jax.lax.cond(proved, from_candidates, from_full_head)
  return top_BxK, ids_BxK, proved


@functools.partial(jax.jit, static_argnames=("lora_scale", "rows_per_prompt", "pad_id",
                                             "sampling", "decode_dtype", "screened"))
def _prefill(graphdef, state, prompt_ids_UxP, rng, *, lora_scale, rows_per_prompt, pad_id,
             sampling, decode_dtype, screened):
  """Distinct prompts through the policy once; first tokens and their log-probs; decode inputs.

  Its cache holds only the prompt's slots, so one program serves every
  completion length.
  """
  model = nnx.merge(graphdef, state)
  num_prompts, width = prompt_ids_UxP.shape
  cfg = model.config
  cache = model.empty_cache(num_prompts, width)
  positions_UxP, mask_UxPxP = logprobs.positions_and_mask(prompt_ids_UxP, pad_id)
  logits_Ux1xV, cache = model(prompt_ids_UxP, positions_UxP, cache, mask_UxPxP,
                              decode_only_last_token=True)
  # The prompt's keys and values stay one per prompt (_decode_layer).
  prompt_cache = (
      jnp.stack([cache[f"layer_{i}"]["k"].transpose(0, 2, 3, 1) for i in range(cfg.num_layers)]),
      jnp.stack([cache[f"layer_{i}"]["v"].transpose(0, 2, 1, 3) for i in range(cfg.num_layers)]))
  repeat = functools.partial(jnp.repeat, repeats=rows_per_prompt, axis=0)
  logits_BxV = repeat(logits_Ux1xV[:, 0])
  first_B = sample_tokens(logits_BxV, jax.random.fold_in(rng, 0), sampling)
  dtype = DECODE_DTYPES[decode_dtype]
  # The float32 head is the model's own array: pass it through, do not copy it.
  embedding_VxD = model.embedder.input_embedding.value
  head_VxD = None if dtype == jnp.float32 else embedding_VxD.astype(dtype)
  screen = None
  if screened:  # the LM head's bfloat16 copy and the largest row norm (_screened_top)
    screen = (embedding_VxD.astype(jnp.bfloat16),
              jnp.max(jnp.linalg.norm(embedding_VxD.astype(jnp.float32), axis=-1)))
  return (decode_weights(model, lora_scale, dtype), head_VxD, screen, first_B,
          _token_logps(logits_BxV, first_B, sampling), prompt_cache,
          repeat(positions_UxP[:, -1]) + 1, prompt_ids_UxP != pad_id)


def _token_logps(logits_BxV, token_B, sampling: Sampling):
  """log p(token) under softmax(logits / temperature): the trainer's log-prob (no top-k/top-p)."""
  # logsumexp, not log_softmax: no [B, V] array is written for one entry a row.
  scaled_BxV = logits_BxV.astype(jnp.float32) / sampling.temperature
  picked_B = jnp.take_along_axis(scaled_BxV, token_B[:, None], axis=-1)[:, 0]
  return picked_B - jax.nn.logsumexp(scaled_BxV, axis=-1)


def _decode_start(first_B, first_logp_B, prompt_cache, stop_ids, *, new_tokens, with_logps):
  """The decode loop's carry before its first step: the prefill's token in slot 0."""
  batch = first_B.shape[0]
  prompt_keys_LxUxKxHxP = prompt_cache[0]
  layers, _, kv_heads, head_dim, _ = prompt_keys_LxUxKxHxP.shape
  dtype = prompt_keys_LxUxKxHxP.dtype
  keys_LxBxKxHxT = jnp.zeros((layers, batch, kv_heads, head_dim, new_tokens), dtype)
  values_LxBxKxTxH = jnp.zeros((layers, batch, kv_heads, new_tokens, head_dim), dtype)
  tokens_BxT = jnp.zeros((batch, new_tokens), jnp.int32).at[:, 0].set(first_B)
  logps_BxT = jnp.zeros((batch, new_tokens if with_logps else 1), jnp.float32)
  logps_BxT = logps_BxT.at[:, 0].set(first_logp_B)
  done_B = jnp.isin(first_B, stop_ids)
  return (1, tokens_BxT, logps_BxT, done_B, keys_LxBxKxHxT, values_LxBxKxTxH, jnp.int32(0))


def _decode_loop(carry, weights, embed_VxD, head_VxD, screen, final_norm_D, prompt_cache,
                 next_position_B, valid_UxP, stop_ids, rng, turns, *, shapes, new_tokens,
                 sampling, with_logps, screen_width):
  """Runs decode steps from `carry` until every row stops or slot new_tokens is reached.

  `turns` is None for one-turn decoding. For tool calls (multi_turn.py) it is
  (forced_BxT, ends_call_V, needs_char_V, last_char_V) and the carry ends
  with paused_B: a row takes forced_BxT[b, t] at slot t where that is >= 0
  (a tool's result, read like a prompt and never sampled), and the loop
  also stops after a step in which a row may have closed a tool call, for
  the host to run it.
  """
  def step(carry):
    t, tokens_BxT, logps_BxT, done_B, keys_LxBxKxHxT, values_LxBxKxTxH, full_heads = carry[:7]
    x_BxD = embed_VxD[tokens_BxT[:, t - 1]] * jnp.sqrt(embed_VxD.shape[-1]).astype(embed_VxD.dtype)
    position_B = next_position_B + t - 1
    for layer, (w, shape) in enumerate(zip(weights, shapes)):
      x_BxD, keys_LxBxKxHxT, values_LxBxKxTxH = _decode_layer(
          w, shape, layer, x_BxD, position_B, t - 1, prompt_cache, valid_UxP, keys_LxBxKxHxT,
          values_LxBxKxTxH)
    normed_BxD = _rms_norm(x_BxD, final_norm_D)
    key = jax.random.fold_in(rng, t)
    if screen_width:
      top_BxK, ids_BxK, proved = _screened_top(
          normed_BxD, head_VxD, *screen, 1 if sampling.greedy else sampling.top_k,
          screen_width, sampling.temperature)
      token_B = (ids_BxK[:, 0].astype(jnp.int32) if sampling.greedy
                 else _draw_from_top(top_BxK, ids_BxK, key, sampling))
      full_heads += 1 - proved.astype(jnp.int32)
    else:
      logits_BxV = _head_logits(normed_BxD, head_VxD)
      token_B = sample_tokens(logits_BxV, key, sampling)
    token_B = jnp.where(done_B, stop_ids[0], token_B)
    if turns is not None:
      forced_BxT, ends_call_V, needs_char_V, last_char_V = turns
      forced_B = forced_BxT[:, t]
      from_tool_B = (forced_B >= 0) & ~done_B
      token_B = jnp.where(from_tool_B, forced_B, token_B)
      # A necessary condition for the row's text to end "</tool_call>"
      # (multi_turn.CallEnds); the host reads the text to be sure.
      previous_B = tokens_BxT[:, t - 1]
      may_close_B = ends_call_V[token_B] | (
          (needs_char_V[token_B] >= 0) & (needs_char_V[token_B] == last_char_V[previous_B]))
      paused_B = may_close_B & ~from_tool_B & ~done_B
    if with_logps:
      logps_BxT = logps_BxT.at[:, t].set(_token_logps(logits_BxV, token_B, sampling))
    stops_B = jnp.isin(token_B, stop_ids)
    if turns is not None:
      stops_B &= ~from_tool_B
    done_B = done_B | stops_B
    out = (t + 1, tokens_BxT.at[:, t].set(token_B), logps_BxT, done_B, keys_LxBxKxHxT,
           values_LxBxKxTxH, full_heads)
    return out if turns is None else (*out, paused_B)

  def more(carry):
    t, _, _, done_B, *_ = carry
    going = (t < new_tokens) & ~jnp.all(done_B)
    return going if turns is None else going & ~jnp.any(carry[7])

  return jax.lax.while_loop(more, step, carry)


@functools.partial(jax.jit, static_argnames=("shapes", "new_tokens", "sampling", "with_logps",
                                             "screen_width"))
def _decode(weights, embed_VxD, head_VxD, screen, final_norm_D, first_B, first_logp_B,
            prompt_cache, next_position_B, valid_UxP, stop_ids, rng, *,
            shapes, new_tokens, sampling, with_logps, screen_width):
  """Tokens 2..new_tokens of every row, and with_logps their log-probs; stops
  early once every row has stopped. Also returns how many steps computed the
  whole float32 LM head although a screen was given (its proof failed).

  Rows are grouped by prompt: row b continues prompt b // R, whose keys and
  values `prompt_cache` holds (_decode_layer). Token t (0-based) of a row
  sits at completion slot t and RoPE position next_position_B + t; it is
  drawn with fold_in(rng, t). `embed_VxD` embeds the input tokens;
  `head_VxD` (the embedding, maybe rounded) gives the logits, through
  `screen` (its bfloat16 copy, max row norm) when screen_width > 0.
  """
  carry = _decode_start(first_B, first_logp_B, prompt_cache, stop_ids, new_tokens=new_tokens,
                        with_logps=with_logps)
  _, tokens_BxT, logps_BxT, _, _, _, full_heads = _decode_loop(
      carry, weights, embed_VxD, head_VxD, screen, final_norm_D, prompt_cache, next_position_B,
      valid_UxP, stop_ids, rng, None, shapes=shapes, new_tokens=new_tokens, sampling=sampling,
      with_logps=with_logps, screen_width=screen_width)
  return tokens_BxT, logps_BxT, full_heads


# Multi-turn decoding (tool calls): the same loop, resumed by the host after
# each pause with the carry donated, so the caches are updated in place.
_decode_turn_start = jax.jit(_decode_start, static_argnames=("new_tokens", "with_logps"))
_decode_turn = jax.jit(_decode_loop, donate_argnums=(0,), static_argnames=(
    "shapes", "new_tokens", "sampling", "with_logps", "screen_width"))


def group_rows(prompts: Sequence[str]) -> tuple[list[int], int]:
  """(index of each run's first row, run length) if `prompts` is equal-length runs."""
  starts = [i for i in range(len(prompts)) if i == 0 or prompts[i] != prompts[i - 1]]
  size = len(prompts) // len(starts)
  equal_runs = size * len(starts) == len(prompts) and all(
      prompts[s:s + size] == [prompts[s]] * size for s in starts)
  if equal_runs:
    return starts, size
  return list(range(len(prompts))), 1


class GroupedRollout(base_rollout.BaseRollout):
  """Rollouts for the RLCluster; see the module docstring."""

  def __init__(self, rollout_actor, tokenizer, mesh=None, rollout_config=None, *,
               lora_scale: float, decode_dtype: str = "float32", screen_lm_head: str = "auto",
               tool_runner: tools_lib.ToolRunner | None = None, max_tool_calls: int = 0):
    """With `tool_runner` and max_tool_calls > 0, completions may call its
    tools (multi_turn.py); `take_tool_turns` then says what they did."""
    del rollout_config  # each generate() call brings its own
    if not isinstance(rollout_actor, gemma3_rl.Gemma3):
      # Converting would make a second module that the trainer never updates.
      raise TypeError(
          f"GroupedRollout needs a gemma_grpo.model.gemma3_rl.Gemma3, got {type(rollout_actor)}")
    self._model = rollout_actor
    if not isinstance(tokenizer, tokenizer_adapter.TokenizerAdapter):
      tokenizer = tokenizer_adapter.TokenizerAdapter(tokenizer)
    self._tokenizer = tokenizer
    self.mesh = mesh
    self._lora_scale = float(lora_scale)
    if decode_dtype not in DECODE_DTYPES:
      raise ValueError(f"decode_dtype={decode_dtype!r}: must be one of {', '.join(DECODE_DTYPES)}")
    self._decode_dtype = decode_dtype
    if screen_lm_head not in SCREEN_SETTINGS:
      raise ValueError(f"screen_lm_head={screen_lm_head!r}: must be one of {', '.join(SCREEN_SETTINGS)}")
    # Only a float32 head is screened: a bfloat16 one is already as cheap.
    self._screen = decode_dtype == "float32" and (
        screen_lm_head == "on" or (screen_lm_head == "auto" and screen_pays_off()))
    self.full_head_steps = 0  # of the last generate(): decode steps the screen did not prove
    self._shapes = tuple(layer_shape(layer) for layer in rollout_actor.layers)
    self._tool_runner = tool_runner if max_tool_calls > 0 else None
    self._max_tool_calls = max_tool_calls
    self._call_ends = None  # multi_turn.CallEnds on device, built at the first tool rollout
    self._tool_turns: list[multi_turn.RowTurns] = []

  def tokenize(self, prompt: str) -> np.ndarray:
    """The ids Tunix's sampler feeds for `prompt` (<bos> once)."""
    ids = self._tokenizer.encode(prompt)
    bos = [self._tokenizer.bos_id()] if self._tokenizer.bos_id() else []
    return np.array(self._tokenizer.dedup_bos_ids(bos + ids), dtype=np.int32)

  def generate(self, prompts: list[str], rollout_config: base_rollout.RolloutConfig,
               **kwargs) -> base_rollout.RolloutOutput:
    del kwargs
    rows = [self.tokenize(p) for p in prompts]
    width = rollout_config.max_prompt_length
    longest = max(len(r) for r in rows)
    if width is None or width < longest:
      width = 1 << (longest - 1).bit_length()  # as Tunix's sampler does
    pad = self.pad_id()
    padded_BxP = np.stack([np.pad(r, (width - len(r), 0), constant_values=pad) for r in rows])
    starts, rows_per_prompt = group_rows(prompts)
    rng = rollout_config.seed  # as Tunix's sampler: a key, an int seed, or None (0)
    if rng is None:
      rng = jax.random.PRNGKey(0)
    elif isinstance(rng, int):
      rng = jax.random.PRNGKey(rng)
    stop_ids = jnp.asarray(list(rollout_config.eos_tokens or [self.eos_id()]), jnp.int32)
    sampling, with_logps, screen = self.settings(rollout_config, rollout_config.return_logprobs)
    fn, args, kwargs = self.prefill_call(jnp.asarray(padded_BxP[starts]), rng,
                                         rows_per_prompt=rows_per_prompt, sampling=sampling,
                                         screen_width=screen)
    fn, args, kwargs = self.decode_call(
        fn(*args, **kwargs), stop_ids, rng, new_tokens=rollout_config.max_tokens_to_generate,
        sampling=sampling, with_logps=with_logps, screen_width=screen)
    turns = None
    if self._tool_runner is None:
      tokens_BxT, logps_BxT, full_heads = jax.device_get(fn(*args, **kwargs))
    else:
      turns, (tokens_BxT, logps_BxT, full_heads) = self._decode_with_tools(args, kwargs)
    del fn, args, kwargs
    tokens_BxT, logps_BxT = np.asarray(tokens_BxT), np.asarray(logps_BxT)
    self.full_head_steps = int(full_heads)
    stops = np.asarray(stop_ids)
    completions, logprobs_out = [], []
    for row, row_logps in zip(tokens_BxT, logps_BxT):
      # A tool result holds no stop token (multi_turn.ToolTurns drops them).
      hits = np.flatnonzero(np.isin(row, stops))
      end = hits[0] if hits.size else len(row)
      completions.append(row[:end])
      logprobs_out.append(row_logps[:end])
    if turns is not None:
      self._tool_turns.extend(turns.rows([len(c) for c in completions]))
    return base_rollout.RolloutOutput(
        text=[self._tokenizer.decode(c.tolist()) for c in completions],
        logits=None,
        tokens=completions,
        left_padded_prompt_tokens=padded_BxP,
        logprobs=logprobs_out if with_logps else None,
    )

  def _decode_with_tools(self, args, kwargs):
    """decode_call's loop, paused for each tool call (multi_turn.py); (turns, its outputs)."""
    (weights, embed_VxD, head_VxD, screen, final_norm_D, first_B, first_logp_B, prompt_cache,
     next_position_B, valid_UxP, stop_ids, rng) = args
    new_tokens, with_logps = kwargs["new_tokens"], kwargs["with_logps"]
    if self._call_ends is None:
      vocab = embed_VxD.shape[0]
      ends = multi_turn.CallEnds.from_texts([self._tokenizer.decode([i]) for i in range(vocab)])
      self._call_ends = tuple(jnp.asarray(x) for x in dataclasses.astuple(ends))
    specials = [self._tokenizer.bos_id(), self.pad_id(), self.eos_id()]
    turns = multi_turn.ToolTurns(
        self._tool_runner, self._tokenizer.decode, self._tokenizer.encode,
        max_calls=self._max_tool_calls, rows=first_B.shape[0], width=new_tokens,
        banned_ids=[i for i in [*specials, *np.asarray(stop_ids).tolist()] if i is not None])
    carry = _decode_turn_start(first_B, first_logp_B, prompt_cache, stop_ids,
                               new_tokens=new_tokens, with_logps=with_logps)
    while True:
      carry = _decode_turn(
          (*carry, jnp.zeros(first_B.shape, bool)), weights, embed_VxD, head_VxD, screen, final_norm_D, prompt_cache,
          next_position_B, valid_UxP, stop_ids, rng,
          (jnp.asarray(turns.forced_BxT), *self._call_ends), **kwargs)
      t, paused = jax.device_get((carry[0], carry[7]))
      carry = carry[:7]
      if int(t) >= new_tokens or not paused.any():
        break
      turns.resume(np.asarray(jax.device_get(carry[1])), int(t), paused)
      # Every process runs the calls, as it runs the reward functions; process
      # 0's results are fed to all, so a tool that answers differently in
      # another process cannot make their programs' inputs differ.
      turns.forced_BxT = distributed.from_chief(turns.forced_BxT)
    _, tokens_BxT, logps_BxT, _, _, _, full_heads = carry
    return turns, jax.device_get((tokens_BxT, logps_BxT, full_heads))

  def take_tool_turns(self) -> list[multi_turn.RowTurns]:
    """What the tools did in each row generated since the last call, in row order.

    Tunix's RLCluster rebuilds the engine's outputs from their standard
    fields, so the learner reads this after each `generate`.
    """
    turns, self._tool_turns = self._tool_turns, []
    return turns

  @property
  def uses_tools(self) -> bool:
    return self._tool_runner is not None

  def settings(self, rollout_config: base_rollout.RolloutConfig,
               with_logps: bool) -> tuple[Sampling, bool, int]:
    """(sampling rule, whether decode returns log-probs, screen width; 0 = unscreened)."""
    greedy = not rollout_config.temperature or rollout_config.top_p is None
    sampling = Sampling(greedy=greedy, temperature=float(rollout_config.temperature or 1.0),
                        top_k=None if greedy else (rollout_config.top_k or None),
                        top_p=1.0 if greedy else float(rollout_config.top_p))
    vocab = self._model.embedder.input_embedding.value.shape[0]
    # Log-probs need every logit: no screen then.
    width = 0 if with_logps or not self._screen else screen_width(sampling, vocab)
    return sampling, bool(with_logps), width

  def prefill_call(self, prompt_ids_UxP, rng, *, rows_per_prompt: int, sampling: Sampling,
                   screen_width: int):
    """(the jitted prefill, its arguments, its keywords) for the distinct prompts."""
    graphdef, state = nnx.split(self._model)
    return _prefill, (graphdef, state, prompt_ids_UxP, rng), dict(
        lora_scale=self._lora_scale, rows_per_prompt=rows_per_prompt, pad_id=self.pad_id(),
        sampling=sampling, decode_dtype=self._decode_dtype, screened=bool(screen_width))

  def decode_call(self, prefilled, stop_ids, rng, *, new_tokens: int, sampling: Sampling,
                  with_logps: bool, screen_width: int):
    """(the jitted decode loop, its arguments, its keywords), fed what the prefill returned."""
    (weights, head_VxD, screen, first_B, first_logp_B, prompt_cache, next_position_B,
     valid_UxP) = prefilled
    embed_VxD = self._model.embedder.input_embedding.value
    return _decode, (
        weights, embed_VxD, embed_VxD if head_VxD is None else head_VxD, screen,
        self._model.final_norm.scale.value, first_B, first_logp_B, prompt_cache,
        next_position_B, valid_UxP, stop_ids, rng), dict(
            shapes=self._shapes, new_tokens=new_tokens, sampling=sampling,
            with_logps=with_logps, screen_width=screen_width)

  def get_per_token_logps(self, prompt_tokens, completion_tokens):
    from tunix.rl import common  # pylint: disable=g-import-not-at-top

    graphdef, state = nnx.split(self._model)
    return common.compute_per_token_logps(
        graphdef, state, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
        pad_id=self.pad_id(), eos_id=self.eos_id(), stop_gradient=True, return_logits=False)

  def update_params(self, params, filter_types=None) -> None:
    # The engine reads the actor's live state at every generate(); this only
    # matters when the cluster hands it weights held elsewhere.
    nnx.update(self._model, params)

  def pad_id(self) -> int:
    return self._tokenizer.pad_id()

  def eos_id(self) -> int:
    return self._tokenizer.eos_id()

  def model(self) -> Any:
    return self._model
