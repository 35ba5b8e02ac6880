"""Choosing tokens from logits, as Tunix's sampler does, and the one top-k.

Temperature, then top-k, then top-p over the sorted top-k; greedy when
temperature is 0 or top_p is None (GroupedRollout.settings). `top_k` is
`jax.lax.top_k` computed through vocabulary blocks, because XLA:CPU's top_k
over a whole 262,144-entry vocabulary is slow; the LM head's screen
(lm_head_screen.py) ranks its candidates with the same `block_top_k`.

Shapes: B rows, V vocabulary, K kept entries, N vocabulary blocks, C = BLOCK.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

BLOCK = 64  # vocabulary entries per block of block_top_k


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
  return draw_from_top(top_logits_BxK, top_ids_BxK, key, sampling)


def sample_keys(rng, samples: int):
  """Sample n's key, fold_in(rng, n): continuous batching draws each sample's
  token t with fold_in(its key, t), so a completion never depends on the slot
  it ran in or on when it started (continuous.decode_slots)."""
  return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(rng, jnp.arange(samples))


def sample_rows(logits_BxV, keys_B, sampling: Sampling):
  """`sample_tokens` with a key per row: row b's token depends only on its
  logits and keys_B[b], not on the other rows or on its place among them."""
  if sampling.greedy:
    return sample_tokens(logits_BxV, None, sampling)
  return jax.vmap(lambda logits_V, key: sample_tokens(logits_V[None], key, sampling)[0])(
      logits_BxV, keys_B)


def draw_rows(top_logits_BxK, top_ids_BxK, keys_B, sampling: Sampling):
  """`draw_from_top` with a key per row, as `sample_rows`."""
  return jax.vmap(lambda top_K, ids_K, key: draw_from_top(top_K[None], ids_K[None], key,
                                                          sampling)[0])(
      top_logits_BxK, top_ids_BxK, keys_B)


def draw_from_top(top_logits_BxK, top_ids_BxK, key, sampling: Sampling):
  """Top-p over the sorted top-k logits (already divided by the temperature), then a draw."""
  probs_BxK = jax.nn.softmax(top_logits_BxK, axis=-1)
  beyond_p_BxK = jnp.cumsum(probs_BxK, axis=-1) - probs_BxK > sampling.top_p
  top_logits_BxK = jnp.where(beyond_p_BxK, -jnp.inf, top_logits_BxK)
  pick_B = jax.random.categorical(key, top_logits_BxK)
  return jnp.take_along_axis(top_ids_BxK, pick_B[:, None], axis=-1)[:, 0].astype(jnp.int32)


def token_logps(logits_BxV, token_B, sampling: Sampling):
  """log p(token) under softmax(logits / temperature): the trainer's log-prob (no top-k/top-p)."""
  # logsumexp, not log_softmax: no [B, V] array is written for one entry a row.
  scaled_BxV = logits_BxV.astype(jnp.float32) / sampling.temperature
  picked_B = jnp.take_along_axis(scaled_BxV, token_B[:, None], axis=-1)[:, 0]
  return picked_B - jax.nn.logsumexp(scaled_BxV, axis=-1)


def top_k(x_BxV, k: int):
  """`jax.lax.top_k(x_BxV, k)`, ties and order included, through vocabulary blocks.

  Where the vocabulary is not whole blocks, or has fewer than 4k of them
  (too few for the blocks to pay), plain top_k.
  """
  _, vocab = x_BxV.shape
  if vocab % BLOCK or vocab // BLOCK < 4 * k:
    return jax.lax.top_k(x_BxV, k)
  top_BxK, ids_BxK, _ = block_top_k(x_BxV, k, in_id_order=True)
  return top_BxK, ids_BxK


def block_top_k(x_BxV, k: int, *, in_id_order: bool):
  """The k largest entries of each row, their ids and the k largest block maxima.

  The k best blocks by their maxima hold the k best entries: each such
  block's maximum is at least the k-th best entry, and at most k blocks can
  hold one. So the best k of those blocks' entries are the row's, sorted
  largest first; every entry outside those blocks is at most the k-th block
  maximum. Ties between block maxima go to the lower block; with
  `in_id_order` the kept blocks are read in vocabulary order, so ties
  between entries go to the lower id, as jax.lax.top_k's do (without it,
  to the block with the larger maximum). Needs whole blocks, at least k.
  """
  batch, vocab = x_BxV.shape
  blocks_BxNxC = x_BxV.reshape(batch, vocab // BLOCK, BLOCK)
  block_max_BxK, block_BxK = jax.lax.top_k(blocks_BxNxC.max(axis=-1), k)
  if in_id_order:
    block_BxK = jnp.sort(block_BxK, axis=-1)
  kept_BxKC = jnp.take_along_axis(blocks_BxNxC, block_BxK[..., None], axis=1).reshape(batch, -1)
  top_BxK, at_BxK = jax.lax.top_k(kept_BxKC, k)
  ids_BxK = (jnp.take_along_axis(block_BxK, at_BxK // BLOCK, axis=-1) * BLOCK
             + at_BxK % BLOCK)
  return top_BxK, ids_BxK, block_max_BxK
