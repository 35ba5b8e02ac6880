"""The GRPO family's settings, one table entry per algorithm, and the loss wiring.

`config.grpo.algorithm` picks the variant; all four train with losses.loss_fn
(see losses.py for the formulas):
  grpo     clipped ratio, sequence-mean token-mean, beta * KL (k3) to the
           reference, advantages (r - mean) / std per group (DeepSeekMath)
  dapo     clip-higher [1 - eps_low, 1 + eps_high], token-mean over the
           batch, no KL; with grpo.overlong_buffer and grpo.dynamic_sampling
           it is the whole of DAPO (arXiv 2503.14476)
  dr_grpo  advantages r - mean (no std), per-sequence sums divided by the
           constant L = rollout.max_new_tokens (arXiv 2503.20783)
  gspo     sequence-level ratio s_i = (pi/pi_old)(o_i)^(1/|o_i|), clipped at
           its own, much narrower range (arXiv 2507.18071)
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
from tunix.rl import function_registry
from tunix.rl.grpo import grpo_learner

from gemma_grpo.config import settings
from gemma_grpo.rl.learner import losses


@dataclasses.dataclass(kw_only=True)
class AlgoConfig(grpo_learner.GRPOConfig):
  """Tunix's GRPOConfig plus what its learners lack.

  Attributes:
    algorithm: grpo | dapo | dr_grpo | gspo.
    epsilon_high: upper clip, ratio <= 1 + epsilon_high (DAPO's clip-higher);
      `epsilon` is the lower one, ratio >= 1 - epsilon.
    overlong_buffer: B, the last tokens before the limit L where DAPO's length
      penalty ramps from 0 to -overlong_penalty; 0 turns it off.
    overlong_penalty: the penalty at length L.
    dynamic_sampling: drop groups whose rewards are all equal and refill.
    max_resample_rounds: extra rollout rounds allowed per batch for that.
    log_kl: compute the KL to the reference for the logs even when beta = 0
      (one reference forward pass per step).
    tis_cap: C of truncated importance sampling, the cap on each token's
      weight min(pi_old / pi_sampler, C); 0 turns it off.
  """

  algorithm: str = "grpo"
  policy_loss_fn: str = losses.LOSS_NAME
  kl_loss_mode: str = "low_var_kl"  # k3, the estimator of the GRPO paper
  epsilon_high: float = 0.2
  overlong_buffer: int = 0
  overlong_penalty: float = 1.0
  dynamic_sampling: bool = False
  max_resample_rounds: int = 0
  log_kl: bool = True
  tis_cap: float = 0.0


# What each algorithm sets beyond the settings all share, read from the grpo
# section. The keys are config.ALGORITHMS, the one list of names.
VARIANTS: dict[str, Callable[[settings.AlgorithmSettings], dict]] = {
    "grpo": lambda g: {},
    "dapo": lambda g: dict(algo_variant="dapo", loss_agg_mode="token-mean", beta=0.0,
                           epsilon_high=g.epsilon_high),
    # Tunix's DrGRPOConfig pieces: no std in the advantage, and a per-sequence
    # sum divided by the padded completion width, which is L.
    "dr_grpo": lambda g: dict(algo_variant="drgrpo", advantage_estimator="drgrpo",
                              loss_agg_mode="sequence-mean-token-scale"),
    "gspo": lambda g: dict(algo_variant="gspo-token", loss_algo="gspo-token",
                           epsilon=g.gspo_epsilon, epsilon_high=g.gspo_epsilon_high),
}


def algo_config(c: settings.AlgorithmSettings) -> AlgoConfig:
  """Tunix's config of the `grpo` settings' algorithm."""
  if c.algorithm not in VARIANTS:
    raise ValueError(f"unknown grpo.algorithm {c.algorithm!r}")
  common = dict(
      algorithm=c.algorithm,
      num_generations=c.num_generations,
      num_iterations=c.num_iterations,
      beta=c.beta,
      epsilon=c.epsilon,
      epsilon_high=c.epsilon,
      overlong_buffer=c.overlong_buffer,
      overlong_penalty=c.overlong_penalty,
      dynamic_sampling=c.dynamic_sampling,
      max_resample_rounds=c.max_resample_rounds,
      log_kl=c.log_kl,
      tis_cap=c.tis_cap,
  )
  return AlgoConfig(**{**common, **VARIANTS[c.algorithm](c)})


def advantages(algo: AlgoConfig, rewards_B) -> np.ndarray:
  """[B] advantages of rewards in groups of G consecutive rows, by algo's estimator."""
  estimator = function_registry.get_advantage_estimator(algo.advantage_estimator)
  return estimator(rewards=rewards_B, num_generations=algo.num_generations)


def loss_metrics(with_kl: bool, with_tis: bool = False) -> dict[str, Callable]:
  """Aux values of losses.loss_fn that Tunix logs as actor/train/<name>."""
  metrics = {
      "entropy": np.mean,
      "token_prob": np.mean,
      "pg_clipfrac": np.mean,
      "clipfrac/low": np.mean,
      "clipfrac/high": np.mean,
      "ratio/mean": np.mean,
      "ratio/min": np.min,
      "ratio/max": np.max,
  }
  if with_kl:
    metrics["kl"] = np.mean
  if with_tis:
    metrics.update({
        "tis/ratio_mean": np.mean,
        "tis/ratio_min": np.min,
        "tis/ratio_max": np.max,
        "tis/capped_frac": np.mean,
    })
  return metrics


def wire_loss(trainer, algo: AlgoConfig, *, pad_id: int, eos_id: int) -> None:
  """Gives the actor trainer its loss, as Tunix's GRPOLearner does, from `algo`.

  The Learner calls it after Tunix's own wiring and `plan` on the trainer it
  builds, so both compile one train step.
  """
  policy_loss_fn = function_registry.get_policy_loss_fn(algo.policy_loss_fn)

  def loss_fn(model, train_example, algo_config):
    del algo_config  # the one bound here; Tunix passes it through the inputs
    return policy_loss_fn(model, train_example, algo_config=algo, pad_id=pad_id, eos_id=eos_id)

  trainer.with_loss_fn(loss_fn, has_aux=True)
  trainer.with_gen_model_input_fn(lambda x: {"train_example": x, "algo_config": algo})
