"""A fake SLURM for tests: `sbatch` runs the batch script at once, `srun` starts
its SLURM_NTASKS tasks as local processes, each with the variables SLURM gives
a task (SLURM_PROCID, SLURM_LOCALID, SLURM_STEP_NODELIST=localhost, ...), so
JAX's own SLURM detection joins them into one runtime.
"""

import pathlib
import random
import socket
import sys

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
with open(os.path.join(os.environ["FAKE_SLURM_LOGS"], "srun.args"), "w") as f:
    f.write("\n".join(args))
procs = []
for rank in range(tasks):
    env = dict(os.environ, SLURM_PROCID=str(rank), SLURM_LOCALID="0",
               SLURM_STEP_NODELIST="localhost", SLURM_STEP_NUM_NODES=str(tasks),
               SLURM_NODEID=str(rank))
    log = open(os.path.join(os.environ["FAKE_SLURM_LOGS"], f"task{rank}.log"), "w")
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


def job_id_with_a_free_port() -> int:
  """A job id whose coordinator port (JAX: 61440 + id % 4096) is free here."""
  for offset in random.sample(range(4096), 4096):
    with socket.socket() as s:
      try:
        s.bind(("localhost", 61440 + offset))
      except OSError:
        continue
    return 4096 * 100 + offset
  raise AssertionError("no free port in 61440..65535")


def install(bin_dir: pathlib.Path) -> None:
  """Writes `sbatch` and `srun` into bin_dir (put it first on PATH)."""
  bin_dir.mkdir(parents=True, exist_ok=True)
  (bin_dir / "sbatch").write_text(FAKE_SBATCH)
  (bin_dir / "srun").write_text(FAKE_SRUN.replace("{python}", sys.executable))
  for tool in ("sbatch", "srun"):
    (bin_dir / tool).chmod(0o755)
