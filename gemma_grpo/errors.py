"""Errors a user can fix, reported as one line each and exit code 2."""

import contextlib
import sys

EXIT_BAD_INPUT = 2


class UserError(Exception):
  """Bad input: each line names the field or file, the value and the fix."""


@contextlib.contextmanager
def exit_on_user_error():
  """Turns a UserError into `error: <line>` on stderr and exit code 2.

  Tracebacks stay for bugs; a user who mistyped a flag gets one line per
  problem, all of them at once.
  """
  try:
    yield
  except UserError as e:
    for line in str(e).splitlines() or ["invalid input"]:
      print(f"error: {line}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_BAD_INPUT) from None
