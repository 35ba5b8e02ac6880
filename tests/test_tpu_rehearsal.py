"""The TPU VM flow of launch/tpu_vm.sh, rehearsed end to end on one machine.

A fake `gcloud` (tests/fake_tpu_cloud.py) runs what it is given: its "TPU VM"
is two worker processes on this machine (the two hosts of a slice), and its
bucket is the local GCS API server. `run` creates the VM, copies this checkout
to both workers, and starts the real trainer on both into the bucket; a
maintenance event (SIGTERM to every process, then the VM reports PREEMPTED)
stops them after a step; `watch` deletes and recreates the VM, sets it up and
trains again, which resumes from the bucket's checkpoint and ends at max_steps
with the metrics of an uninterrupted two-process run.
"""

import json
import pathlib
import subprocess
import sys
import time

from etils import epath
import pytest

from conftest import DEVICES_PER_PROCESS, REPO, TWO_PROCESS_ARGS, xla_flags
from gemma_grpo.runtime import metrics

SCRIPT = REPO / "launch" / "tpu_vm.sh"
TPU = ["--name", "t1", "--zone", "us-central2-b", "--project", "proj-x",
       "--accelerator", "v4-16"]
# Tests the trainer's own compile cache would land in the fake workers' homes.
CACHE = f"--config.model.cache_dir={pathlib.Path.home() / '.cache' / 'gemma_grpo'}"
COMPARED_PREFIXES = ("rewards/", "completions/", "actor/train/loss", "actor/train/kl",
                     "actor/train/grad_norm", "actor/train/learning_rate")


class Cloud:
  """The fake gcloud on PATH, its state directory and the launcher's environment."""

  def __init__(self, tmp, gcs_env):
    self.state = tmp / "cloud"
    self.bin = tmp / "bin"
    self.state.mkdir()
    self.bin.mkdir()
    gcloud = self.bin / "gcloud"
    gcloud.write_text(f"#!/usr/bin/env bash\nexec {sys.executable}"
                      f" {REPO / 'tests' / 'fake_tpu_cloud.py'} \"$@\"\n")
    gcloud.chmod(0o755)
    self.env = {**gcs_env, "PATH": f"{self.bin}:/usr/bin:/bin", "HOME": str(tmp),
                "TMPDIR": str(tmp), "FAKE_CLOUD": str(self.state), "REPO_DIR": str(REPO),
                "POLL_SECONDS": "1", "PYTHONUNBUFFERED": "1",
                "FAKE_XLA_FLAGS": xla_flags(DEVICES_PER_PROCESS),
                "JAX_COMPILATION_CACHE_DIR": str(pathlib.Path.home() / ".cache/gemma_grpo/xla")}

  def launch(self, *args, timeout=900):
    return subprocess.run(["bash", str(SCRIPT), *args], env=self.env, capture_output=True,
                          text=True, timeout=timeout)

  def worker_log(self, worker):
    path = self.state / "vm" / f"worker-{worker}" / "gemma-grpo-logs" / f"train-worker-{worker}.log"
    return path.read_text() if path.exists() else ""

  def wait_for_log(self, text, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      if text in self.worker_log(0):
        return
      time.sleep(0.5)
    raise AssertionError(f"{text!r} not in worker 0's log:\n{self.worker_log(0)[-3000:]}"
                         f"\nworker 1:\n{self.worker_log(1)[-3000:]}")

  def preempt(self):
    subprocess.run([sys.executable, str(REPO / "tests" / "fake_tpu_cloud.py"), "--preempt"],
                   env={**self.env, "PATH": f"{self.bin}:/usr/bin:/bin"}, check=True, timeout=400)

  def shut_down(self):
    subprocess.run([str(self.bin / "gcloud"), "compute", "tpus", "tpu-vm", "delete", "t1"],
                   env=self.env, timeout=60, check=False)

  def calls(self):
    return [json.loads(line) for line in (self.state / "calls.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_run_preempt_watch_resumes_in_the_bucket_to_the_end(tmp_path, gcs_server,
                                                            two_processes_four_steps):
  cloud = Cloud(tmp_path, gcs_server)
  workdir = f"gs://test-bucket/rehearsal-{time.time_ns()}"
  trainer = [*TWO_PROCESS_ARGS[:2], "--workdir", workdir, *TPU]
  overrides = [*TWO_PROCESS_ARGS[2:], CACHE]
  try:
    launched = cloud.launch("run", *trainer, *overrides)
    assert launched.returncode == 0, launched.stderr[-3000:]
    # Both "hosts" got this checkout and run its code, joined as one runtime.
    for worker in range(2):
      home = cloud.state / "vm" / f"worker-{worker}"
      assert (home / "gemma-grpo" / "gemma_grpo" / "train.py").read_text() == (
          REPO / "gemma_grpo" / "train.py").read_text()
    cloud.wait_for_log("step 1/4", timeout=600)
    for worker in range(2):
      assert (f"jax.distributed: process {worker} of 2 (rank from environment), 4 devices,"
              " 2 of them here") in cloud.worker_log(worker)

    cloud.preempt()
    first = [cloud.worker_log(w) for w in range(2)]
    stopped = [int(log.split("SIGTERM: stopped after step ")[1].split(";")[0]) for log in first]
    assert stopped[0] == stopped[1] < 4, [log[-2000:] for log in first]
    assert all("training exited with status 143" in log for log in first)
    assert not epath.Path(workdir, "DONE").exists()  # a preempted run is not marked

    watched = cloud.launch("watch", *trainer, *overrides)
    assert watched.returncode == 0, (watched.stderr[-3000:], cloud.worker_log(0)[-3000:])
    assert "t1 is PREEMPTED: recreating it (restart 1/10)" in watched.stderr
    assert f"training finished: {workdir}/DONE" in watched.stderr
    second = [cloud.worker_log(w) for w in range(2)]  # the recreated VM's fresh disks
    assert all(f"Resuming from step {stopped[0]}" in log for log in second)
    assert all("training exited with status 0" in log for log in second)
    kinds = [" ".join(c[3:4] if c[:2] == ["compute", "tpus"] else c[:2])
             for c in cloud.calls()]
    assert kinds.count("create") == 2 and kinds.count("delete") == 1
  finally:
    cloud.shut_down()

  rows = metrics.read_jsonl(epath.Path(workdir) / "tensorboard" / "metrics.jsonl")
  reference = metrics.read_jsonl(
      two_processes_four_steps.workdir / "tensorboard" / "metrics.jsonl")
  assert [r["step"] for r in rows] == [r["step"] for r in reference] == [1, 2, 3, 4]
  for row, ref_row in zip(rows, reference):
    keys = sorted(k for k in ref_row if k.startswith(COMPARED_PREFIXES))
    assert keys
    for key in keys:
      assert row[key] == pytest.approx(ref_row[key], rel=1e-6, abs=1e-9), (row["step"], key)
  work = epath.Path(workdir)
  saved = sorted(int(p.name) for p in (work / "checkpoints" / "actor").iterdir()
                 if p.name.isdigit())
  assert stopped[0] in saved and saved[-1] == 4  # the preemption's checkpoint, and the last
  # Every file of a run is in the bucket, written by process 0.
  assert len(list((work / "tensorboard").glob("events.out.tfevents.*"))) == 2  # one per start
  assert (work / "plots" / "rewards.png").read_bytes()[:4] == b"\x89PNG"
  assert json.loads((work / "config.json").read_text())["mesh"] == {"fsdp": 2, "tp": 2, "rollout_devices": 0}
  assert (work / "run.json").exists() and not (work / "trainer.lock").exists()
