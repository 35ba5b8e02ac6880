"""One training step's rollout rounds: what each holds, and what they log.

A step rolls out its batch once, and with dynamic sampling refill rounds
after it (dynamic_sampling.py); the training batch takes chosen rows of them.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from gemma_grpo.rl.learner import dynamic_sampling


@dataclasses.dataclass
class Round:
  """One rollout of a batch of groups, G rows per group."""

  inputs: dict  # batch columns, one entry per row ("prompts" a list)
  prompt_ids: np.ndarray  # [n, P] left-padded
  completion_ids: np.ndarray  # [n, L] right-padded
  lengths: np.ndarray  # [n] tokens generated before the stop token
  truncated: np.ndarray  # [n] hit L without a stop token
  rewards: np.ndarray  # [n] sum of reward functions + overlong penalty
  fn_rewards: dict[str, np.ndarray]  # reward function name -> [n]
  seconds: float
  # [n, L] log-probs of the sampled tokens under the sampler's own logits
  # (0 past each row's end); None unless the learner asks for them.
  sample_logps: np.ndarray | None = None
  # [n, L] True where a token is a tool's result (multi_turn.py): read by the
  # model, never trained on; None when the engine has no tools.
  tool_mask: np.ndarray | None = None
  tool_calls: np.ndarray | None = None  # [n] calls per completion
  failed_calls: np.ndarray | None = None  # [n] of them, those that returned an error
  # What the engine's decode loop did, one entry per generate() call
  # (rollout.DecodeStats: steps, slots, kept_B, refills), its kept tokens
  # ending at stop_text (kept_through_stop_text); None from Tunix's engine.
  decode_stats: Sequence | None = None


def kept_through_stop_text(stats: Sequence, kept_tokens_B: np.ndarray) -> list:
  """The engine's stats, each completion's kept decode steps ending where the
  learner cut it at rollout.stop_text.

  The engine stops a row right after its stop text where its automaton sees
  it (rl/engine/stop_text.py), which may miss it; tokens it decoded after
  the stop text are discarded, so they count as idle slot-steps, not kept
  ones. `kept_tokens_B`: per completion, in the order of the stats' rows, the
  tokens left after the cut (the first came from the prefill), or -1 where
  nothing was cut.
  """
  out, row = [], 0
  for s in stats:
    cuts = kept_tokens_B[row:row + len(s.kept_B)]
    out.append(dataclasses.replace(s, kept_B=tuple(
        k if cut < 0 else min(k, max(int(cut) - 1, 0)) for k, cut in zip(s.kept_B, cuts))))
    row += len(s.kept_B)
  assert row == len(kept_tokens_B), (row, len(kept_tokens_B))
  return out


def overlong_penalty(lengths, max_length: int, buffer: int, penalty: float) -> np.ndarray:
  """DAPO's soft overlong punishment, with lengths in tokens.

  0 up to L - B tokens, then falling linearly to -penalty at L (and staying
  there beyond): -clip((l - (L - B)) / B, 0, 1) * penalty.
  """
  lengths = np.asarray(lengths, dtype=np.float64)
  if buffer <= 0:
    return np.zeros_like(lengths)
  excess = (lengths - (max_length - buffer)) / buffer
  return -np.clip(excess, 0.0, 1.0) * penalty


def stack_rows(rounds: Sequence[Round], rows: Sequence[tuple[int, int]],
               field: str) -> np.ndarray | None:
  """`field` of each (round, row), stacked; None where the rounds lack it."""
  if getattr(rounds[0], field) is None:
    return None
  return np.stack([getattr(rounds[r], field)[k] for r, k in rows])


def diagnostics(rounds: Sequence[Round], selection: dynamic_sampling.Selection,
                advantages_B, *, dynamic: bool) -> dict:
  """Per-step health metrics, {name: (value, reduce)} (Tunix logs <group>/<mode>/<name>).

  Rewards, lengths and truncation cover every completion rolled out this
  step (refill rounds included: they describe the policy); advantages cover
  the training batch. `dynamic` adds dynamic sampling's counts.
  """
  rewards = np.concatenate([r.rewards for r in rounds])
  lengths = np.concatenate([r.lengths for r in rounds])
  truncated = np.concatenate([r.truncated for r in rounds])
  advantages = np.asarray(advantages_B, dtype=np.float64)
  seconds = sum(r.seconds for r in rounds)
  tokens = int(lengths.sum())
  metrics = {
      "diagnostics/reward/mean": (rewards.mean(), np.mean),
      "diagnostics/reward/std": (rewards.std(), np.mean),
      "diagnostics/zero_std_frac": (selection.zero_std / max(selection.rolled_out, 1), np.mean),
      "diagnostics/advantage/abs_mean": (np.abs(advantages).mean(), np.mean),
      "diagnostics/advantage/max": (advantages.max(), np.max),
      "diagnostics/advantage/min": (advantages.min(), np.min),
      "diagnostics/advantage/nonzero_frac": ((np.abs(advantages) > 1e-8).mean(), np.mean),
      "completions/mean_length": (lengths.mean(), np.mean),
      "completions/max_length": (lengths.max(), np.max),
      "completions/min_length": (lengths.min(), np.min),
      "completions/truncated_frac": (truncated.mean(), np.mean),
      "perf/rollout_seconds": (seconds, np.sum),
      "perf/rollout_tokens_per_second": (tokens / max(seconds, 1e-9), np.mean),
  }
  if rounds[0].decode_stats is not None:
    stats = [s for r in rounds for s in r.decode_stats]
    slot_steps = sum(s.steps * s.slots for s in stats)
    metrics.update({
        # The share of decode slot-steps that made a token a completion kept:
        # lockstep idles rows that ended while the longest goes on.
        "rollout/occupancy": (sum(s.kept for s in stats) / slot_steps if slot_steps else 1.0,
                              np.mean),
        "rollout/decode_steps": (sum(s.steps for s in stats), np.sum),
        "rollout/refills": (sum(s.refills for s in stats), np.sum),
    })
  if rounds[0].tool_calls is not None:
    calls = np.concatenate([r.tool_calls for r in rounds])
    failed = np.concatenate([r.failed_calls for r in rounds])
    metrics.update({
        "tools/calls_per_completion": (calls.mean(), np.mean),
        "tools/failed_per_completion": (failed.mean(), np.mean),
        "tools/failed_frac": (failed.sum() / max(calls.sum(), 1), np.mean),
        "tools/completions_with_calls_frac": ((calls > 0).mean(), np.mean),
        "tools/turns_mean": ((calls + 1).mean(), np.mean),
    })
  for name in rounds[0].fn_rewards:
    values = np.concatenate([r.fn_rewards[name] for r in rounds])
    metrics[f"diagnostics/reward_std/{name}"] = (values.std(), np.mean)
  if dynamic:
    metrics.update({
        "diagnostics/dynamic_sampling/extra_rounds": (selection.extra_rounds, np.sum),
        "diagnostics/dynamic_sampling/dropped_groups": (selection.dropped, np.sum),
        "diagnostics/dynamic_sampling/padded_groups": (selection.padded, np.sum),
        "diagnostics/dynamic_sampling/surplus_groups": (selection.surplus, np.sum),
    })
  return metrics
