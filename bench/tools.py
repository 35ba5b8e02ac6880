"""What does the calculator gain? The tool benchmark of RESULTS.md.

  python bench/tools.py --seeds 0 1 --steps 20 --out docs/results/tools

Per seed S (rollout.seed = lora.seed = S), two runs with the same task, data,
steps and seed, each evaluated greedily on the same 200 held-out products
before its first step and after its last:
  tool     configs/gemma3_270m_tools.py: the calculator offered and shown in
           the prompt's solved examples;
  no_tool  configs/gemma3_270m_tools_off.py: the same examples worked out in
           words, no tool.
The tool run's first eval is the base model with the tool prompt. Each run's
evidence (eval.json and samples.jsonl of both evals, metrics.jsonl, plots,
console.txt, wall_time.json) goes to OUT/<arm>/seed_S, as
bench/first_command.py keeps it. Then prints, per seed, accuracy and tool
use at both ends of both runs and the paired differences with their 95%
paired-bootstrap intervals: tool after vs. its own step 0, and tool after vs.
no_tool after. Nothing here asserts a figure. bench/tables.py turns the
stored files into RESULTS.md's table.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
for path in (REPO, REPO / "bench"):
  if str(path) not in sys.path:
    sys.path.insert(0, str(path))

import first_command  # pylint: disable=g-import-not-at-top,wrong-import-position

ARMS = {"tool": "configs/gemma3_270m_tools.py", "no_tool": "configs/gemma3_270m_tools_off.py"}


def overrides(steps: int) -> list[str]:
  """The benchmark's scale: 200 held-out problems, both evals, `steps` updates."""
  return [
      "data.num_heldout=200", "eval.num_examples=200", "eval.batch_size=40",
      f"train.max_steps={steps}", f"eval.every_steps={steps}", f"ckpt.every_steps={steps}",
  ]


def read_evals(run: pathlib.Path) -> list[tuple[dict, list[dict]]]:
  """(metrics, samples) of each eval of a run, first to last."""
  evals = sorted((run / "eval").glob("step_*"), key=lambda d: int(d.name.split("_")[1]))
  return [(json.loads((d / "eval.json").read_text())["metrics"],
           [json.loads(line) for line in (d / "samples.jsonl").read_text().splitlines()])
          for d in evals]


def summarize(out: pathlib.Path, seeds: list[int]) -> None:
  from gemma_grpo.rl.eval import scoring  # pylint: disable=g-import-not-at-top

  for seed in seeds:
    runs = {arm: out / arm / f"seed_{seed}" for arm in ARMS}
    if not all(r.exists() for r in runs.values()):
      print(f"seed {seed}: missing {[str(r) for r in runs.values() if not r.exists()]}")
      continue
    evals = {arm: read_evals(run) for arm, run in runs.items()}
    print(f"seed {seed}:")
    for arm, run in runs.items():
      (first, _), (last, _) = evals[arm][0], evals[arm][-1]
      wall = json.loads((run / "wall_time.json").read_text())["seconds"]
      calls = ""
      if "tool_calls_per_completion" in first:
        calls = (f"; tool calls per completion {first['tool_calls_per_completion']:.2f} ->"
                 f" {last['tool_calls_per_completion']:.2f}, failed"
                 f" {first['failed_tool_calls_per_completion']:.2f} ->"
                 f" {last['failed_tool_calls_per_completion']:.2f}")
      print(f"  {arm:8} accuracy {first['accuracy']:.1%} -> {last['accuracy']:.1%},"
            f" format {first['format_accuracy']:.1%} -> {last['format_accuracy']:.1%}"
            f"{calls}; {wall / 60:.1f} min")
    tool_first, tool_last = evals["tool"][0][1], evals["tool"][-1][1]
    print("  tool, after vs. its step 0: " + scoring.paired_accuracy_line(tool_first, tool_last))
    print("  after, tool vs. no_tool: "
          + scoring.paired_accuracy_line(evals["no_tool"][-1][1], tool_last))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, nargs="+", default=[0])
  parser.add_argument("--steps", type=int, default=20, help="updates per run")
  parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
  parser.add_argument("--out", type=pathlib.Path, default=REPO / "docs/results/tools")
  parser.add_argument("--summarize-only", action="store_true",
                      help="print the table of runs already in --out")
  args = parser.parse_args()
  if not args.summarize_only:
    for seed in args.seeds:
      for arm in args.arms:
        minutes = first_command.run_seed(seed, args.out / arm, ARMS[arm], overrides(args.steps)) / 60
        print(f"seed {seed}, {arm}: {minutes:.1f} min", flush=True)
  summarize(args.out, args.seeds)


if __name__ == "__main__":
  main()
