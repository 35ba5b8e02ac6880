"""Scoring completions of held-out problems: the metrics of every eval.

`score` turns completions into metrics without any model, so the metric code
is testable on hand-written completions; `run` generates them first, through
any `generate` function (the trainer's in-training eval and `gemma-grpo eval`
both call it); `write` keeps eval.json and samples.jsonl.

Metrics (each completion is scored against its problem's gold answer; with k
samples per problem, per-completion metrics average over problems x samples):
  accuracy            the answer in <answer> equals the gold number
                      (`rewards.is_correct`: same text, or same number)
  partial_accuracy    the answer is within 10% of the gold (correct included)
  format_accuracy     exactly "<reasoning>…</reasoning><answer>…</answer>"
  truncation_rate     hit max_new_tokens without emitting a stop token
  mean_length_tokens  generated tokens, stop token excluded
  mean_length_chars   characters of the decoded completion
  reward/<fn>         mean of each reward function of the preset, weighted
                      as in training (comparable to rewards/train/<fn>)
  reward/sum          mean of their sum (comparable to rewards/train/sum)
  num_problems        problems scored; num_dropped: prompts longer than
                      rollout.max_prompt_length, dropped (never truncated)
Only when sampling k > 1 completions per problem (j = 1, 2, 4, ..., k):
  pass@j              unbiased estimate of P(at least one of j samples is
                      correct) from the n = k samples, c of them correct:
                      1 - C(n-c, j) / C(n, j) (Chen et al. 2021); pass@k is
                      "any sample correct"
  maj@j               the majority answer of the first j samples is correct.
                      Votes are the numbers read from <answer> (its text when
                      it holds no number); samples without an answer do not
                      vote; a tie goes to the answer whose first vote came
                      earliest (lowest sample index); no votes is wrong.

Files (`write`): eval.json (metrics and whatever the caller reports) and
samples.jsonl (one line per completion: prompt, completion, extracted
answer, gold, verdicts, rewards).
"""

from __future__ import annotations

import collections
import json
import math
from typing import Callable, Sequence

import numpy as np

from gemma_grpo import storage
from gemma_grpo.runtime import console
from gemma_grpo.tasks import data as data_lib
from gemma_grpo.tasks import rewards
from gemma_grpo.tasks import tools as tools_lib

# generate(prompts) -> (completions, truncated flags[, generated token counts])
GenerateFn = Callable[[list[str]], tuple]

SUMMARY_FILE = "eval.json"
SAMPLES_FILE = "samples.jsonl"


# --- Metrics ----------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c,k)/C(n,k)."""
  if not 0 <= c <= n or not 1 <= k <= n:
    raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
  return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def vote_key(sample: dict) -> tuple | None:
  """What a sample votes for: its number, else its answer text, else nothing."""
  if sample["number"] is not None:
    return ("number", sample["number"])
  text = (sample["extracted"] or "").strip()
  return ("text", text) if text else None


def majority_vote(samples: Sequence[dict]) -> dict | None:
  """The earliest sample carrying the most common vote, or None if no votes.

  Ties go to the answer voted for first (lowest sample index).
  """
  counts = collections.Counter()
  first = {}
  for sample in samples:
    key = vote_key(sample)
    if key is not None:
      counts[key] += 1
      first.setdefault(key, sample)
  if not counts:
    return None
  top = max(counts.values())
  # `first` keeps insertion order: the earliest-voted answer among the tied.
  return next(s for key, s in first.items() if counts[key] == top)


