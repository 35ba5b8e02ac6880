"""The optimizer (gemma_grpo/rl/run/optim.py)."""

import dataclasses
import math

import numpy as np
import pytest

from gemma_grpo import config as config_lib
from gemma_grpo.config import settings
from gemma_grpo.rl.run import optim


@pytest.fixture
def tiny():
  return settings.from_config(config_lib.load("configs/tiny.py"))


def test_optimizer_warms_up_from_zero_then_decays(tiny):
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  tx = optim.optimizer(dataclasses.replace(tiny.optim, peak_lr=1e-3, warmup_fraction=0.1),
                       max_steps=100)
  params = {"w": jnp.ones(3)}
  state = tx.init(params)
  lrs = []
  for _ in range(100):  # the learning rate update k used
    _, state = tx.update({"w": jnp.ones(3)}, state, params)
    lrs.append(float(state.hyperparams["learning_rate"]))
  assert lrs[0] == 0.0
  assert lrs[10] == pytest.approx(1e-3)  # warmup of 10% of 100 steps
  assert lrs[55] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 45 / 90)), rel=1e-4)
  assert lrs[-1] < 1e-5


def test_learning_rates_list_the_schedule_of_every_update(tiny):
  c = dataclasses.replace(tiny.optim, warmup_fraction=0.25, peak_lr=1e-3, end_lr=0.0)
  rates = optim.learning_rates(c, 8)
  schedule = optim.learning_rate(c, 8)
  assert rates.shape == (8,)
  np.testing.assert_allclose(rates, [float(schedule(i)) for i in range(8)], rtol=1e-6)
  assert rates[0] == 0.0 and rates[2] == pytest.approx(1e-3)
