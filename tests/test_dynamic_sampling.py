"""Tests for gemma_grpo.rl.learner.dynamic_sampling: DAPO's group selection and refills."""

import numpy as np
import pytest

from gemma_grpo.rl.learner import dynamic_sampling
from gemma_grpo.tasks import data
from gemma_grpo.tasks import prompts

FLAT = [1.0, 1.0]    # a group whose rewards are all equal (zero std)
SPREAD = [0.0, 1.0]  # a group with a reward spread


def test_has_signal():
  np.testing.assert_array_equal(
      dynamic_sampling.has_signal([FLAT, SPREAD, [0.0, 0.0], [-1.0, -1.5]]),
      [False, True, False, True])


def test_select_groups_keeps_informative_groups_without_refilling_when_full():
  calls = []
  sel = dynamic_sampling.select_groups([SPREAD, SPREAD], lambda r: calls.append(r), 2, 3)
  assert sel.picks == ((0, 0), (0, 1))
  assert calls == [] and sel.extra_rounds == 0 and sel.padded == 0


def test_select_groups_refills_from_extra_rounds_and_drops_flat_groups():
  refills = {1: [FLAT, SPREAD, FLAT], 2: [SPREAD, SPREAD, FLAT]}
  calls = []

  def roll_more(round_):
    calls.append(round_)
    return refills[round_]

  sel = dynamic_sampling.select_groups([SPREAD, FLAT, FLAT], roll_more, 3, 5)
  assert calls == [1, 2]  # stopped as soon as 3 informative groups were in
  assert sel.picks == ((0, 0), (1, 1), (2, 0))  # only groups with a spread
  assert sel.extra_rounds == 2
  assert sel.padded == 0
  assert sel.dropped == 5  # every flat group rolled out
  assert sel.surplus == 1  # (2, 1) had a spread but the batch was full
  assert (sel.zero_std, sel.rolled_out) == (5, 9)


def test_select_groups_stops_at_its_bound_and_pads_with_flat_groups():
  calls = []

  def roll_more(round_):
    calls.append(round_)
    return [FLAT, FLAT]

  sel = dynamic_sampling.select_groups([FLAT, SPREAD], roll_more, 2, 2)
  assert calls == [1, 2]  # max_extra_rounds = 2
  assert sel.picks == ((0, 0), (0, 1))  # the batch's own flat group fills the gap
  assert (sel.extra_rounds, sel.padded, sel.dropped) == (2, 1, 4)


def test_select_groups_without_refills_keeps_the_batch():
  sel = dynamic_sampling.select_groups([FLAT, SPREAD], None, 2, 3)
  assert sel.picks == ((0, 0), (0, 1)) and sel.extra_rounds == 0 and sel.padded == 1


def test_the_rows_of_a_selection_are_each_picked_groups_completions():
  sel = dynamic_sampling.Selection(picks=((0, 1), (2, 0)), extra_rounds=2, dropped=0,
                                   padded=0, surplus=0, zero_std=0, rolled_out=6)
  assert sel.rows(3) == [(0, 3), (0, 4), (0, 5), (2, 0), (2, 1), (2, 2)]


PROBLEMS = [data.Problem(f"What is {i} + 1?", str(i + 1), "") for i in range(10)]


def test_refill_batch_is_deterministic_per_step_call_and_round():
  kwargs = dict(num_groups=3, num_generations=2, seed=7, step=4, call=0,
                columns={"prompts": [], "answer": [], "trajectory_ids": []})
  first = dynamic_sampling.refill_batch(PROBLEMS, round_=1, **kwargs)
  again = dynamic_sampling.refill_batch(PROBLEMS, round_=1, **kwargs)
  other = dynamic_sampling.refill_batch(PROBLEMS, round_=2, **kwargs)
  assert first["prompts"] == again["prompts"]
  assert first["prompts"] != other["prompts"]
  assert len(first["prompts"]) == 6 and first["prompts"][0] == first["prompts"][1]
  gold = {prompts.render_prompt(p.question): p.answer for p in PROBLEMS}
  assert all(gold[q] == a for q, a in zip(first["prompts"], first["answer"]))
  assert set(first) == {"prompts", "answer", "trajectory_ids"}


def test_refill_batch_needs_every_training_column():
  with pytest.raises(ValueError, match="difficulty"):
    dynamic_sampling.refill_batch(PROBLEMS, num_groups=1, num_generations=2, seed=0, step=0,
                                  call=0, round_=1, columns={"prompts": [], "difficulty": []})
