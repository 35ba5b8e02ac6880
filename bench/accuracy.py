"""Does GRPO raise held-out accuracy, beyond noise? The accuracy benchmark of RESULTS.md.

  python bench/accuracy.py --seeds 0 --out docs/results/accuracy

Trains configs/gemma3_270m_accuracy.py once per seed (rollout.seed =
lora.seed = S) and keeps each run's evidence in OUT/seed_S as
bench/first_command.py does: both held-out evals (eval.json, samples.jsonl),
metrics.jsonl, plots, console.txt, wall_time.json. Then prints, per seed,
the base (the eval before the first step: the same weights, LoRA B = 0) and
the GRPO policy (after the last step) side by side on the 200 held-out
problems: accuracy, exact format, truncation, mean length, the paired
difference with its 95% paired-bootstrap interval, the problems that flipped
either way, accuracy by equation form, the training reward's first and last
five steps, how many held-out equations the run trained on (0 by
construction; counted from the drawn batches, not assumed), and the wall
time. Nothing here asserts a figure. About an hour per seed on 2 cores.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
for path in (REPO, REPO / "bench"):
  if str(path) not in sys.path:
    sys.path.insert(0, str(path))

import first_command  # pylint: disable=g-import-not-at-top,wrong-import-position

CONFIG = "configs/gemma3_270m_accuracy.py"


def read_eval(directory: pathlib.Path) -> tuple[dict, list[dict]]:
  metrics = json.loads((directory / "eval.json").read_text())["metrics"]
  samples = [json.loads(line) for line in (directory / "samples.jsonl").read_text().splitlines()]
  return metrics, samples


def summarize(out: pathlib.Path, seeds: list[int]) -> None:
  from configs import gemma3_270m_accuracy  # pylint: disable=g-import-not-at-top
  from gemma_grpo.rl.eval import scoring  # pylint: disable=g-import-not-at-top

  c = gemma3_270m_accuracy.get_config()
  seen = first_command.trained_equations(c.train.max_steps, c)
  for seed in seeds:
    workdir = out / f"seed_{seed}"
    evals = sorted((workdir / "eval").glob("step_*"), key=lambda d: int(d.name.split("_")[1]))
    (base, base_samples), (grpo, grpo_samples) = read_eval(evals[0]), read_eval(evals[-1])
    wall = json.loads((workdir / "wall_time.json").read_text())["seconds"]
    trained_on = sum(first_command.equation(s["question"]) in seen for s in base_samples)
    print(f"seed {seed} ({wall / 60:.1f} min; {len(base_samples)} held-out problems,"
          f" {trained_on} of them met in training):")
    print(f"  {'':12} {evals[0].name:>10} {evals[-1].name:>10}")
    for name in ("accuracy", "format_accuracy", "truncation_rate"):
      print(f"  {name:15} {base[name]:>10.1%} {grpo[name]:>10.1%}")
    print(f"  {'mean tokens':15} {base['mean_length_tokens']:>10.1f} {grpo['mean_length_tokens']:>10.1f}")
    print("  " + scoring.paired_accuracy_line(base_samples, grpo_samples))
    pairs = list(zip(base_samples, grpo_samples, strict=True))
    print(f"  wrong -> right {sum(not a['correct'] and b['correct'] for a, b in pairs)},"
          f" right -> wrong {sum(a['correct'] and not b['correct'] for a, b in pairs)}")
    by_form = collections.defaultdict(lambda: [0, 0, 0])
    for a, b in pairs:
      counts = by_form[re.sub(r"\d+", "n", first_command.equation(a["question"]))]
      counts[0] += 1
      counts[1] += a["correct"]
      counts[2] += b["correct"]
    print("  by form (correct, base -> GRPO): " + "; ".join(
        f"{form} {start} -> {end} of {n}" for form, (n, start, end)
        in sorted(by_form.items(), key=lambda kv: -kv[1][0])))
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["rewards/train/sum"] for r in rows if "rewards/train/sum" in r]
    print(f"  training reward, mean of the first 5 -> last 5 steps:"
          f" {sum(rewards[:5]) / 5:.2f} -> {sum(rewards[-5:]) / 5:.2f}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, nargs="+", default=[0])
  parser.add_argument("--out", type=pathlib.Path, default=REPO / "docs/results/accuracy")
  parser.add_argument("--summarize-only", action="store_true",
                      help="print the table of runs already in --out")
  args = parser.parse_args()
  if not args.summarize_only:
    for seed in args.seeds:
      print(f"seed {seed}: {first_command.run_seed(seed, args.out, CONFIG) / 60:.1f} min", flush=True)
  summarize(args.out, args.seeds)


if __name__ == "__main__":
  main()
