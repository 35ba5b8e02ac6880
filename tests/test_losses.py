"""Tests for gemma_grpo.rl.learner.losses: each variant's value against a hand computation.

The expected numbers are written in numpy straight from the papers' formulas
(GRPO arXiv 2402.03300 eq. 3 with the k3 KL of eq. 4; DAPO 2503.14476 eq. 8;
Dr. GRPO 2503.20783 eq. 5 with its constant normaliser; GSPO 2507.18071 eqs.
5-7; TIS's w = min(pi_old / pi_sampler, C) of Yao et al. 2025), never by
calling the code under test.
"""

import dataclasses

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tunix.rl import function_registry
from tunix.rl import utils as rl_utils

from gemma_grpo.rl.learner import losses

# Two completions of one group, T = 4 (the generation limit L): the first has
# 4 tokens, the second 3. The old policy sampled them; ratios r = pi / pi_old
# are chosen to land on both sides of both clip ranges:
#   row 0 (A > 0): 1.5 beyond 1.28 and 1.2, 1.25 between them, 0.7, 1.0
#   row 1 (A < 0): 0.6 below 0.8, 1.3, 0.9, (padding)
RATIOS = np.array([[1.5, 1.25, 0.7, 1.0], [0.6, 1.3, 0.9, 1.0]])
MASK = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=np.float64)
OLD_LOGPS = np.log(np.array([[0.2, 0.4, 0.5, 0.3], [0.5, 0.25, 0.6, 0.9]]))
LOGPS = OLD_LOGPS + np.log(RATIOS)
REF_LOGPS = np.log(np.array([[0.25, 0.3, 0.5, 0.2], [0.4, 0.3, 0.5, 0.9]]))
ADVANTAGES = np.array([1.0, -0.5])
LENGTHS = MASK.sum(axis=1)  # [4, 3]


def clipped_token_loss(ratios, advantages, low, high):
  """-min(r A, clip(r, 1 - low, 1 + high) A), token by token."""
  a = advantages[:, None]
  return -np.minimum(ratios * a, np.clip(ratios, 1 - low, 1 + high) * a)


def k3(logps, ref_logps):
  """pi_ref / pi - log(pi_ref / pi) - 1."""
  return np.exp(ref_logps - logps) - (ref_logps - logps) - 1


def run(aggregation, *, low=0.2, high=0.2, beta=0.0, sequence_ratio=False, ref=False):
  loss, aux = losses.policy_loss(
      jnp.asarray(LOGPS, jnp.float32), jnp.asarray(ADVANTAGES, jnp.float32),
      jnp.asarray(MASK),
      old_logps_BxT=jnp.asarray(OLD_LOGPS, jnp.float32),
      ref_logps_BxT=jnp.asarray(REF_LOGPS, jnp.float32) if ref else None,
      epsilon_low=low, epsilon_high=high, beta=beta,
      sequence_ratio=sequence_ratio, aggregation=aggregation,
  )
  return float(loss), {k: float(v) for k, v in aux.items()}


def test_grpo_is_sequence_mean_token_mean_with_clip_and_k3_kl():
  per_token = clipped_token_loss(RATIOS, ADVANTAGES, 0.2, 0.2)
  kl = k3(LOGPS, REF_LOGPS)
  # 1/G sum_i 1/|o_i| sum_t [l_it + beta k_it]
  expected = np.mean(((per_token + 0.04 * kl) * MASK).sum(1) / LENGTHS)
  loss, aux = run("sequence-mean-token-mean", beta=0.04, ref=True)
  assert loss == pytest.approx(expected, rel=1e-5)
  assert aux["kl"] == pytest.approx((kl * MASK).sum() / MASK.sum(), rel=1e-5)
  # Clipped: 1.5 and 1.25 (A > 0, above 1.2); 0.6 (A < 0, below 0.8).
  assert aux["clipfrac/high"] == pytest.approx(2 / 7)
  assert aux["clipfrac/low"] == pytest.approx(1 / 7)
  assert aux["pg_clipfrac"] == pytest.approx(3 / 7)
  assert aux["ratio/max"] == pytest.approx(1.5, rel=1e-5)
  assert aux["ratio/min"] == pytest.approx(0.6, rel=1e-5)
  assert aux["token_prob"] == pytest.approx((np.exp(LOGPS) * MASK).sum() / 7, rel=1e-5)


