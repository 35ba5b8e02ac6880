"""Tests for gemma_grpo.rl.learner.algorithms: the table of algorithms and its settings."""

import dataclasses

import numpy as np
import pytest

from configs import base
from gemma_grpo import config as config_lib
from gemma_grpo.config import settings
from gemma_grpo.rl.learner import algorithms


def grpo_section(**overrides) -> settings.AlgorithmSettings:
  return dataclasses.replace(settings.from_config(base.get_config()).grpo, **overrides)


def test_the_table_holds_exactly_the_algorithms_config_accepts():
  assert sorted(algorithms.VARIANTS) == sorted(config_lib.ALGORITHMS)


def test_an_unknown_algorithm_is_refused():
  with pytest.raises(ValueError, match="unknown grpo.algorithm 'ppo'"):
    algorithms.algo_config(grpo_section(algorithm="ppo"))


@pytest.mark.parametrize("algorithm, expected", [
    ("grpo", dict(advantage_estimator="grpo", loss_agg_mode="sequence-mean-token-mean",
                  loss_algo="grpo", epsilon=0.2, epsilon_high=0.2, beta=0.08)),
    ("dapo", dict(advantage_estimator="grpo", loss_agg_mode="token-mean",
                  loss_algo="grpo", epsilon=0.2, epsilon_high=0.28, beta=0.0)),
    ("dr_grpo", dict(advantage_estimator="drgrpo", loss_agg_mode="sequence-mean-token-scale",
                     loss_algo="grpo", epsilon=0.2, epsilon_high=0.2, beta=0.08)),
    ("gspo", dict(advantage_estimator="grpo", loss_agg_mode="sequence-mean-token-mean",
                  loss_algo="gspo-token", epsilon=3e-4, epsilon_high=4e-4, beta=0.08)),
])
def test_algo_config(algorithm, expected):
  cfg = algorithms.algo_config(grpo_section(algorithm=algorithm))
  assert cfg.policy_loss_fn == "gemma_grpo"
  assert cfg.kl_loss_mode == "low_var_kl"
  assert {f: getattr(cfg, f) for f in expected} == pytest.approx(expected)


def test_algo_config_carries_the_tis_cap():
  assert algorithms.algo_config(grpo_section()).tis_cap == 0.0
  assert algorithms.algo_config(grpo_section(algorithm="gspo", tis_cap=2.0)).tis_cap == 2.0


def test_algo_config_carries_dapo_extras():
  cfg = algorithms.algo_config(grpo_section(
      algorithm="dapo", beta=0.0, overlong_buffer=64, overlong_penalty=0.5,
      dynamic_sampling=True, max_resample_rounds=2))
  assert (cfg.overlong_buffer, cfg.overlong_penalty) == (64, 0.5)
  assert (cfg.dynamic_sampling, cfg.max_resample_rounds) == (True, 2)


def test_loss_metrics_log_tis_only_when_it_is_on():
  tis = {"tis/ratio_mean", "tis/ratio_min", "tis/ratio_max", "tis/capped_frac"}
  assert not tis & set(algorithms.loss_metrics(with_kl=True))
  on = algorithms.loss_metrics(with_kl=True, with_tis=True)
  assert tis <= set(on)
  assert (on["tis/ratio_min"], on["tis/ratio_max"]) == (np.min, np.max)


# Worked by hand for two groups of G = 2: {1, 3} has mean 2 and sample std
# (ddof 1) sqrt(2); {0, 4} has mean 2 and std 2 sqrt(2); {0, 0} has no spread.
# Every algorithm but Dr. GRPO divides by the std; Dr. GRPO keeps r - mean.
_SCALED = [-1 / np.sqrt(2), 1 / np.sqrt(2)]


@pytest.mark.parametrize("algorithm, rewards, expected", [
    ("grpo", [1.0, 3.0, 0.0, 4.0], _SCALED + _SCALED),
    ("grpo", [1.0, 3.0, 0.0, 0.0], _SCALED + [0.0, 0.0]),
    ("dapo", [1.0, 3.0, 0.0, 4.0], _SCALED + _SCALED),
    ("gspo", [1.0, 3.0, 0.0, 4.0], _SCALED + _SCALED),
    ("dr_grpo", [1.0, 3.0, 0.0, 4.0], [-1.0, 1.0, -2.0, 2.0]),
    ("dr_grpo", [1.0, 3.0, 0.0, 0.0], [-1.0, 1.0, 0.0, 0.0]),
])
def test_advantages_follow_the_algorithms_estimator(algorithm, rewards, expected):
  beta = 0.0 if algorithm == "dapo" else 0.08  # DAPO has no KL term
  algo = algorithms.algo_config(grpo_section(algorithm=algorithm, num_generations=2, beta=beta))
  np.testing.assert_allclose(algorithms.advantages(algo, np.array(rewards)),
                             expected, rtol=1e-5, atol=1e-6)
