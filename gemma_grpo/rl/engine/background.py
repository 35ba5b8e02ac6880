"""One piece of engine work at a time, off the caller's thread.

With a device group of its own (mesh.rollout_devices), the engine can decode
while the trainer updates on the other group. The work runs on one worker
thread; anything else that touches the engine first waits for it (`settle`),
so the engine never serves two callers at once, and what the work computes
does not depend on when it ran: only on the state it was started from.
"""

from __future__ import annotations

from concurrent import futures
import threading
from typing import Callable


class Worker:
  """At most one background call in flight; `settle` waits for it."""

  def __init__(self):
    self._executor: futures.ThreadPoolExecutor | None = None
    self._pending: futures.Future | None = None
    self._thread: int | None = None

  def start(self, fn: Callable[[], object]) -> None:
    """Runs `fn()` on the worker, after any call still in flight."""
    self.settle()
    if self._executor is None:
      self._executor = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
    self._pending = self._executor.submit(self._run, fn)

  def _run(self, fn):
    self._thread = threading.get_ident()
    return fn()

  def settle(self) -> None:
    """Waits for the call in flight; raises what it raised. A no-op on the worker itself."""
    if self._pending is None or threading.get_ident() == self._thread:
      return
    pending, self._pending = self._pending, None
    pending.result()

  def busy(self) -> bool:
    return self._pending is not None and not self._pending.done()

  def close(self) -> None:
    """Waits for the call in flight, then stops the worker."""
    try:
      self.settle()
    finally:
      if self._executor is not None:
        self._executor.shutdown(wait=True)
        self._executor = None
