"""A newcomer's journey: README's commands, in README's order, on the offline default.

tests/journey.py runs them (the `journey` fixture, once per session); the
tests below read what each command printed and left behind.
"""

from __future__ import annotations

import json
import re

import pytest

from journey import PAGES
from journey import SHORT
from journey import journey_commands
import test_api

pytestmark = pytest.mark.slow


def test_the_pages_mark_the_whole_journey():
  written = [" ".join(argv) for page in PAGES for argv in journey_commands(page)]
  kinds = [re.sub(r"^(python -m gemma_grpo\.train|gemma-grpo \w+).*", r"\1", w) for w in written]
  assert kinds == ["python -m gemma_grpo.train", "gemma-grpo eval", "gemma-grpo eval",
                   "gemma-grpo export", "gemma-grpo export", "gemma-grpo export", "gemma-grpo plot",
                   "gemma-grpo eval", "gemma-grpo eval"], written


def test_the_first_command_evaluates_trains_and_prints_both(journey):
  out = journey.step(r"gemma3_270m\.py$").proc.stdout
  assert re.search(r"held-out \(2 problems, greedy\), start -> step 1: accuracy [\d.]+% -> [\d.]+%", out), out
  run = journey.root / "runs" / "gemma3_270m"
  assert (run / "checkpoints" / "actor" / "1").is_dir()


def test_running_it_again_reads_the_run_and_finds_it_done(journey):
  proc = journey.step(r"\(again\)$").proc
  assert "already holds step 1 >= train.max_steps; nothing to do" in proc.stderr, proc.stderr[-3000:]


def test_eval_without_flags_compares_the_newest_run_with_its_base(journey):
  out = journey.step(r"^gemma-grpo eval --num-test").proc.stdout
  assert "evaluating the most recent run, runs/gemma3_270m" in out
  assert re.search(r"accuracy difference [+-][\d.]+ points, 95% paired-bootstrap interval", out), out
  assert (journey.root / "runs" / "eval" / "gguf_gemma-3-270m" / "eval.json").is_file()  # the base's


def test_eval_of_a_workdir_reads_the_run_the_first_command_made(journey):
  # The regression that made this file: a run's own config.json was refused here.
  proc = journey.step(r"^gemma-grpo eval --workdir runs/gemma3_270m --num-test 16$").proc
  assert re.search(r"eval \S+runs/gemma3_270m step 1 on reasoning_gym:simple_equations: 2 problems",
                   proc.stdout), proc.stdout
  report = json.loads((journey.root / "runs" / "gemma3_270m" / "eval_step1" / "eval.json").read_text())
  assert report["metrics"]["num_problems"] == 2


def test_the_exports_are_written(journey):
  hf = journey.root / "exported" / "g270m"
  assert {"model.safetensors", "config.json", "tokenizer.json", "README.md"} <= {p.name for p in hf.iterdir()}
  for name in ("g270m.gguf", "g270m-q8_0.gguf"):  # tests/test_llama_cpp.py runs them
    with open(journey.root / "exported" / name, "rb") as f:
      assert f.read(4) == b"GGUF"


def test_plot_redraws_the_runs_curves(journey):
  journey.step(r"^gemma-grpo plot")
  assert (journey.root / "runs" / "gemma3_270m" / "plots" / "rewards.png").stat().st_size > 1000


def test_the_python_api_block_runs_on_the_offline_270m(journey):
  rewards, accuracy, completion = test_api.example_output(journey.step("From Python").proc.stdout)
  assert len(rewards) == SHORT["train.max_steps"] and 0 <= accuracy <= 1 and completion
  assert (journey.root / "exported" / "notebook" / "model.safetensors").is_file()


def test_the_evaluation_pages_comparison_reads_back_the_base_eval(journey):
  out = journey.step(r"--compare runs/eval/gguf_gemma-3-270m").proc.stdout
  assert re.search(r"accuracy difference [+-][\d.]+ points, 95% paired-bootstrap interval .* over 2 problems",
                   out), out
  assert "evaluated differently" not in out  # the same settings, read back from its eval.json
