"""`--config.a.b=value` on the command line: set one key, converted to its declared type."""

from __future__ import annotations

import ast

import ml_collections

from gemma_grpo import errors
from gemma_grpo.config.defaults import OPEN_SECTIONS
from gemma_grpo.config.files import frozen


def _parse_value(text: str, kind: type, key: str):
  if kind is bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
      return True
    if lowered in ("false", "0", "no"):
      return False
    raise errors.UserError(f"--config.{key}={text}: expected true or false")
  if kind is str:
    return text
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    raise errors.UserError(
        f"--config.{key}={text}: expected a {kind.__name__}"
    ) from None
  if kind is float and isinstance(value, int) and not isinstance(value, bool):
    value = float(value)
  if not isinstance(value, kind) or isinstance(value, bool):
    raise errors.UserError(f"--config.{key}={text}: expected a {kind.__name__}")
  return value


def _literal(text: str):
  """A Python literal (numbers, tuples, True), else the text itself."""
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text
  return frozen(value)


def override(c: ml_collections.ConfigDict, key: str, text: str) -> None:
  """Sets `c.<key>` from command-line text, converted to the field's type."""
  *parents, leaf = key.split(".")
  node = c
  for i, part in enumerate(parents):
    if part not in node or not isinstance(node[part], ml_collections.ConfigDict):
      where = ".".join(parents[:i]) or "config"
      valid = sorted(k for k, v in node.items() if isinstance(v, ml_collections.ConfigDict))
      raise errors.UserError(
          f"--config.{key}: {where} has no section {part!r}; sections: {', '.join(valid)}"
      )
    node = node[part]
  if leaf not in node and ".".join(parents) in OPEN_SECTIONS:
    with node.unlocked():  # a key of the user's own: its value as Python writes it
      node[leaf] = _literal(text)
    return
  if leaf not in node:
    raise errors.UserError(
        f"--config.{key}: unknown key {leaf!r}; valid keys here: "
        f"{', '.join(sorted(node.keys()))}"
    )
  if isinstance(node[leaf], ml_collections.ConfigDict):
    raise errors.UserError(f"--config.{key} is a section; set one of its keys")
  kind = node.get_ref(leaf).get_type()
  with node.unlocked():
    node[leaf] = _parse_value(text, kind, key)


def apply_overrides(c: ml_collections.ConfigDict, args: list[str]) -> list[str]:
  """Applies `--config.a.b=v` / `--config.a.b v` args; returns the rest."""
  rest, i = [], 0
  while i < len(args):
    arg = args[i]
    if arg.startswith("--config."):
      if "=" in arg:
        key, text = arg[len("--config."):].split("=", 1)
      elif i + 1 < len(args):
        key, text = arg[len("--config."):], args[i + 1]
        i += 1
      else:
        raise errors.UserError(f"{arg}: missing value (use {arg}=VALUE)")
      override(c, key, text)
    else:
      rest.append(arg)
    i += 1
  return rest