def test_grpo_without_beta_logs_kl_but_leaves_it_out_of_the_loss():
  per_token = clipped_token_loss(RATIOS, ADVANTAGES, 0.2, 0.2)
  loss, aux = run("sequence-mean-token-mean", beta=0.0, ref=True)
  assert loss == pytest.approx(np.mean((per_token * MASK).sum(1) / LENGTHS), rel=1e-5)
  assert aux["kl"] > 0


def test_dapo_is_token_mean_with_asymmetric_clip():
  per_token = clipped_token_loss(RATIOS, ADVANTAGES, 0.2, 0.28)
  # 1 / sum_i |o_i| * sum_i sum_t l_it
  expected = (per_token * MASK).sum() / MASK.sum()
  loss, aux = run("token-mean", low=0.2, high=0.28)
  assert loss == pytest.approx(expected, rel=1e-5)
  # 1.25 is inside [0.8, 1.28] now; only 1.5 is clipped above.
  assert aux["clipfrac/high"] == pytest.approx(1 / 7)
  assert aux["clipfrac/low"] == pytest.approx(1 / 7)
  assert aux["kl"] == 0.0


def test_dr_grpo_divides_every_sequence_by_the_constant_length_limit():
  per_token = clipped_token_loss(RATIOS, ADVANTAGES, 0.2, 0.2)
  # 1/G sum_i 1/L sum_t l_it, L = 4 for both rows (not |o_2| = 3).
  expected = np.mean((per_token * MASK).sum(1) / 4)
  loss, _ = run("sequence-mean-token-scale")
  assert loss == pytest.approx(expected, rel=1e-5)


def test_gspo_clips_and_weights_the_sequence_level_ratio():
  # s_i = exp(1/|o_i| sum_t log r_it); loss = 1/G sum_i -min(s A, clip(s) A).
  s = np.exp((np.log(RATIOS) * MASK).sum(1) / LENGTHS)
  low, high = 0.05, 0.05
  expected = np.mean(-np.minimum(s * ADVANTAGES, np.clip(s, 1 - low, 1 + high) * ADVANTAGES))
  loss, aux = run("sequence-mean-token-mean", low=low, high=high, sequence_ratio=True)
  assert loss == pytest.approx(expected, rel=1e-5)
  assert aux["ratio/max"] == pytest.approx(s.max(), rel=1e-5)


def test_gspo_gradient_is_the_sequence_ratio_times_token_score():
  # d loss / d log pi(o_it) = -A_i s_i / (G |o_i|) where s_i is not clipped.
  s = np.exp((np.log(RATIOS) * MASK).sum(1) / LENGTHS)
  assert np.all(np.abs(s - 1) < 0.2)  # inside the clip range below
  grad = jax.grad(lambda lp: losses.policy_loss(
      lp, jnp.asarray(ADVANTAGES, jnp.float32), jnp.asarray(MASK),
      old_logps_BxT=jnp.asarray(OLD_LOGPS, jnp.float32), epsilon_low=0.2,
      epsilon_high=0.2, beta=0.0, sequence_ratio=True,
      aggregation="sequence-mean-token-mean")[0])(jnp.asarray(LOGPS, jnp.float32))
  expected = -(ADVANTAGES * s / (2 * LENGTHS))[:, None] * MASK
  np.testing.assert_allclose(np.asarray(grad), expected, rtol=1e-5, atol=1e-7)


def test_without_old_logps_the_ratio_is_one_and_the_gradient_is_the_score():
  # One update per rollout: pi_old = pi, so the loss is 0 and its gradient is
  # -A_i / (G |o_i|) per token (sequence-mean token-mean).
  lp = jnp.asarray(LOGPS, jnp.float32)
  fn = lambda lp: losses.policy_loss(
      lp, jnp.asarray(ADVANTAGES, jnp.float32), jnp.asarray(MASK),
      epsilon_low=0.2, epsilon_high=0.2, beta=0.0, sequence_ratio=False,
      aggregation="sequence-mean-token-mean")[0]
  assert float(fn(lp)) == pytest.approx(-np.mean(ADVANTAGES), abs=1e-6)
  expected = -(ADVANTAGES / (2 * LENGTHS))[:, None] * MASK
  np.testing.assert_allclose(np.asarray(jax.grad(fn)(lp)), expected, rtol=1e-5, atol=1e-7)


