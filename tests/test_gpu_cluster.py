"""launch/gpu_cluster.sh: the SLURM and plain-ssh launchers for several GPU hosts.

Dry runs check the commands; one rehearsal runs the SLURM path for real: a fake
`sbatch` runs the batch script and a fake `srun` starts its tasks as local
processes with the variables SLURM gives each task, so JAX's own SLURM
detection joins them (4 simulated CPU devices each, one fsdp=4 tp=2 mesh).
"""

import os
import pathlib
import random
import shlex
import socket
import subprocess
import sys

import pytest

from conftest import LEARNING, REPO, cli_env
from gemma_grpo import metrics

SCRIPT = REPO / "launch" / "gpu_cluster.sh"

FAKE_SBATCH = r'''#!/usr/bin/env bash
# Runs the batch script at once, with the variables sbatch would set.
set -euo pipefail
nodes="$(sed -n 's/^#SBATCH --nodes=//p' "$1")"
export SLURM_JOB_ID="$FAKE_JOB_ID" SLURM_NTASKS="$nodes" SLURM_JOB_NUM_NODES="$nodes"
echo "Submitted batch job $SLURM_JOB_ID"
exec bash "$1"
'''

FAKE_SRUN = r'''#!{python}
"""srun inside a job: SLURM_NTASKS tasks on "localhost", each with its SLURM_* rank."""
import os, subprocess, sys, time
args = sys.argv[1:]
kill_on_bad_exit = "--kill-on-bad-exit=1" in args
while args and args[0].startswith("--"):
    args.pop(0)
tasks = int(os.environ["SLURM_NTASKS"])
with open(os.path.join(os.environ["FAKE_STATE"], "srun.args"), "w") as f:
    f.write("\n".join(args))
procs = []
for rank in range(tasks):
    env = dict(os.environ, SLURM_PROCID=str(rank), SLURM_LOCALID="0",
               SLURM_STEP_NODELIST="localhost", SLURM_STEP_NUM_NODES=str(tasks),
               SLURM_NODEID=str(rank))
    log = open(os.path.join(os.environ["FAKE_STATE"], f"task{rank}.log"), "w")
    procs.append(subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT))
codes = [None] * tasks
while None in codes:
    for i, p in enumerate(procs):
        if codes[i] is None:
            codes[i] = p.poll()
    if kill_on_bad_exit and any(c not in (None, 0) for c in codes):
        for p in procs:
            p.kill()
    time.sleep(0.2)
sys.exit(max(codes))
'''


def _run(*args, env=None):
  return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                        timeout=60, env={**os.environ, **(env or {})}, cwd=REPO)


def test_slurm_dry_run_prints_the_batch_script():
  proc = _run("slurm", "--nodes", "4", "--gpus-per-node", "8", "--partition", "a100",
              "--time", "12:00:00", "--workdir", "gs://bkt/g1b", "--config.grpo.beta=0.04",
              "--python", "/opt/venv/bin/python", "--repo", "/opt/gemma-grpo", "--dry-run")
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  for expected in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1",
                   "#SBATCH --gpus-per-node=8", "#SBATCH --partition=a100",
                   "#SBATCH --time=12:00:00", "cd /opt/gemma-grpo && mkdir -p runs/logs",
                   "srun --kill-on-bad-exit=1 /opt/venv/bin/python -m gemma_grpo.train"
                   " --config configs/gemma3_1b.py --workdir gs://bkt/g1b"
                   " --config.grpo.beta=0.04",
                   "+ sbatch BATCH_SCRIPT"):
    assert expected in lines, (expected, proc.stdout)
  # No rank flags: under SLURM each task's rank comes from SLURM_PROCID.
  assert "--process-id" not in proc.stdout


