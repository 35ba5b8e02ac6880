"""How well a policy reasons on held-out problems.

`score` turns completions into metrics without any model, so the metric code
is testable on hand-written completions; `run` generates them first.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from gemma_grpo import data as data_lib
from gemma_grpo import prompts
from gemma_grpo import rewards

# generate(prompts) -> (completions, truncated flags)
GenerateFn = Callable[[list[str]], tuple[list[str], list[bool]]]


def score(problems: Sequence[data_lib.Problem], completions: Sequence[str],
          truncated: Sequence[bool]) -> tuple[dict[str, float], list[dict]]:
  """Metrics over (problem, completion) pairs, and one sample record each."""
  samples = []
  for problem, completion, cut in zip(problems, completions, truncated, strict=True):
    s = rewards.score_completion(completion, problem.answer)
    samples.append({
        "question": problem.question,
        "completion": completion,
        "extracted": s["answer"],
        "gold": problem.answer,
        "correct": bool(s["correct"]),
        "partial": bool(s["partial"]),
        "exact_format": bool(s["exact_format"]),
        "truncated": bool(cut),
        "length_chars": len(completion),
    })
  n = max(len(samples), 1)
  metrics = {
      "accuracy": sum(s["correct"] for s in samples) / n,
      "partial_accuracy": sum(s["partial"] for s in samples) / n,
      "format_accuracy": sum(s["exact_format"] for s in samples) / n,
      "truncation_rate": sum(s["truncated"] for s in samples) / n,
      "mean_length_chars": float(np.mean([s["length_chars"] for s in samples])) if samples else 0.0,
  }
  golds = [p.answer for p in problems]
  for fn in rewards.build_reward_fns("reference", {}):
    values = fn(prompts=[""] * len(completions), completions=list(completions), answer=golds)
    metrics[f"reward/{fn.__name__}"] = float(np.mean(values)) if values else 0.0
  return metrics, samples


def run(generate: GenerateFn, problems: Sequence[data_lib.Problem],
        batch_size: int) -> tuple[dict[str, float], list[dict]]:
  """Generates a completion per problem in batches, then scores them."""
  completions, truncated = [], []
  for start in range(0, len(problems), batch_size):
    chunk = problems[start:start + batch_size]
    texts, cuts = generate([prompts.render_prompt(p.question) for p in chunk])
    completions.extend(texts)
    truncated.extend(cuts)
  return score(problems, completions, truncated)
