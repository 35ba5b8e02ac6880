"""Who takes which slot and prompt slot (rl/engine/continuous.start_samples), on small integer arrays.

The decode loop's own tests (test_rollout.py, continuous batching) check the
tokens; here each prompt's keys are its index, so a copy shows where it went.
"""

import jax.numpy as jnp
import numpy as np

from gemma_grpo.rl.engine import continuous

SLOTS, LANES = 4, 2
PROMPTS = 5  # 10 samples, two per prompt, every one live
QUEUE = continuous.Queue(
    sample_K=jnp.arange(PROMPTS * LANES), live=jnp.int32(PROMPTS * LANES), offset=0, lanes=LANES,
    prompt_cache=(jnp.arange(PROMPTS, dtype=jnp.float32).reshape(1, PROMPTS, 1, 1, 1),
                  jnp.arange(PROMPTS, dtype=jnp.float32).reshape(1, PROMPTS, 1, 1, 1)),
    valid_UxP=jnp.ones((PROMPTS, 1), bool), first_state_N=None)
IDLE = PROMPTS * LANES


def empty() -> continuous.Seats:
  q = 3  # prompt slots: one fewer than the engine gives 4 slots of groups of 2, to fill them
  return continuous.Seats(
      jnp.full(SLOTS, IDLE), jnp.ones(SLOTS, jnp.int32), jnp.zeros(SLOTS, jnp.int32),
      jnp.zeros(SLOTS, jnp.int32), None, jnp.int32(0), jnp.int32(-1), jnp.int32(0),
      (jnp.full((1, q, 1, 1, 1), -1.0), jnp.full((1, q, 1, 1, 1), -1.0),
       jnp.zeros((q, 1), bool)))


def end(seats: continuous.Seats, *samples: int) -> continuous.Seats:
  sample_S = np.asarray(seats.sample_S).copy()
  sample_S[np.isin(sample_S, samples)] = IDLE
  return continuous.Seats(jnp.asarray(sample_S), *[getattr(seats, f) for f in (
      "t_S", "prompt_slot_S", "lane_S", "text_state_S", "next_pending", "head_prompt",
      "head_slot", "prompts")])


def held(seats: continuous.Seats) -> list[int]:
  """The prompt each prompt slot holds (-1: none yet)."""
  return np.asarray(seats.prompts[0]).reshape(-1).astype(int).tolist()


def test_a_sample_waits_for_a_free_prompt_slot_then_takes_the_first_one_freed():
  seats, started = continuous.start_samples(empty(), QUEUE)
  assert np.asarray(seats.sample_S).tolist() == [0, 1, 2, 3] and int(started) == 4
  assert np.asarray(seats.prompt_slot_S).tolist() == [0, 0, 1, 1]
  assert np.asarray(seats.lane_S).tolist() == [0, 1, 0, 1]
  assert held(seats) == [0, 1, -1]
  # Samples 0 and 2 end; 1 and 3 hold prompts 0 and 1: prompt 2 takes the last prompt slot.
  seats, started = continuous.start_samples(end(seats, 0, 2), QUEUE)
  assert np.asarray(seats.sample_S).tolist() == [4, 1, 5, 3] and int(started) == 2
  assert np.asarray(seats.prompt_slot_S).tolist() == [2, 0, 2, 1] and held(seats) == [0, 1, 2]
  # Sample 4 ends: sample 6 (prompt 3) finds no free prompt slot and waits; its slot idles.
  seats, started = continuous.start_samples(end(seats, 4), QUEUE)
  assert np.asarray(seats.sample_S).tolist() == [IDLE, 1, 5, 3] and int(started) == 0
  assert int(seats.next_pending) == 6
  # Sample 1 ends, prompt 0 leaves its prompt slot: prompt 3 takes it, both its samples start.
  seats, started = continuous.start_samples(end(seats, 1), QUEUE)
  assert np.asarray(seats.sample_S).tolist() == [6, 7, 5, 3] and int(started) == 2
  assert np.asarray(seats.prompt_slot_S).tolist() == [0, 0, 2, 1]
  assert np.asarray(seats.lane_S).tolist() == [0, 1, 1, 1] and held(seats) == [3, 1, 2]


def test_a_prompt_keeps_its_prompt_slot_while_its_samples_wait():
  # Prompt 2 (prompt slot 0) started its first sample, which has ended; its
  # second waits, as do prompt 3's two. Prompt slot 0 then holds no sample,
  # but prompt 3 must take the other free one (2), not prompt 2's.
  seats = empty()
  seats = continuous.Seats(
      jnp.array([IDLE, IDLE, 3, IDLE]), seats.t_S, jnp.array([0, 0, 1, 0]), jnp.array([0, 0, 1, 0]),
      None, jnp.int32(5), jnp.int32(2), jnp.int32(0),
      (jnp.array([2.0, 1.0, -1.0]).reshape(1, 3, 1, 1, 1),) * 2 + (jnp.ones((3, 1), bool),))
  seats, started = continuous.start_samples(seats, QUEUE)
  assert np.asarray(seats.sample_S).tolist() == [5, 6, 3, 7] and int(started) == 3
  assert np.asarray(seats.prompt_slot_S).tolist() == [0, 2, 1, 2] and held(seats) == [2, 1, 3]


def test_prompt_slots_hold_the_slots_whole_groups_and_two_more():
  assert [continuous.prompt_slots(s, 8) for s in (4, 8, 16)] == [3, 3, 4]
  assert continuous.prompt_slots(3, 1) == 5
