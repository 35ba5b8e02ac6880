"""Evaluation metrics on hand-written completions, and `gemma-grpo eval` end to end."""

import itertools
import json
import math

import pytest

from conftest import run_cli
from gemma_grpo import data as data_lib
from gemma_grpo import evaluate
from gemma_grpo import rewards

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
  metrics, samples = evaluate.score(
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
  metrics, _ = evaluate.score(problems, completions, truncated, num_tokens=num_tokens)
  # Guarded weights 0.5, 0.5, 5, 0.5 on the raw means 1.5, 0.5, 0.625, 0.375.
  assert metrics["reward/format_exact"] == pytest.approx(0.75)
  assert metrics["reward/format_approx"] == pytest.approx(0.25)
  assert metrics["reward/answer_correct"] == pytest.approx(3.125)
  assert metrics["reward/number_match"] == pytest.approx(0.1875)
  assert metrics["reward/sum"] == pytest.approx(4.3125)


def test_score_without_token_counts_leaves_the_token_length_out():
  problems, completions, truncated, _ = four_completions()
  metrics, samples = evaluate.score(problems, completions, truncated)
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
  assert evaluate.pass_at_k(n, c, k) == pytest.approx(expected)
  # Also by enumeration: the share of k-subsets holding a correct sample.
  outcomes = [True] * c + [False] * (n - c)
  subsets = list(itertools.combinations(outcomes, k))
  assert evaluate.pass_at_k(n, c, k) == pytest.approx(sum(map(any, subsets)) / len(subsets))


def test_pass_at_k_rejects_impossible_counts():
  with pytest.raises(ValueError):
    evaluate.pass_at_k(4, 5, 1)
  with pytest.raises(ValueError):
    evaluate.pass_at_k(4, 1, 5)


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
  assert evaluate.majority_vote(votes) is votes[winner]


def test_majority_vote_without_votes_is_none():
  assert evaluate.majority_vote([vote(None), vote(None, "")]) is None


@pytest.mark.parametrize("n, sizes", [(1, [1]), (2, [1, 2]), (3, [1, 2, 3]),
                                      (4, [1, 2, 4]), (5, [1, 2, 4, 5]), (8, [1, 2, 4, 8])])
def test_sample_sizes(n, sizes):
  assert evaluate.sample_sizes(n) == sizes


def test_score_pass_and_majority_at_k():
  problems = [data_lib.Problem("A?", "18"), data_lib.Problem("B?", "7")]
  completions = [
      # A: 18 correct twice. Votes 20, 18, 18, none.
      "<answer>20</answer>", "<answer>18</answer>", "<answer>18</answer>", "no answer",
      # B: 7 correct twice ("$7.00" equals 7). Votes 7, 7, 9, 9.
      "<answer>7</answer>", "<answer>$7.00</answer>", "<answer>9</answer>", "<answer>9</answer>",
  ]
  metrics, samples = evaluate.score(problems, completions, [False] * 8, num_samples=4)
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
    evaluate.score([GOLD_12], ["a", "b", "c"], [False] * 3, num_samples=2)


def test_run_batches_and_keeps_the_cli_metric_names():
  problems, completions, truncated, num_tokens = four_completions()
  by_prompt = iter(zip(completions, truncated, num_tokens))
  calls = []

  def generate(batch_prompts):
    calls.append(len(batch_prompts))
    rows = [next(by_prompt) for _ in batch_prompts]
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]

  metrics, _ = evaluate.run(generate, problems, 3)
  assert calls == [3, 1]
  direct, _ = evaluate.score(problems, completions, truncated, num_tokens=num_tokens)
  assert metrics == direct

  # The older two-column form still works, without the token length.
  two = evaluate.run(lambda ps: (["<answer>12</answer>"] * len(ps), [False] * len(ps)), problems, 2)[0]
  assert two["accuracy"] == 1.0 and "mean_length_tokens" not in two


@pytest.mark.parametrize("source, split, expected", [
    ("gsm8k", "test", True),
    ("gsm8k", "train", False),
    ("/data/gsm8k/test.jsonl", None, True),
    ("/data/GSM8K_test.parquet", None, True),
    ("/data/gsm8k/train.jsonl", None, False),
    ("/data/mytest.jsonl", None, False),
    ("reasoning_gym:gsm_symbolic", None, False),
])
def test_is_gsm8k_test(source, split, expected):
  assert evaluate.is_gsm8k_test(source, split) is expected


