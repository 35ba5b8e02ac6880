"""Does running ahead (rollout.max_staleness) cost learning? Lockstep against it, per seed.

  python bench/async_accuracy.py LOCKSTEP_OUT AHEAD_OUT [--seeds 0 1]

Reads two `bench/first_command.py --out` folders made with the same seeds
(one with `--config-override rollout.slots=8 --config-override
rollout.max_staleness=K`, one without) and prints, per seed and run: wall
time, median seconds per step, held-out accuracy before the first and after
the last update, and the training reward; then the held-out accuracy of
ahead minus lockstep after the last update, over every (seed, problem) pair,
with its 95% paired-bootstrap interval (rl/eval/scoring.paired_bootstrap).
Both runs take the same number of steps, so a faster ahead run reaches its
accuracy in less wall time. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
  sys.path.insert(0, str(REPO))

from gemma_grpo.rl.eval import scoring  # pylint: disable=g-import-not-at-top,wrong-import-position


def read_run(out: pathlib.Path, seed: int) -> dict:
  workdir = out / f"seed_{seed}"
  evals = sorted((workdir / "eval").glob("step_*"), key=lambda d: int(d.name.split("_")[1]))
  samples = [[json.loads(line) for line in (d / "samples.jsonl").read_text().splitlines()]
             for d in (evals[0], evals[-1])]
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  seconds = [r["perf/train/step_seconds"] for r in rows if "perf/train/step_seconds" in r]
  rewards = [r["rewards/train/sum"] for r in rows if "rewards/train/sum" in r]
  rollout = [r["perf/train/rollout_seconds"] for r in rows if "perf/train/rollout_seconds" in r]
  return {
      "wall": json.loads((workdir / "wall_time.json").read_text())["seconds"],
      "step_seconds": statistics.median(seconds) if seconds else float("nan"),
      "rollout_seconds": statistics.median(rollout) if rollout else float("nan"),
      "start": samples[0], "end": samples[1], "rewards": rewards,
      "occupancy": [r["rollout/train/occupancy"] for r in rows if "rollout/train/occupancy" in r],
  }


def accuracy(samples) -> float:
  return sum(s["correct"] for s in samples) / len(samples)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("lockstep", type=pathlib.Path)
  parser.add_argument("ahead", type=pathlib.Path)
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
  args = parser.parse_args()
  print("run | seed | wall time | median s/step | mean occupancy | held-out accuracy start -> end"
        " | median rollout s | training reward, first 5 -> last 5 steps")
  base, new = [], []
  for seed in args.seeds:
    runs = {name: read_run(getattr(args, name), seed) for name in ("lockstep", "ahead")}
    for name, run in runs.items():
      occupancy = statistics.mean(run["occupancy"]) if run["occupancy"] else float("nan")
      print(f"{name} | {seed} | {run['wall'] / 60:.1f} min | {run['step_seconds']:.1f} s"
            f" | {occupancy:.2f} | {accuracy(run['start']):.1%} -> {accuracy(run['end']):.1%}"
            f" | {run['rollout_seconds']:.1f} s | {sum(run['rewards'][:5]) / 5:.2f} -> {sum(run['rewards'][-5:]) / 5:.2f}")
    ours = {s["question"]: float(s["correct"]) for s in runs["lockstep"]["end"]}
    theirs = {s["question"]: float(s["correct"]) for s in runs["ahead"]["end"]}
    if set(ours) != set(theirs):
      raise SystemExit(f"seed {seed}: the two runs' held-out problems differ")
    base += [ours[q] for q in sorted(ours)]
    new += [theirs[q] for q in sorted(ours)]
  diff, low, high = scoring.paired_bootstrap(base, new)
  print(f"held-out accuracy after the last update, ahead - lockstep: {diff * 100:+.1f} points,"
        f" 95% paired-bootstrap interval [{low * 100:+.1f}, {high * 100:+.1f}] over {len(base)}"
        f" (seed, problem) pairs")


if __name__ == "__main__":
  main()
