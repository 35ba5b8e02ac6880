"""GRPO-family learners: Tunix's, with a per-step sampling key and rollout stats.

`config.grpo.algorithm` picks the variant:
  grpo     Tunix GRPO (sequence-mean token-mean loss, KL to the reference)
  dr_grpo  Dr. GRPO: no std normalisation of advantages, no length normalisation
  gspo     GSPO: sequence-level importance ratio (Tunix's gspo-token loss)
  dapo     DAPO: clip-higher, token-mean loss, no KL term
"""

from __future__ import annotations

import dataclasses
import time

import jax
import ml_collections
import numpy as np
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo import dapo_learner
from tunix.rl.grpo import drgrpo_learner
from tunix.rl.grpo import grpo_learner


def algo_config(c: ml_collections.ConfigDict) -> grpo_learner.GRPOConfig:
  """Tunix's algorithm dataclass for `c.algorithm` (c is the `grpo` section)."""
  common = dict(
      num_generations=c.num_generations,
      num_iterations=c.num_iterations,
      epsilon=c.epsilon,
  )
  if c.algorithm == "grpo":
    return grpo_learner.GRPOConfig(beta=c.beta, **common)
  if c.algorithm == "gspo":
    return grpo_learner.GRPOConfig(beta=c.beta, loss_algo="gspo-token", **common)
  if c.algorithm == "dr_grpo":
    return drgrpo_learner.DrGRPOConfig(beta=c.beta, **common)
  if c.algorithm == "dapo":
    return dapo_learner.DAPOConfig(
        beta=None, epsilon_high=c.epsilon_high, overlong_buffer=None, **common
    )
  raise ValueError(f"unknown grpo.algorithm {c.algorithm!r}")


@dataclasses.dataclass
class RolloutStats:
  """What the last training rollout produced, for the per-step console line."""

  step: int = 0
  completion_length: float = 0.0
  seconds: float = 0.0
  tokens: int = 0


class Learner(grpo_learner.GRPOLearner):
  """Tunix's GRPO learner, sampling step s with key fold_in(seed, s).

  Tunix's vanilla rollout uses the same key for every call unless told
  otherwise, so every step would draw the same noise. A key derived from the
  step number gives fresh samples each step and lets a resumed run draw
  exactly the samples the uninterrupted run would have drawn.
  """

  def __init__(self, *args, rollout_seed: int, **kwargs):
    super().__init__(*args, **kwargs)
    self._rollout_key = jax.random.PRNGKey(rollout_seed)
    self.last_rollout = RolloutStats()

  def _generate_and_compute_advantage(self, training_input, mode=rl_cluster_lib.Mode.TRAIN):
    step = self.rl_cluster.actor_trainer.train_steps  # updates done so far
    rollout_config = self.rl_cluster.get_rollout_config(mode)
    rollout_config.seed = jax.random.fold_in(self._rollout_key, step)
    start = time.perf_counter()
    example = super()._generate_and_compute_advantage(training_input, mode)
    if mode == rl_cluster_lib.Mode.TRAIN:
      lengths = np.asarray(example.completion_mask).sum(axis=-1)
      self.last_rollout = RolloutStats(
          step=step + 1,
          completion_length=float(lengths.mean()),
          seconds=time.perf_counter() - start,
          tokens=int(lengths.sum()),
      )
    return example