@pytest.mark.parametrize("trained_on, data, split, contaminated", [
    (("reasoning_gym:gsm_symbolic", "train"), "gsm8k", "test", True),
    (("reasoning_gym:gsm_symbolic", "train"), "/d/gsm8k/test.jsonl", None, True),
    (("reasoning_gym:gsm_symbolic", "train"), "/d/gsm8k/train.jsonl", None, False),
    (("gsm8k", "train"), "gsm8k", "test", False),
    (("gsm8k", "test"), "gsm8k", "test", True),
    (None, "gsm8k", "test", False),  # a model source: nothing known
])
def test_contamination(trained_on, data, split, contaminated):
  target = evaluate.Target("random", trained_on=trained_on)
  assert bool(evaluate.contamination(target, data, split)) is contaminated


def test_table_with_a_baseline():
  text = evaluate.table({"num_problems": 4, "accuracy": 0.5, "mean_length_chars": 12.25},
                        {"num_problems": 4, "accuracy": 0.25, "pass@2": 0.5}, "base_dir")
  lines = text.splitlines()
  assert lines[0].split() == ["metric", "base_dir", "this", "run", "delta"]
  assert lines[2].split() == ["num_problems", "4", "4", "+0"]
  assert lines[3].split() == ["accuracy", "0.2500", "0.5000", "+0.2500"]
  assert lines[4].split() == ["mean_length_chars", "-", "12.2", "-"]
  assert lines[5].split() == ["pass@2", "0.5000", "-", "-"]


def test_target_default_out(tmp_path):
  assert str(evaluate.Target("gguf:gemma-3-270m").default_out()) == "runs/eval/gguf_gemma-3-270m"
  assert str(evaluate.Target("hf:google/gemma-3-1b-it").default_out()) == "runs/eval/hf_google_gemma-3-1b-it"
  assert evaluate.Target("random", tmp_path, 7).default_out() == tmp_path / "eval_step7"


# --- The command, on a tiny trained run ---------------------------------------

# Our own GSM8K-format problems (never GSM8K text).
PROBLEMS = [
    ("Mia packs 3 boxes with 4 pencils each. How many pencils is that?", "3 * 4 = 12", "12"),
    ("A cart moves 60 metres a minute for 2 minutes. How far does it go?", "60 * 2 = 120", "120"),
    ("Tom had 10 plums and gave away 7. How many are left?", "10 - 7 = 3", "3"),
    ("Pens cost 2 dollars each. What do 5 pens cost?", "5 * 2 = 10", "10"),
    ("Sara reads 15 pages a day. How many pages does she read in 4 days?", "15 * 4 = 60", "60"),
]


@pytest.fixture(scope="module")
def problems_file(tmp_path_factory):
  # The path names GSM8K test, so a run trained on gsm_symbolic is flagged.
  path = tmp_path_factory.mktemp("data") / "gsm8k_test_like.jsonl"
  path.write_text("".join(
      json.dumps({"question": q, "answer": f"{w}\n#### {a}"}) + "\n" for q, w, a in PROBLEMS))
  return path


def eval_args(workdir, data, out, *extra):
  return ["eval", "--workdir", str(workdir), "--data", str(data), "--num-test", "4",
          "--max-new-tokens", "8", "--out", str(out), *extra]


@pytest.fixture(scope="module")
def two_evals(tiny_run, problems_file, tmp_path_factory):
  """The same eval twice; the second compares itself with the first."""
  root = tmp_path_factory.mktemp("evals")
  first = run_cli(eval_args(tiny_run, problems_file, root / "first"))
  second = run_cli(eval_args(tiny_run, problems_file, root / "second", "--compare", str(root / "first")))
  return root / "first", first, root / "second", second


def test_eval_writes_a_report_samples_and_a_table(two_evals, tiny_run, problems_file):
  out, proc, _, _ = two_evals
  report = json.loads((out / "eval.json").read_text())
  m = report["metrics"]
  assert m["num_problems"] == 4 and m["num_dropped"] == 0
  for name in ("accuracy", "partial_accuracy", "format_accuracy", "truncation_rate",
               "mean_length_tokens", "mean_length_chars", "reward/answer_correct", "reward/sum"):
    assert math.isfinite(m[name]), name
  assert 0 <= m["mean_length_tokens"] <= 8
  s = report["settings"]
  assert s["model"] == {"source": "random", "workdir": str(tiny_run), "step": 2}
  assert s["data"]["num_test"] == 4 and s["data"]["path"] == str(problems_file)
  assert s["decoding"]["mode"] == "greedy" and s["decoding"]["max_new_tokens"] == 8
  assert s["decoding"]["stop_token_ids"] == [1, 106]
  assert s["rewards"]["preset"] == "guarded"
  assert report["config"]["eval"]["max_new_tokens"] == 8
  assert "HF_TOKEN" not in json.dumps(report)
  # A tiny run trains on gsm_symbolic, and the data's path says GSM8K test.
  assert report["contaminated"] is True
  assert "CONTAMINATED" in proc.stderr

  samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
  assert [s["gold"] for s in samples] == ["12", "120", "3", "10"]
  for sample in samples:
    assert {"prompt", "completion", "extracted", "gold", "correct"} <= set(sample)
    assert sample["truncated"] == (sample["length_tokens"] == 8)
  assert "accuracy" in proc.stdout and "metric" in proc.stdout