def test_hosts_dry_run_gives_each_host_its_rank():
  proc = _run("hosts", "--hosts", "10.0.0.2,10.0.0.3", "--port", "9000", "--workdir",
              "gs://bkt/g1b", "--repo", "/srv/gg", "--dry-run", "--", "--config.train.max_steps=9")
  assert proc.returncode == 0, proc.stderr
  commands = [line for line in proc.stdout.splitlines() if line.startswith("+ ")]
  assert len(commands) == 2
  for rank, (host, line) in enumerate(zip(["10.0.0.2", "10.0.0.3"], commands)):
    words = shlex.split(line[2:].split(" > ")[0])
    assert words[:2] == ["ssh", host]
    assert shlex.split(words[2]) == [
        "cd", "/srv/gg", "&&", "PYTHONUNBUFFERED=1", "exec", "/srv/gg/.venv/bin/python", "-m",
        "gemma_grpo.train", "--config", "configs/gemma3_1b.py", "--workdir", "gs://bkt/g1b",
        "--config.train.max_steps=9", "--coordinator", "10.0.0.2:9000", "--num-processes", "2",
        "--process-id", str(rank)]
    assert line.endswith(f"> runs/logs/host-{rank}.log 2>&1 &")


@pytest.mark.parametrize("args, message", [
    (["slurm"], "WORKDIR is not set"),
    (["hosts", "--workdir", "w"], "HOSTS is not set"),
    (["slurm", "--workdir", "w", "--nodes", "0"], "--nodes must be a positive number"),
    (["mpi"], "unknown command 'mpi'"),
    (["slurm", "--workdir", "w", "--gpus", "8"], "unknown option --gpus"),
])
def test_bad_input_exits_2_in_one_line(args, message):
  proc = _run(*args)
  assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.splitlines()) == 1


def _job_id_with_a_free_port() -> int:
  """A job id whose coordinator port (JAX: 61440 + id % 4096) is free here."""
  for offset in random.sample(range(4096), 4096):
    with socket.socket() as s:
      try:
        s.bind(("localhost", 61440 + offset))
      except OSError:
        continue
    return 4096 * 100 + offset
  raise AssertionError("no free port in 61440..65535")


def test_a_slurm_job_of_two_tasks_trains_one_mesh(tmp_path):
  bin_dir, state = tmp_path / "bin", tmp_path / "state"
  bin_dir.mkdir()
  state.mkdir()
  (bin_dir / "sbatch").write_text(FAKE_SBATCH)
  (bin_dir / "srun").write_text(FAKE_SRUN.replace("{python}", sys.executable))
  for tool in ("sbatch", "srun"):
    (bin_dir / tool).chmod(0o755)
  env = cli_env(4)
  env.update(PATH=f"{bin_dir}:{env['PATH']}", FAKE_STATE=str(state),
             FAKE_JOB_ID=str(_job_id_with_a_free_port()))
  workdir = tmp_path / "run"
  proc = subprocess.run(
      ["bash", str(SCRIPT), "slurm", "--nodes", "2", "--gpus-per-node", "0",
       "--config", "configs/tiny.py", "--workdir", str(workdir), "--python", sys.executable,
       "--log-dir", str(tmp_path / "logs"), *LEARNING, "--config.train.batch_size=4",
       "--config.mesh.fsdp=4", "--config.mesh.tp=2", "--config.train.max_steps=2"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  logs = [(state / f"task{rank}.log").read_text() for rank in range(2)]
  assert proc.returncode == 0, (proc.stderr[-2000:], [log[-3000:] for log in logs])
  assert "Submitted batch job" in proc.stdout
  # JAX found both tasks through SLURM's variables: one mesh over 8 devices.
  for rank, log in enumerate(logs):
    assert (f"jax.distributed: process {rank} of 2 (rank from cluster), 8 devices, 4 of them"
            " here") in log, log[-2000:]
  rows = metrics.read_jsonl(workdir / "tensorboard" / "metrics.jsonl")
  assert [row["step"] for row in rows] == [1, 2]
  assert pathlib.Path(state / "srun.args").read_text().splitlines()[:3] == [
      sys.executable, "-m", "gemma_grpo.train"]
