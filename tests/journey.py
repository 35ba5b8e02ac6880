"""A newcomer's journey: README's commands, in README's order, on the offline default.

After the install (what .ci/run does), a user runs README's first command,
then types every bash block that README marks for tests/test_journey.py,
top to bottom, then README's Python API block;
docs/evaluation.md's marked block follows on the same run. Everything happens
in one directory holding a copy of configs/, on the real Gemma-3-270M,
shortened only by overrides (SHORT: one training step, two problems per
eval), and every command must exit 0. Rerunning the first command reads
the run's identity and stops at "nothing to do" (its max_steps is done);
that a rerun with more steps resumes is tests/test_train.py's to show, on
the tiny config, since a second 270M training run here cost about 70 s of
the suite's time for the same code path.

The `journey` fixture makes it once per session: tests/test_journey.py reads
what each command printed and left behind, tests/test_llama_cpp.py runs its
GGUF export in llama.cpp. conftest.py imports the fixture for both files and
puts both on one xdist worker.
"""

from __future__ import annotations

import dataclasses
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
      if argv[0] in ("pip", "npm", "pytest", ".") or argv[:2] == ["python3", "-m"]:
        continue
      commands.append(argv)
  return commands


def _run(root: pathlib.Path, written: list[str], argv: list[str]) -> Step:
  start = time.monotonic()
  proc = run_cli(argv, cwd=root, timeout=900)
  return Step(" ".join(written), argv, proc, time.monotonic() - start)


def api_example() -> str:
  """README's Python API block, shortened as the commands are: SHORT's
  overrides after the block's own (one step), EVAL_PROBLEMS held-out problems."""
  code, count = re.subn(r"api\.load_config\(([^,]+), \{([^{}]*)\}\)", r"api.load_config(\1, {\2, **SHORT})",
                        test_api.readme_example())
  assert count == 1, "README's API block no longer calls api.load_config(path, {...})"
  code, count = re.subn(r"api\.heldout\(policy, \d+\)", f"api.heldout(policy, {EVAL_PROBLEMS})", code)
  assert count == 1, "README's API block no longer evaluates api.heldout(policy, N)"
  return f"SHORT = {SHORT!r}\n{code}"


@pytest.fixture(scope="session")
def journey(tmp_path_factory) -> Journey:
  root = tmp_path_factory.mktemp("journey")
  shutil.copytree(REPO / "configs", root / "configs")
  readme = journey_commands("README.md")
  first, rest = readme[0], readme[1:]
  assert first[:3] == ["python", "-m", "gemma_grpo.train"], first
  steps = [_run(root, first, shortened(first))]
  steps.append(_run(root, [*first, "(again)"], shortened(first)))
  steps += [_run(root, argv, shortened(argv)) for argv in rest]
  start = time.monotonic()
  proc = run_python(api_example(), cwd=root, timeout=900)
  steps.append(Step("README: From Python", [], proc, time.monotonic() - start))
  steps += [_run(root, argv, shortened(argv)) for argv in journey_commands("docs/evaluation.md")]
  print("\n".join(f"journey: {s.seconds:6.1f} s  {s.written}" for s in steps))
  return Journey(root, steps)

