"""95% paired-bootstrap intervals for every GSM8K comparison RESULTS.md reports.

  python docs/results/gsm8k_intervals.py > docs/results/gsm8k_intervals.txt

The eval outputs of those runs (2026-11-30 and 12-01) were not kept, but
RESULTS.md lists which test problems each model solved and how many problems
changed format in each direction, which fixes the per-problem pairs exactly.
The interval is gemma_grpo.scoring.paired_bootstrap's (problems resampled
with their pair, 10,000 times, seed 0).
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from gemma_grpo import scoring  # pylint: disable=g-import-not-at-top,wrong-import-position

# 1-based GSM8K test problems each model answered correctly (RESULTS.md).
SOLVED = {
    "base": set(),
    "SFT-80": {125, 154, 232},
    "SFT-80 + GRPO": {180, 254},
    "SFT-400": {53, 162, 169, 242},
    "SFT-400 + GRPO": {70, 80, 119, 169, 203, 225},
}


def accuracy(base: str, new: str, problems: range) -> str:
  a = [float(p in SOLVED[base]) for p in problems]
  b = [float(p in SOLVED[new]) for p in problems]
  diff, low, high = scoring.paired_bootstrap(a, b)
  return (f"accuracy {new} vs {base}, problems {problems.start}-{problems.stop - 1}:"
          f" {int(sum(b))} vs {int(sum(a))} solved, {diff * 100:+.1f} points,"
          f" 95% interval [{low * 100:+.1f}, {high * 100:+.1f}]")


def format_flips(base: str, new: str, n: int, gained: int, lost: int, what: str) -> str:
  diff_P = [1.0] * gained + [-1.0] * lost + [0.0] * (n - gained - lost)
  diff, low, high = scoring.paired_bootstrap([0.0] * n, diff_P)
  return (f"format {new} vs {base}, {what}: {gained} problems gained the format, {lost} lost it,"
          f" {diff * 100:+.1f} points, 95% interval [{low * 100:+.1f}, {high * 100:+.1f}]")


def main() -> None:
  for problems in (range(1, 129), range(1, 257)):
    print(accuracy("base", "SFT-80", problems))
    print(accuracy("SFT-80", "SFT-80 + GRPO", problems))
  print(accuracy("base", "SFT-400", range(1, 257)))
  print(accuracy("SFT-400", "SFT-400 + GRPO", range(1, 257)))
  print(accuracy("SFT-80 + GRPO", "SFT-400 + GRPO", range(1, 257)))
  print(format_flips("SFT-80", "SFT-80 + GRPO", 128, 50, 0, "problems 1-128"))
  print(format_flips("SFT-400", "SFT-400 + GRPO", 256, 45, 4, "problems 1-256"))


if __name__ == "__main__":
  main()