def paired_bootstrap(base_BxP: Sequence[float], new_BxP: Sequence[float], *,
                     resamples: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
  """(mean difference, 2.5th, 97.5th percentile) of new - base over problems.

  Both score the same problems (in the same order); problems are resampled
  with replacement, keeping each problem's pair together, so the interval
  reflects which problems happened to be drawn, not sampling noise alone.
  """
  diff_P = np.asarray(new_BxP, dtype=np.float64) - np.asarray(base_BxP, dtype=np.float64)
  if diff_P.ndim != 1 or not len(diff_P):
    raise ValueError("paired_bootstrap needs two equal-length, non-empty score lists")
  picks_RxP = np.random.default_rng(seed).integers(0, len(diff_P), (resamples, len(diff_P)))
  means_R = diff_P[picks_RxP].mean(axis=1)
  return float(diff_P.mean()), float(np.percentile(means_R, 2.5)), float(np.percentile(means_R, 97.5))


def per_problem_accuracy(samples: Sequence[dict]) -> dict[str, float]:
  """question -> share of its samples that are correct."""
  scores = collections.defaultdict(list)
  for s in samples:
    scores[s["question"]].append(float(s["correct"]))
  return {q: float(np.mean(v)) for q, v in scores.items()}


def paired_accuracy_line(base_samples: Sequence[dict], samples: Sequence[dict]) -> str | None:
  """The accuracy difference with its 95% paired-bootstrap interval, if the problems pair up."""
  base, new = per_problem_accuracy(base_samples), per_problem_accuracy(samples)
  if set(base) != set(new):
    return None
  questions = sorted(new)
  diff, low, high = paired_bootstrap([base[q] for q in questions], [new[q] for q in questions])
  return (f"accuracy difference {diff * 100:+.1f} points, 95% paired-bootstrap interval"
          f" [{low * 100:+.1f}, {high * 100:+.1f}] over {len(questions)} problems")


def sample_sizes(n: int) -> list[int]:
  """1, 2, 4, ... below n, then n: the j of pass@j and maj@j."""
  sizes = [1 << i for i in range(n.bit_length()) if 1 << i < n]
  return sizes + [n]


def _mean(values: Sequence[float]) -> float:
  return float(np.mean(values)) if len(values) else 0.0


def score(problems: Sequence[data_lib.Problem], completions: Sequence[str],
          truncated: Sequence[bool], *, num_tokens: Sequence[int] | None = None,
          num_samples: int = 1, reward_fns: Sequence[Callable] | None = None,
          num_dropped: int = 0, tools: bool = False) -> tuple[dict[str, float], list[dict]]:
  """Metrics over problems and their completions, and one record per completion.

  Args:
    problems: the problems, in order.
    completions: `num_samples` completions per problem, problem-major
      (completion i * num_samples + j is sample j of problem i).
    truncated: per completion, whether it hit the token limit without a stop.
    num_tokens: per completion, generated tokens; without it the metric
      mean_length_tokens is left out.
    num_samples: k, samples per problem; k > 1 adds pass@j and maj@j.
    reward_fns: weighted reward functions (`rewards.build_reward_fns`);
      default the default preset's.
    num_dropped: problems dropped before generation, reported as is.
    tools: the completions could call tools (rollout.tools); adds each
      sample's tool_calls and failed_tool_calls, read from its text, and
      their means.
  """
  k = num_samples
  if k < 1 or len(completions) != len(problems) * k:
    raise ValueError(f"{len(completions)} completions for {len(problems)} problems x {k} samples")
  if reward_fns is None:
    reward_fns = rewards.build_reward_fns(rewards.DEFAULT_PRESET)
  rendered = [p.prompt for p in problems for _ in range(k)]
  golds = [p.answer for p in problems for _ in range(k)]
  reward_values = {
      fn.__name__: fn(prompts=rendered, completions=list(completions), answer=golds)
      for fn in reward_fns
  }
  samples = []
  for i, (completion, cut) in enumerate(zip(completions, truncated, strict=True)):
    problem = problems[i // k]
    s = rewards.score_completion(completion, problem.answer)
    samples.append({
        "problem": i // k,
        "sample": i % k,
        "question": problem.question,
        "prompt": rendered[i],
        "completion": completion,
        "extracted": s["answer"],
        "number": s["number"],
        "gold": problem.answer,
        "grade": s["grade"],
        "correct": bool(s["correct"]),
        "partial": bool(s["partial"]),
        "exact_format": bool(s["exact_format"]),
        "truncated": bool(cut),
        "length_tokens": None if num_tokens is None else int(num_tokens[i]),
        "length_chars": len(completion),
        "rewards": {name: float(values[i]) for name, values in reward_values.items()},
    })
    if tools:
      samples[-1]["tool_calls"], samples[-1]["failed_tool_calls"] = tools_lib.count_calls(completion)

  metrics = {
      "num_problems": len(problems),
      "num_dropped": num_dropped,
      "accuracy": _mean([s["correct"] for s in samples]),
      "partial_accuracy": _mean([s["partial"] for s in samples]),
      "format_accuracy": _mean([s["exact_format"] for s in samples]),
      "truncation_rate": _mean([s["truncated"] for s in samples]),
  }
  if num_tokens is not None:
    metrics["mean_length_tokens"] = _mean([s["length_tokens"] for s in samples])
  metrics["mean_length_chars"] = _mean([s["length_chars"] for s in samples])
  if tools:
    metrics["tool_calls_per_completion"] = _mean([s["tool_calls"] for s in samples])
    metrics["failed_tool_calls_per_completion"] = _mean([s["failed_tool_calls"] for s in samples])
    metrics["tool_use_rate"] = _mean([s["tool_calls"] > 0 for s in samples])
  for name, values in reward_values.items():
    metrics[f"reward/{name}"] = _mean(values)
  metrics["reward/sum"] = _mean([sum(s["rewards"].values()) for s in samples])

  if k > 1:
    groups = [samples[i * k:(i + 1) * k] for i in range(len(problems))]
    for j in sample_sizes(k):
      metrics[f"pass@{j}"] = _mean([pass_at_k(k, sum(s["correct"] for s in g), j) for g in groups])
    for j in sample_sizes(k):
      winners = [majority_vote(g[:j]) for g in groups]
      metrics[f"maj@{j}"] = _mean([w is not None and w["correct"] for w in winners])
    for group in groups:
      winner = majority_vote(group)
      vote = {"answer": winner and winner["extracted"], "correct": bool(winner and winner["correct"])}
      for s in group:
        s["majority"] = vote
  return metrics, samples


def run(generate: GenerateFn, problems: Sequence[data_lib.Problem],
        batch_size: int, *, reward_fns: Sequence[Callable] | None = None,
        num_dropped: int = 0, show_progress: bool = False,
        tools: bool = False) -> tuple[dict[str, float], list[dict]]:
  """Generates a completion per problem in batches, then scores them.

  `generate` returns (texts, truncated) or (texts, truncated, num_tokens);
  only the latter gives mean_length_tokens. `show_progress` draws a bar on
  an interactive terminal.
  """
  completions, truncated, num_tokens = [], [], []
  bar = console.progress(len(problems), "eval", "problem", enabled=show_progress)
  for start in range(0, len(problems), batch_size):
    chunk = problems[start:start + batch_size]
    texts, cuts, *counts = generate([p.prompt for p in chunk])
    completions.extend(texts)
    truncated.extend(cuts)
    if counts and num_tokens is not None:
      num_tokens.extend(counts[0])
    else:
      num_tokens = None
    bar.update(len(chunk))
  bar.close()
  return score(problems, completions, truncated, num_tokens=num_tokens,
               reward_fns=reward_fns, num_dropped=num_dropped, tools=tools)


def write(out, report: dict, samples: list[dict]) -> None:
  """eval.json and samples.jsonl into `out` (a local directory or gs:// URL)."""
  out = storage.path(out)
  out.mkdir(parents=True, exist_ok=True)
  storage.write_text(out / SUMMARY_FILE, json.dumps(report, indent=2) + "\n")
  storage.write_text(out / SAMPLES_FILE, "".join(
      json.dumps(sample, ensure_ascii=False) + "\n" for sample in samples))
