"""Continuous batching: the grouped engine's decode loop with a fixed number of busy rows.

The lockstep loop (lockstep.decode) decodes every completion of a call until
the longest ends, so rows that ended early idle. Here (rollout.slots > 0) a
fixed number of rows, slots, each hold one sample; when a sample ends its
slot takes the next waiting one in the same step. Rows sit at their own
completion slot and position, and every sample draws with its own key.

Prompts sit in prompt slots, as lockstep keeps them: one copy of a prompt's
keys and values, read once a step by all the rows that continue it, each in
its own lane (its index within its group, as lockstep's row within its
prompt). A slot's sample may only start once its prompt holds a prompt slot:
there are two more prompt slots than the slots need for whole groups
(prompt_slots), and a group's prompt takes a free one when its first sample
starts and leaves it when its last sample ends. While none is free, the
next sample waits and a slot idles.

With `carried` (rollout.max_staleness > 0, carry_over.py), the slots outlive
a call: the call starts with the samples the last one left in its slots, at
their own completion slots, with their own caches, prompt slots and keys,
and stops as soon as a slot would idle with no sample waiting, leaving its
unfinished samples in the slots for the next call, except the samples
marked `finish_S` (carried) or `finish_new_N` (new), which it decodes to
their end. Between calls the adapters
may change: a carried sample's later tokens come from the newer policy (its
log-probs say which).

Shapes: N samples, S slots, Q prompt slots, U distinct prompts, P prompt
width, T new tokens, L layers, K key/value heads, H head width, D model
width, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from gemma_grpo.rl.engine import decode_dots
from gemma_grpo.rl.engine import decode_layers
from gemma_grpo.rl.engine import lm_head_screen
from gemma_grpo.rl.engine import sampling as sampling_lib
from gemma_grpo.rl.engine import stop_text as stop_text_lib


def prompt_slots(slots: int, rows_per_prompt: int) -> int:
  """Prompt slots for `slots` rows: one per group the rows can hold, and two
  more, so the next groups can start while earlier groups' longest samples
  run. One more made 8 slots busy 68% of the time running ahead on
  long-tailed completions, two 87%, three 87% at a dearer step
  (docs/results/continuous_batching/prompt_slots.txt)."""
  return -(-slots // rows_per_prompt) + 2


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
  prompt_slot_S: jax.Array  # the prompt slot holding its prompt
  lane_S: jax.Array  # its lane there
  prompt_keys_LxQxKxHxP: jax.Array  # each prompt slot's prompt keys, values and valid mask
  prompt_values_LxQxKxPxH: jax.Array
  valid_QxP: jax.Array


def _empty_prompt_slots(prompt_cache, count: int) -> tuple:
  """`count` prompt slots' keys [L, Q, K, H, P], values [L, Q, K, P, H] and
  valid mask [Q, P], zeroed, shaped like the prefill's prompt cache."""
  layers, _, kv_heads, head_dim, width = prompt_cache[0].shape
  dtype = prompt_cache[0].dtype
  return (jnp.zeros((layers, count, kv_heads, head_dim, width), dtype),
          jnp.zeros((layers, count, kv_heads, width, head_dim), dtype),
          jnp.zeros((count, width), bool))


def empty_slots(prompt_cache, *, slots: int, rows_per_prompt: int, new_tokens: int,
                with_logps: bool) -> SlotState:
  """A SlotState of `slots` idle slots, shaped for a call with this prefill's outputs."""
  keys, values = decode_layers.completion_cache(prompt_cache, slots, new_tokens)
  zeros = jnp.zeros(slots, jnp.int32)
  return SlotState(
      jnp.zeros((slots, new_tokens), jnp.int32),
      jnp.zeros((slots, new_tokens if with_logps else 1), jnp.float32), zeros, zeros,
      sampling_lib.sample_keys(jax.random.PRNGKey(0), slots), zeros, jnp.zeros(slots, bool),
      keys, values, zeros, zeros,
      *_empty_prompt_slots(prompt_cache, prompt_slots(slots, rows_per_prompt)))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Seats:
  """Who sits where: each slot's sample, and each prompt slot's prompt (the loop's bookkeeping)."""

  sample_S: jax.Array  # the sample slot s holds (N where idle)
  t_S: jax.Array  # the completion slot its next token fills
  prompt_slot_S: jax.Array
  lane_S: jax.Array
  text_state_S: jax.Array | None
  next_pending: jax.Array  # queue position of the next sample to start
  head_prompt: jax.Array  # the prompt of the last sample started (-1: none yet this call)
  head_slot: jax.Array  # and its prompt slot
  prompts: tuple  # the prompt slots' keys [L, Q, K, H, P], values [L, Q, K, P, H], valid [Q, P]


