"""The Python API (gemma_grpo/api.py); tests/test_journey.py runs README's example on the offline 270M."""

import re

import pytest

from conftest import REPO
from gemma_grpo import api
from gemma_grpo import errors


def readme_example() -> str:
  readme = (REPO / "README.md").read_text()
  section = readme.split("## From Python", 1)[1]
  return re.search(r"```python\n(.*?)```", section, re.S)[1]


def example_output(stdout: str) -> tuple[list[float], float, str]:
  """(rewards, accuracy, completion) as README's example prints them; a
  completion may hold newlines, so the last lines are not enough."""
  printed = re.search(r"^\[([^\]\n]*)\]\n(\S+) (.*)", stdout, re.M | re.S)
  assert printed, stdout[-2000:]
  return [float(r) for r in printed[1].split(",")], float(printed[2]), printed[3]


def test_bad_overrides_raise_the_one_line_user_error():
  with pytest.raises(errors.UserError, match="unknown key 'max_stepz'"):
    api.load_config("configs/tiny.py", {"train.max_stepz": 2})
  with pytest.raises(errors.UserError, match="train.max_steps"):
    api.load_config("configs/tiny.py", {"train.max_steps": 0})
  assert api.load_config("configs/tiny.py", {"rollout.temperature": 0.5}).rollout.temperature == 0.5



def shout(arguments: str) -> str:
  """A module-level tool: loadable again by its import path."""
  return arguments.upper()


def test_use_tools_names_each_tool_by_its_import_path():
  c = api.load_config("configs/tiny.py")
  from gemma_grpo.tasks import tools  # pylint: disable=g-import-not-at-top

  assert api.use_tools(c, tools.calculator, shout) is c
  assert c.rollout.tools == "calculator,test_api:shout"
  assert tools.load_tools(c.rollout.tools)["shout"]("hi") == "HI"


def test_use_tools_refuses_a_tool_that_cannot_be_loaded_again_by_name():
  c = api.load_config("configs/tiny.py")
  with pytest.raises(errors.UserError, match="rollout.tools: .* is not a module-level function"):
    api.use_tools(c, lambda arguments: arguments)
