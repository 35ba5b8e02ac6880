"""Throughput of each reward function on a realistic mix of completions.

  python bench/rewards.py [--n 10000] [--math-n 300]

Scores n synthetic completions (40% well-formed and correct, 30% well-formed
and wrong, 20% malformed, 10% long: 2k-100k characters) with every reward and
prints seconds and completions per second. math_verify_correct costs
milliseconds per completion (sympy), so it is timed on the first --math-n
completions only; its throughput is comparable, its seconds are not.
Runs in about 3 s on one CPU core. Prints figures; asserts nothing.
"""

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gemma_grpo.tasks import rewards  # pylint: disable=g-import-not-at-top

_WORDS = ("she buys packs of pens so each pack costs dollars and the total is "
          "then we add subtract multiply half twice remaining").split()


def _reasoning(rng: random.Random, words: int) -> str:
  return " ".join(rng.choice(_WORDS) if rng.random() < 0.8 else
                  str(rng.randint(1, 500)) for _ in range(words))


def _completion(rng: random.Random, gold: int) -> str:
  """One completion from the mix described in the module docstring."""
  kind = rng.random()
  if kind < 0.4:
    answer = rng.choice([str(gold), f" {gold} ", f"${gold:,}", f"{gold}.0"])
    return (f"<reasoning>{_reasoning(rng, 60)}</reasoning>\n"
            f"<answer>{answer}</answer><end_of_turn>")
  if kind < 0.7:
    wrong = gold + rng.choice([1, -1, 7, gold, -2 * gold - 3])
    return (f"<reasoning>{_reasoning(rng, 60)}</reasoning>\n"
            f"<answer>{wrong}</answer><end_of_turn>")
  if kind < 0.9:
    return rng.choice([
        f"{_reasoning(rng, 40)} The answer is {gold}.",
        f"<reasoning>{_reasoning(rng, 40)}<answer>{gold}",
        f"<answer>{gold}</answer><answer>{gold}</answer>",
        f"<reasoning><reasoning>{_reasoning(rng, 20)}</reasoning>",
        "",
    ])
  # A repeated paragraph costs as much to score as fresh text, and is cheap.
  long = (_reasoning(rng, 60) + " ") * rng.choice([5, 50, 250])  # 2k-100k chars
  return f"<reasoning>{long}</reasoning>\n<answer>{gold}</answer>"


def _time(fn, completions, golds) -> float:
  start = time.perf_counter()
  scores = fn(["prompt"] * len(completions), completions, golds, mode="train")
  elapsed = time.perf_counter() - start
  assert len(scores) == len(completions)
  return elapsed


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--n", type=int, default=10_000)
  parser.add_argument("--math-n", type=int, default=300)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()

  rng = random.Random(args.seed)
  golds = [str(rng.randint(-50, 5000)) for _ in range(args.n)]
  completions = [_completion(rng, int(g)) for g in golds]
  chars = sum(len(c) for c in completions)
  print(f"{args.n} completions, {chars / 1e6:.1f} M characters, "
        f"longest {max(map(len, completions))}")

  # The first math-verify call imports sympy and warms its caches.
  rewards.math_verify_correct(None, ["<answer>1</answer>"], ["1"])
  rows = []
  for name, fn in rewards.REWARD_FUNCTIONS.items():
    n = args.math_n if name == "math_verify_correct" else args.n
    rows.append((name, n, _time(fn, completions[:n], golds[:n])))
  guarded = rewards.build_reward_fns("guarded", {})
  rows.append(("guarded preset (4 fns)", args.n,
               sum(_time(fn, completions, golds) for fn in guarded)))

  print(f"{'reward':<24} {'n':>6} {'seconds':>8} {'completions/s':>14}")
  for name, n, seconds in rows:
    print(f"{name:<24} {n:>6} {seconds:>8.3f} {n / seconds:>14,.0f}")


if __name__ == "__main__":
  main()
