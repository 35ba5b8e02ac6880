"""One trainer per work directory: a lease file with a heartbeat.

`WORKDIR/trainer.lock` names the trainer that holds the directory (host, pid,
since when) and its heartbeat, rewritten every BEAT_EVERY_S seconds. A second
`train` or `sft` on the directory refuses in one line while the lease is live.
A lease is stale, and taken over with a warning, once its heartbeat is older
than STALE_AFTER_S, or at once when it names a process of this host that is
gone. So a trainer that exits (done, error or signal) frees the directory at
once, and one that was killed frees it within STALE_AFTER_S.

Taking the lease works the same on a local disk and in a bucket: read it,
write our record, wait SETTLE_S, read it back; of two trainers that start in
the same instant, the later write wins and the other refuses. (gcsfs has no
create-if-absent; locally the first create is also atomic: the record is
hard-linked into place, so no trainer ever reads a lease half written.) Every
heartbeat reads the lease before rewriting it: a trainer that finds another's
record (it was frozen past STALE_AFTER_S and was taken over) stops at once,
writing nothing more, with exit code 2.

In a run of several processes, process 0 holds the lease for all of them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import socket
import sys
import threading
import time
import uuid

from absl import logging
from etils import epath

from gemma_grpo import errors
from gemma_grpo import storage

LOCK_NAME = "trainer.lock"
BEAT_EVERY_S = 10.0
STALE_AFTER_S = 60.0
SETTLE_S = 1.0


@dataclasses.dataclass(frozen=True)
class Holder:
  host: str
  pid: int
  since: str  # UTC, ISO 8601
  beat: float  # time.time() of the last heartbeat
  token: str

  def describe(self, now: float) -> str:
    ago = max(0, round(now - self.beat))
    return (f"pid {self.pid} on host {self.host}, since {self.since}"
            f" (last heartbeat {ago} s ago)")


def _read(lock: epath.Path) -> Holder | None:
  """The lease's record; None when there is none or it cannot be parsed."""
  try:
    record = json.loads(lock.read_text())
    return Holder(host=str(record["host"]), pid=int(record["pid"]),
                  since=str(record["since"]), beat=float(record["beat"]),
                  token=str(record["token"]))
  except (FileNotFoundError, ValueError, KeyError, TypeError):
    return None


def _process_exists(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def is_live(holder: Holder, now: float, stale_after_s: float = STALE_AFTER_S) -> bool:
  if now - holder.beat > stale_after_s:
    return False
  if holder.host == socket.gethostname():
    return _process_exists(holder.pid)
  return True


class Lease:
  """This process's hold on a work directory; `release()` gives it up."""

  def __init__(self, work: epath.Path, *, beat_every_s: float = BEAT_EVERY_S,
               stale_after_s: float = STALE_AFTER_S, settle_s: float = SETTLE_S):
    self.work = work
    self.lock = work / LOCK_NAME
    self._beat_every_s = beat_every_s
    self._stale_after_s = stale_after_s
    self._settle_s = settle_s
    self._mine = Holder(
        host=socket.gethostname(), pid=os.getpid(),
        since=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        beat=time.time(), token=uuid.uuid4().hex)
    self._made_dir = False
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None
    self._lock_io = threading.Lock()  # the heartbeat and release() never interleave

  def acquire(self) -> "Lease":
    """Takes the lease or raises UserError naming the trainer that holds it."""
    if storage.is_remote(self.work):
      storage.check_writable(self.work)  # a bucket has no directories to make
    else:
      if self.work.exists() and not self.work.is_dir():
        raise errors.UserError(f"--workdir {self.work}: exists and is not a directory")
      self._made_dir = not self.work.exists()
      try:
        self.work.mkdir(parents=True, exist_ok=True)
      except OSError as e:
        raise errors.UserError(
            f"--workdir {self.work}: cannot create it ({e.strerror}); pass a writable path"
        ) from None
    held = _read(self.lock)
    created = held is None and self._create_exclusively()
    if not created and held is None and not storage.is_remote(self.lock):
      held = _read(self.lock)  # created by another trainer since we looked
    if held is not None and is_live(held, time.time(), self._stale_after_s):
      raise self._refusal(held)
    if held is not None:
      logging.warning("%s: taking over the lease of %s, whose trainer is gone", self.lock,
                      held.describe(time.time()))
    if not created:
      self._write()
      time.sleep(self._settle_s)
      now_held = _read(self.lock)
      if now_held is None or now_held.token != self._mine.token:
        raise self._refusal(now_held or held)
    self._thread = threading.Thread(target=self._heartbeat, name="workdir-lease", daemon=True)
    self._thread.start()
    return self

  def release(self) -> None:
    """Stops the heartbeat and removes the lease if it is still ours."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=5)
      self._thread = None
    with self._lock_io:
      held = _read(self.lock)
      if held is not None and held.token == self._mine.token:
        with contextlib.suppress(FileNotFoundError):
          self.lock.unlink()
    if self._made_dir:  # a run refused before it wrote anything leaves no trace
      with contextlib.suppress(OSError):
        self.work.rmdir()

  def _refusal(self, held: Holder | None) -> errors.UserError:
    who = held.describe(time.time()) if held else "a trainer that started at the same moment"
    return errors.UserError(
        f"--workdir {self.work} is in use by another trainer: {who}; stop that run first or"
        f" pass another --workdir (the lease {self.lock} expires {self._stale_after_s:.0f} s"
        " after its trainer's last heartbeat)")

  def _record(self) -> str:
    return json.dumps(dataclasses.asdict(self._mine)) + "\n"

  def _create_exclusively(self) -> bool:
    """Local only: creates the lease file, record and all, unless it exists. False on GCS.

    The record is written aside and hard-linked into place, so the lease
    appears complete or not at all: a file created empty and written after
    could be read as "no lease" by a trainer starting at that moment, which
    would then write its own over it and hold the lease too.
    """
    if storage.is_remote(self.lock):
      return False
    aside = self.lock.with_name(f".{self.lock.name}.{self._mine.token}")
    aside.write_text(self._record())
    try:
      os.link(aside, self.lock)
    except FileExistsError:
      return False
    finally:
      aside.unlink(missing_ok=True)
    return True

  def _write(self) -> None:
    storage.write_text(self.lock, self._record())

  def _heartbeat(self) -> None:
    while not self._stop.wait(self._beat_every_s):
      with self._lock_io:
        if self._stop.is_set():
          return
        try:
          held = _read(self.lock)
          if held is not None and held.token != self._mine.token:
            self._lost(held)
          self._mine = dataclasses.replace(self._mine, beat=time.time())
          self._write()
        except OSError as e:
          # A bucket that is briefly unreachable: the next beat tries again;
          # the lease only goes stale after STALE_AFTER_S of failures.
          logging.warning("%s: heartbeat failed (%s); retrying", self.lock, e)

  def _lost(self, held: Holder) -> None:
    print(f"error: lost the lease on --workdir {self.work} to {held.describe(time.time())}:"
          " this process was unresponsive for longer than the lease allows; stopping without"
          " writing anything more", file=sys.stderr, flush=True)
    os._exit(errors.EXIT_BAD_INPUT)  # pylint: disable=protected-access


@contextlib.contextmanager
def held(work: epath.Path, *, take: bool = True):
  """Holds the work directory's lease for the block (`take=False`: no-op)."""
  if not take:
    yield None
    return
  lease = Lease(work).acquire()
  try:
    yield lease
  finally:
    lease.release()