def test_eval_is_deterministic(two_evals):
  first, _, second, _ = two_evals
  report_a = json.loads((first / "eval.json").read_text())
  report_b = json.loads((second / "eval.json").read_text())
  assert report_a["metrics"] == report_b["metrics"]
  assert (first / "samples.jsonl").read_bytes() == (second / "samples.jsonl").read_bytes()


def test_eval_compare_prints_both_columns(two_evals):
  first, _, _, proc = two_evals
  header = next(line for line in proc.stdout.splitlines() if line.startswith("metric"))
  assert str(first)[-20:] in header and "this run" in header and "delta" in header
  accuracy = next(line for line in proc.stdout.splitlines() if line.startswith("accuracy "))
  assert len(accuracy.split()) == 4 and accuracy.split()[-1] == "+0.0000"
  assert "evaluated differently" not in proc.stdout


def test_eval_offline_hub_data_is_one_line(monkeypatch, capsys):
  def offline(split):
    raise data_lib.errors.UserError(f"data.source=gsm8k: cannot download split {split}")

  monkeypatch.setattr(data_lib, "load_gsm8k_hub", offline)
  with pytest.raises(SystemExit) as exit_info:
    evaluate.main(["--model", "random", "--data", "gsm8k", "--num-test", "2"])
  assert exit_info.value.code == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1
  assert lines[0].startswith("error: --data gsm8k: cannot download") and "--data /path/" in lines[0]


@pytest.mark.parametrize("args, message", [
    (["--workdir", "{tmp}/missing"], "no such directory"),
    (["--workdir", "{run}", "--step", "99"], "--step 99"),
    (["--model", "random", "--data", "{tmp}/nope.jsonl"], "--data"),
    (["--model", "random", "--data", "{data}", "--num-test", "0"], "--num-test 0"),
    (["--workdir", "{run}", "--model", "random"], "--workdir"),
    (["--model", "random", "--data", "{data}", "--num-samples", "4", "--temperature", "0"], "--temperature"),
    (["--model", "random", "--data", "{data}", "--compare", "{tmp}/nothing"], "--compare"),
])
def test_eval_bad_input_is_one_line_and_exit_2(args, message, tiny_run, problems_file, tmp_path):
  filled = [a.format(tmp=tmp_path, run=tiny_run, data=problems_file) for a in args]
  proc = run_cli(["eval", *filled], check=False, timeout=120)
  assert proc.returncode == 2, proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
  assert message in lines[0]
  assert "Traceback" not in proc.stderr


# --- one decoder: the run's own eval and `gemma-grpo eval` --------------------


def test_cli_eval_of_a_checkpoint_repeats_the_runs_own_eval_token_for_token(tmp_path):
  from conftest import LEARNING  # pylint: disable=g-import-not-at-top
  from gemma_grpo import metrics  # pylint: disable=g-import-not-at-top

  workdir = tmp_path / "run"
  # Random text holds an "a" in most completions: the stop text cuts them
  # in training rollouts, in the run's evals and in the CLI's alike.
  proc = run_cli(["train", "--config", "configs/tiny.py", "--workdir", str(workdir), *LEARNING,
                  "--config.eval.every_steps=2", "--config.rollout.stop_text=a"])
  # Evaluated before the first update and after the last, printed on one line.
  assert "held-out (4 problems, greedy), start -> step 2: accuracy" in proc.stdout
  rows = {r["step"]: r for r in metrics.read_jsonl(workdir / "tensorboard" / "metrics.jsonl")}
  assert "eval/accuracy" in rows[0] and "eval/accuracy" in rows[2]
  assert rows[1]["completions/train/max_length"] <= 16

  own = [json.loads(line) for line in
         (workdir / "eval" / "step_000002" / evaluate.SAMPLES_FILE).read_text().splitlines()]
  assert len(own) == 4
  cut = [s for s in own if s["completion"].endswith("a")]
  assert cut and all(s["completion"].count("a") == 1 and not s["truncated"] for s in cut)
  heldout = tmp_path / "heldout.jsonl"
  heldout.write_text("".join(
      json.dumps({"question": s["question"], "answer": f"#### {s['gold']}"}) + "\n" for s in own))
  out = tmp_path / "cli"
  run_cli(["eval", "--workdir", str(workdir), "--data", str(heldout), "--num-test", "4",
           "--batch-size", "4", "--max-new-tokens", "16", "--out", str(out)])
  cli = [json.loads(line) for line in (out / evaluate.SAMPLES_FILE).read_text().splitlines()]
  assert [s["prompt"] for s in cli] == [s["prompt"] for s in own]
  assert [s["completion"] for s in cli] == [s["completion"] for s in own]
  assert [s["length_tokens"] for s in cli] == [s["length_tokens"] for s in own]
  report = json.loads((out / evaluate.SUMMARY_FILE).read_text())
  assert report["settings"]["decoding"]["engine"] == "grouped"
  assert report["settings"]["decoding"]["stop_text"] == "a"


