"""Continuous batching: the grouped engine's decode loop with a fixed number of busy rows.

The lockstep loop (lockstep.decode) decodes every completion of a call until
the longest ends, so rows that ended early idle. Here (rollout.slots > 0) a
fixed number of rows, slots, each hold one sample; when a sample ends its
slot takes the next waiting one in the same step. Rows sit at their own
completion slot and position, with their own prompt (decode_layers'
per-row attention), and every sample draws with its own key.

With `carried` (rollout.max_staleness > 0, carry_over.py), the slots outlive
a call: the call starts with the samples the last one left in its slots, at
their own completion slots, with their own caches and keys, and stops as
soon as a slot would idle, leaving its unfinished samples in the slots for
the next call, except the samples marked `finish_S`, which it decodes to
their end. Between calls the adapters may change: a carried sample's later
tokens come from the newer policy (its log-probs say which).

Shapes: N samples, S slots, U distinct prompts, P prompt width, T new tokens,
L layers, K key/value heads, H head width, D model width, V vocabulary.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from gemma_grpo.rl.engine import decode_dots
from gemma_grpo.rl.engine import decode_layers
from gemma_grpo.rl.engine import lm_head_screen
from gemma_grpo.rl.engine import sampling as sampling_lib
from gemma_grpo.rl.engine import stop_text as stop_text_lib


class SlotState(NamedTuple):
  """The samples a carrying call left in its slots (slot s holds one where live_S[s])."""

  tokens_SxT: jax.Array  # each slot's sample's tokens so far
  logps_SxT: jax.Array  # and their log-probs ([S, 1] without with_logps)
  t_S: jax.Array  # the completion slot its next token fills
  position_S: jax.Array  # its prompt's next position (next_position_N)
  key_S: jax.Array  # its sampling key (sampling.sample_keys)
  text_state_S: jax.Array  # its stop-text state (zeros without a stop text)
  live_S: jax.Array  # the slot holds an unfinished sample
  keys_LxSxKxHxT: jax.Array  # its completion's keys and values
  values_LxSxKxTxH: jax.Array
  prompt_keys_LxSxKxHxP: jax.Array  # its prompt's keys, values and valid mask
  prompt_values_LxSxKxPxH: jax.Array
  valid_SxP: jax.Array


def empty_slots(prompt_cache, valid_UxP, *, slots: int, new_tokens: int,
                with_logps: bool) -> SlotState:
  """A SlotState of `slots` idle slots, shaped for a call with this prefill's outputs."""
  keys, values = decode_layers.completion_cache(prompt_cache, slots, new_tokens)
  layers, _, kv_heads, head_dim, width = prompt_cache[0].shape
  dtype = prompt_cache[0].dtype
  zeros = jnp.zeros(slots, jnp.int32)
  return SlotState(
      jnp.zeros((slots, new_tokens), jnp.int32),
      jnp.zeros((slots, new_tokens if with_logps else 1), jnp.float32), zeros, zeros,
      sampling_lib.sample_keys(jax.random.PRNGKey(0), slots), zeros, jnp.zeros(slots, bool),
      keys, values,
      jnp.zeros((layers, slots, kv_heads, head_dim, width), dtype),
      jnp.zeros((layers, slots, kv_heads, width, head_dim), dtype),
      jnp.zeros((slots, valid_UxP.shape[1]), bool))


@functools.partial(jax.jit, static_argnames=("shapes", "new_tokens", "sampling", "with_logps",
                                             "screen_width", "slots", "rows_per_prompt"))
