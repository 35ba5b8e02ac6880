"""One piece of engine work at a time, off the caller's thread (rl/engine/background.py)."""

import threading

import pytest

from gemma_grpo.rl.engine import background


def test_settle_waits_for_the_call_in_flight_and_raises_what_it_raised():
  worker = background.Worker()
  release, order = threading.Event(), []

  def slow():
    release.wait(timeout=10)
    order.append("work")

  worker.start(slow)
  assert worker.busy()
  threading.Timer(0.2, release.set).start()
  worker.settle()
  order.append("after")
  assert order == ["work", "after"] and not worker.busy()

  def broken():
    raise ValueError("decode failed")

  worker.start(broken)
  with pytest.raises(ValueError, match="decode failed"):
    worker.settle()
  worker.settle()  # raised once; nothing is in flight now
  worker.close()


def test_a_second_start_waits_for_the_first_and_the_work_may_settle_itself():
  worker = background.Worker()
  seen = []

  def first():
    worker.settle()  # on the worker itself: a no-op, not a deadlock
    seen.append(("first", threading.current_thread().name))

  worker.start(first)
  worker.start(lambda: seen.append(("second", threading.current_thread().name)))
  worker.close()
  assert [name for name, _ in seen] == ["first", "second"]
  assert all(thread.startswith("engine") for _, thread in seen)
  assert threading.current_thread().name not in {thread for _, thread in seen}
