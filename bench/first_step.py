"""How long until the first step of README's command, with an empty and a warm compile cache?

  flock /tmp/gemma_grpo_heavy.lock python bench/first_step.py [--steps 4]
About 6 min on a quiet 2-core CPU.

Runs `python -m gemma_grpo.train --config configs/gemma3_270m.py` (the README
default, with --config.eval.every_steps=0 so the first step follows loading
and --config.train.max_steps=STEPS) twice, one after the other, each in a
fresh work directory and process: first with an empty XLA compilation cache
(a fresh model.cache_dir whose converted 270M checkpoint is a link to the
usual one, so only compilation is cold), then again with the cache the
first run filled. For each it reads the console's phase line
"step 1: the first step, compilation included (X s; T s since start)" and
the later steps' perf/train/step_seconds, and prints: seconds from the
command to the end of step 1 (T), step 1's own seconds (X), the median of
steps 2..STEPS, and X / median. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
  sys.path.insert(0, str(REPO))

FIRST_STEP = re.compile(r"step 1: the first step, compilation included \(([\d.]+) s; (\d+) s since start\)")


def run(cache_dir: pathlib.Path, workdir: pathlib.Path, steps: int) -> dict:
  from gemma_grpo import metrics  # pylint: disable=g-import-not-at-top

  proc = subprocess.run(
      [sys.executable, "-m", "gemma_grpo.train", "--config", "configs/gemma3_270m.py",
       "--workdir", str(workdir), f"--config.model.cache_dir={cache_dir}",
       f"--config.train.max_steps={steps}", "--config.eval.every_steps=0",
       f"--config.ckpt.every_steps={steps}"],
      cwd=REPO, capture_output=True, text=True, check=False)
  found = FIRST_STEP.search(proc.stderr)
  if proc.returncode or not found:
    raise SystemExit(f"the run exited {proc.returncode}:\n{proc.stderr[-3000:]}")
  later = [r["perf/train/step_seconds"] for r in metrics.read_jsonl(workdir / "tensorboard" / "metrics.jsonl")
           if r["step"] > 1 and "perf/train/step_seconds" in r]
  median = statistics.median(later)
  return {"to_first_step_s": int(found.group(2)), "first_step_s": float(found.group(1)),
          "median_step_s": median, "ratio": float(found.group(1)) / median}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=4)
  args = parser.parse_args()
  converted = pathlib.Path(os.path.expanduser("~/.cache/gemma_grpo/gemma-3-270m"))
  if not converted.is_dir():
    raise SystemExit(f"{converted} missing: run the README command once first")
  with tempfile.TemporaryDirectory(prefix="first_step_") as tmp:
    cache = pathlib.Path(tmp) / "cache"
    cache.mkdir()
    (cache / converted.name).symlink_to(converted)
    rows = [(label, run(cache, pathlib.Path(tmp) / label, args.steps)) for label in ("cold", "warm")]
  print("cache | command -> end of step 1 | step 1 | median of steps 2.. | step 1 / median")
  for label, r in rows:
    print(f"{label} | {r['to_first_step_s']} s | {r['first_step_s']:.1f} s | {r['median_step_s']:.1f} s"
          f" | {r['ratio']:.2f}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