# --- truncated importance sampling -------------------------------------------

# pi_old / pi_sampler per token; C = 2 caps 4.0 and 2.5 (tokens (0, 2), (1, 1)).
TIS_RATIOS = np.array([[0.5, 1.0, 4.0, 1.5], [0.8, 2.5, 1.2, 1.0]])
SAMPLER_LOGPS = OLD_LOGPS - np.log(TIS_RATIOS)
TIS_WEIGHTS = np.array([[0.5, 1.0, 2.0, 1.5], [0.8, 2.0, 1.2, 1.0]])


def policy_loss_fn(aggregation, *, old=True, sampler=None, cap=0.0):
  """lp -> (loss, aux) of the clipped loss, eps 0.2 both sides, no KL."""
  return lambda lp: losses.policy_loss(
      lp, jnp.asarray(ADVANTAGES, jnp.float32), jnp.asarray(MASK),
      old_logps_BxT=jnp.asarray(OLD_LOGPS, jnp.float32) if old else None,
      sampler_logps_BxT=None if sampler is None else jnp.asarray(sampler, jnp.float32),
      tis_cap=cap, epsilon_low=0.2, epsilon_high=0.2, beta=0.0, sequence_ratio=False,
      aggregation=aggregation)


@pytest.mark.parametrize("old", [True, False])
def test_tis_weight_is_one_where_sampler_and_trainer_agree(old):
  # The sampler's log-probs equal pi_old: OLD_LOGPS given, or the loss's own
  # log pi when it is None (one update per rollout).
  lp = jnp.asarray(LOGPS, jnp.float32)
  sampler = OLD_LOGPS if old else LOGPS
  plain = policy_loss_fn("sequence-mean-token-mean", old=old)
  tis = policy_loss_fn("sequence-mean-token-mean", old=old, sampler=sampler, cap=2.0)
  assert float(tis(lp)[0]) == float(plain(lp)[0])
  grad = lambda fn: np.asarray(jax.grad(lambda x: fn(x)[0])(lp))
  np.testing.assert_array_equal(grad(tis), grad(plain))
  aux = tis(lp)[1]
  assert (float(aux["tis/ratio_min"]), float(aux["tis/ratio_max"])) == (1.0, 1.0)
  assert float(aux["tis/capped_frac"]) == 0.0


def test_tis_caps_a_far_larger_ratio_at_exactly_c():
  # Token (0, 3) (r = 1, unclipped, A = 1): pi_old / pi_sampler = e^10, C = 2.
  sampler = OLD_LOGPS.copy()
  sampler[0, 3] -= 10.0
  lp = jnp.asarray(LOGPS, jnp.float32)
  plain = jax.grad(lambda x: policy_loss_fn("token-mean")(x)[0])(lp)
  tis_fn = policy_loss_fn("token-mean", sampler=sampler, cap=2.0)
  tis = jax.grad(lambda x: tis_fn(x)[0])(lp)
  assert float(tis[0, 3]) == 2.0 * float(plain[0, 3]) != 0.0
  # Every other token has weight 1: its gradient is unchanged.
  others = np.ones_like(MASK, dtype=bool)
  others[0, 3] = False
  np.testing.assert_array_equal(np.asarray(tis)[others], np.asarray(plain)[others])
  aux = tis_fn(lp)[1]
  assert float(aux["tis/ratio_max"]) == pytest.approx(np.exp(10.0), rel=1e-4)
  assert float(aux["tis/capped_frac"]) == pytest.approx(1 / 7)


