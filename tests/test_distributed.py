"""Several processes, one JAX runtime: ranks, one mesh over two processes, faults.

The end-to-end tests start two real processes of `gemma-grpo train` on
localhost, 2 simulated CPU devices each, forming one (fsdp=2, tp=2) mesh over
all 4 devices through jax.distributed (gloo collectives).
"""

import argparse
import json
import time

import pytest

from conftest import BATCH_OF_4, start_processes, wait_all
from gemma_grpo.runtime import distributed
from gemma_grpo import errors
from gemma_grpo.runtime import metrics

ARGS = ["train", *BATCH_OF_4, "--config.mesh.fsdp=2", "--config.mesh.tp=2"]
COMPARED = ("rewards/train/sum", "actor/train/loss", "actor/train/kl",
            "actor/train/grad_norm", "completions/train/mean_length")


def _args(**kw):
  return argparse.Namespace(**{"coordinator": None, "num_processes": None,
                               "process_id": None, **kw})


@pytest.mark.parametrize("flags, env, expected", [
    ({}, {}, ("single", None, None, None)),
    ({"coordinator": "h:1", "num_processes": 2, "process_id": 1}, {}, ("flags", "h:1", 2, 1)),
    ({}, {"JAX_COORDINATOR_ADDRESS": "h:2", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"},
     ("environment", "h:2", 4, 3)),
    # Flags win over the environment, key by key.
    ({"process_id": 0}, {"JAX_COORDINATOR_ADDRESS": "h:2", "JAX_NUM_PROCESSES": "2",
                         "JAX_PROCESS_ID": "1"}, ("flags", "h:2", 2, 0)),
    ({}, {"TPU_WORKER_HOSTNAMES": "10.0.0.1,10.0.0.2"}, ("cluster", None, None, None)),
    ({}, {"TPU_WORKER_HOSTNAMES": "10.0.0.1"}, ("single", None, None, None)),
    ({}, {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2"}, ("cluster", None, None, None)),
    ({}, {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"}, ("single", None, None, None)),
    ({}, {"GEMMA_GRPO_DISTRIBUTED": "1"}, ("cluster", None, None, None)),
    ({"coordinator": "h:1", "num_processes": 1, "process_id": 0}, {}, ("single", None, None, None)),
])
def test_rank_comes_from_flags_then_environment_then_cluster(flags, env, expected):
  rank = distributed.resolve_rank(_args(**flags), env)
  assert (rank.source, rank.coordinator, rank.num_processes, rank.process_id) == expected


@pytest.mark.parametrize("flags, env, message", [
    ({}, {"JAX_COORDINATOR_ADDRESS": "h:1"}, "set JAX_NUM_PROCESSES and JAX_PROCESS_ID"),
    ({"coordinator": "h:1", "num_processes": 2}, {}, "--process-id: missing"),
    ({"num_processes": 2, "process_id": 0}, {}, "--coordinator: missing"),
    ({"coordinator": "nohost", "num_processes": 2, "process_id": 0}, {}, "expected HOST:PORT"),
    ({"coordinator": "h:1", "num_processes": 2, "process_id": 2}, {}, "must be in 0..1"),
    ({"coordinator": "h:1", "num_processes": 0, "process_id": 0}, {}, "at least 1"),
    ({}, {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "two", "JAX_PROCESS_ID": "0"},
     "JAX_NUM_PROCESSES='two': not a non-negative integer"),
])
def test_bad_rank_settings_are_one_line_errors(flags, env, message):
  with pytest.raises(errors.UserError, match=message) as e:
    distributed.resolve_rank(_args(**flags), env)
  assert "\n" not in str(e.value)


def test_fingerprint_tells_configs_apart():
  assert distributed.fingerprint("a") == distributed.fingerprint("a")
  assert distributed.fingerprint("a") != distributed.fingerprint("b")
  assert 0 <= distributed.fingerprint("x") < 2**62


def _rows(workdir):
  return {row["step"]: row for row in metrics.read_jsonl(workdir / "tensorboard" / "metrics.jsonl")}


def _read(logdir, rank, stream):
  return (logdir / f"p{rank}.{stream}").read_text()


def _wait_for(path, text, timeout):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if path.exists() and text in path.read_text():
      return
    time.sleep(0.5)
  raise AssertionError(f"{text!r} not in {path} after {timeout} s:\n{path.read_text()[-3000:]}")


@pytest.mark.slow
def test_two_processes_train_one_mesh_like_one_process(two_processes_four_steps, one_device_run):
  workdir = two_processes_four_steps.workdir
  errs = two_processes_four_steps.logs
  # Only process 0 writes: one events file, each step's row once, one plot line.
  assert len(list((workdir / "tensorboard").glob("events.out.tfevents.*"))) == 1
  lines = (workdir / "tensorboard" / "metrics.jsonl").read_text().splitlines()
  assert sorted(json.loads(line)["step"] for line in lines) == [1, 2, 3, 4]
  assert "Plots:" in errs[0] and "Plots:" not in errs[1]
  assert json.loads((workdir / "config.json").read_text())["mesh"] == {"fsdp": 2, "tp": 2, "rollout_devices": 0}

  # One device's 2 steps of the same batches at the same constant rate
  # (conftest.BATCH_OF_4). As tests/test_mesh.py: rewards and lengths exact,
  # the rest to the float32 rounding of collectives that sum in another order.
  # Later steps are not compared: by then that rounding can flip a sampled
  # token (seen at step 4). Stopping both processes by SIGTERM and resuming
  # is rehearsed in tests/test_tpu_rehearsal.py, through the TPU launcher.
  two, one = _rows(workdir), _rows(one_device_run)
  assert sorted(one) == [1, 2]
  for step in (1, 2):
    for key in COMPARED:
      tolerance = 0 if key.startswith(("rewards/", "completions/")) else (
          1e-5 if step == 1 else 1e-4)
      assert two[step][key] == pytest.approx(one[step][key], rel=tolerance, abs=1e-8), (step, key)


@pytest.mark.slow
def test_each_process_compiles_the_train_step_once_and_nothing_after_step_1(
    two_processes_four_steps):
  # The train step is compiled ahead of the first rollout for an example laid
  # out as the real batches are (trainers.RLTrainer._prepare_inputs); an
  # example of another layout would make the first update compile it again.
  # As tests/test_train.py checks for one process: no program is compiled
  # after step 1 (its line is written once the step is done).
  for log in two_processes_four_steps.logs:
    assert log.count("Compiling jit(_train_step) ") == 1, [
        line[:300] for line in log.splitlines() if "_train_step" in line]
    after_step_1 = log.split("step 1: the first step, compilation included", 1)[1]
    late = [line[:300] for line in after_step_1.splitlines() if "Compiling jit(" in line]
    assert not late, late


@pytest.mark.slow
def test_a_killed_process_stops_the_other_within_the_bound(tmp_path):
  args = [*ARGS, "--workdir", str(tmp_path / "run"), "--config.train.max_steps=50"]
  procs = start_processes(args, logdir=tmp_path)
  # Both have joined, built the model and are about to compile the first step
  # (not waiting for a step keeps the test short; the watchdog is the same).
  _wait_for(tmp_path / "p1.err", "data: ", timeout=300)
  procs[1].kill()
  killed = time.monotonic()
  code = procs[0].wait(timeout=distributed.STALE_AFTER_S + 60)
  assert time.monotonic() - killed < distributed.STALE_AFTER_S + 60
  assert code == distributed.EXIT_PEER_FAILED
  errors_ = [line for line in _read(tmp_path, 0, "err").splitlines() if line.startswith("error:")]
  assert len(errors_) == 1, errors_
  assert ("process 1 stopped responding" in errors_[0]
          or "a collective with the other processes failed" in errors_[0]), errors_
  assert "Traceback" not in _read(tmp_path, 0, "err")


@pytest.mark.slow
def test_a_reward_raising_in_one_process_stops_both_in_one_line(tmp_path):
  # It fails in step 1's rewards: the fixture's 4 steps, so process 0 finds
  # every program in the compilation cache.
  args = [*ARGS, "--workdir", str(tmp_path / "run"), "--config.train.max_steps=4",
          "--config.rewards.custom=tests.toy_rewards:fails_in_process_1"]
  procs = start_processes(args, logdir=tmp_path)
  codes = wait_all(procs, timeout=300)
  err0, err1 = _read(tmp_path, 0, "err"), _read(tmp_path, 1, "err")
  assert codes[1] == 5, err1[-3000:]
  assert "error: step 1: reward function fails_in_process_1 raised ValueError: bad input" in err1
  assert "toy_rewards.py" in err1 and "site-packages/tunix" not in err1  # the user's frames only
  assert codes[0] == distributed.EXIT_PEER_FAILED, err0[-3000:]
  assert "error: process 1: exited with status 5; stopping this process too" in err0


@pytest.mark.slow
def test_processes_with_different_configs_refuse_to_start(tmp_path):
  args = [*ARGS, "--workdir", str(tmp_path / "run")]
  procs = start_processes(args, logdir=tmp_path, extra_args={1: ["--config.grpo.beta=0.5"]})
  codes = wait_all(procs, timeout=120)
  assert 2 in codes, [_read(tmp_path, r, "err")[-2000:] for r in range(2)]
  assert all(c != 0 for c in codes)
  said = _read(tmp_path, 0, "err") + _read(tmp_path, 1, "err")
  assert "the config or --workdir differs between processes (process 1 against process 0)" in said
  assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_process_count_that_does_not_divide_the_mesh_is_one_line(tmp_path):
  args = [*ARGS[:-2], "--config.mesh.fsdp=3", "--config.mesh.tp=1", "--workdir",
          str(tmp_path / "run")]
  codes = wait_all(start_processes(args, logdir=tmp_path), timeout=120)
  assert codes == [2, 2] or 2 in codes
  err = _read(tmp_path, 0, "err")
  assert "error: mesh.fsdp=3 x mesh.tp=1 does not fill the 4 available devices" in err
  assert "Traceback" not in err


class _KeyValueStore:
  """The coordination service's key-value calls the watchdog makes, in memory."""

  def __init__(self):
    self.values, self.reads = {}, 0

  def key_value_set(self, key, value, allow_overwrite=False):
    if not allow_overwrite and key in self.values:
      raise RuntimeError(f"ALREADY_EXISTS: {key}")
    self.values[key] = value

  def key_value_dir_get(self, prefix):
    self.reads += 1
    return [(k, v) for k, v in self.values.items() if k.startswith(prefix)]

  def key_value_try_get(self, key):
    if key not in self.values:
      raise RuntimeError(f"NOT_FOUND: {key}")
    return self.values[key]


def _watch(monkeypatch, store, **kw):
  exits = []
  monkeypatch.setattr(distributed, "_exit", exits.append)
  dog = distributed.Watchdog(store, 0, 3, poll=0.05, **kw)
  dog.start()
  return dog, exits


def test_the_watchdog_stops_this_process_when_a_peer_goes_silent(monkeypatch, capsys):
  store = _KeyValueStore()
  store.values.update({"gemma_grpo/beat/1": "7", "gemma_grpo/beat/2": "7"})
  dog, exits = _watch(monkeypatch, store, stale_after=0.5)
  for beat in range(8, 30):  # process 2 keeps beating; process 1 never does again
    store.values["gemma_grpo/beat/2"] = str(beat)
    time.sleep(0.05)
  dog.join(timeout=5)
  assert exits == [distributed.EXIT_PEER_FAILED]
  assert "error: process 1 stopped responding (no heartbeat for" in capsys.readouterr().err
  # One read of the whole store per poll, however many peers.
  assert store.reads <= 30


def test_the_watchdog_relays_a_peer_report_and_ignores_its_own(monkeypatch, capsys):
  store = _KeyValueStore()
  store.values["gemma_grpo/failed"] = "process 0: error: bad input"
  dog, exits = _watch(monkeypatch, store, stale_after=60)
  time.sleep(0.5)
  assert exits == [] and dog.is_alive()  # its own report: nothing to relay
  dog.close()
  dog.join(timeout=5)
  store = _KeyValueStore()
  store.values["gemma_grpo/failed"] = "process 2: exited with status 5"
  monkeypatch.setattr(distributed, "_wait_for_acknowledgements", lambda *a: None)
  dog, exits = _watch(monkeypatch, store, stale_after=60)
  dog.join(timeout=5)
  assert exits == [distributed.EXIT_PEER_FAILED]
  assert "error: process 2: exited with status 5; stopping this process too" in (
      capsys.readouterr().err)
  assert store.values["gemma_grpo/acknowledged/0"] == "1"


@pytest.mark.parametrize("message, lost", [
    ("UNKNOWN: Gloo AllGather failed: [pair.cc:547] Connection closed by peer [127.0.0.1]:1", True),
    ("INTERNAL: NCCL operation ncclAllReduce failed: remote process exited", True),
    ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate", False),
])
def test_a_collective_that_lost_its_peer_is_told_apart(message, lost):
  error_type = type("JaxRuntimeError", (RuntimeError,), {})
  assert distributed._lost_a_peer(error_type(message)) is lost  # pylint: disable=protected-access
  assert not distributed._lost_a_peer(ValueError(message))  # pylint: disable=protected-access
