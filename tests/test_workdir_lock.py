"""The work directory's lease: one trainer at a time, on a local disk and in a bucket.

End to end (a second `train` refused while the first one runs) is in
tests/test_reliability.py's `preempted` runs; these tests drive the lease
directly, with real processes where liveness matters.
"""

import json
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from gemma_grpo import errors
from gemma_grpo import storage
from gemma_grpo.runtime import workdir_lock


def _dead_pid() -> int:
  proc = subprocess.Popen([sys.executable, "-c", "pass"])
  proc.wait()
  return proc.pid


def _write_holder(work, *, host=None, pid, beat_age_s=0.0, token="theirs"):
  work.mkdir(parents=True, exist_ok=True)
  (work / workdir_lock.LOCK_NAME).write_text(json.dumps({
      "host": host or socket.gethostname(), "pid": pid, "since": "2026-12-01 09:00:00 UTC",
      "beat": time.time() - beat_age_s, "token": token}))


@pytest.fixture(params=["local", "gs"])
def work(request, tmp_path):
  if request.param == "local":
    return storage.path(tmp_path / "run")
  request.getfixturevalue("gcs_server")
  return storage.path(f"gs://test-bucket/lease-{request.node.name.split('[')[0]}-{time.time_ns()}")


def test_a_lease_names_this_process_and_is_gone_after_release(work):
  lease = workdir_lock.Lease(work, settle_s=0.1).acquire()
  record = json.loads((work / workdir_lock.LOCK_NAME).read_text())
  assert (record["host"], record["pid"]) == (socket.gethostname(), __import__("os").getpid())
  lease.release()
  assert not (work / workdir_lock.LOCK_NAME).exists()


def test_a_live_holder_is_refused_in_one_line_naming_it(work):
  with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as holder:
    try:
      written = time.time()
      _write_holder(work, pid=holder.pid, beat_age_s=3)
      with pytest.raises(errors.UserError) as e:
        workdir_lock.Lease(work, settle_s=0.1).acquire()
      elapsed = time.time() - written  # a bucket's round trips can take seconds
    finally:
      holder.kill()
  message = str(e.value)
  assert "\n" not in message
  assert f"--workdir {work} is in use by another trainer: pid {holder.pid} on host" in message
  ago = re.search(r"since 2026-12-01 09:00:00 UTC \(last heartbeat (\d+) s ago\)", message)
  assert ago and 3 <= int(ago[1]) <= round(3 + elapsed), message
  assert json.loads((work / workdir_lock.LOCK_NAME).read_text())["token"] == "theirs"


@pytest.mark.parametrize("holder, beat_age_s", [
    ("dead process on this host", 0.0),
    ("other host, no heartbeat for longer than the lease", workdir_lock.STALE_AFTER_S + 5),
])
def test_a_stale_lease_is_taken_over(work, holder, beat_age_s):
  host = None if holder.startswith("dead") else "another-host"
  pid = _dead_pid() if holder.startswith("dead") else 1
  _write_holder(work, host=host, pid=pid, beat_age_s=beat_age_s)
  lease = workdir_lock.Lease(work, settle_s=0.1).acquire()
  assert json.loads((work / workdir_lock.LOCK_NAME).read_text())["token"] != "theirs"
  lease.release()


def test_another_host_with_a_recent_heartbeat_is_live(work):
  _write_holder(work, host="another-host", pid=_dead_pid(), beat_age_s=30)
  with pytest.raises(errors.UserError, match="pid .* on host another-host"):
    workdir_lock.Lease(work, settle_s=0.1).acquire()


def test_the_heartbeat_keeps_the_lease_fresh(work):
  lease = workdir_lock.Lease(work, beat_every_s=0.2, settle_s=0.1).acquire()
  first = json.loads((work / workdir_lock.LOCK_NAME).read_text())["beat"]
  time.sleep(1.0)
  later = json.loads((work / workdir_lock.LOCK_NAME).read_text())["beat"]
  lease.release()
  assert later > first


def _take_lease(work, settle_s: float, results: list) -> None:
  """A trainer starting: appends its Lease, or the UserError refusing it."""
  try:
    results.append(workdir_lock.Lease(work, settle_s=settle_s).acquire())
  except errors.UserError as e:
    results.append(e)


def test_of_two_trainers_starting_at_once_exactly_one_gets_the_lease(work):
  results = []
  threads = [threading.Thread(target=_take_lease, args=(work, 0.5, results)) for _ in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  leases = [r for r in results if isinstance(r, workdir_lock.Lease)]
  assert len(leases) == 1, results
  assert "is in use by another trainer" in str(next(r for r in results if r not in leases))
  leases[0].release()


def test_a_lease_still_being_written_is_never_taken_for_none(tmp_path, monkeypatch):
  # The first trainer stalls while writing its record (a busy host), the
  # second starts meanwhile: it must not read the lease as absent and take it.
  # Local disks only: a bucket has no atomic create, and there the settle
  # time (workdir_lock.SETTLE_S) is what bounds a stall between two writers.
  work = storage.path(tmp_path / "run")
  record = workdir_lock.Lease._record
  first_writing = threading.Event()

  def slow_first_record(self):
    if not first_writing.is_set():
      first_writing.set()
      time.sleep(0.5)
    return record(self)

  monkeypatch.setattr(workdir_lock.Lease, "_record", slow_first_record)
  results = []
  threads = [threading.Thread(target=_take_lease, args=(work, 0.1, results)) for _ in range(2)]
  threads[0].start()
  assert first_writing.wait(timeout=10)
  threads[1].start()
  for t in threads:
    t.join()
  leases = [r for r in results if isinstance(r, workdir_lock.Lease)]
  names = [p.name for p in work.iterdir()]
  for lease in leases:
    lease.release()
  assert len(leases) == 1, results
  assert names == [workdir_lock.LOCK_NAME]  # no record left aside


LOSER = """
import sys, time
from gemma_grpo import storage
from gemma_grpo.runtime import workdir_lock
lease = workdir_lock.Lease(storage.path(sys.argv[1]), beat_every_s=0.2, settle_s=0.1).acquire()
print("held", flush=True)
time.sleep(30)
"""


def test_a_trainer_that_lost_its_lease_stops_at_once_without_writing(tmp_path):
  work = tmp_path / "run"
  proc = subprocess.Popen([sys.executable, "-c", LOSER, str(work)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  assert proc.stdout.readline() == "held\n"
  # Another trainer took the lease over (this one looked stale to it).
  _write_holder(work, host="another-host", pid=7, token="theirs")
  code = proc.wait(timeout=20)
  err = proc.stderr.read()
  assert code == errors.EXIT_BAD_INPUT
  assert (f"error: lost the lease on --workdir {work} to pid 7 on host another-host" in err)
  assert json.loads((work / workdir_lock.LOCK_NAME).read_text())["token"] == "theirs"


def test_a_refused_start_leaves_no_directory_behind(tmp_path):
  lease = workdir_lock.Lease(storage.path(tmp_path / "new"), settle_s=0.1).acquire()
  lease.release()
  assert not (tmp_path / "new").exists()


def test_a_file_in_the_way_is_one_line(tmp_path):
  (tmp_path / "f").write_text("x")
  with pytest.raises(errors.UserError, match="exists and is not a directory"):
    workdir_lock.Lease(storage.path(tmp_path / "f")).acquire()
