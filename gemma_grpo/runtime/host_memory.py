"""Giving freed host memory back to the operating system.

On CPU, JAX's buffers come from the C library's malloc. glibc serves blocks
under its mmap threshold (which it raises to as much as 32 MB as large blocks
are freed) from heap arenas and keeps the pages of the ones freed. After a
rollout and a reference pass much of a run's resident memory is such free
heap, and the update's temporaries, the step's peak, land on top of it.
`malloc_trim` hands those pages back (what it returns and costs, measured:
docs/benchmarks/history.md, "One GRPO step against TRL").
"""

from __future__ import annotations

import ctypes
import functools
from typing import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
  try:
    return ctypes.CDLL(None).malloc_trim  # glibc only
  except (OSError, AttributeError):
    return None


def release_free_memory() -> bool:
  """Returns free heap pages to the OS; False where the C library cannot."""
  trim = _malloc_trim()
  if trim is None:
    return False
  trim(0)
  return True
