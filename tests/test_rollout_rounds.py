"""Tests for gemma_grpo.rl.learner.rollout_rounds: DAPO's overlong penalty, rows, diagnostics."""

import types

import numpy as np
import pytest

from gemma_grpo.rl.engine import rollout
from gemma_grpo.rl.learner import dynamic_sampling
from gemma_grpo.rl.learner import rollout_rounds


# --- overlong penalty: L = 16 tokens, buffer B = 4, penalty 1.0 (or 0.5) ------

@pytest.mark.parametrize("length, penalty, expected", [
    (0, 1.0, 0.0),
    (11, 1.0, 0.0),     # below the buffer
    (12, 1.0, 0.0),     # L - B: the buffer starts after this
    (13, 1.0, -0.25),   # inside: -(13 - 12) / 4
    (14, 1.0, -0.5),
    (15, 1.0, -0.75),
    (16, 1.0, -1.0),    # at L: the full penalty
    (20, 1.0, -1.0),    # beyond L: stays at the full penalty
    (14, 0.5, -0.25),   # scaled by the penalty factor
    (16, 0.5, -0.5),
])
def test_overlong_penalty(length, penalty, expected):
  [value] = rollout_rounds.overlong_penalty([length], max_length=16, buffer=4, penalty=penalty)
  assert value == pytest.approx(expected)


def test_overlong_penalty_off_with_zero_buffer():
  np.testing.assert_array_equal(rollout_rounds.overlong_penalty([3, 16], 16, 0, 1.0), [0.0, 0.0])


def a_round(rewards, lengths, seconds=1.0, **fields) -> rollout_rounds.Round:
  n = len(rewards)
  return rollout_rounds.Round(
      inputs={}, prompt_ids=np.zeros((n, 2), np.int32),
      completion_ids=np.arange(n * 3).reshape(n, 3), lengths=np.array(lengths),
      truncated=np.array(lengths) >= 3, rewards=np.array(rewards, np.float64),
      fn_rewards={"answer": np.array(rewards, np.float64)}, seconds=seconds, **fields)


def test_stack_rows_takes_each_round_and_row_and_skips_absent_fields():
  rounds = [a_round([0.0, 1.0], [1, 2]), a_round([2.0, 3.0], [3, 3])]
  np.testing.assert_array_equal(
      rollout_rounds.stack_rows(rounds, [(1, 0), (0, 1)], "completion_ids"),
      [[0, 1, 2], [3, 4, 5]])
  np.testing.assert_array_equal(rollout_rounds.stack_rows(rounds, [(1, 1)], "rewards"), [3.0])
  assert rollout_rounds.stack_rows(rounds, [(0, 0)], "tool_mask") is None


def test_diagnostics_cover_every_round_and_the_trained_advantages():
  rounds = [a_round([0.0, 0.0], [1, 3], seconds=1.0), a_round([1.0, 3.0], [2, 2], seconds=3.0)]
  selection = dynamic_sampling.Selection(picks=((1, 0),), extra_rounds=1, dropped=1,
                                         padded=0, surplus=0, zero_std=1, rolled_out=2)
  metrics = rollout_rounds.diagnostics(rounds, selection, [-1.0, 1.0], dynamic=True)
  value = {name: v for name, (v, _) in metrics.items()}
  assert value["diagnostics/reward/mean"] == pytest.approx(1.0)  # (0 + 0 + 1 + 3) / 4
  assert value["diagnostics/zero_std_frac"] == pytest.approx(0.5)
  assert value["completions/max_length"] == 3 and value["completions/truncated_frac"] == 0.25
  assert value["perf/rollout_seconds"] == 4.0
  assert value["perf/rollout_tokens_per_second"] == pytest.approx(8 / 4)
  assert value["diagnostics/advantage/abs_mean"] == 1.0
  assert value["diagnostics/dynamic_sampling/dropped_groups"] == 1
  assert "tools/calls_per_completion" not in metrics
  assert "diagnostics/dynamic_sampling/dropped_groups" not in rollout_rounds.diagnostics(
      rounds, selection, [-1.0, 1.0], dynamic=False)


def test_occupancy_is_the_kept_share_of_all_rounds_slot_steps():
  # Round 1, lockstep: 4 rows x 10 steps, rows kept 10 + 2 + 3 + 5 tokens;
  # round 2, 2 slots x 6 steps with 11 kept: (20 + 11) / (40 + 12).
  stats = lambda steps, slots, kept, refills: types.SimpleNamespace(
      steps=steps, slots=slots, kept=kept, refills=refills)
  rounds = [a_round([0.0, 1.0], [1, 2], decode_stats=[stats(10, 4, 20, 0)]),
            a_round([1.0, 3.0], [2, 2], decode_stats=[stats(6, 2, 11, 3)])]
  selection = dynamic_sampling.Selection(picks=((0, 0),), extra_rounds=1, dropped=0,
                                         padded=0, surplus=0, zero_std=0, rolled_out=2)
  metrics = rollout_rounds.diagnostics(rounds, selection, [1.0, -1.0], dynamic=False)
  value = {name: v for name, (v, _) in metrics.items()}
  assert value["rollout/occupancy"] == pytest.approx(31 / 52)
  assert (value["rollout/decode_steps"], value["rollout/refills"]) == (16, 3)
  # Tunix's engine reports nothing: no occupancy then.
  assert "rollout/occupancy" not in rollout_rounds.diagnostics(
      [a_round([0.0, 1.0], [1, 2])], selection, [1.0, -1.0], dynamic=False)


def test_tokens_decoded_after_the_stop_text_are_not_kept():
  # Two generate() calls: 3 completions, then 2. The engine kept 9, 4, 9 and
  # 9, 2 decode steps; the learner cut the first after 5 tokens (4 decode
  # steps) and the fourth after 1 token (the prefill's, no decode step).
  stats = [rollout.DecodeStats(steps=9, slots=3, kept_B=(9, 4, 9), refills=0),
           rollout.DecodeStats(steps=9, slots=2, kept_B=(9, 2), refills=0)]
  cut = rollout_rounds.kept_through_stop_text(stats, np.array([5, -1, -1, 1, -1]))
  assert [s.kept_B for s in cut] == [(4, 4, 9), (0, 2)]
  assert [(s.steps, s.slots, s.refills) for s in cut] == [(9, 3, 0), (9, 2, 0)]
  # A cut at the last of 10 tokens (the limit, no stop token) changes nothing.
  assert rollout_rounds.kept_through_stop_text(stats[:1], np.array([10, -1, -1]))[0].kept_B == (9, 4, 9)
