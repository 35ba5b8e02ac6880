"""DAPO's dynamic sampling: which rolled-out groups train, and refill prompts.

Groups whose rewards are all equal carry no gradient, so they are dropped and
the batch is refilled with fresh prompts. Refill prompts are not taken from
the training iterator (Tunix fast-forwards that by a count of batches on
resume, and would not know about the extra ones) but drawn at random from the
training problems with a generator seeded by (rollout.seed, step, call,
round). A resumed run therefore draws the same refill prompts as the
uninterrupted run would have, and the main data stream is untouched; the
price is that a refill prompt may repeat within an epoch.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from gemma_grpo.tasks import data as data_lib


def has_signal(rewards_NxG) -> np.ndarray:
  """True for groups whose rewards are not all equal (non-zero std)."""
  return np.ptp(np.asarray(rewards_NxG), axis=-1) > 0


@dataclasses.dataclass(frozen=True)
class Selection:
  """Which rolled-out groups form the training batch.

  Attributes:
    picks: (round, group) of each training group, in rollout order.
    extra_rounds: refill rounds rolled out beyond the first.
    dropped: zero-variance groups rolled out and not trained on.
    padded: zero-variance groups trained on to keep the batch full.
    surplus: groups with a reward spread rolled out beyond the batch.
    zero_std: zero-variance groups among all those rolled out.
    rolled_out: groups rolled out in all rounds.
  """

  picks: tuple[tuple[int, int], ...]
  extra_rounds: int
  dropped: int
  padded: int
  surplus: int
  zero_std: int
  rolled_out: int

  def rows(self, num_generations: int) -> list[tuple[int, int]]:
    """(round, row) of each training completion: the G rows of every pick."""
    g = num_generations
    return [(r, i * g + j) for r, i in self.picks for j in range(g)]


def select_groups(first_NxG, roll_more: Callable[[int], np.ndarray] | None,
                  num_groups: int, max_extra_rounds: int) -> Selection:
  """Keep groups with a reward spread, refill, bound.

  Args:
    first_NxG: rewards of the batch's own groups.
    roll_more: roll_more(round) rolls out a fresh batch of groups and returns
      its rewards [N', G]; None disables refilling.
    num_groups: groups the training batch must hold.
    max_extra_rounds: most calls to roll_more.

  Returns:
    The Selection. When the bound is hit first, the batch is filled up with
    zero-variance groups (their advantage is 0: no gradient, fixed shapes),
    taken in rollout order, so the original batch's come first.
  """
  rounds = [np.asarray(first_NxG)]

  def signal() -> list[tuple[int, int]]:
    return [(r, int(i)) for r, rewards in enumerate(rounds)
            for i in np.flatnonzero(has_signal(rewards))]

  while (roll_more is not None and len(signal()) < num_groups
         and len(rounds) - 1 < max_extra_rounds):
    rounds.append(np.asarray(roll_more(len(rounds))))
  informative = signal()
  keep = informative[:num_groups]
  zero = [(r, i) for r, rewards in enumerate(rounds) for i in range(len(rewards))
          if (r, i) not in set(informative)]
  pad = zero[:num_groups - len(keep)]
  return Selection(
      picks=tuple(sorted(keep + pad)),
      extra_rounds=len(rounds) - 1,
      dropped=len(zero) - len(pad),
      padded=len(pad),
      surplus=len(informative) - len(keep),
      zero_std=len(zero),
      rolled_out=sum(len(r) for r in rounds),
  )


def refill_batch(problems: Sequence[data_lib.Problem], *, num_groups: int,
                 num_generations: int, seed: int, step: int, call: int,
                 round_: int, columns) -> dict:
  """Fresh prompts for a refill round, each repeated G times.

  Drawn from `problems` by a generator seeded with (seed, step, call, round),
  so a resumed run refills exactly as the uninterrupted one. `columns` are
  the training batch's; a refill batch must provide each of them.
  """
  g = num_generations
  rng = np.random.default_rng([seed % 2**32, step, call, round_])
  chosen = rng.choice(len(problems), size=num_groups, replace=len(problems) < num_groups)
  batch = data_lib.to_batch([problems[i] for i in chosen])
  inputs = {k: np.repeat(v, g, axis=0) for k, v in batch.items()}
  inputs["prompts"] = list(inputs["prompts"])
  if "trajectory_ids" in columns:
    inputs["trajectory_ids"] = [f"refill-{step}-{call}-{round_}-{i // g}_{i % g}"
                                for i in range(num_groups * g)]
  missing = sorted(set(columns) - set(inputs))
  if missing:
    raise ValueError(f"refill batches lack the columns {missing} of the training batch")
  return inputs
