"""Several processes, one JAX runtime: ranks, start-up agreement, failing fast.

Multi-host training is JAX's own multi-controller runtime: every process runs
the same program on its local devices, `jax.distributed` joins them into one
set of global devices, and collectives cross hosts (ICI/DCN on TPU, NCCL on
GPU, gloo on CPU). Every process reads the same data with the same seeds and
holds the same batch; only process 0 writes files.

How a process learns its rank (the first that applies wins):
  1. flags: --coordinator HOST:PORT --num-processes N --process-id I
  2. environment: JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID
  3. a cluster JAX detects by itself: a Cloud TPU slice of several hosts
     (TPU_WORKER_HOSTNAMES), SLURM with SLURM_NTASKS > 1, or any environment
     jax.distributed.initialize() understands when GEMMA_GRPO_DISTRIBUTED=1
  otherwise the run is one process.

A process that fails posts one line to the coordination service before it
exits; a watchdog thread in every other process reads it within a second and
exits with EXIT_PEER_FAILED and that line. A process that vanishes (SIGKILL,
a lost host) stops its heartbeat counter; the others notice within
STALE_AFTER_S seconds. Without this, the survivors would wait in their next
collective until JAX's own timeouts (minutes) and then abort with a C++ trace.

The watchdog reads the coordination service's key-value store through
seam.jax_distributed (JAX has no public API for it), because a collective
cannot run on a background thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import sys
import threading
import time
import traceback

import numpy as np

from gemma_grpo import errors

# Deferred imports (jax, gemma_grpo.seam.jax_distributed): the CLI imports this
# module to read its rank flags before it checks the config, and JAX takes
# seconds to import, so each function that needs JAX imports it itself.

EXIT_PEER_FAILED = 4
# A vanished peer is declared lost after this long without a heartbeat. JAX's
# own heartbeat timeout is longer, so this one-line report always comes first.
STALE_AFTER_S = 20.0
JAX_HEARTBEAT_TIMEOUT_S = 60
# A process that failed waits this long for the others to read its report.
_REPORT_GRACE_S = 5.0
_PREFIX = "gemma_grpo/"
_FAILED_KEY = _PREFIX + "failed"
_ACK_KEY = _PREFIX + "acknowledged/{}"
_BEAT_KEY = _PREFIX + "beat/{}"
_DONE_KEY = _PREFIX + "done/{}"
_watchdog: "Watchdog | None" = None
_before_exit: list = []


@dataclasses.dataclass(frozen=True)
class Rank:
  """Where this process stands; `coordinator` None means JAX detects it."""

  coordinator: str | None
  num_processes: int | None
  process_id: int | None
  source: str  # "flags", "environment", "cluster", or "single"

  @property
  def distributed(self) -> bool:
    return self.source != "single"


def add_flags(parser) -> None:
  """--coordinator, --num-processes, --process-id on an argparse parser."""
  group = parser.add_argument_group(
      "several processes (one per host; see launch/README.md)")
  group.add_argument("--coordinator", metavar="HOST:PORT",
                     help="address of process 0's coordination service"
                          " (env JAX_COORDINATOR_ADDRESS)")
  group.add_argument("--num-processes", type=int, metavar="N",
                     help="how many processes run this command (env JAX_NUM_PROCESSES)")
  group.add_argument("--process-id", type=int, metavar="I",
                     help="this process's rank, 0..N-1 (env JAX_PROCESS_ID)")


def _cluster_detected(env) -> bool:
  hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
  slurm_tasks = env.get("SLURM_NTASKS", "1")
  return (len(hosts) > 1
          or ("SLURM_JOB_ID" in env and slurm_tasks.isdigit() and int(slurm_tasks) > 1)
          or env.get("GEMMA_GRPO_DISTRIBUTED") == "1")


def _int_setting(env_name: str, value, env) -> int | None:
  if value is not None:
    return value
  text = env.get(env_name)
  if text is None or text == "":
    return None
  if not text.strip().isdigit():
    raise errors.UserError(f"{env_name}={text!r}: not a non-negative integer")
  return int(text)


def resolve_rank(args=None, env=None) -> Rank:
  """The rank from flags (`args` of add_flags), else environment, else cluster."""
  env = os.environ if env is None else env
  coordinator = getattr(args, "coordinator", None) or env.get("JAX_COORDINATOR_ADDRESS") or None
  flags_given = any(getattr(args, name, None) is not None
                    for name in ("coordinator", "num_processes", "process_id"))
  num = _int_setting("JAX_NUM_PROCESSES", getattr(args, "num_processes", None), env)
  pid = _int_setting("JAX_PROCESS_ID", getattr(args, "process_id", None), env)
  if num is None and pid is None and not flags_given:
    if _cluster_detected(env):
      return Rank(None, None, None, "cluster")
    if coordinator:
      raise errors.UserError(
          f"JAX_COORDINATOR_ADDRESS={coordinator} is set but not how many processes"
          " run or which one this is; set JAX_NUM_PROCESSES and JAX_PROCESS_ID"
          " (or pass --num-processes and --process-id)")
    return Rank(None, None, None, "single")
  source = "flags" if flags_given else "environment"
  missing = [flag for flag, value in (("--coordinator", coordinator),
                                      ("--num-processes", num), ("--process-id", pid))
             if value is None]
  if missing:
    raise errors.UserError(
        f"{', '.join(missing)}: missing; several processes need all of --coordinator"
        " HOST:PORT, --num-processes N and --process-id I (or JAX_COORDINATOR_ADDRESS,"
        " JAX_NUM_PROCESSES, JAX_PROCESS_ID)")
  host, _, port = coordinator.rpartition(":")
  if not host or not port.isdigit():
    raise errors.UserError(f"--coordinator {coordinator}: expected HOST:PORT, e.g. 10.0.0.2:1234")
  if num < 1:
    raise errors.UserError(f"--num-processes {num}: must be at least 1")
  if not 0 <= pid < num:
    raise errors.UserError(
        f"--process-id {pid}: must be in 0..{num - 1} for --num-processes {num}")
  if num == 1:
    return Rank(None, None, None, "single")
  return Rank(coordinator, num, pid, source)


def initialize(rank: Rank) -> None:
  """Joins the JAX runtime of `rank` (nothing for one process); starts the watchdog.

  Must run before anything touches a device.
  """
  if not rank.distributed:
    return
  import jax  # pylint: disable=g-import-not-at-top

  try:
    jax.distributed.initialize(
        coordinator_address=rank.coordinator, num_processes=rank.num_processes,
        process_id=rank.process_id, heartbeat_timeout_seconds=JAX_HEARTBEAT_TIMEOUT_S,
        shutdown_timeout_seconds=JAX_HEARTBEAT_TIMEOUT_S)
  except (RuntimeError, ValueError) as e:
    first = (str(e).strip().splitlines() or [""])[0][:200]
    where = rank.coordinator or "the detected cluster"
    raise errors.UserError(
        f"could not join the other processes through {where} ({type(e).__name__}:"
        f" {first}); check that every process got the same coordinator and process"
        " count and that process 0 is running") from None
  # One line per process, so a log shows how the run was joined.
  print(f"jax.distributed: process {jax.process_index()} of {jax.process_count()}"
        f" (rank from {rank.source}), {jax.device_count()} devices, {jax.local_device_count()}"
        " of them here", file=sys.stderr, flush=True)
  global _watchdog
  _watchdog = Watchdog(_client(), jax.process_index(), jax.process_count())
  _watchdog.start()


@contextlib.contextmanager
def failures_reported():
  """In a run of several processes, a failure here stops all of them.

  A UserError prints its `error:` lines, anything else its traceback; then the
  other processes are told in one line and this one exits (2 for bad input,
  the exit status for SystemExit, 1 otherwise). One process: no change.
  """
  if _watchdog is None:
    yield
    return

  try:
    yield
  except errors.UserError as e:
    lines = str(e).splitlines() or ["invalid input"]
    for line in lines:
      print(f"error: {line}", file=sys.stderr, flush=True)
    report_failure_and_exit(f"error: {lines[0]}", errors.EXIT_BAD_INPUT)
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else 1
    report_failure_and_exit(f"exited with status {code}", code)
  except BaseException as e:  # pylint: disable=broad-exception-caught
    first = (str(e).strip().splitlines() or [""])[0][:200]
    if _lost_a_peer(e):
      # The other side of a collective is gone. If it failed and said why, the
      # watchdog reads that within a second and exits with its line; else ours.
      time.sleep(_REPORT_GRACE_S / 2)
      line = (f"a collective with the other processes failed ({first}): another process"
              " stopped or its host is unreachable; stopping this process too")
      print(f"error: {line}", file=sys.stderr, flush=True)
      report_failure_and_exit(line, EXIT_PEER_FAILED)
    traceback.print_exc()
    report_failure_and_exit(f"{type(e).__name__}: {first}", 1)


# How a collective reports a peer that went away: gloo (CPU) and NCCL (GPU).
_PEER_LOSS_SIGNS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                    "NCCL operation", "ncclRemoteError")


def _lost_a_peer(error: BaseException) -> bool:
  text = str(error)
  return type(error).__name__ == "JaxRuntimeError" and any(s in text for s in _PEER_LOSS_SIGNS)


def finish(code: int) -> int:
  """Ends this process's part in a run; returns `code`.

  Success and an agreed stop by signal (128+N) end every process alike. Any
  other status may be this process's alone (a reward function that raised
  here only), so the others are told, as for an exception.
  """
  if _watchdog is None:
    return code
  if code and code < 128:
    report_failure_and_exit(f"exited with status {code}", code)
  _watchdog.close()
  return code


def _client():
  from gemma_grpo.seam import jax_distributed  # pylint: disable=g-import-not-at-top

  return jax_distributed.coordination_client()


def process_count() -> int:
  import jax  # pylint: disable=g-import-not-at-top

  return jax.process_count()


def is_chief() -> bool:
  """True in the process that writes files (process 0)."""
  import jax  # pylint: disable=g-import-not-at-top

  return jax.process_index() == 0


def fingerprint(text: str) -> int:
  """A 62-bit digest of `text`, to compare across processes as an integer."""
  return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 2


def check_same(what: str, text: str, fix: str) -> None:
  """Raises UserError unless every process holds the same `text`.

  A collective: every process must call it at the same point.
  """
  if process_count() == 1:
    return
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

  digests = np.asarray(multihost_utils.process_allgather(
      np.array([fingerprint(text)], dtype=np.int64))).reshape(-1)
  differ = [i for i, d in enumerate(digests) if d != digests[0]]
  if differ:
    raise errors.UserError(
        f"{what} differs between processes (process {differ[0]} against process 0); {fix}")


def from_chief(array: np.ndarray) -> np.ndarray:
  """Process 0's `array` in every process (a collective), so that what the
  host computes (a tool's result) enters every process's program alike."""
  if process_count() == 1:
    return array
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

  return np.array(multihost_utils.broadcast_one_to_all(array))  # writable, as given


def largest(value: int) -> int:
  """The largest of `value` over all processes (a collective)."""
  if process_count() == 1:
    return value
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

  return int(np.asarray(multihost_utils.process_allgather(np.array([value]))).max())


def report_failure_and_exit(line: str, code: int) -> None:
  """Tells the other processes why this one stops, then exits at once.

  Skips JAX's shutdown barrier, which would wait minutes for processes that
  are stuck in a collective this one will never join. Process 0 hosts the
  coordination service, so it leaves last: it waits until the others have
  read the report (or a few seconds), because they abort the moment it is
  gone.
  """
  client = _client()
  import jax  # pylint: disable=g-import-not-at-top

  me = jax.process_index()
  try:
    client.key_value_set(_FAILED_KEY, f"process {me}: {line}", allow_overwrite=False)
  except Exception:  # pylint: disable=broad-exception-caught
    pass  # another process reported first, or the coordinator is gone
  if me == 0:
    _wait_for_acknowledgements(client, [p for p in range(1, jax.process_count())])
  _exit(code)


def _wait_for_acknowledgements(client, processes: list[int]) -> None:
  """Until each of `processes` has read the failure report (bounded)."""
  deadline = time.monotonic() + _REPORT_GRACE_S
  while processes and time.monotonic() < deadline:
    try:
      processes = [p for p in processes if not _try_get(client, _ACK_KEY.format(p))]
    except Exception:  # pylint: disable=broad-exception-caught
      return
    time.sleep(0.2)
  time.sleep(0.5)  # they exit right after acknowledging


def before_hard_exit(callback) -> None:
  """Runs `callback()` when this module ends the process with os._exit
  (which skips `finally` blocks and atexit), e.g. to release a lease."""
  _before_exit.append(callback)


def _exit(code: int) -> None:
  for callback in _before_exit:
    try:
      callback()
    except Exception:  # pylint: disable=broad-exception-caught
      pass  # exiting anyway; the lease then expires by itself
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


def _try_get(client, key: str) -> str | None:
  try:
    return client.key_value_try_get(key)
  except Exception as e:  # pylint: disable=broad-exception-caught
    if "NOT_FOUND" in str(e) or "not found" in str(e).lower():
      return None
    raise


class Watchdog(threading.Thread):
  """Exits this process when another one failed or vanished; see the module doc."""

  def __init__(self, client, process_id: int, num_processes: int, *,
               stale_after: float = STALE_AFTER_S, poll: float = 1.0):
    super().__init__(name="gemma-grpo-watchdog", daemon=True)
    self._client = client
    self._me = process_id
    self._peers = [p for p in range(num_processes) if p != process_id]
    self._stale_after = stale_after
    self._poll = poll
    self._closed = threading.Event()

  def close(self) -> None:
    """Stops watching; the others stop watching this process."""
    self._closed.set()
    try:
      self._client.key_value_set(_DONE_KEY.format(self._me), "1", allow_overwrite=True)
    except Exception:  # pylint: disable=broad-exception-caught
      pass

  def run(self):
    beat = 0
    seen = {p: (None, time.monotonic()) for p in self._peers}
    while not self._closed.is_set():
      beat += 1
      try:
        self._client.key_value_set(_BEAT_KEY.format(self._me), str(beat), allow_overwrite=True)
        # One read of every key of ours: two calls a second per process, however many
        # processes (reading each peer's keys would load process 0 quadratically).
        keys = dict(self._client.key_value_dir_get(_PREFIX))
        failed = keys.get(_FAILED_KEY)
        beats = {p: keys.get(_BEAT_KEY.format(p)) for p in self._peers
                 if _DONE_KEY.format(p) not in keys}
      except Exception as e:  # pylint: disable=broad-exception-caught
        if self._closed.is_set():
          return
        if self._me == 0:
          self._fail(f"the coordination service failed ({type(e).__name__}: "
                     f"{(str(e).splitlines() or [''])[0][:160]})")
          return
        self._fail(f"lost contact with process 0, which hosts the coordination service"
                   f" ({type(e).__name__}); it has stopped or its host is unreachable")
        return
      if self._closed.is_set():
        return
      if failed and not failed.startswith(f"process {self._me}:"):  # not our own report
        try:
          self._client.key_value_set(_ACK_KEY.format(self._me), "1", allow_overwrite=True)
        except Exception:  # pylint: disable=broad-exception-caught
          pass
        print(f"error: {failed}; stopping this process too", file=sys.stderr, flush=True)
        if self._me == 0:
          failed_process = int(failed.split()[1].rstrip(":"))
          _wait_for_acknowledgements(
              self._client, [p for p in self._peers if p != failed_process])
        _exit(EXIT_PEER_FAILED)
        return
      now = time.monotonic()
      for p, value in beats.items():
        last_value, since = seen[p]
        if value != last_value:
          seen[p] = (value, now)
        elif value is not None and now - since > self._stale_after:
          self._fail(f"process {p} stopped responding (no heartbeat for"
                     f" {now - since:.0f} s: killed, or its host is down); stopping")
          return
      self._closed.wait(self._poll)

  def _fail(self, line: str) -> None:
    print(f"error: {line}", file=sys.stderr, flush=True)
    _exit(EXIT_PEER_FAILED)
