"""gemma_grpo.rl.eval.scoring: the eval metrics on hand-written completions, and the paired bootstrap."""

import itertools

import pytest

from gemma_grpo.tasks import data as data_lib
from gemma_grpo.tasks import rewards
from gemma_grpo.rl.eval import scoring

# Character counts, by hand: <reasoning> 11, </reasoning> 12, <answer> 8, </answer> 9.
FULL_12 = "<reasoning>r</reasoning><answer>12</answer>"  # 11+1+12+8+2+9 = 43
BARE_13 = "<answer>13</answer>"  # 8+2+9 = 19
FULL_20 = "<reasoning>r</reasoning><answer>20</answer>"  # 43
NO_TAG = "so 12"  # 5
GOLD_12 = data_lib.Problem("How many?", "12")


def four_completions():
  problems = [GOLD_12] * 4
  completions = [FULL_12, BARE_13, FULL_20, NO_TAG]
  truncated = [False, False, False, True]
  num_tokens = [10, 5, 10, 16]
  return problems, completions, truncated, num_tokens


def test_score_metrics_by_hand():
  problems, completions, truncated, num_tokens = four_completions()
  metrics, samples = scoring.score(
      problems, completions, truncated, num_tokens=num_tokens,
      reward_fns=rewards.build_reward_fns("reference"), num_dropped=3)
  # correct: FULL_12 only. Within 10%: FULL_12 and BARE_13 (13/12 = 1.083).
  # Exact format: FULL_12, FULL_20. Truncated: NO_TAG.
  expected = {
      "num_problems": 4,
      "num_dropped": 3,
      "accuracy": 0.25,
      "partial_accuracy": 0.5,
      "format_accuracy": 0.5,
      "truncation_rate": 0.25,
      "mean_length_tokens": 10.25,  # (10 + 5 + 10 + 16) / 4
      "mean_length_chars": 27.5,  # (43 + 19 + 43 + 5) / 4
      # format_exact: 3, 0, 3, 0.
      "reward/format_exact": 1.5,
      # format_approx: all four tags +2; answer tags only 0; again +2; none -2.
      "reward/format_approx": 0.5,
      # answer_correct: exact 3.0, within 10% 0.5, wrong -1.0, no tag 0.0.
      "reward/answer_correct": 0.625,
      # number_match: 1.5 for FULL_12 only.
      "reward/number_match": 0.375,
      "reward/sum": 3.0,  # 1.5 + 0.5 + 0.625 + 0.375
  }
  assert list(metrics) == list(expected)
  assert metrics == pytest.approx(expected)
  assert [s["correct"] for s in samples] == [True, False, False, False]
  assert [s["extracted"] for s in samples] == ["12", "13", "20", None]
  assert [s["length_chars"] for s in samples] == [43, 19, 43, 5]
  assert samples[1]["rewards"] == {"format_exact": 0.0, "format_approx": 0.0,
                                   "answer_correct": 0.5, "number_match": 0.0}


def test_score_default_rewards_are_the_guarded_preset():
  problems, completions, truncated, num_tokens = four_completions()
  metrics, _ = scoring.score(problems, completions, truncated, num_tokens=num_tokens)
  # Guarded weights 0.5, 0.5, 5, 0.5 on the raw means 1.5, 0.5, 0.625, 0.375.
  assert metrics["reward/format_exact"] == pytest.approx(0.75)
  assert metrics["reward/format_approx"] == pytest.approx(0.25)
  assert metrics["reward/answer_correct"] == pytest.approx(3.125)
  assert metrics["reward/number_match"] == pytest.approx(0.1875)
  assert metrics["reward/sum"] == pytest.approx(4.3125)


def test_score_without_token_counts_leaves_the_token_length_out():
  problems, completions, truncated, _ = four_completions()
  metrics, samples = scoring.score(problems, completions, truncated)
  assert "mean_length_tokens" not in metrics
  assert samples[0]["length_tokens"] is None


