"""Functions a config names as "module:function" (rewards.custom, rollout.tools).

The user's own code, imported by path; every way the name can be wrong is one
`ValueError` line that starts with the config key and says what to fix.
"""

from __future__ import annotations

import importlib
from typing import Callable


def named_function(item: str, key: str) -> Callable:
  """The function that `item` ("module:function") names in config key `key`."""
  module_name, _, attr = item.partition(":")
  if not module_name or not attr:
    raise ValueError(f"{key}: {item!r} is not 'module:function'")
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise ValueError(f"{key}: cannot import {module_name!r} ({e}); is it on PYTHONPATH?") from None
  fn = getattr(module, attr, None)
  if not callable(fn):
    raise ValueError(f"{key}: {module_name} has no function {attr!r}")
  return fn
