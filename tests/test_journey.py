"""A newcomer's journey: README's commands, in README's order, on the offline default.

After the install (what .ci/run does), a user runs README's first command,
runs it again (it resumes), then types every bash block that README marks for
this file, top to bottom, then README's Python API block; docs/evaluation.md's
marked block follows on the same run. Everything happens in one directory
holding a copy of configs/, on the real Gemma-3-270M, shortened only by
overrides (SHORT: one training step, a second on the rerun, two problems per
eval), and every command must exit 0. The journey runs once per session; the
tests below read what each command printed and left behind.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import shutil
import subprocess
import time

import pytest

from conftest import REPO
from conftest import run_cli
from conftest import run_python
import test_api
import test_docs

pytestmark = pytest.mark.slow

MARK = "tests/test_journey.py"
# The first command's run, one step of 1 problem x 2 samples, each eval on 2
# held-out problems: shorter, not different (same task, prompt and model).
SHORT = {"train.max_steps": 1, "train.batch_size": 1, "grpo.num_generations": 2,
         "eval.num_examples": 2, "eval.batch_size": 2}
EVAL_PROBLEMS = "2"
# Where the docs' blocks come from, in the order a reader meets them.
PAGES = ("README.md", "docs/evaluation.md")


@dataclasses.dataclass
class Step:
  written: str  # the command as the page shows it
  argv: list[str]  # what ran: the CLI's arguments, shortened
  proc: subprocess.CompletedProcess
  seconds: float  # wall time, for the summary the fixture prints


@dataclasses.dataclass
class Journey:
  root: pathlib.Path  # the user's directory: configs/, then runs/ and exported/
  steps: list[Step]

  def step(self, pattern: str) -> Step:
    """The one step whose written command matches `pattern`."""
    found = [s for s in self.steps if re.search(pattern, s.written)]
    assert len(found) == 1, (pattern, [s.written for s in self.steps])
    return found[0]


def _overrides(values: dict) -> list[str]:
  return [f"--config.{key}={value}" for key, value in values.items()]


def shortened(argv: list[str]) -> list[str]:
  """The CLI arguments of a page's command, with SHORT's overrides applied."""
  if argv[:3] == ["python", "-m", "gemma_grpo.train"]:
    return ["train", *argv[3:], *_overrides(SHORT)]
  assert argv[0] == "gemma-grpo", f"not a gemma-grpo command: {argv}"
  if "--num-test" in argv:
    argv = list(argv)
    argv[argv.index("--num-test") + 1] = EVAL_PROBLEMS
  return argv[1:]


def journey_commands(page: str) -> list[list[str]]:
  """The gemma-grpo commands of `page`'s blocks marked for this file, in order.

  Installs and the test command are .ci/run's; every other line must be a
  command this file can run.
  """
  commands = []
  for path, _, language, marker, code in test_docs.blocks():
    if path != page or MARK not in marker or language != "bash":
      continue
    for argv in test_docs._commands(code):  # pylint: disable=protected-access
      if argv[0] in ("pip", "pytest", ".") or argv[:2] == ["python3", "-m"]:
        continue
      commands.append(argv)
  return commands


def _run(root: pathlib.Path, written: list[str], argv: list[str]) -> Step:
  start = time.monotonic()
  proc = run_cli(argv, cwd=root, timeout=900)
  return Step(" ".join(written), argv, proc, time.monotonic() - start)


def api_example() -> str:
  """README's Python API block, its load_config given SHORT's overrides too."""
  code, count = re.subn(r"api\.load_config\(([^,]+), \{", r"api.load_config(\1, {**SHORT, ",
                        test_api.readme_example())
  assert count == 1, "README's API block no longer calls api.load_config(path, {...})"
  return f"SHORT = {SHORT!r}\n{code}"


@pytest.fixture(scope="session")
def journey(tmp_path_factory) -> Journey:
  root = tmp_path_factory.mktemp("journey")
  shutil.copytree(REPO / "configs", root / "configs")
  readme = journey_commands("README.md")
  first, rest = readme[0], readme[1:]
  assert first[:3] == ["python", "-m", "gemma_grpo.train"], first
  steps = [_run(root, first, shortened(first))]
  # README: "rerunning resumes"; one more step shows it.
  steps.append(_run(root, [*first, "(again)"], [*shortened(first), "--config.train.max_steps=2"]))
  steps += [_run(root, argv, shortened(argv)) for argv in rest]
  start = time.monotonic()
  proc = run_python(api_example(), cwd=root, timeout=900)
  steps.append(Step("README: From Python", [], proc, time.monotonic() - start))
  steps += [_run(root, argv, shortened(argv)) for argv in journey_commands("docs/evaluation.md")]
  print("\n".join(f"journey: {s.seconds:6.1f} s  {s.written}" for s in steps))
  return Journey(root, steps)


def test_the_pages_mark_the_whole_journey():
  written = [" ".join(argv) for page in PAGES for argv in journey_commands(page)]
  kinds = [re.sub(r"^(python -m gemma_grpo\.train|gemma-grpo \w+).*", r"\1", w) for w in written]
  assert kinds == ["python -m gemma_grpo.train", "gemma-grpo eval", "gemma-grpo eval",
                   "gemma-grpo export", "gemma-grpo export", "gemma-grpo plot",
                   "gemma-grpo eval", "gemma-grpo eval"], written


def test_the_first_command_evaluates_trains_and_prints_both(journey):
  out = journey.step(r"gemma3_270m\.py$").proc.stdout
  assert re.search(r"held-out \(2 problems, greedy\), start -> step 1: accuracy [\d.]+% -> [\d.]+%", out), out
  run = journey.root / "runs" / "gemma3_270m"
  assert (run / "checkpoints" / "actor" / "1").is_dir()


def test_running_it_again_resumes(journey):
  proc = journey.step(r"\(again\)$").proc
  assert "Resuming from step 1" in proc.stderr, proc.stderr[-3000:]
  rows = [json.loads(line) for line in
          (journey.root / "runs" / "gemma3_270m" / "tensorboard" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "rewards/train/sum" in r] == [1, 2]


def test_eval_without_flags_compares_the_newest_run_with_its_base(journey):
  out = journey.step(r"^gemma-grpo eval --num-test").proc.stdout
  assert "evaluating the most recent run, runs/gemma3_270m" in out
  assert re.search(r"accuracy difference [+-][\d.]+ points, 95% paired-bootstrap interval", out), out
  assert (journey.root / "runs" / "eval" / "gguf_gemma-3-270m" / "eval.json").is_file()  # the base's


def test_eval_of_a_workdir_reads_the_run_the_first_command_made(journey):
  # The regression that made this file: a run's own config.json was refused here.
  proc = journey.step(r"^gemma-grpo eval --workdir runs/gemma3_270m --num-test 16$").proc
  assert re.search(r"eval \S+runs/gemma3_270m step 2 on reasoning_gym:simple_equations: 2 problems",
                   proc.stdout), proc.stdout
  report = json.loads((journey.root / "runs" / "gemma3_270m" / "eval_step2" / "eval.json").read_text())
  assert report["metrics"]["num_problems"] == 2


def test_both_exports_are_written(journey):
  hf = journey.root / "exported" / "g270m"
  assert {"model.safetensors", "config.json", "tokenizer.json", "README.md"} <= {p.name for p in hf.iterdir()}
  gguf = journey.root / "exported" / "g270m.gguf"
  with open(gguf, "rb") as f:
    assert f.read(4) == b"GGUF"


def test_plot_redraws_the_runs_curves(journey):
  journey.step(r"^gemma-grpo plot")
  assert (journey.root / "runs" / "gemma3_270m" / "plots" / "rewards.png").stat().st_size > 1000


def test_the_python_api_block_runs_on_the_offline_270m(journey):
  rewards, accuracy, completion = test_api.example_output(journey.step("From Python").proc.stdout)
  assert len(rewards) == 2 and 0 <= accuracy <= 1 and completion
  assert (journey.root / "exported" / "notebook" / "model.safetensors").is_file()


def test_the_evaluation_pages_comparison_reads_back_the_base_eval(journey):
  out = journey.step(r"--compare runs/eval/gguf_gemma-3-270m").proc.stdout
  assert re.search(r"accuracy difference [+-][\d.]+ points, 95% paired-bootstrap interval .* over 2 problems",
                   out), out
  assert "evaluated differently" not in out  # the same settings, read back from its eval.json
