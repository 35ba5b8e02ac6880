"""Per-token log-probabilities of completions without full-vocabulary logits.

Gemma's vocabulary has 262,144 entries, so the LM head dominates a small
model's cost, and Tunix's log-prob path materialises float32 logits for every
position of prompt + completion. Here the LM head runs on completion positions
only, over vocabulary chunks with an online log-sum-exp, and under
differentiation the same pass accumulates what the gradient needs (the
expected embedding under the softmax), so the backward pass never returns to
the vocabulary: peak memory is one [B, C, chunk] block.

Shapes: B batch, P prompt length, C completion length, D model width,
V vocabulary, K vocabulary chunk.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from gemma_grpo.model import gemma3_rl

DEFAULT_CHUNK = 16384
# Stands in for -inf: exp() of it is 0 and, unlike -inf, its gradients stay finite.
_NEG = -1e30


def logps_and_entropy_from_hidden(
    hidden_BxCxD: jax.Array,
    embed_VxD: jax.Array,
    targets_BxC: jax.Array,
    temperature: float = 1.0,
    chunk: int = DEFAULT_CHUNK,
    matmul_dtype: str | None = None,
) -> tuple[jax.Array, jax.Array]:
  """log p(target) and the entropy of softmax(hidden @ embed.T / temperature).

  Differentiable. The usual gradient, of the log-probs with respect to the
  hidden states alone (the LM head frozen, the entropy a diagnostic), is
    d log p(t) / d hidden = (embed[t] - sum_k p_k embed[k]) / temperature,
  and the expected embedding sum_k p_k embed[k] is accumulated in the forward
  pass, chunk by chunk like the normaliser: one [B, C, K] x [K, D] product per
  chunk, and no backward pass over the vocabulary at all, where autodiff
  would recompute every chunk's logits and then multiply by the embedding
  again (three vocabulary-sized products instead of two). Gradients through
  the entropy or into the embedding take that autodiff path.

  With `matmul_dtype` ("bfloat16"), both vocabulary-sized products multiply
  operands cast to it, accumulating in float32 (gemma3_rl.Gemma3.matmul_dtype).
  """
  chunk = min(chunk, embed_VxD.shape[0])
  return _logps_and_entropy(hidden_BxCxD, embed_VxD, targets_BxC, float(temperature), chunk,
                            matmul_dtype)


def _chunked(embed_VxD, chunk: int):
  """The embedding as [N, K, D] chunks (zero-padded) and each chunk's row ids."""
  vocab = embed_VxD.shape[0]
  num_chunks = -(-vocab // chunk)
  padded = num_chunks * chunk
  embed_NxKxD = jnp.pad(embed_VxD, ((0, padded - vocab), (0, 0))).reshape(num_chunks, chunk, -1)
  return embed_NxKxD, jnp.arange(padded).reshape(num_chunks, chunk)


def _scan_vocabulary(hidden_BxCxD, embed_VxD, targets_BxC, temperature, chunk,
                     matmul_dtype, expected_embedding: bool):
  """Online log-sum-exp over vocabulary chunks; optionally sum_k p_k embed[k] too."""
  vocab = embed_VxD.shape[0]
  embed_NxKxD, rows_NxK = _chunked(embed_VxD, chunk)

  # Under autodiff, recomputing a chunk's logits in the backward pass keeps
  # one [B, C, K] block alive instead of all of them.
  @functools.partial(jax.checkpoint, prevent_cse=False)
  def body(carry, xs):
    run_max, run_sum, run_dot, run_target, run_embed = carry
    embed_KxD, rows_K = xs
    logits_BxCxK = _chunk_logits(hidden_BxCxD, embed_KxD, rows_K < vocab, temperature,
                                 matmul_dtype)
    c_max = logits_BxCxK.max(axis=-1)
    weights_BxCxK = jnp.exp(logits_BxCxK - c_max[..., None])
    new_max = jnp.maximum(run_max, c_max)
    old_scale, new_scale = jnp.exp(run_max - new_max), jnp.exp(c_max - new_max)
    if expected_embedding:
      c_embed = jnp.einsum("bck,kd->bcd", gemma3_rl.operand(weights_BxCxK, matmul_dtype),
                           gemma3_rl.operand(embed_KxD, matmul_dtype),
                           preferred_element_type=jnp.float32)
      run_embed = run_embed * old_scale[..., None] + c_embed * new_scale[..., None]
    return (
        new_max,
        run_sum * old_scale + weights_BxCxK.sum(axis=-1) * new_scale,
        run_dot * old_scale + (weights_BxCxK * logits_BxCxK).sum(axis=-1) * new_scale,
        run_target + _picked(logits_BxCxK, targets_BxC - rows_K[0]),
        run_embed,
    ), None

  zeros_BxC = jnp.zeros(targets_BxC.shape, jnp.float32)
  run_embed = jnp.zeros(hidden_BxCxD.shape if expected_embedding else (), jnp.float32)
  init = (jnp.full(targets_BxC.shape, _NEG, jnp.float32), zeros_BxC, zeros_BxC, zeros_BxC,
          run_embed)
  (run_max, run_sum, run_dot, target_BxC, run_embed), _ = jax.lax.scan(
      body, init, (embed_NxKxD, rows_NxK))
  log_norm_BxC = run_max + jnp.log(run_sum)
  logps_BxC, entropy_BxC = target_BxC - log_norm_BxC, log_norm_BxC - run_dot / run_sum
  if expected_embedding:
    return logps_BxC, entropy_BxC, run_embed / run_sum[..., None]
  return logps_BxC, entropy_BxC


def _chunk_logits(hidden_BxCxD, embed_KxD, valid_K, temperature, matmul_dtype):
  logits_BxCxK = jnp.einsum(
      "bcd,kd->bck", gemma3_rl.operand(hidden_BxCxD, matmul_dtype),
      gemma3_rl.operand(embed_KxD, matmul_dtype),
      preferred_element_type=jnp.float32,
  ) / temperature
  return jnp.where(valid_K, logits_BxCxK, _NEG)


def _picked(logits_BxCxK, local_BxC):
  """Each row's logit at local_BxC, 0 where that falls outside this chunk."""
  size = logits_BxCxK.shape[-1]
  in_chunk_BxC = (local_BxC >= 0) & (local_BxC < size)
  picked_BxC = jnp.take_along_axis(
      logits_BxCxK, jnp.clip(local_BxC, 0, size - 1)[..., None], axis=-1)[..., 0]
  return jnp.where(in_chunk_BxC, picked_BxC, 0.0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _logps_and_entropy(hidden_BxCxD, embed_VxD, targets_BxC, temperature, chunk, matmul_dtype):
  return _scan_vocabulary(hidden_BxCxD, embed_VxD, targets_BxC, temperature, chunk,
                          matmul_dtype, False)


def _logps_and_entropy_fwd(hidden, embed, targets, temperature, chunk, matmul_dtype):
  wants_expected = hidden.perturbed
  outputs = _scan_vocabulary(hidden.value, embed.value, targets.value, temperature, chunk,
                             matmul_dtype, wants_expected)
  expected_BxCxD = outputs[2] if wants_expected else None
  # Residual pytrees keep None/() apart: the flag stays static in bwd.
  embed_flag = () if embed.perturbed else None
  return outputs[:2], (hidden.value, embed.value, targets.value, expected_BxCxD, embed_flag)


def _logps_and_entropy_bwd(temperature, chunk, matmul_dtype, residuals, cotangents):
  hidden_BxCxD, embed_VxD, targets_BxC, expected_BxCxD, embed_flag = residuals
  d_logps_BxC, d_entropy_BxC = cotangents
  zero = jax.custom_derivatives.SymbolicZero
  if isinstance(d_logps_BxC, zero) and isinstance(d_entropy_BxC, zero):
    return None, None, None
  if expected_BxCxD is None or embed_flag is not None or not isinstance(d_entropy_BxC, zero):
    # The general case, by autodiff of the same chunked scan.
    _, vjp = jax.vjp(
        lambda h, e: _scan_vocabulary(h, e, targets_BxC, temperature, chunk, matmul_dtype, False),
        hidden_BxCxD, embed_VxD)
    d_hidden, d_embed = vjp(tuple(
        jnp.zeros(targets_BxC.shape, jnp.float32) if isinstance(d, zero) else d
        for d in cotangents))
    return d_hidden, d_embed if embed_flag is not None else None, None
  target_embed_BxCxD = jnp.take(embed_VxD, targets_BxC, axis=0).astype(jnp.float32)
  d_hidden = d_logps_BxC[..., None] * (target_embed_BxCxD - expected_BxCxD) / temperature
  return d_hidden.astype(hidden_BxCxD.dtype), None, None


_logps_and_entropy.defvjp(_logps_and_entropy_fwd, _logps_and_entropy_bwd, symbolic_zeros=True)


def per_token_logps(
    model,
    prompt_ids_BxP: jax.Array,
    completion_ids_BxC: jax.Array,
    pad_id: int,
    temperature: float = 1.0,
    chunk: int = DEFAULT_CHUNK,
    group_size: int = 1,
) -> tuple[jax.Array, jax.Array]:
  """(log p(completion token), entropy) at every completion position, [B, C].

  `model` is a `gemma3_rl.Gemma3` (with or without LoRA). Prompts are left
  padded, completions right padded with `pad_id`; values at padded
  completion positions are meaningless and must be masked by the caller.

  With `group_size` G > 1, rows come in groups of G consecutive completions
  of one prompt (GRPO's layout) and each prompt is run once, not G times:
  its keys and values are computed for the B / G distinct prompts and shared
  by the group's completions, which are then run against them. Same numbers
  (up to float rounding) as the full pass, a fraction of the work when
  prompts are long; used when prompt and completion fit one sliding-attention
  window, the case in which Tunix's cached attention masks exactly like the
  full pass.
  """
  prompt_len, completion_len = prompt_ids_BxP.shape[1], completion_ids_BxC.shape[1]
  if group_size > 1 and _fits_one_window(model, prompt_len + completion_len):
    hidden_BxCxD = _shared_prompt_hidden(model, prompt_ids_BxP, completion_ids_BxC, pad_id, group_size)
  else:
    tokens_BxL = jnp.concatenate([prompt_ids_BxP, completion_ids_BxC], axis=1)
    positions_BxL, mask_BxLxL = gemma3_rl.positions_and_mask(tokens_BxL, pad_id)
    hidden_BxLxD = model.hidden_states(tokens_BxL, positions_BxL, mask_BxLxL)
    # The state after token t predicts token t + 1.
    hidden_BxCxD = hidden_BxLxD[:, prompt_len - 1:prompt_len + completion_len - 1]
  embed_VxD = model.embedder.input_embedding.get_value()
  return logps_and_entropy_from_hidden(
      hidden_BxCxD, embed_VxD, completion_ids_BxC, temperature, chunk, model.matmul_dtype
  )


def _fits_one_window(model, length: int) -> bool:
  window = model.config.sliding_window_size
  return window is None or length <= window


def _shared_prompt_hidden(model, prompt_ids_BxP, completion_ids_BxC, pad_id: int, group: int):
  """The states predicting each completion token, running each prompt once.

  Pass 1 runs the U = B / G distinct prompts with an empty KV cache; the cache
  is then repeated G times and pass 2 runs the completions against it.
  """
  prompt_len = prompt_ids_BxP.shape[1]
  completion_len = completion_ids_BxC.shape[1]
  length = prompt_len + completion_len
  prompt_ids_UxP = prompt_ids_BxP[::group]
  valid_UxP = prompt_ids_UxP != pad_id
  positions_UxP = jnp.maximum(jnp.cumsum(valid_UxP, axis=-1) - 1, 0)
  causal_PxL = jnp.arange(length)[None, :] <= jnp.arange(prompt_len)[:, None]
  mask_UxPxL = causal_PxL[None] & jnp.pad(valid_UxP, ((0, 0), (0, completion_len)))[:, None, :]
  cache = model.empty_cache(len(prompt_ids_UxP), length)
  hidden_UxPxD, cache = model(prompt_ids_UxP, positions_UxP, cache, mask_UxPxL, return_hidden=True)
  cache = jax.tree.map(lambda x: jnp.repeat(x, group, axis=0), cache)

  prompt_valid_BxP = jnp.repeat(valid_UxP, group, axis=0)
  completion_valid_BxC = completion_ids_BxC != pad_id
  positions_BxC = (prompt_valid_BxP.sum(axis=-1, keepdims=True)
                   + jnp.cumsum(completion_valid_BxC, axis=-1) - 1)
  keys_valid_BxL = jnp.concatenate([prompt_valid_BxP, completion_valid_BxC], axis=1)
  causal_CxL = jnp.arange(length)[None, :] <= prompt_len + jnp.arange(completion_len)[:, None]
  mask_BxCxL = causal_CxL[None] & keys_valid_BxL[:, None, :]
  hidden_BxCxD, _ = model(completion_ids_BxC, jnp.maximum(positions_BxC, 0), cache,
                          mask_BxCxL, return_hidden=True)
  last_prompt_BxD = jnp.repeat(hidden_UxPxD[:, -1], group, axis=0)
  return jnp.concatenate([last_prompt_BxD[:, None], hidden_BxCxD[:, :-1]], axis=1)