class Queue(NamedTuple):
  """A call's samples in the order they start, and where their prompts come from."""

  sample_K: jax.Array  # the samples that take slots, first (index order), then the others
  live: jax.Array  # how many of them take slots
  offset: int  # sample n >= offset is the call's new sample n - offset (carried ones below)
  lanes: int  # rows_per_prompt: new sample n's prompt is (n - offset) // lanes
  prompt_cache: tuple  # the prefill's prompt keys [L, U, K, H, P], values [L, U, K, P, H]
  valid_UxP: jax.Array
  first_state_N: jax.Array | None  # each sample's stop-text state after its first token


def start_samples(seats: Seats, queue: Queue) -> tuple[Seats, jax.Array]:
  """Idle slots, in slot order, take the next pending samples in queue
  order, as long as each one's prompt holds a prompt slot or gets a free
  one; (the seats after, how many samples started)."""
  samples = queue.sample_K.shape[0]
  num_prompt_slots = seats.prompts[2].shape[0]

  def queued(k):  # the sample at queue position k (clipped)
    return queue.sample_K[jnp.clip(k, 0, samples - 1)]

  def prompt_of(n):  # a new sample's prompt (index into the prefill's) and lane
    new = jnp.maximum(jnp.minimum(n, samples - 1) - queue.offset, 0)
    return new // queue.lanes, new % queue.lanes

  idle_S = seats.sample_S >= samples
  rank_S = jnp.cumsum(idle_S) - 1
  k_S = seats.next_pending + rank_S  # the queue position each idle slot would take
  wants_S = idle_S & (k_S < queue.live)
  sample_S = queued(k_S)
  prompt_S, lane_S = prompt_of(sample_S)
  before_S = jnp.where(rank_S == 0, seats.head_prompt, prompt_of(queued(k_S - 1))[0])
  new_prompt_S = wants_S & (prompt_S != before_S)
  nth_new_S = jnp.cumsum(new_prompt_S) - 1  # which free prompt slot a new prompt takes
  busy_Q = jnp.zeros(num_prompt_slots, jnp.int32).at[seats.prompt_slot_S].add(
      (~idle_S).astype(jnp.int32)) > 0
  # The last started prompt keeps its prompt slot while its samples wait.
  head_waits = ((seats.next_pending < queue.live)
                & (prompt_of(queued(seats.next_pending))[0] == seats.head_prompt))
  busy_Q |= head_waits & (jnp.arange(num_prompt_slots) == seats.head_slot)
  free_Q = jnp.argsort(busy_Q, stable=True)  # free prompt slots first
  blocked_S = jnp.cumsum(new_prompt_S & (nth_new_S >= jnp.sum(~busy_Q))) > 0
  take_S = wants_S & ~blocked_S
  to_S = jnp.where(nth_new_S < 0, seats.head_slot,
                   free_Q[jnp.clip(nth_new_S, 0, num_prompt_slots - 1)])
  taken = jnp.sum(take_S)
  last = jnp.argmax(jnp.where(take_S, k_S, -1))  # the slot that took the last one
  text_state_S = seats.text_state_S
  if text_state_S is not None:
    text_state_S = jnp.where(take_S, queue.first_state_N[sample_S], text_state_S)
  # Prompt slots given a new prompt copy its keys and values in from the prefill's.
  given_S = take_S & new_prompt_S
  prompt_Q = jnp.full(num_prompt_slots, -1).at[jnp.where(given_S, to_S, num_prompt_slots)].set(
      prompt_S, mode="drop")

  def copy_prompts(held):
    (keys_LxQxKxHxP, values_LxQxKxPxH, valid_QxP), (keys_LxUxKxHxP, values_LxUxKxPxH) = (
        held, queue.prompt_cache)
    given_Q, source_Q = prompt_Q >= 0, jnp.maximum(prompt_Q, 0)
    by_slot = given_Q[None, :, None, None, None]
    return (jnp.where(by_slot, keys_LxUxKxHxP[:, source_Q], keys_LxQxKxHxP),
            jnp.where(by_slot, values_LxUxKxPxH[:, source_Q], values_LxQxKxPxH),
            jnp.where(given_Q[:, None], queue.valid_UxP[source_Q], valid_QxP))

  return Seats(
      jnp.where(take_S, sample_S, seats.sample_S), jnp.where(take_S, 1, seats.t_S),
      jnp.where(take_S, to_S, seats.prompt_slot_S), jnp.where(take_S, lane_S, seats.lane_S),
      text_state_S, seats.next_pending + taken,
      jnp.where(taken > 0, prompt_S[last], seats.head_prompt),
      jnp.where(taken > 0, to_S[last], seats.head_slot),
      jax.lax.cond(jnp.any(given_S), copy_prompts, lambda held: held, seats.prompts)), taken


