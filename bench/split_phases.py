"""Where a step's seconds go, shared layout against a rollout group of its own.

  python bench/split_phases.py RUN_OUT [RUN_OUT ...] [--seed 0]

Reads `bench/first_command.py --out` folders and prints, per run, the median
over its training steps (the first, which compiles, left out) of each phase
the trainer logs: the step, the rollout (on its own group: the head start
that ran beside the previous update), the reference pass, the update, the
time the trainer waited for its batch (Tunix's actor_dequeue_time, logged
only when the rollout has a mesh of its own), decode steps and occupancy,
and the held-out accuracy after the last update. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics

PHASES = (
    ("step s", "perf/train/step_seconds"),
    ("rollout s", "perf/train/rollout_seconds"),
    ("head start s", "rollout/train/head_start_seconds"),
    ("reference s", "perf/train/reference_seconds"),
    ("update s", "perf/train/update_seconds"),
    ("waited for the batch s", "global/train/actor_dequeue_time"),
    ("decode steps", "rollout/train/decode_steps"),
    ("occupancy", "rollout/train/occupancy"),
    ("staleness", "rollout/train/staleness_mean"),
)


def phases(run: pathlib.Path) -> dict[str, str]:
  rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
  steps = [r for r in rows if "rewards/train/sum" in r][1:]
  out = {}
  for name, key in PHASES:
    values = [r[key] for r in steps if key in r]
    out[name] = f"{statistics.median(values):.2f}" if values else "-"
  evals = [r for r in rows if "eval/accuracy" in r]
  out["held-out accuracy start -> end"] = (f"{100 * evals[0]['eval/accuracy']:.1f}% ->"
                                           f" {100 * evals[-1]['eval/accuracy']:.1f}%")
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("runs", nargs="+", type=pathlib.Path)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  table = {str(run): phases(run / f"seed_{args.seed}") for run in args.runs}
  names = list(next(iter(table.values())))
  print("run | " + " | ".join(names))
  for run, values in table.items():
    print(f"{run} | " + " | ".join(values[n] for n in names))


if __name__ == "__main__":
  main()