def decode_slots(weights, embed_VxD, head_VxD, screen, final_norm_D, first_N, first_logp_N,
                 prompt_cache, next_position_N, valid_UxP, stop_ids, next_state_SxV, rng,
                 carried=None, finish_S=None, admit_N=None, *, shapes, new_tokens,
                 sampling, with_logps, screen_width, slots, rows_per_prompt):
  """lockstep.decode's tokens for N samples, decoded in `slots` rows.

  Each slot holds one sample at a time at its own completion slot t_S; when
  a sample stops (a stop token, its stop text, or slot new_tokens - 1), its slot takes the
  next pending sample in the same step, so no slot idles while samples wait.
  Samples are taken in index order (samples whose prefill token already
  ended them never take a slot); they finish out of order. Sample n (of
  prompt n // rows_per_prompt) draws token t with fold_in(fold_in(rng, n),
  t) (sampling.sample_keys), from its own logits only: its tokens and
  log-probs do not depend on its slot or on when it started.

  Each slot holds a copy of its sample's prompt keys and values, copied in
  when it takes the sample (steps with refills only), so a step reads each
  row's prompt once instead of gathering it again. Either way every row
  reads its own prompt where lockstep's G rows share one read: the slot
  loop's main extra cost per step (docs/results/continuous_batching/prompt_reads.txt).

  With `carried` (a SlotState) the samples are indexed [0, S) for the
  carried slots' and S + n for new sample n; only the new ones whose
  `admit_N` is set take slots, after the carried ones; and the loop stops
  once a slot idles and every carried sample marked in `finish_S` has ended.

  Returns ([N, T] tokens, zeros after a stop; [N, T] or [N, 1] log-probs;
  unproved screen steps; decode steps run; slots refilled); with `carried`
  the tokens and log-probs span [S + N] samples, followed by each slot's
  sample (S + N where idle) and the SlotState to carry on.
  """
  prompt_keys_LxUxKxHxP, prompt_values_LxUxKxPxH = prompt_cache
  tokens_NxT, logps_NxT = decode_layers.first_tokens(first_N, first_logp_N, new_tokens=new_tokens,
                                                     with_logps=with_logps)
  keys_N = sampling_lib.sample_keys(rng, first_N.shape[0])
  ended_N = jnp.isin(first_N, stop_ids)
  first_state_N = None  # each sample's stop-text state after its first token
  if next_state_SxV is not None:
    first_state_N, ended_N = stop_text_lib.step(next_state_SxV, jnp.zeros_like(first_N), first_N,
                                                ended_N)
  live_N = ~ended_N & (new_tokens > 1)
  offset = 0  # index of the first new sample
  if carried is not None:
    offset = slots
    live_N = jnp.concatenate([jnp.zeros(slots, bool), live_N & admit_N])  # carried: in slots
    tokens_NxT = jnp.concatenate([carried.tokens_SxT, tokens_NxT])
    logps_NxT = jnp.concatenate([carried.logps_SxT, logps_NxT])
    keys_N = jnp.concatenate([carried.key_S, keys_N])
    next_position_N = jnp.concatenate([carried.position_S, next_position_N])
    if first_state_N is not None:
      first_state_N = jnp.concatenate([carried.text_state_S.astype(first_state_N.dtype),
                                       first_state_N])
    finish_N = jnp.concatenate([finish_S & carried.live_S,
                                jnp.zeros(first_N.shape[0], bool)])
  samples = live_N.shape[0]
  queue_N = jnp.argsort(~live_N, stable=True)  # live samples first, in index order
  num_live = jnp.sum(live_N)
  slot_S = jnp.arange(slots)

  def states_of(sample_S):
    return None if first_state_N is None else first_state_N[jnp.minimum(sample_S, samples - 1)]

  def prompts_of(sample_S):
    """Each slot's prompt keys, values and valid mask, for the new samples it holds."""
    new_S = jnp.minimum(sample_S, samples - 1)
    if offset:
      new_S = jnp.maximum(new_S - offset, 0)
    prompt_S = new_S // rows_per_prompt
    return (prompt_keys_LxUxKxHxP[:, prompt_S], prompt_values_LxUxKxPxH[:, prompt_S],
            valid_UxP[prompt_S])

  if carried is None:
    keys_LxSxKxHxT, values_LxSxKxTxH = decode_layers.completion_cache(prompt_cache, slots,
                                                                      new_tokens)
    # sample_S == samples marks an idle slot (its writes are dropped).
    sample_S = jnp.where(slot_S < num_live, queue_N[slot_S], samples)
    t_S = jnp.ones(slots, jnp.int32)  # the completion slot each sample's next token fills
    slot_prompts = prompts_of(sample_S)
    next_pending = jnp.minimum(slots, num_live)
  else:
    keys_LxSxKxHxT, values_LxSxKxTxH = carried.keys_LxSxKxHxT, carried.values_LxSxKxTxH
    idle_S = ~carried.live_S
    rank_S = jnp.cumsum(idle_S) - 1  # the k-th idle slot takes the k-th queued sample
    taken_S = jnp.where(idle_S & (rank_S < num_live),
                        queue_N[jnp.clip(rank_S, 0, samples - 1)], samples)
    sample_S = jnp.where(carried.live_S, slot_S, taken_S)
    t_S = jnp.where(carried.live_S, carried.t_S, 1)
    by_slot = carried.live_S[None, :, None, None, None]
    new_keys, new_values, new_valid = prompts_of(sample_S)
    slot_prompts = (jnp.where(by_slot, carried.prompt_keys_LxSxKxHxP, new_keys),
                    jnp.where(by_slot, carried.prompt_values_LxSxKxPxH, new_values),
                    jnp.where(carried.live_S[:, None], carried.valid_SxP, new_valid))
    next_pending = jnp.minimum(jnp.sum(idle_S), num_live)

  zero = jnp.int32(0)
  carry = (tokens_NxT, logps_NxT, sample_S, t_S, states_of(sample_S), next_pending,
           keys_LxSxKxHxT, values_LxSxKxTxH, slot_prompts, zero, zero, zero)

  def step(carry):
    (tokens_NxT, logps_NxT, sample_S, t_S, text_state_S, next_pending, keys_LxSxKxHxT,
     values_LxSxKxTxH, slot_prompts, full_heads, steps, refills) = carry
    active_S = sample_S < samples
    row_S = jnp.minimum(sample_S, samples - 1)
    x_SxD = (embed_VxD[tokens_NxT[row_S, t_S - 1]]
             * jnp.sqrt(embed_VxD.shape[-1]).astype(embed_VxD.dtype))
    position_S = next_position_N[row_S] + t_S - 1
    for layer, (w, shape) in enumerate(zip(weights, shapes)):
      x_SxD, keys_LxSxKxHxT, values_LxSxKxTxH = decode_layers.decode_layer(
          w, shape, layer, x_SxD, position_S, t_S - 1, slot_prompts[:2], slot_prompts[2],
          keys_LxSxKxHxT, values_LxSxKxTxH, per_row=True)
    normed_SxD = decode_layers.rms_norm(x_SxD, final_norm_D)
    step_keys_S = jax.vmap(jax.random.fold_in)(keys_N[row_S], t_S)
    if screen_width:
      top_SxK, ids_SxK, proved = lm_head_screen.screened_top(
          normed_SxD, head_VxD, *screen, 1 if sampling.greedy else sampling.top_k, screen_width,
          sampling.temperature, active_S)
      full_heads += 1 - proved.astype(jnp.int32)
      token_S = (ids_SxK[:, 0].astype(jnp.int32) if sampling.greedy
                 else sampling_lib.draw_rows(top_SxK, ids_SxK, step_keys_S, sampling))
    else:
      logits_SxV = decode_dots.head_logits(normed_SxD, head_VxD)
      token_S = sampling_lib.sample_rows(logits_SxV, step_keys_S, sampling)
      if with_logps:
        logps_NxT = logps_NxT.at[sample_S, t_S].set(
            sampling_lib.token_logps(logits_SxV, token_S, sampling), mode="drop")
    tokens_NxT = tokens_NxT.at[sample_S, t_S].set(token_S, mode="drop")
    # Ended samples hand their slots to the next pending ones, in slot order.
    stopped_S = jnp.isin(token_S, stop_ids)
    if text_state_S is not None:
      text_state_S, by_text_S = stop_text_lib.step(next_state_SxV, text_state_S, token_S,
                                                   jnp.zeros_like(stopped_S))
      stopped_S |= by_text_S
    ended_S = active_S & (stopped_S | (t_S + 1 >= new_tokens))
    pending_S = next_pending + jnp.cumsum(ended_S) - 1
    taken_S = jnp.where(pending_S < num_live, queue_N[jnp.minimum(pending_S, samples - 1)],
                        samples)
    refilled_S = ended_S & (taken_S < samples)
    refills += jnp.sum(refilled_S)
    sample_S = jnp.where(ended_S, taken_S, sample_S)
    t_S = jnp.where(ended_S, 1, jnp.where(active_S, t_S + 1, t_S))
    if text_state_S is not None:
      text_state_S = jnp.where(ended_S, states_of(sample_S), text_state_S)

    def copy_prompts(slot_prompts):  # the refilled slots take their new samples' prompts
      keys_LxSxKxHxP, values_LxSxKxPxH, valid_SxP = slot_prompts
      new_keys, new_values, new_valid = prompts_of(sample_S)
      by_slot = refilled_S[None, :, None, None, None]
      return (jnp.where(by_slot, new_keys, keys_LxSxKxHxP),
              jnp.where(by_slot, new_values, values_LxSxKxPxH),
              jnp.where(refilled_S[:, None], new_valid, valid_SxP))

    slot_prompts = jax.lax.cond(jnp.any(refilled_S), copy_prompts, lambda x: x, slot_prompts)
    return (tokens_NxT, logps_NxT, sample_S, t_S, text_state_S, next_pending + jnp.sum(ended_S),
            keys_LxSxKxHxT, values_LxSxKxTxH, slot_prompts, full_heads, steps + 1, refills)

  def more(carry):
    active_S = carry[2] < samples
    if carried is None:
      return jnp.any(active_S)
    # Carrying: go on while every slot is busy, or a sample that must finish has not.
    must_S = active_S & finish_N[jnp.minimum(carry[2], samples - 1)]
    return jnp.any(active_S) & (jnp.all(active_S) | jnp.any(must_S))

  (tokens_NxT, logps_NxT, sample_S, t_S, text_state_S, _, keys_LxSxKxHxT, values_LxSxKxTxH,
   slot_prompts, full_heads, steps, refills) = jax.lax.while_loop(more, step, carry)
  if carried is None:
    return tokens_NxT, logps_NxT, full_heads, steps, refills
  row_S = jnp.minimum(sample_S, samples - 1)
  left = SlotState(
      tokens_NxT[row_S], logps_NxT[row_S], t_S, next_position_N[row_S], keys_N[row_S],
      jnp.zeros(slots, jnp.int32) if text_state_S is None else text_state_S.astype(jnp.int32),
      sample_S < samples, keys_LxSxKxHxT, values_LxSxKxTxH, *slot_prompts)
  return tokens_NxT, logps_NxT, full_heads, steps, refills, sample_S, left
