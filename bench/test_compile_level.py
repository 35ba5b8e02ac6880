"""What cheaper XLA CPU compiles (the test suite's -O0) cost and save on tiny training runs.

  python bench/test_compile_level.py --rounds 2 [--levels default,O0,cheap_llvm]

Each round trains configs/tiny.py for 4 steps on one CPU device, as separate
processes, once per level of XLA's CPU compiler: the default,
--xla_backend_optimization_level=0 (O0: tests/conftest.py's XLA_OPT) and,
if asked, --xla_llvm_disable_expensive_passes=true (cheap_llvm). Each level
runs first with an empty compilation cache (cold: every program compiled)
and then again on the cache it left (warm). The levels rotate which goes
first from round to round, so this machine's drifting speed falls on all.
Prints, per round and level, the child's CPU seconds and its own "step 1,
compilation included" seconds, cold and warm, and the median of steps 2-4;
then each level / default ratio. Nothing here asserts a figure.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
LEVELS = {"default": "", "O0": " --xla_backend_optimization_level=0",
          "cheap_llvm": " --xla_llvm_disable_expensive_passes=true"}


def one_run(level: str, cache_dir: pathlib.Path, workdir: pathlib.Path) -> dict[str, float]:
  """Child CPU seconds, step 1's seconds and the median later step of one run."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_COMPILATION_CACHE_DIR": str(cache_dir),
         "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
         "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
         "XLA_FLAGS": "--xla_force_host_platform_device_count=1" + LEVELS[level]}
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  proc = subprocess.run(
      [sys.executable, "-m", "gemma_grpo.commands.cli", "train", "--config", "configs/tiny.py",
       "--workdir", str(workdir), "--config.train.max_steps=4"],
      cwd=REPO, env=env, capture_output=True, text=True, check=False)
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  if proc.returncode != 0:
    raise SystemExit(f"{level}: exited {proc.returncode}\n{proc.stderr[-3000:]}")
  output = proc.stdout + proc.stderr
  step_1 = float(re.search(r"compilation included \(([0-9.]+) s", output).group(1))
  later = [float(s) for s in re.findall(r"s/step ([0-9.]+)", output)][1:]
  return {"cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
          "step1_s": step_1, "later_step_s": statistics.median(later)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--levels", default="default,O0",
                      help=f"comma-separated, from {', '.join(LEVELS)}; default first")
  args = parser.parse_args()
  levels = args.levels.split(",")
  if levels[0] != "default" or not set(levels) <= set(LEVELS):
    raise SystemExit(f"--levels: 'default' first, then any of {', '.join(LEVELS)}")
  totals = {(level, phase): [] for level in levels for phase in ("cold", "warm")}
  for round_ in range(args.rounds):
    shift = round_ % len(levels)
    order = levels[shift:] + levels[:shift]
    for level in order:
      scratch = pathlib.Path(tempfile.mkdtemp(prefix=f"compile-level-{level}-"))
      try:
        for phase in ("cold", "warm"):
          shutil.rmtree(scratch / "run", ignore_errors=True)
          result = one_run(level, scratch / "xla", scratch / "run")
          totals[level, phase].append(result)
          print(f"round {round_ + 1} {level:7s} {phase}: " + ", ".join(
              f"{k} {v:.2f}" for k, v in result.items()), flush=True)
      finally:
        shutil.rmtree(scratch, ignore_errors=True)
  for level in levels[1:]:
    print(f"\n{level} / default, per round:")
    for phase in ("cold", "warm"):
      for key in ("cpu_s", "step1_s", "later_step_s"):
        ratios = [o[key] / d[key] for o, d in zip(totals[level, phase], totals["default", phase])]
        print(f"  {phase} {key:12s} " + " ".join(f"{r:.2f}" for r in ratios))


if __name__ == "__main__":
  main()