@functools.partial(jax.jit, static_argnames=("shapes", "new_tokens", "sampling", "with_logps",
                                             "screen_width", "slots", "rows_per_prompt"))
def decode_slots(weights, embed_VxD, head_VxD, screen, final_norm_D, first_N, first_logp_N,
                 prompt_cache, next_position_N, valid_UxP, stop_ids, next_state_SxV, rng,
                 carried=None, finish_S=None, admit_N=None, finish_new_N=None, *, shapes,
                 new_tokens,
                 sampling, with_logps, screen_width, slots, rows_per_prompt):
  """lockstep.decode's tokens for N samples, decoded in `slots` rows.

  Each slot holds one sample at a time at its own completion slot t_S; when
  a sample stops (a stop token, its stop text, or slot new_tokens - 1), its slot takes the
  next pending sample in the same step, if its prompt has a prompt slot or
  one is free (samples whose prefill token already ended them never take a
  slot). Samples are taken in index order; they finish out of order. Sample
  n (of prompt n // rows_per_prompt, in lane n % rows_per_prompt) draws
  token t with fold_in(fold_in(rng, n), t) (sampling.sample_keys), from its
  own logits only: its tokens and log-probs do not depend on its slot, its
  prompt slot or when it started.

  With `carried` (a SlotState) the samples are indexed [0, S) for the
  carried slots' and S + n for new sample n; only the new ones whose
  `admit_N` is set take slots, after the carried ones; and the loop stops
  once a slot idles with no sample waiting and every carried sample marked
  in `finish_S`, and every new one marked in `finish_new_N`, has ended.

  Returns ([N, T] tokens, zeros after a stop; [N, T] or [N, 1] log-probs;
  unproved screen steps; decode steps run; samples started after the first
  step); with `carried` the tokens and log-probs span [S + N] samples,
  followed by each slot's sample (S + N where idle) and the SlotState to
  carry on.
  """
  lanes = rows_per_prompt
  num_prompt_slots = prompt_slots(slots, lanes)
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
    finish_N = jnp.concatenate([
        finish_S & carried.live_S,
        jnp.zeros(first_N.shape[0], bool) if finish_new_N is None else finish_new_N & live_N[slots:]])
  samples = live_N.shape[0]
  queue_N = jnp.argsort(~live_N, stable=True)  # live samples first, in index order
  num_live = jnp.sum(live_N)
  slot_S = jnp.arange(slots)

  def states_of(sample_S):
    return None if first_state_N is None else first_state_N[jnp.minimum(sample_S, samples - 1)]

  zero = jnp.int32(0)
  if carried is None:
    keys_LxSxKxHxT, values_LxSxKxTxH = decode_layers.completion_cache(prompt_cache, slots,
                                                                      new_tokens)
    seats = Seats(
        jnp.full(slots, samples), jnp.ones(slots, jnp.int32), jnp.zeros(slots, jnp.int32),
        jnp.zeros(slots, jnp.int32), None, zero, jnp.int32(-1), zero,
        _empty_prompt_slots(prompt_cache, num_prompt_slots))
  else:
    keys_LxSxKxHxT, values_LxSxKxTxH = carried.keys_LxSxKxHxT, carried.values_LxSxKxTxH
    seats = Seats(
        jnp.where(carried.live_S, slot_S, samples), jnp.where(carried.live_S, carried.t_S, 1),
        carried.prompt_slot_S, carried.lane_S, None, zero, jnp.int32(-1), zero,
        (carried.prompt_keys_LxQxKxHxP, carried.prompt_values_LxQxKxPxH, carried.valid_QxP))
  seats = dataclasses.replace(seats, text_state_S=states_of(seats.sample_S))
  queue = Queue(queue_N, num_live, offset, lanes, prompt_cache, valid_UxP, first_state_N)
  seats, _ = start_samples(seats, queue)
  carry = (tokens_NxT, logps_NxT, seats, keys_LxSxKxHxT, values_LxSxKxTxH, zero, zero, zero)

  def step(carry):
    (tokens_NxT, logps_NxT, seats, keys_LxSxKxHxT, values_LxSxKxTxH, full_heads, steps,
     refills) = carry
    sample_S, t_S = seats.sample_S, seats.t_S
    active_S = sample_S < samples
    row_S = jnp.minimum(sample_S, samples - 1)
    x_SxD = (embed_VxD[tokens_NxT[row_S, t_S - 1]]
             * jnp.sqrt(embed_VxD.shape[-1]).astype(embed_VxD.dtype))
    position_S = next_position_N[row_S] + t_S - 1
    rows = decode_layers.SlotRows(
        prompt_slot_B=seats.prompt_slot_S,
        place_B=jnp.where(active_S, seats.prompt_slot_S * lanes + seats.lane_S,
                          num_prompt_slots * lanes),
        lanes=lanes)
    for layer, (w, shape) in enumerate(zip(weights, shapes)):
      x_SxD, keys_LxSxKxHxT, values_LxSxKxTxH = decode_layers.decode_layer(
          w, shape, layer, x_SxD, position_S, t_S - 1, seats.prompts[:2], seats.prompts[2],
          keys_LxSxKxHxT, values_LxSxKxTxH, rows=rows)
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
    stopped_S = jnp.isin(token_S, stop_ids)
    text_state_S = seats.text_state_S
    if text_state_S is not None:
      text_state_S, by_text_S = stop_text_lib.step(next_state_SxV, text_state_S, token_S,
                                                   jnp.zeros_like(stopped_S))
      stopped_S |= by_text_S
    ended_S = active_S & (stopped_S | (t_S + 1 >= new_tokens))
    # Ended samples leave their slots; idle slots take the next pending ones.
    seats, started = start_samples(dataclasses.replace(
        seats, sample_S=jnp.where(ended_S, samples, sample_S),
        t_S=jnp.where(active_S & ~ended_S, t_S + 1, t_S), text_state_S=text_state_S), queue)
    return (tokens_NxT, logps_NxT, seats, keys_LxSxKxHxT, values_LxSxKxTxH, full_heads,
            steps + 1, refills + started)

  def more(carry):
    seats = carry[2]
    active_S = seats.sample_S < samples
    waiting = seats.next_pending < num_live
    if carried is None:
      return jnp.any(active_S) | waiting
    # Carrying: go on while every slot is busy or a sample waits, or a sample
    # that must finish has not.
    must_S = active_S & finish_N[jnp.minimum(seats.sample_S, samples - 1)]
    return waiting | (jnp.any(active_S) & (jnp.all(active_S) | jnp.any(must_S)))

  (tokens_NxT, logps_NxT, seats, keys_LxSxKxHxT, values_LxSxKxTxH, full_heads, steps,
   refills) = jax.lax.while_loop(more, step, carry)
  if carried is None:
    return tokens_NxT, logps_NxT, full_heads, steps, refills
  sample_S = seats.sample_S
  row_S = jnp.minimum(sample_S, samples - 1)
  left = SlotState(
      tokens_NxT[row_S], logps_NxT[row_S], seats.t_S, next_position_N[row_S], keys_N[row_S],
      (jnp.zeros(slots, jnp.int32) if seats.text_state_S is None
       else seats.text_state_S.astype(jnp.int32)),
      sample_S < samples, keys_LxSxKxHxT, values_LxSxKxTxH, seats.prompt_slot_S, seats.lane_S,
      *seats.prompts)
  return tokens_NxT, logps_NxT, full_heads, steps, refills, sample_S, left
