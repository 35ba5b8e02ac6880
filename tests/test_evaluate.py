"""`gemma-grpo eval`: targets, data, contamination, the console table, and the command end to end."""

import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest

from conftest import REPO, cli_env, run_cli
from gemma_grpo import config as config_lib
from gemma_grpo import errors
from gemma_grpo.config import settings
from gemma_grpo.commands import evaluate
from gemma_grpo.rl.eval import targets
from gemma_grpo.tasks import data as data_lib
from gemma_grpo.rl.eval import problem_sets
from gemma_grpo.rl.eval import reports
from gemma_grpo.rl.eval import scoring

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
  assert problem_sets.is_gsm8k_test(source, split) is expected


@pytest.mark.parametrize("trained_on, data, split, contaminated", [
    (("reasoning_gym:gsm_symbolic", "train"), "gsm8k", "test", True),
    (("reasoning_gym:gsm_symbolic", "train"), "/d/gsm8k/test.jsonl", None, True),
    (("reasoning_gym:gsm_symbolic", "train"), "/d/gsm8k/train.jsonl", None, False),
    (("gsm8k", "train"), "gsm8k", "test", False),
    (("gsm8k", "test"), "gsm8k", "test", True),
    (None, "gsm8k", "test", False),  # a model source: nothing known
])
def test_contamination(trained_on, data, split, contaminated):
  assert bool(problem_sets.contamination(trained_on, data, split)) is contaminated


def test_table_with_a_baseline():
  text = reports.table({"num_problems": 4, "accuracy": 0.5, "mean_length_chars": 12.25},
                        {"num_problems": 4, "accuracy": 0.25, "pass@2": 0.5}, "base_dir")
  lines = text.splitlines()
  assert lines[0].split() == ["metric", "base_dir", "this", "run", "delta"]
  assert lines[2].split() == ["num_problems", "4", "4", "+0"]
  assert lines[3].split() == ["accuracy", "0.2500", "0.5000", "+0.2500"]
  assert lines[4].split() == ["mean_length_chars", "-", "12.2", "-"]
  assert lines[5].split() == ["pass@2", "0.5000", "-", "-"]


def test_target_default_out(tmp_path):
  assert str(targets.Target("gguf:gemma-3-270m").default_out()) == "runs/eval/gguf_gemma-3-270m"
  assert str(targets.Target("hf:google/gemma-3-1b-it").default_out()) == "runs/eval/hf_google_gemma-3-1b-it"
  assert targets.Target("random", tmp_path, 7).default_out() == tmp_path / "eval_step7"


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


@pytest.mark.slow
def test_cli_eval_of_a_checkpoint_repeats_the_runs_own_eval_token_for_token(tmp_path):
  from conftest import LEARNING  # pylint: disable=g-import-not-at-top
  from gemma_grpo.runtime import metrics  # pylint: disable=g-import-not-at-top

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
         (workdir / "eval" / "step_000002" / scoring.SAMPLES_FILE).read_text().splitlines()]
  assert len(own) == 4
  cut = [s for s in own if s["completion"].endswith("a")]
  assert cut and all(s["completion"].count("a") == 1 and not s["truncated"] for s in cut)
  heldout = tmp_path / "heldout.jsonl"
  heldout.write_text("".join(
      json.dumps({"question": s["question"], "answer": f"#### {s['gold']}"}) + "\n" for s in own))
  out = tmp_path / "cli"
  run_cli(["eval", "--workdir", str(workdir), "--data", str(heldout), "--num-test", "4",
           "--batch-size", "4", "--max-new-tokens", "16", "--out", str(out)])
  cli = [json.loads(line) for line in (out / scoring.SAMPLES_FILE).read_text().splitlines()]
  assert [s["prompt"] for s in cli] == [s["prompt"] for s in own]
  assert [s["completion"] for s in cli] == [s["completion"] for s in own]
  assert [s["length_tokens"] for s in cli] == [s["length_tokens"] for s in own]
  report = json.loads((out / scoring.SUMMARY_FILE).read_text())
  assert report["settings"]["decoding"]["engine"] == "grouped"
  assert report["settings"]["decoding"]["stop_text"] == "a"


def test_default_data_is_the_configs_own_source_never_a_training_file():
  data = settings.from_config(config_lib.defaults()).data
  for source in ("reasoning_gym:simple_equations", "gsm8k"):
    assert problem_sets.default_data(dataclasses.replace(data, source=source)) == source
  with pytest.raises(errors.UserError, match="--data: required"):
    problem_sets.default_data(dataclasses.replace(data, source="/data/gsm8k/train.jsonl"))


def test_latest_run_is_the_one_with_the_newest_checkpoint(tmp_path):
  assert targets.latest_run(tmp_path / "runs") is None
  for name, age in (("old", 100), ("new", 10), ("not_a_run", 0)):
    step = tmp_path / "runs" / name / "checkpoints" / "actor" / "4"
    step.mkdir(parents=True)
    os.utime(step, (1e9 - age, 1e9 - age))
    if name != "not_a_run":  # a run has its config.json
      (tmp_path / "runs" / name / "config.json").write_text("{}")
  assert targets.latest_run(tmp_path / "runs") == tmp_path / "runs" / "new"


HEAVY = ("jax", "tunix", "flax", "orbax", "transformers", "torch")


@pytest.mark.parametrize("args, code", [
    (["--help"], 0),
    (["--model", "random", "--num-test", "0"], 2),
    (["--workdir", "runs/x", "--model", "random"], 2),
])
def test_help_and_a_bad_flag_answer_in_half_a_second(args, code):
  # A fresh interpreter: the suite's own has imported JAX long ago. Its CPU
  # seconds: on a loaded machine (the suite's other worker) the wall clock also
  # counts the waits for a core.
  script = (
      "import sys, time\nstart = time.process_time()\n"
      "from gemma_grpo.commands import evaluate\n"
      "try:\n  evaluate.main(sys.argv[1:])\nexcept SystemExit as e:\n  code = e.code\n"
      "else:\n  code = 0\n"
      f"heavy = sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))\n"
      "print(f'{code} {time.process_time() - start:.3f} {heavy}', file=sys.stderr)\n")
  proc = subprocess.run([sys.executable, "-c", script, *args], cwd=REPO, env=cli_env(1),
                        capture_output=True, text=True, timeout=60, check=False)
  exit_code, seconds, heavy = proc.stderr.strip().splitlines()[-1].split(" ", 2)
  assert int(exit_code) == code, proc.stderr
  assert heavy == "[]", proc.stderr
  assert float(seconds) < 0.5, proc.stderr
