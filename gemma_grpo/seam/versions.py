"""The versions the touches were made for, and what every canary shares."""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect

from gemma_grpo import errors

SUPPORTED = {"google-tunix": "0.1.7", "qwix": "0.1.8"}


class UnsupportedVersion(errors.UserError, ImportError):
  """An installed Tunix or Qwix other than the one the touches were made for."""


def check_versions(installed: dict[str, str] | None = None) -> None:
  """Raises UnsupportedVersion, one line, unless every SUPPORTED version is installed."""
  for package, wanted in SUPPORTED.items():
    found = (installed or {}).get(package) if installed is not None else _version(package)
    if found != wanted:
      raise UnsupportedVersion(
          f"gemma-grpo needs {package}=={wanted} (it reaches into its internals,"
          f" gemma_grpo/seam), found {found or 'none'}; run `pip install -e .` in the checkout")


def _version(package: str) -> str | None:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


class TouchChanged(AssertionError):
  """An internal that gemma-grpo relies on has changed shape."""


def expect(ok: bool, touch: str, what: str) -> None:
  """Raises TouchChanged, naming the versions and the touch, unless `ok`."""
  if not ok:
    versions = ", ".join(f"{p} {_version(p)}" for p in SUPPORTED)
    raise TouchChanged(f"{versions}: touch {touch} changed: {what} (see gemma_grpo/seam)")


def params(fn) -> list[str]:
  return list(inspect.signature(fn).parameters)


def fingerprint(source: str) -> str:
  """A hash of `source` that ignores indentation, blank lines and comment lines."""
  lines = (line.strip() for line in source.splitlines())
  text = "\n".join(line for line in lines if line and not line.startswith("#"))
  return hashlib.sha256(text.encode()).hexdigest()[:16]
