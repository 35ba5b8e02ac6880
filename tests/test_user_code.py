"""Functions named in a config as "module:function"."""

import os.path

import pytest

from gemma_grpo import user_code


def test_a_named_function_is_imported():
  assert user_code.named_function("os.path:join", "rewards.custom") is os.path.join


@pytest.mark.parametrize("item, message", [
    ("no_colon", "rollout.tools: 'no_colon' is not 'module:function'"),
    (":f", "rollout.tools: ':f' is not 'module:function'"),
    ("os.path:", "rollout.tools: 'os.path:' is not 'module:function'"),
    ("no_such_module_xyz:f", "rollout.tools: cannot import 'no_such_module_xyz'"),
    ("os.path:no_such_function", "rollout.tools: os.path has no function 'no_such_function'"),
    ("os.path:sep", "rollout.tools: os.path has no function 'sep'"),  # not callable
])
def test_every_wrong_name_is_one_line_naming_the_key(item, message):
  with pytest.raises(ValueError) as e:
    user_code.named_function(item, "rollout.tools")
  assert str(e.value).startswith(message) and "\n" not in str(e.value)