def test_tis_weights_the_clipped_loss_and_its_gradient_token_by_token():
  # token-mean: loss = 1/7 sum w l, d loss / d log pi = -w A r / 7 where the
  # unclipped side is active, 0 where the clip holds it (r = 1.5, 1.25 with
  # A > 0 beyond 1.2; r = 0.6 with A < 0 below 0.8).
  per_token = clipped_token_loss(RATIOS, ADVANTAGES, 0.2, 0.2)
  unclipped = np.array([[0, 0, 1, 1], [0, 1, 1, 0]])
  expected_grad = -TIS_WEIGHTS * ADVANTAGES[:, None] * RATIOS * unclipped / 7
  fn = policy_loss_fn("token-mean", sampler=SAMPLER_LOGPS, cap=2.0)
  lp = jnp.asarray(LOGPS, jnp.float32)
  (loss, aux), grad = jax.value_and_grad(fn, has_aux=True)(lp)
  assert float(loss) == pytest.approx((TIS_WEIGHTS * per_token * MASK).sum() / 7, rel=1e-5)
  np.testing.assert_allclose(np.asarray(grad), expected_grad, rtol=1e-5, atol=1e-7)
  assert float(aux["tis/ratio_mean"]) == pytest.approx((TIS_RATIOS * MASK).sum() / 7, rel=1e-5)
  assert float(aux["tis/ratio_min"]) == pytest.approx(0.5, rel=1e-5)
  assert float(aux["tis/ratio_max"]) == pytest.approx(4.0, rel=1e-5)
  assert float(aux["tis/capped_frac"]) == pytest.approx(2 / 7)
  assert float(aux["ratio/max"]) == pytest.approx(1.5, rel=1e-5)  # pi / pi_old, untouched


def test_tis_with_one_update_per_rollout_weights_the_score_by_the_detached_ratio():
  # pi_old = stop_gradient(pi): ratio 1, so d loss / d log pi(o_it) =
  # -A_i w_it / (G |o_i|), with w_it = min(pi / pi_sampler, C) carrying no gradient.
  sampler = LOGPS - np.log(TIS_RATIOS)
  fn = policy_loss_fn("sequence-mean-token-mean", old=False, sampler=sampler, cap=2.0)
  grad = jax.grad(lambda x: fn(x)[0])(jnp.asarray(LOGPS, jnp.float32))
  expected = -(ADVANTAGES / (2 * LENGTHS))[:, None] * TIS_WEIGHTS * MASK
  np.testing.assert_allclose(np.asarray(grad), expected, rtol=1e-5, atol=1e-7)


def test_tis_needs_a_cap():
  with pytest.raises(ValueError, match="tis_cap=0.0"):
    policy_loss_fn("token-mean", sampler=SAMPLER_LOGPS, cap=0.0)(jnp.asarray(LOGPS, jnp.float32))


def test_train_example_keeps_the_sampler_logps_through_tunix_batch_slicing():
  example = losses.TrainExample(
      prompt_ids=jnp.zeros((4, 2), jnp.int32), prompt_mask=jnp.ones((4, 2), bool),
      completion_ids=jnp.zeros((4, 3), jnp.int32), completion_mask=jnp.ones((4, 3), bool),
      advantages=jnp.arange(4.0), ref_per_token_logps=None, old_per_token_logps=None,
      sampler_per_token_logps=jnp.arange(12.0).reshape(4, 3))
  part = rl_utils.get_batch_slice(example, slice(2, 4))
  assert isinstance(part, losses.TrainExample)
  np.testing.assert_array_equal(part.sampler_per_token_logps, [[6, 7, 8], [9, 10, 11]])
  assert part.sampler_is_weights is None  # Tunix's own weights stay unused


def test_unknown_aggregation_is_rejected():
  with pytest.raises(ValueError, match="aggregation"):
    run("seq-mean-token-sum")


# --- the model-facing half ----------------------------------------------------


class Embedder(nnx.Module):

  def __init__(self, table):
    self.input_embedding = nnx.Param(table.T)  # logits = hidden @ table.T.T


class Bigram(nnx.Module):
  """A 'language model' whose next-token logits depend on the last token only.

  It has gemma3_rl.Gemma3's interface: one-hot hidden states and a tied
  embedding, so hidden @ embedding.T = table[last token].
  """

  matmul_dtype = None  # the products in float32, as gemma3_rl.Gemma3's default

  def __init__(self, vocab: int):
    self.table = nnx.Param(jax.random.normal(jax.random.PRNGKey(0), (vocab, vocab)))
    self.embedder = Embedder(self.table.get_value())

  def hidden_states(self, tokens, positions=None, attention_mask=None):
    del positions, attention_mask
    return jax.nn.one_hot(tokens, self.table.get_value().shape[0])


