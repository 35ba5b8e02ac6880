"""Config files: run a Python config file's get_config(); save and reload a run's config as JSON."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import sys
import traceback

import ml_collections

from gemma_grpo import errors
from gemma_grpo import storage
from gemma_grpo.config.defaults import defaults
from gemma_grpo.config.defaults import OPEN_SECTIONS


def load(path: str) -> ml_collections.ConfigDict:
  """Runs `get_config()` of a config file given by path."""
  file = pathlib.Path(path)
  if not file.is_file():
    raise errors.UserError(
        f"--config: no such file {path!r}; pass e.g. configs/gemma3_270m.py"
    )
  # A config file may start from a sibling (`from configs import gemma3_270m`):
  # the folder above its own makes `configs` importable from any directory.
  root = str(file.resolve().parent.parent)
  if root not in sys.path:
    sys.path.insert(0, root)
  spec = importlib.util.spec_from_file_location(f"_config_{file.stem}", file)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
      raise errors.UserError(f"--config: {path} has no get_config() function")
    c = module.get_config()
  except errors.UserError:
    raise
  except Exception as e:  # pylint: disable=broad-exception-caught
    # A user's config file is input: say where it failed in one line.
    raise errors.UserError(f"--config {_where(e, file)}: {_first_line(e)}") from None
  if not isinstance(c, ml_collections.ConfigDict):
    raise errors.UserError(f"--config: get_config() of {path} returned a {type(c).__name__}, not a ConfigDict")
  missing = _missing_fields(c)
  if missing:
    shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
    raise errors.UserError(
        f"--config: {path} lacks {shown}, which gemma_grpo.config.defaults() has; start get_config()"
        f" from config.defaults() (as configs/tiny.py does) or add them")
  _freeze(c)
  return c


def _missing_fields(c: ml_collections.ConfigDict) -> list[str]:
  """Fields of the defaults that `c` lacks (a config written for an older version)."""
  missing = []

  def walk(defaults, node, prefix):
    for key in defaults.keys():
      if key not in node:
        missing.append(prefix + key)
      elif isinstance(defaults[key], ml_collections.ConfigDict) and isinstance(node[key], ml_collections.ConfigDict):
        walk(defaults[key], node[key], f"{prefix}{key}.")

  walk(defaults(), c, "")
  return missing


def _where(e: BaseException, file: pathlib.Path) -> str:
  """`path:line` of the deepest frame of `e` inside the config file."""
  if isinstance(e, SyntaxError) and e.lineno:
    return f"{e.filename or file}:{e.lineno}"
  line = None
  for frame in traceback.extract_tb(e.__traceback__):
    if pathlib.Path(frame.filename).resolve() == file.resolve():
      line = frame.lineno
  return f"{file}:{line}" if line else str(file)


def _first_line(e: BaseException) -> str:
  text = str(e).strip().strip("'\"")
  hint = ""
  if "Did you mean" in text:  # ml_collections' suggestion for a mistyped key
    hint = "; " + text[text.index("Did you mean"):].splitlines()[0]
  if isinstance(e, ModuleNotFoundError) and e.name in ("configs", "configs.base"):
    # Older config files began `from configs import base`, which only the repo provides.
    hint = "; start from the library's defaults: `from gemma_grpo import config` and `config.defaults()`"
  text = text.split(". Other fields present")[0]
  if isinstance(e, SyntaxError):
    text = e.msg
  return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}{hint}"


def as_json(c: ml_collections.ConfigDict) -> str:
  """The text of a run's config.json: the resolved config (no secrets live in configs)."""
  return c.to_json_best_effort(indent=2) + "\n"


def save(c: ml_collections.ConfigDict, path: str | os.PathLike) -> None:
  """Writes the resolved config beside the run."""
  storage.write_text(storage.path(path), as_json(c))


def frozen(value):
  """`value` with every list, at any depth, a tuple: the form a config holds.

  JSON has only arrays, and a user may write a list where the defaults hold a
  tuple; frozen, a config equals itself after a save and reload.
  """
  if isinstance(value, (list, tuple)):
    return tuple(frozen(v) for v in value)
  if isinstance(value, dict):
    return {k: frozen(v) for k, v in value.items()}
  return value


def _freeze(node: ml_collections.ConfigDict) -> None:
  """Lists as tuples, and every section locked as defaults() locks it (a
  section that a config file replaced comes unlocked)."""
  for key in list(node.keys()):
    if isinstance(node[key], ml_collections.ConfigDict):
      _freeze(node[key])
    elif isinstance(node[key], (list, tuple)) and node[key] != frozen(node[key]):
      value = frozen(node[key])
      with node.unlocked():  # a list-typed field keeps lists: make it a tuple field
        del node[key]
        node[key] = value
  node.lock()


def _assign(node: ml_collections.ConfigDict, values: dict, prefix: str) -> None:
  open_section = prefix.rstrip(".") in OPEN_SECTIONS
  for key, value in values.items():
    if key not in node and not open_section:
      raise errors.UserError(f"{prefix}{key}: not a config key of this version")
    if key in node and isinstance(node[key], ml_collections.ConfigDict):
      if not isinstance(value, dict):
        raise errors.UserError(f"{prefix}{key}: {value!r} where a section belongs; restore the saved config.json")
      _assign(node[key], value, f"{prefix}{key}.")
      continue
    try:
      with node.unlocked():
        node[key] = frozen(value)
    except TypeError:
      raise errors.UserError(
          f"{prefix}{key}: {value!r} is not a {node.get_ref(key).get_type().__name__};"
          " restore the saved config.json") from None


def load_saved(path: str | os.PathLike) -> ml_collections.ConfigDict:
  """The config a run saved as JSON, rebuilt on top of the defaults (types kept)."""
  file = storage.path(path)
  if not file.is_file():
    raise errors.UserError(f"{file}: missing; is this a gemma-grpo work directory?")
  try:
    values = json.loads(file.read_text())
  except json.JSONDecodeError as e:
    raise errors.UserError(f"{file}: not valid JSON ({e.msg})") from None
  c = defaults()
  _assign(c, values, "")
  _freeze(c)
  return c