@pytest.mark.parametrize("n, c, k, expected", [
    (4, 0, 1, 0.0),
    (4, 4, 1, 1.0),
    (4, 1, 1, 0.25),
    (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (4, 2, 2, 5 / 6),  # 1 - C(2,2)/C(4,2) = 1 - 1/6
    (5, 2, 3, 0.9),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
    (4, 1, 4, 1.0),  # n == k: any correct
    (3, 0, 3, 0.0),
    (10, 3, 5, 11 / 12),  # 1 - C(7,5)/C(10,5) = 1 - 21/252
])
def test_pass_at_k(n, c, k, expected):
  assert scoring.pass_at_k(n, c, k) == pytest.approx(expected)
  # Also by enumeration: the share of k-subsets holding a correct sample.
  outcomes = [True] * c + [False] * (n - c)
  subsets = list(itertools.combinations(outcomes, k))
  assert scoring.pass_at_k(n, c, k) == pytest.approx(sum(map(any, subsets)) / len(subsets))


def test_pass_at_k_rejects_impossible_counts():
  with pytest.raises(ValueError):
    scoring.pass_at_k(4, 5, 1)
  with pytest.raises(ValueError):
    scoring.pass_at_k(4, 1, 5)


def vote(number, text=None, correct=False):
  return {"number": number, "extracted": text if text is not None else (None if number is None else str(number)),
          "correct": correct}


@pytest.mark.parametrize("votes, winner", [
    ([vote(18), vote(18), vote(20)], 0),
    ([vote(20), vote(18)], 0),  # tie: the earliest answer
    ([vote(None), vote(18), vote(20), vote(20), vote(18)], 1),  # 2-2 tie, 18 first
    ([vote(None), vote(None, "  "), vote(5)], 2),  # no answer / blank: no vote
    ([vote(None, "seven"), vote(7), vote(None, "seven")], 0),  # text votes
    ([vote(7.0, "$7.00"), vote(9), vote(7, "7")], 0),  # same number, other text
])
def test_majority_vote(votes, winner):
  assert scoring.majority_vote(votes) is votes[winner]


def test_majority_vote_without_votes_is_none():
  assert scoring.majority_vote([vote(None), vote(None, "")]) is None


@pytest.mark.parametrize("n, sizes", [(1, [1]), (2, [1, 2]), (3, [1, 2, 3]),
                                      (4, [1, 2, 4]), (5, [1, 2, 4, 5]), (8, [1, 2, 4, 8])])
def test_sample_sizes(n, sizes):
  assert scoring.sample_sizes(n) == sizes


def test_score_pass_and_majority_at_k():
  problems = [data_lib.Problem("A?", "18"), data_lib.Problem("B?", "7")]
  completions = [
      # A: 18 correct twice. Votes 20, 18, 18, none.
      "<answer>20</answer>", "<answer>18</answer>", "<answer>18</answer>", "no answer",
      # B: 7 correct twice ("$7.00" equals 7). Votes 7, 7, 9, 9.
      "<answer>7</answer>", "<answer>$7.00</answer>", "<answer>9</answer>", "<answer>9</answer>",
  ]
  metrics, samples = scoring.score(problems, completions, [False] * 8, num_samples=4)
  assert metrics["num_problems"] == 2
  assert metrics["accuracy"] == pytest.approx(0.5)  # 4 of 8 samples
  assert metrics["pass@1"] == pytest.approx(0.5)  # c/n = 2/4 for both
  assert metrics["pass@2"] == pytest.approx(5 / 6)  # 1 - C(2,2)/C(4,2) for both
  assert metrics["pass@4"] == pytest.approx(1.0)
  # maj@1: A's first says 20 (wrong), B's first 7 (right).
  assert metrics["maj@1"] == pytest.approx(0.5)
  # maj@2: A ties 20-18, 20 came first (wrong); B 7-7 (right).
  assert metrics["maj@2"] == pytest.approx(0.5)
  # maj@4: A 18 wins 2-1; B ties 7-9, 7 came first.
  assert metrics["maj@4"] == pytest.approx(1.0)
  assert [(s["problem"], s["sample"]) for s in samples[:5]] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]
  assert samples[0]["majority"] == {"answer": "18", "correct": True}
  assert samples[7]["majority"] == {"answer": "7", "correct": True}


def test_score_rejects_a_wrong_number_of_completions():
  with pytest.raises(ValueError):
    scoring.score([GOLD_12], ["a", "b", "c"], [False] * 3, num_samples=2)


def test_run_batches_and_keeps_the_cli_metric_names():
  problems, completions, truncated, num_tokens = four_completions()
  by_prompt = iter(zip(completions, truncated, num_tokens))
  calls = []

  def generate(batch_prompts):
    calls.append(len(batch_prompts))
    rows = [next(by_prompt) for _ in batch_prompts]
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]

  metrics, _ = scoring.run(generate, problems, 3)
  assert calls == [3, 1]
  direct, _ = scoring.score(problems, completions, truncated, num_tokens=num_tokens)
  assert metrics == direct

  # The older two-column form still works, without the token length.
  two = scoring.run(lambda ps: (["<answer>12</answer>"] * len(ps), [False] * len(ps)), problems, 2)[0]
  assert two["accuracy"] == 1.0 and "mean_length_tokens" not in two


# --- paired bootstrap of an accuracy difference -------------------------------


def test_paired_bootstrap_bounds():
  assert scoring.paired_bootstrap([1, 0, 1], [1, 0, 1]) == (0.0, 0.0, 0.0)
  assert scoring.paired_bootstrap([0] * 5, [1] * 5) == (1.0, 1.0, 1.0)
  # 30 of 100 problems gained, 10 lost: +20 points, an interval that excludes 0.
  base = [0] * 30 + [1] * 10 + [0] * 60
  new = [1] * 30 + [0] * 10 + [0] * 60
  diff, low, high = scoring.paired_bootstrap(base, new)
  assert diff == pytest.approx(0.2)
  assert 0.05 < low < 0.2 < high < 0.35
  assert scoring.paired_bootstrap(base, new) == (diff, low, high)  # seeded
  # 1 gained and 1 lost of 20: no evidence either way.
  _, low, high = scoring.paired_bootstrap([1, 0] + [0] * 18, [0, 1] + [0] * 18)
  assert low < 0 < high
  with pytest.raises(ValueError):
    scoring.paired_bootstrap([], [])


def test_paired_accuracy_line_pairs_by_question_and_averages_samples():
  def samples(verdicts):
    return [{"question": q, "correct": c} for q, cs in verdicts.items() for c in cs]

  base = samples({"a": [0, 0], "b": [1, 1], "c": [0, 0]})
  new = samples({"c": [1, 1], "b": [1, 0], "a": [1, 1]})  # other order, 2 samples each
  line = scoring.paired_accuracy_line(base, new)
  # per problem: a +1, b -0.5, c +1 -> mean +0.5
  assert line.startswith("accuracy difference +50.0 points, 95% paired-bootstrap interval [")
  assert line.endswith("over 3 problems")
  assert scoring.paired_accuracy_line(base, samples({"a": [1], "z": [0], "c": [1]})) is None