# --- paired bootstrap of an accuracy difference -------------------------------


def test_paired_bootstrap_bounds():
  assert evaluate.paired_bootstrap([1, 0, 1], [1, 0, 1]) == (0.0, 0.0, 0.0)
  assert evaluate.paired_bootstrap([0] * 5, [1] * 5) == (1.0, 1.0, 1.0)
  # 30 of 100 problems gained, 10 lost: +20 points, an interval that excludes 0.
  base = [0] * 30 + [1] * 10 + [0] * 60
  new = [1] * 30 + [0] * 10 + [0] * 60
  diff, low, high = evaluate.paired_bootstrap(base, new)
  assert diff == pytest.approx(0.2)
  assert 0.05 < low < 0.2 < high < 0.35
  assert evaluate.paired_bootstrap(base, new) == (diff, low, high)  # seeded
  # 1 gained and 1 lost of 20: no evidence either way.
  _, low, high = evaluate.paired_bootstrap([1, 0] + [0] * 18, [0, 1] + [0] * 18)
  assert low < 0 < high
  with pytest.raises(ValueError):
    evaluate.paired_bootstrap([], [])


def test_paired_accuracy_line_pairs_by_question_and_averages_samples():
  def samples(verdicts):
    return [{"question": q, "correct": c} for q, cs in verdicts.items() for c in cs]

  base = samples({"a": [0, 0], "b": [1, 1], "c": [0, 0]})
  new = samples({"c": [1, 1], "b": [1, 0], "a": [1, 1]})  # other order, 2 samples each
  line = evaluate.paired_accuracy_line(base, new)
  # per problem: a +1, b -0.5, c +1 -> mean +0.5
  assert line.startswith("accuracy difference +50.0 points, 95% paired-bootstrap interval [")
  assert line.endswith("over 3 problems")
  assert evaluate.paired_accuracy_line(base, samples({"a": [1], "z": [0], "c": [1]})) is None


def test_default_data_is_the_configs_own_source_never_a_training_file():
  from configs import base  # pylint: disable=g-import-not-at-top
  from gemma_grpo import errors  # pylint: disable=g-import-not-at-top

  c = base.get_config()
  for source in ("reasoning_gym:simple_equations", "gsm8k"):
    c.data.source = source
    assert evaluate.default_data(c) == source
  c.data.source = "/data/gsm8k/train.jsonl"
  with pytest.raises(errors.UserError, match="--data: required"):
    evaluate.default_data(c)


def test_latest_run_is_the_one_with_the_newest_checkpoint(tmp_path):
  import os  # pylint: disable=g-import-not-at-top

  assert evaluate.latest_run(tmp_path / "runs") is None
  for name, age in (("old", 100), ("new", 10), ("not_a_run", 0)):
    step = tmp_path / "runs" / name / "checkpoints" / "actor" / "4"
    step.mkdir(parents=True)
    os.utime(step, (1e9 - age, 1e9 - age))
    if name != "not_a_run":  # a run has its config.json
      (tmp_path / "runs" / name / "config.json").write_text("{}")
  assert evaluate.latest_run(tmp_path / "runs") == tmp_path / "runs" / "new"


def test_eval_as_typed_after_the_first_command_compares_the_run_with_its_base(tiny_run, tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  from conftest import REPO, cli_env  # pylint: disable=g-import-not-at-top

  shutil.copytree(tiny_run, tmp_path / "runs" / "tiny")
  proc = subprocess.run(
      [sys.executable, "-m", "gemma_grpo.cli", "eval", "--num-test", "2", "--max-new-tokens", "4"],
      cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
      # The run scored with tests.toy_rewards, which the eval imports again.
      env={**cli_env(1), "PYTHONPATH": str(REPO)})
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "evaluating the most recent run, runs/tiny" in proc.stdout
  # The run's own data source (offline), the run against its base, paired.
  assert "on reasoning_gym:gsm_symbolic: 2 problems" in proc.stdout
  assert "accuracy difference +0.0 points" in proc.stdout
  assert (tmp_path / "runs" / "tiny" / "eval_step2" / evaluate.SUMMARY_FILE).is_file()
  assert (tmp_path / "runs" / "eval" / "random" / evaluate.SUMMARY_FILE).is_file()
