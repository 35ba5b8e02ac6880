"""launch/gpu_cluster.sh: the SLURM and plain-ssh launchers for several GPU hosts.

Dry runs check the commands; the SLURM path runs for real in conftest's
`two_processes_four_steps`: a fake `sbatch` runs the batch script and a fake
`srun` starts its tasks as local processes with the variables SLURM gives each
task (tests/fake_slurm.py), so JAX's own SLURM detection joins them (2
simulated CPU devices each, one fsdp=2 tp=2 mesh).
"""

import os
import shlex
import subprocess
import sys

import pytest

from conftest import REPO
from gemma_grpo.runtime import metrics

SCRIPT = REPO / "launch" / "gpu_cluster.sh"

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


@pytest.mark.slow
def test_a_slurm_job_of_two_tasks_trains_one_mesh(two_processes_four_steps):
  run = two_processes_four_steps  # launched by conftest through `gpu_cluster.sh slurm`
  assert "Submitted batch job" in run.launcher.stdout
  assert run.srun_args[:3] == [sys.executable, "-m", "gemma_grpo.train"]
  # JAX found both tasks through SLURM's variables: one mesh over 4 devices.
  for rank, log in enumerate(run.logs):
    assert (f"jax.distributed: process {rank} of 2 (rank from cluster), 4 devices, 2 of them"
            " here") in log, log[-2000:]
  rows = metrics.read_jsonl(run.workdir / "tensorboard" / "metrics.jsonl")
  assert [row["step"] for row in rows] == [1, 2, 3, 4]