def numpy_log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_per_token_logps_and_entropy_on_a_bigram_model():
  model = Bigram(vocab=7)
  table = np.asarray(model.table.get_value(), dtype=np.float64)
  prompt = np.array([[0, 3, 4]])  # pad id 0 on the left
  completion = np.array([[5, 2, 6, 0]])  # and on the right
  temperature = 0.7
  logps, entropy = losses.per_token_logps_and_entropy(
      model, jnp.asarray(prompt), jnp.asarray(completion), 0, 1, temperature)
  previous = [4, 5, 2, 6]  # the token before each completion position
  log_probs = numpy_log_softmax(table[previous] / temperature)
  np.testing.assert_allclose(np.asarray(logps)[0, :3],
                             log_probs[np.arange(3), completion[0, :3]], rtol=1e-5)
  np.testing.assert_allclose(np.asarray(entropy)[0, :3],
                             -(np.exp(log_probs) * log_probs).sum(-1)[:3], rtol=1e-5)


@dataclasses.dataclass
class Example:
  prompt_ids: jax.Array
  completion_ids: jax.Array
  completion_mask: jax.Array
  advantages: jax.Array
  old_per_token_logps: jax.Array | None = None
  ref_per_token_logps: jax.Array | None = None
  sampler_per_token_logps: jax.Array | None = None


@dataclasses.dataclass
class Settings:
  temperature: float = 1.0
  epsilon: float = 0.2
  epsilon_high: float = 0.28
  beta: float = 0.0
  loss_algo: str = "grpo"
  loss_agg_mode: str = "token-mean"
  num_generations: int = 1  # rows here are distinct prompts
  tis_cap: float = 0.0


def test_registered_loss_fn_is_policy_loss_on_the_model_logps():
  model = Bigram(vocab=7)
  example = Example(
      prompt_ids=jnp.array([[3, 4], [4, 3]]),
      completion_ids=jnp.array([[5, 2, 6], [2, 2, 0]]),
      completion_mask=jnp.array([[1, 1, 1], [1, 1, 0]]),
      advantages=jnp.array([0.5, -0.5]),
  )
  fn = function_registry.get_policy_loss_fn(losses.LOSS_NAME)
  loss, aux = fn(model, example, Settings(), pad_id=0, eos_id=1)
  logps, entropy = losses.per_token_logps_and_entropy(
      model, example.prompt_ids, example.completion_ids, 0, 1, 1.0)
  mask = np.asarray(example.completion_mask, dtype=np.float64)
  # Ratio 1: token-mean of -A.
  assert float(loss) == pytest.approx(-(np.array([[0.5], [-0.5]]) * mask).sum() / 5, abs=1e-6)
  assert float(aux["entropy"]) == pytest.approx((np.asarray(entropy) * mask).sum() / 5, rel=1e-5)
  assert float(aux["token_prob"]) == pytest.approx((np.exp(np.asarray(logps)) * mask).sum() / 5, rel=1e-5)


def test_registered_loss_fn_weights_by_the_examples_sampler_logps():
  model = Bigram(vocab=7)
  prompt_ids, completion_ids = jnp.array([[3, 4], [4, 3]]), jnp.array([[5, 2, 6], [2, 2, 0]])
  logps, _ = losses.per_token_logps_and_entropy(model, prompt_ids, completion_ids, 0, 1, 1.0)
  example = Example(
      prompt_ids=prompt_ids, completion_ids=completion_ids,
      completion_mask=jnp.array([[1, 1, 1], [1, 1, 0]]), advantages=jnp.array([0.5, -0.5]),
      # The sampler gave every token 1/1.5 of the trainer's probability.
      sampler_per_token_logps=logps - np.log(1.5))
  fn = function_registry.get_policy_loss_fn(losses.LOSS_NAME)
  loss, aux = fn(model, example, Settings(tis_cap=2.0), pad_id=0, eos_id=1)
  mask = np.asarray(example.completion_mask, dtype=np.float64)
  # Ratio 1, weight 1.5: 1.5 x the token-mean of -A.
  assert float(loss) == pytest.approx(-1.5 * (np.array([[0.5], [-0.5]]) * mask).sum() / 5, abs=1e-6)
  assert float(aux["tis/ratio_mean"]) == pytest.approx(1.5, rel=1e-5)
