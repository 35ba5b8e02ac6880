"""The GRPO-family policy loss, one function for grpo, dapo, dr_grpo and gspo.

Registered in Tunix's function registry as `gemma_grpo` (the learner's
algorithm config names it), so Tunix's trainer calls it like its own
`grpo_loss_fn`. It exists because that one cannot report the clip fractions of
the two sides separately, and it is split in two so each half can change
alone:

  per_token_logps_and_entropy  the only place the policy model runs; a later
                               memory/speed rewrite replaces just this.
  policy_loss                  pure math on per-token log-probabilities,
                               testable without a model.

Notation (o_i: completion i of a group of G, |o_i| its length in tokens, L the
generation limit rollout.max_new_tokens, A_i its advantage):
  token ratio     r_it = pi(o_it) / pi_old(o_it)
  sequence ratio  s_i  = exp(1/|o_i| sum_t log r_it)                   (GSPO)
  clipped term    l_it = -min(r A_i, clip(r, 1 - eps_low, 1 + eps_high) A_i)
  KL (k3)         k_it = pi_ref/pi - log(pi_ref/pi) - 1                (GRPO)
  TIS weight      w_it = min(pi_old(o_it) / pi_sampler(o_it), C), detached  (grpo.tis_cap)
  aggregation     sequence-mean-token-mean  1/G sum_i 1/|o_i| sum_t    (GRPO, GSPO)
                  token-mean                1/sum_i|o_i| sum_i sum_t   (DAPO)
                  sequence-mean-token-scale 1/G sum_i 1/L sum_t        (Dr. GRPO)
  loss = agg(w l) + beta * agg(k)      (w = 1 without TIS)

Truncated importance sampling (TIS; Yao et al. 2025, TRL's token_truncate,
verl's rollout_is=token): when the rollout engine samples from a policy that
differs from the trainer's by rounding or kernels (pi_sampler), pi_old in the
ratio stays the trainer's own and w corrects for the sampler; the KL term is
not weighted (as in TRL, verl and Tunix).
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp
from tunix.rl import common
from tunix.rl import function_registry

from gemma_grpo.rl.learner import logprobs

LOSS_NAME = "gemma_grpo"
# |log r| is clamped here before exp(): r = e^20 is already far outside any
# clip range, and the clamp keeps a rare outlier from overflowing to inf.
LOG_RATIO_LIMIT = 20.0
AGGREGATIONS = (
    "sequence-mean-token-mean", "token-mean", "sequence-mean-token-scale",
)


@flax.struct.dataclass(frozen=True)
class TrainExample(common.TrainExample):
  """Tunix's train example plus the sampler's own log-probs, for TIS.

  Tunix's `sampler_is_weights` would hold finished weights, which need pi_old
  before the loss runs: with one update per rollout pi_old is the loss's own
  forward pass, so filling it would cost a second one. The loss forms the
  weights from these log-probs instead; `sampler_is_weights` stays None.

  Attributes:
    sampler_per_token_logps: [B, T] log pi_sampler of the completion tokens
      (0 past each row's end), or None: no TIS.
  """

  sampler_per_token_logps: jax.Array | None = None


def per_token_logps_and_entropy(model, prompt_ids, completion_ids, pad_id: int,
                                eos_id: int, temperature: float, group_size: int = 1):
  """Log pi(o_t | prefix) of each completion token and the policy's entropy there.

  Both are of the sampling distribution: logits divided by the rollout
  temperature (top-k/top-p truncation is not applied). The entropy carries no
  gradient; it is a diagnostic. The LM head runs on completion positions only,
  in vocabulary chunks (logprobs.py): full [B, P + T, V] logits are never
  materialised.

  Args:
    model: the policy, a gemma3_rl.Gemma3 (with or without LoRA).
    prompt_ids: [B, P] left-padded prompt tokens.
    completion_ids: [B, T] right-padded completion tokens.
    pad_id, eos_id: token ids (eos_id is unused: padding marks the end).
    temperature: rollout temperature.
    group_size: G when rows come in groups of G completions of one prompt;
      each prompt is then run once (logprobs.per_token_logps).

  Returns:
    (logps_BxT, entropy_BxT), float32; positions past a completion's end hold
    values for pad tokens, to be masked by the caller.
  """
  del eos_id
  logps_BxT, entropy_BxT = logprobs.per_token_logps(
      model, prompt_ids, completion_ids, pad_id, temperature, group_size=group_size)
  return logps_BxT, jax.lax.stop_gradient(entropy_BxT)


def token_mean(x_BxT, mask_BxT):
  """Mean of x over the completion tokens of the whole batch."""
  mask = mask_BxT.astype(jnp.float32)
  return jnp.sum(x_BxT * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def policy_loss(
    logps_BxT,
    advantages_B,
    mask_BxT,
    *,
    old_logps_BxT=None,
    ref_logps_BxT=None,
    sampler_logps_BxT=None,
    tis_cap: float = 0.0,
    epsilon_low: float,
    epsilon_high: float,
    beta: float,
    sequence_ratio: bool,
    aggregation: str,
):
  """The clipped surrogate (+ beta * KL) and its diagnostics.

  Args:
    logps_BxT: log pi of the completion tokens (carries the gradient).
    advantages_B: one advantage per completion.
    mask_BxT: 1 on completion tokens, 0 on padding.
    old_logps_BxT: log pi_old, the ratio's denominator. Without TIS, that
      of the policy that sampled: the trainer's own log-probs before this
      batch's updates, or the sampler's where it is a policy of its own
      (rollout.decode_dtype="bfloat16"). With TIS, always the trainer's.
      None means the trainer's parameters are the ones that sampled (one
      update per rollout): pi_old = stop_gradient(pi), so the ratio is
      exactly 1 while its gradient is grad log pi.
    ref_logps_BxT: log pi_ref; None skips the KL term and its metric.
    sampler_logps_BxT: log pi_sampler, the rollout engine's own log-probs of
      the tokens it drew; given, each token's clipped term is weighted by
      w = min(pi_old / pi_sampler, tis_cap) (TIS); None: no weight.
    tis_cap: C, the cap on w; must be > 0 when sampler_logps_BxT is given.
    epsilon_low, epsilon_high: clip range [1 - eps_low, 1 + eps_high].
    beta: KL weight.
    sequence_ratio: GSPO: clip and weight with s_i instead of r_it (the
      GSPO-token form: value s_i, gradient s_i * grad log pi(o_it)).
    aggregation: one of AGGREGATIONS (Tunix's common.aggregate_loss modes;
      sequence-mean-token-scale divides by T, the padded completion width,
      which the learner makes equal to the generation limit L).

  Returns:
    (loss, aux): aux holds scalars: pg_loss, kl (token-mean k3, 0 when
    ref_logps_BxT is None), kl_loss, pg_clipfrac (tokens whose clipped side
    is active), clipfrac/low (r < 1 - eps_low with A < 0), clipfrac/high
    (r > 1 + eps_high with A > 0), ratio/{mean,min,max}, token_prob (mean
    probability pi(o_t) of the sampled tokens); with TIS also
    tis/ratio_{mean,min,max} (pi_old / pi_sampler before the cap) and
    tis/capped_frac (tokens whose ratio exceeds C).
  """
  if aggregation not in AGGREGATIONS:
    raise ValueError(f"aggregation={aggregation!r}: use one of {AGGREGATIONS}")
  if sampler_logps_BxT is not None and not tis_cap > 0:
    raise ValueError(f"tis_cap={tis_cap}: TIS (sampler_logps_BxT given) needs a cap C > 0")
  mask_BxT = mask_BxT.astype(jnp.float32)
  if old_logps_BxT is None:
    old_logps_BxT = jax.lax.stop_gradient(logps_BxT)
  log_ratio_BxT = jnp.clip(logps_BxT - old_logps_BxT, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
  if sequence_ratio:
    lengths_B = jnp.maximum(mask_BxT.sum(axis=-1), 1.0)
    log_s_B = (log_ratio_BxT * mask_BxT).sum(axis=-1) / lengths_B
    log_ratio_BxT = (logps_BxT - jax.lax.stop_gradient(logps_BxT)
                     + jax.lax.stop_gradient(log_s_B)[:, None])
  ratio_BxT = jnp.exp(log_ratio_BxT)
  adv_Bx1 = advantages_B.astype(jnp.float32)[:, None]

  unclipped_BxT = -adv_Bx1 * ratio_BxT
  clipped_BxT = -adv_Bx1 * jnp.clip(ratio_BxT, 1.0 - epsilon_low, 1.0 + epsilon_high)
  per_token_loss_BxT = jnp.maximum(unclipped_BxT, clipped_BxT)
  tis_aux = {}
  if sampler_logps_BxT is not None:
    tis_weight_BxT, tis_aux = tis_weights(old_logps_BxT, sampler_logps_BxT, mask_BxT, tis_cap)
    per_token_loss_BxT = per_token_loss_BxT * tis_weight_BxT
  pg_loss = common.aggregate_loss(per_token_loss_BxT, mask_BxT, aggregation)
  loss = pg_loss

  kl = kl_loss = jnp.float32(0.0)
  if ref_logps_BxT is not None:
    kl_BxT = common.compute_kl_divergence(logps_BxT, ref_logps_BxT, "low_var_kl")
    kl = token_mean(kl_BxT, mask_BxT)
    kl_loss = common.aggregate_loss(kl_BxT, mask_BxT, aggregation)
    if beta:
      loss = loss + beta * kl_loss

  ratio = jax.lax.stop_gradient(ratio_BxT)
  adv_BxT = jnp.broadcast_to(adv_Bx1, ratio.shape)
  present_BxT = mask_BxT > 0
  aux = {
      "pg_loss": pg_loss,
      "kl": kl,
      "kl_loss": kl_loss,
      "pg_clipfrac": token_mean(clipped_BxT > unclipped_BxT, mask_BxT),
      "clipfrac/low": token_mean((ratio < 1.0 - epsilon_low) & (adv_BxT < 0), mask_BxT),
      "clipfrac/high": token_mean((ratio > 1.0 + epsilon_high) & (adv_BxT > 0), mask_BxT),
      "ratio/mean": token_mean(ratio, mask_BxT),
      "ratio/min": jnp.min(jnp.where(present_BxT, ratio, jnp.inf)),
      "ratio/max": jnp.max(jnp.where(present_BxT, ratio, -jnp.inf)),
      "token_prob": token_mean(jnp.exp(jax.lax.stop_gradient(logps_BxT)), mask_BxT),
      **tis_aux,
  }
  return loss, aux


def tis_weights(old_logps_BxT, sampler_logps_BxT, mask_BxT, cap: float):
  """TIS's w = min(pi_old / pi_sampler, C) per token, detached, and its metrics.

  Returns:
    (weight_BxT, aux): aux holds tis/ratio_{mean,min,max} of the uncapped
    ratio and tis/capped_frac, over completion tokens.
  """
  log_ratio_BxT = jnp.clip(jax.lax.stop_gradient(old_logps_BxT) - sampler_logps_BxT,
                           -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
  ratio_BxT = jnp.exp(log_ratio_BxT)
  present_BxT = mask_BxT > 0
  aux = {
      "tis/ratio_mean": token_mean(ratio_BxT, mask_BxT),
      "tis/ratio_min": jnp.min(jnp.where(present_BxT, ratio_BxT, jnp.inf)),
      "tis/ratio_max": jnp.max(jnp.where(present_BxT, ratio_BxT, -jnp.inf)),
      "tis/capped_frac": token_mean(ratio_BxT > cap, mask_BxT),
  }
  return jax.lax.stop_gradient(jnp.minimum(ratio_BxT, cap)), aux


@function_registry.register_policy_loss_fn(LOSS_NAME)
def loss_fn(model, train_example, algo_config, pad_id, eos_id, **unused):
  """Tunix's policy-loss signature; settings come from algorithms.AlgoConfig."""
  del unused
  logps_BxT, entropy_BxT = per_token_logps_and_entropy(
      model, train_example.prompt_ids, train_example.completion_ids,
      pad_id, eos_id, algo_config.temperature,
      group_size=algo_config.num_generations,  # the learner keeps groups together
  )
  mask_BxT = train_example.completion_mask
  loss, aux = policy_loss(
      logps_BxT,
      train_example.advantages,
      mask_BxT,
      old_logps_BxT=train_example.old_per_token_logps,
      ref_logps_BxT=train_example.ref_per_token_logps,
      sampler_logps_BxT=train_example.sampler_per_token_logps,
      tis_cap=algo_config.tis_cap,
      epsilon_low=algo_config.epsilon,
      epsilon_high=algo_config.epsilon_high,
      beta=algo_config.beta or 0.0,
      sequence_ratio=algo_config.loss_algo == "gspo-token",
      aggregation=algo_config.loss_agg_mode,
  )
  aux["entropy"] = token_mean(entropy_BxT, mask_BxT)
  return loss, aux
