"""Tests for gemma_grpo.rl.learner.train_examples: which log-probs fill the train
example, and tool results kept in the sequence but out of the loss.
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from gemma_grpo.config import settings
from gemma_grpo.rl.learner import algorithms
from gemma_grpo.rl.learner import losses
from gemma_grpo.rl.learner import train_examples


def grpo_section(**overrides) -> settings.AlgorithmSettings:
  return dataclasses.replace(settings.from_config(base.get_config()).grpo, **overrides)


# --- which log-probs the ratio and TIS's weight divide by ---------------------

SAMPLER, TRAINER = "sampler", "trainer"


@pytest.mark.parametrize("sampler, tis, off_policy, expected", [
    # float32 sampler, TIS off: the loss's own log pi, or the trainer's old ones.
    (None, False, False, (None, None)),
    (None, False, True, (TRAINER, None)),
    # A bfloat16 sampler, TIS off: it is the behaviour policy of the ratio.
    (SAMPLER, False, False, (SAMPLER, None)),
    (SAMPLER, False, True, (SAMPLER, None)),
    # TIS on: the ratio keeps the trainer's log-probs, the weight takes the sampler's.
    (SAMPLER, True, False, (None, SAMPLER)),
    (SAMPLER, True, True, (TRAINER, SAMPLER)),
])
def test_behaviour_logps(sampler, tis, off_policy, expected):
  calls = []

  def trainer_old_logps():
    calls.append(1)
    return TRAINER

  got = train_examples.behaviour_logps(sampler, tis=tis,
                                       trainer_old_logps=trainer_old_logps if off_policy else None)
  assert got == expected
  assert len(calls) == (expected[0] == TRAINER)  # the trainer's pass only when used


# --- Tool results: in the sequence, out of the loss ----------------------------

PAD = 0
# One completion that called a tool: the model wrote 5 tokens, the tool's
# result 3 (slots 3-5), then the model 2 more, then padding.
TOOL_ROW = np.array([11, 12, 13, 21, 22, 23, 14, 15, PAD, PAD])
TOOL_MASK = np.array([0, 0, 0, 1, 1, 1, 0, 0, 0, 0], bool)
PLAIN_ROW = np.array([16, 17, 18, 19, PAD, PAD, PAD, PAD, PAD, PAD])


def test_the_train_example_masks_tool_results_token_by_token():
  completion_ids = jnp.asarray(np.stack([TOOL_ROW, PLAIN_ROW]))
  example = train_examples.train_example(
      jnp.ones((2, 4), jnp.int32), completion_ids, np.zeros(2), None, None, None, PAD,
      np.stack([TOOL_MASK, np.zeros(10, bool)]))
  np.testing.assert_array_equal(example.completion_ids, completion_ids)  # read by the model
  np.testing.assert_array_equal(example.completion_mask, [
      [1, 1, 1, 0, 0, 0, 1, 1, 0, 0],
      [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]])


@pytest.mark.parametrize("algorithm", ["grpo", "dapo", "dr_grpo", "gspo"])
def test_tool_tokens_change_no_term_of_the_loss(algorithm):
  """Values at tool-result slots (log-probs, old and reference log-probs, the
  sampler's) move neither the loss nor any metric, and the loss equals that of
  the same completion with the result's slots cut out (token counts, DAPO's
  included, see only the model's tokens)."""
  algo = algorithms.algo_config(grpo_section(algorithm=algorithm, beta=0.04, tis_cap=2.0))
  rng = np.random.default_rng(0)
  logps, old, ref, sampler = (jnp.asarray(-rng.uniform(0.1, 3.0, (2, 10)), jnp.float32)
                              for _ in range(4))
  mask = jnp.asarray(np.stack([~TOOL_MASK & (TOOL_ROW != PAD), PLAIN_ROW != PAD]))
  advantages = jnp.asarray([1.0, -0.5])

  def loss(logps, old, ref, sampler, mask):
    return losses.policy_loss(
        logps, advantages, mask, old_logps_BxT=old, ref_logps_BxT=ref,
        sampler_logps_BxT=sampler, tis_cap=algo.tis_cap, epsilon_low=algo.epsilon,
        epsilon_high=algo.epsilon_high, beta=algo.beta,
        sequence_ratio=algo.loss_algo == "gspo-token", aggregation=algo.loss_agg_mode)

  want, want_aux = loss(logps, old, ref, sampler, mask)
  noise = jnp.asarray(np.stack([TOOL_MASK, np.zeros(10, bool)])) * 5.0
  got, got_aux = loss(logps - noise, old + noise, ref - noise, sampler + noise, mask)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  for name in want_aux:
    np.testing.assert_allclose(got_aux[name], want_aux[name], rtol=1e-6, err_msg=name)

  keep = np.flatnonzero(~TOOL_MASK)  # row 0 with the tool's slots cut out, padded again

  def cut(x_BxT):
    x_BxT = np.array(x_BxT)
    x_BxT[0] = np.r_[x_BxT[0, keep], np.zeros(len(TOOL_ROW) - len(keep), x_BxT.dtype)]
    return jnp.asarray(x_BxT)

  cut_loss, _ = loss(cut(logps), cut(old), cut(ref), cut(sampler), cut(mask))
  np.testing.assert_allclose(cut_loss, want, rtol=1e-6)
