"""GRPO-family learners on Tunix: grpo, dapo, dr_grpo and gspo.

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

`Learner` replaces Tunix's rollout-and-advantage step to add what Tunix lacks:
a per-step sampling key, DAPO's overlong penalty counted in tokens, dynamic
sampling, temperature-consistent old log-probs, truncated importance sampling,
and per-step diagnostics.

The sampler's own log-probs (rollout_config.return_logprobs) serve one of two
ends, chosen by grpo.tis_cap (behaviour_logps):
  TIS off (0)  a sampler that rounds the policy (rollout.decode_dtype=
               "bfloat16") is the behaviour policy: its log-probs are the PPO
               ratio's denominator, and the clip bounds the difference.
  TIS on (C)   the ratio divides by the trainer's own old log-probs, and each
               token's loss is weighted by min(pi_old / pi_sampler, C)
               (losses.tis_weights), whatever the decode dtype.

Dynamic sampling and resume: groups whose rewards are all equal carry no
gradient, so they are dropped and the batch is refilled with fresh prompts.
Refill prompts are not taken from the training iterator (Tunix fast-forwards
that by a count of batches on resume, and would not know about the extra ones)
but drawn at random from the training problems with a generator seeded by
(rollout.seed, step, call, round). A resumed run therefore draws the same
refill prompts as the uninterrupted run would have, and the main data stream
is untouched; the price is that a refill prompt may repeat within an epoch.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Callable, Sequence

from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from tunix.rl import function_registry
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo import grpo_learner
from tunix.sft import sharding_utils

from gemma_grpo import config as config_lib
from gemma_grpo.tasks import data as data_lib
from gemma_grpo.rl import losses
from gemma_grpo import seam
from gemma_grpo.model import tokenizer as tokenizer_lib

seam.check_versions()  # Tunix/Qwix internals below: other versions stop here (seam.py)

Mode = rl_cluster_lib.Mode


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


def algo_config(c: ml_collections.ConfigDict) -> AlgoConfig:
  """The algorithm settings for `c.algorithm` (c is the `grpo` section)."""
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
  if c.algorithm == "grpo":
    return AlgoConfig(**common)
  if c.algorithm == "gspo":
    common.update(epsilon=c.gspo_epsilon, epsilon_high=c.gspo_epsilon_high)
    return AlgoConfig(algo_variant="gspo-token", loss_algo="gspo-token", **common)
  if c.algorithm == "dr_grpo":
    # Tunix's DrGRPOConfig pieces: no std in the advantage, and a per-sequence
    # sum divided by the padded completion width, which is L.
    return AlgoConfig(algo_variant="drgrpo", advantage_estimator="drgrpo",
                      loss_agg_mode="sequence-mean-token-scale", **common)
  if c.algorithm == "dapo":
    common.update(beta=0.0, epsilon_high=c.epsilon_high)
    return AlgoConfig(algo_variant="dapo", loss_agg_mode="token-mean", **common)
  raise ValueError(f"unknown grpo.algorithm {c.algorithm!r}")


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


def behaviour_logps(sampler_logps, *, tis: bool, trainer_old_logps: Callable[[], jax.Array] | None):
  """(old log-probs for the PPO ratio, sampler log-probs for TIS's weight).

  Args:
    sampler_logps: [B, T] the rollout engine's own log-probs, or None when
      it was not asked for them.
    tis: truncated importance sampling is on (grpo.tis_cap > 0).
    trainer_old_logps: computes the trainer's log-probs under the parameters
      that sampled; None when the loss's own forward pass gives them (one
      update per rollout).

  Without TIS the sampler's log-probs, where there are any, are the ratio's
  denominator; with TIS that is the trainer's, and the sampler's go to the
  weight. None for the ratio means the loss's own stop_gradient(log pi).
  """
  if sampler_logps is not None and not tis:
    return sampler_logps, None
  old_logps = trainer_old_logps() if trainer_old_logps is not None else None
  return old_logps, sampler_logps if tis else None


# --- pure pieces, tested without a model ------------------------------------


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


def select_groups(first_NxG, roll_more: Callable[[int], np.ndarray] | None,
                  num_groups: int, max_extra_rounds: int) -> Selection:
  """DAPO's dynamic sampling: keep groups with a reward spread, refill, bound.

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


# --- the learner -------------------------------------------------------------


@dataclasses.dataclass
class RolloutStats:
  """What the last training rollout produced (all refill rounds together)."""

  step: int = 0
  completion_length: float = 0.0
  seconds: float = 0.0
  tokens: int = 0


@dataclasses.dataclass
class _Round:
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


def _left_pad(rows: list[np.ndarray], pad: int) -> np.ndarray:
  """Stacks left-padded prompt rows of possibly different widths."""
  width = max(len(r) for r in rows)
  return np.stack([np.pad(r, (width - len(r), 0), constant_values=pad) for r in rows])


def _sampling_logps(model, prompt_ids, completion_ids, pad_id, eos_id, temperature, group_size):
  # A pure jax.jit over the split model: nnx.jit would return fresh copies of
  # every weight and so end the actor/reference sharing of the frozen ones.
  graphdef, state = nnx.split(model)
  return logps_program(graphdef, state, prompt_ids, completion_ids, pad_id, eos_id,
                             temperature, group_size)


# The reference (and old-policy) log-prob pass: `gemma-grpo plan` lowers it too.
@functools.partial(jax.jit, static_argnames=("pad_id", "eos_id", "temperature",
                                             "group_size"))
def logps_program(graphdef, state, prompt_ids, completion_ids, pad_id, eos_id,
                        temperature, group_size):
  return losses.per_token_logps_and_entropy(
      nnx.merge(graphdef, state), prompt_ids, completion_ids, pad_id, eos_id, temperature,
      group_size)[0]


def _train_example(prompt_ids, completion_ids, advantages, ref_logps, old_logps,
                   sampler_logps, pad: int, tool_mask=None) -> losses.TrainExample:
  """Tunix's train example; `tool_mask` [B, T] marks tool results, which the
  model reads (they stay in completion_ids) but is not trained on: every term
  of the loss and its metrics weighs tokens by completion_mask."""
  completion_mask = completion_ids != pad
  if tool_mask is not None:
    completion_mask &= ~jnp.asarray(tool_mask)
  return losses.TrainExample(
      prompt_ids=prompt_ids,
      prompt_mask=prompt_ids != pad,
      completion_ids=completion_ids,
      completion_mask=completion_mask,
      ref_per_token_logps=ref_logps,
      advantages=jax.device_put(np.asarray(advantages, dtype=np.float32)),
      old_per_token_logps=old_logps,
      sampler_per_token_logps=sampler_logps,
  )


def train_example_like(rows: int, *, prompt_width: int, completion_width: int, pad: int,
                       with_ref: bool, sampler_logps: bool, tis: bool,
                       off_policy: bool) -> losses.TrainExample:
  """A train example of zeros with a training step's shapes and optional columns."""
  logps = jnp.zeros((rows, completion_width), jnp.float32)
  # The same choice as a training step's, so the structure matches too.
  old_logps, tis_logps = behaviour_logps(
      logps if sampler_logps else None, tis=tis,
      trainer_old_logps=(lambda: logps) if off_policy else None)
  return _train_example(
      jnp.full((rows, prompt_width), pad, jnp.int32),
      jnp.full((rows, completion_width), pad, jnp.int32),
      np.zeros(rows), logps if with_ref else None, old_logps, tis_logps, pad)


def wants_sampler_logps(c: ml_collections.ConfigDict) -> bool:
  """Whether training asks the rollout engine for its own log-probs (Learner)."""
  return c.rollout.decode_dtype != "float32" or c.grpo.tis_cap > 0


def example_columns(c: ml_collections.ConfigDict) -> dict[str, bool]:
  """train_example_like's column choices, as the Learner that `train` builds makes them."""
  g = c.grpo
  return dict(with_ref=bool(g.beta) or g.log_kl, sampler_logps=wants_sampler_logps(c),
              tis=g.tis_cap > 0, off_policy=config_lib.updates_per_batch(c) > 1)


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


class Learner(grpo_learner.GRPOLearner):
  """Tunix's GRPO learner with our rollout step; see the module docstring.

  Step s samples round k of call c with key fold_in(seed, s, c, k), so every
  step draws fresh noise and a resumed run draws exactly the samples the
  uninterrupted run would have drawn.
  """

  def __init__(self, *args, rollout_seed: int,
               refill_problems: Sequence[data_lib.Problem] | None = None,
               stop_text: str = "", updates_per_batch: int = 1,
               sampler_logps: bool = False, tools: bool = False, **kwargs):
    super().__init__(*args, **kwargs)
    cfg = self.algo_config
    if not isinstance(cfg, AlgoConfig):
      raise TypeError("Learner needs learner.algo_config(c.grpo), an AlgoConfig")
    if self.metric_fns:
      raise ValueError("metric_fns are not supported; add metrics in _log_diagnostics")
    if cfg.dynamic_sampling and cfg.max_resample_rounds and not refill_problems:
      raise ValueError("grpo.dynamic_sampling needs refill_problems (the training problems)")
    self._rollout_seed = rollout_seed
    if cfg.num_iterations > 1:
      # Tunix resumes its data iterator at the trainer's update count, but
      # with mu updates per batch only updates / mu batches were consumed
      # (checkpoints fall on batch boundaries: config.validate).
      self._last_iter_step //= cfg.num_iterations
    self._stop_text = stop_text
    # The engine's tool calls (rollout.tools): their results are masked out.
    self._tools = tools
    # Updates after a batch's first see samples of an older policy: they need
    # the sampling policy's log-probs for the importance ratio.
    self._off_policy = updates_per_batch > 1
    # sampler_logps: a sampler that rounds the policy (rollout.decode_dtype=
    # "bfloat16") is a behaviour policy of its own. Its log-probs are the
    # ratio's denominator, or with TIS (which asks for them whatever the
    # sampler) the weight's (module docstring, behaviour_logps).
    self._tis = cfg.tis_cap > 0
    self._sampler_logps = sampler_logps or self._tis
    self._rollout_key = jax.random.PRNGKey(rollout_seed)
    self._refill_problems = refill_problems
    self._call = (-1, 0)  # (step, calls made during it)
    self._with_ref = bool(cfg.beta) or cfg.log_kl
    self.last_rollout = RolloutStats()
    wire_loss(self.rl_cluster.actor_trainer, cfg, pad_id=self.rl_cluster.rollout.pad_id(),
              eos_id=self.rl_cluster.rollout.eos_id())
    self.rl_cluster.actor_trainer.with_rl_metrics_to_log(loss_metrics(self._with_ref, self._tis))

  # --- one rollout round -----------------------------------------------------

  def _rollout(self, inputs: dict, mode, key) -> _Round:
    cfg = self.algo_config
    rollout_config = self.rl_cluster.get_rollout_config(mode)
    rollout_config.seed = key
    rollout_config.return_logprobs = self._sampler_logps and mode == Mode.TRAIN
    limit = rollout_config.max_tokens_to_generate
    pad = self.rl_cluster.rollout.pad_id()
    start = time.perf_counter()
    out = self.rl_cluster.generate(
        prompts=inputs["prompts"], mode=mode,
        micro_batch_size=self._rollout_micro_batch_size * cfg.num_generations,
    )
    seconds = time.perf_counter() - start
    n = len(out.tokens)
    turns = self.rl_cluster.rollout.take_tool_turns() if self._tools else None
    completion_ids = np.full((n, limit), pad, dtype=np.int32)
    tool_mask = np.zeros((n, limit), dtype=bool) if turns is not None else None
    lengths = np.zeros(n, dtype=np.int64)  # the model's own tokens
    truncated = np.zeros(n, dtype=bool)
    stops = np.asarray(rollout_config.eos_tokens or [self.rl_cluster.rollout.eos_id()])
    texts = list(out.text)
    sample_logps = None
    if rollout_config.return_logprobs:
      sample_logps = np.zeros((n, limit), dtype=np.float32)
    for row, tokens in enumerate(out.tokens):
      tokens = np.asarray(tokens)[:limit]
      cut = tokenizer_lib.tokens_through(tokens, texts[row], self._stop_text,
                                         self.rl_cluster.tokenizer)
      if cut is not None:
        # Ends here as at a stop token: what follows is neither scored nor trained.
        tokens, texts[row] = tokens[:cut[0]], cut[1]
      completion_ids[row, :len(tokens)] = tokens
      if sample_logps is not None:
        sample_logps[row, :len(tokens)] = np.asarray(out.logprobs[row])[:len(tokens)]
      lengths[row] = len(tokens)
      if tool_mask is not None:
        tool_mask[row, :len(tokens)] = turns[row].tool_mask[:len(tokens)]
        lengths[row] -= tool_mask[row].sum()
      truncated[row] = (cut is None and len(tokens) >= limit
                        and not np.isin(tokens, stops).any())

    columns = {k: v for k, v in inputs.items() if k != "prompts"}
    if "mode" in columns:
      raise ValueError(f"batch already has a 'mode' column: {sorted(columns)}")
    info = self.reward_manager(prompts=inputs["prompts"], completions=texts,
                               mode=str(mode), **columns)
    self.rl_cluster.buffer_metrics(info["log_metrics"], mode=mode)
    fn_rewards = {
        fn.__name__: np.asarray(info["log_metrics"][f"rewards/{fn.__name__}"][0], dtype=np.float64)
        for fn in self.reward_manager.reward_fns
    }
    rewards = np.asarray(info["rewards"], dtype=np.float64)
    if cfg.overlong_buffer > 0:
      # The budget counts tool results too: they fill the same slots.
      used = (completion_ids != pad).sum(axis=1)
      penalty = overlong_penalty(used, limit, cfg.overlong_buffer, cfg.overlong_penalty)
      fn_rewards["overlong"] = penalty
      self.rl_cluster.buffer_metrics({"rewards/overlong": (penalty, np.mean)}, mode=mode)
      rewards = rewards + penalty
    tool_calls = failed = None
    if turns is not None:
      tool_calls = np.array([len(t.calls) for t in turns])
      failed = np.array([t.failed_calls for t in turns])
    return _Round(inputs, np.asarray(out.left_padded_prompt_tokens), completion_ids,
                  lengths, truncated, rewards, fn_rewards, seconds, sample_logps,
                  tool_mask, tool_calls, failed)

  # --- Tunix's hook --------------------------------------------------------

  def _generate_and_compute_advantage(self, training_input, mode=Mode.TRAIN):
    cfg = self.algo_config
    g = cfg.num_generations
    step = self.rl_cluster.actor_trainer.train_steps  # updates done so far
    if mode == Mode.TRAIN:
      # Rollout metrics belong to the batch's first update (Tunix counts batches).
      self.rl_cluster.global_steps = step
    call = self._call[1] + 1 if self._call[0] == step else 0
    self._call = (step, call)
    step_key = jax.random.fold_in(jax.random.fold_in(self._rollout_key, step), call)

    inputs = dict(training_input)
    inputs["prompts"] = list(inputs["prompts"])
    num_groups = len(inputs["prompts"]) // g
    rounds = [self._rollout(inputs, mode, jax.random.fold_in(step_key, 0))]

    def roll_more(round_: int) -> np.ndarray:
      more = refill_batch(
          self._refill_problems, num_groups=num_groups, num_generations=g,
          seed=self._rollout_seed, step=step, call=call, round_=round_, columns=inputs)
      rounds.append(self._rollout(more, mode, jax.random.fold_in(step_key, round_)))
      return rounds[-1].rewards.reshape(-1, g)

    refills = cfg.dynamic_sampling and mode == Mode.TRAIN and self._refill_problems
    selection = select_groups(rounds[0].rewards.reshape(-1, g), roll_more if refills else None,
                              num_groups, cfg.max_resample_rounds)
    rows = [(r, i * g + j) for r, i in selection.picks for j in range(g)]
    pad, eos = self.rl_cluster.rollout.pad_id(), self.rl_cluster.rollout.eos_id()
    prompt_ids = _left_pad([rounds[r].prompt_ids[k] for r, k in rows], pad)
    completion_ids = np.stack([rounds[r].completion_ids[k] for r, k in rows])
    tool_mask = None
    if rounds[0].tool_mask is not None:
      tool_mask = np.stack([rounds[r].tool_mask[k] for r, k in rows])
    rewards = np.array([rounds[r].rewards[k] for r, k in rows])
    advantages = function_registry.get_advantage_estimator(cfg.advantage_estimator)(
        rewards=rewards, num_generations=g)

    grouped = prompt_ids.reshape(-1, g, prompt_ids.shape[-1])
    if not (grouped == grouped[:, :1]).all():
      # The loss runs each group's prompt once (logprobs.per_token_logps).
      raise AssertionError("rows of a group must share one prompt")
    prompt_ids, completion_ids = jnp.asarray(prompt_ids), jnp.asarray(completion_ids)
    logps_micro = (self._compute_logps_micro_batch_size or num_groups) * g
    ref_logps = None
    if self._with_ref:
      start = time.perf_counter()
      # Tunix's reference path materialises [B, P + T, V] logits; ours does not.
      reference = self.rl_cluster.inference_worker.get_model("reference")
      with self.rl_cluster.r2m[rl_cluster_lib.Role.REFERENCE]:
        ref_logps = jnp.concatenate([
            _sampling_logps(reference, *sharding_utils.shard_input(
                (prompt_ids[s:s + logps_micro], completion_ids[s:s + logps_micro]), ("fsdp",)),
                            pad, eos, cfg.temperature, g)
            for s in range(0, len(rows), logps_micro)
        ]).block_until_ready()
      self.rl_cluster.buffer_metrics(
          {"perf/reference_seconds": (time.perf_counter() - start, np.sum)}, mode=mode)
    sample_logps = None
    if rounds[0].sample_logps is not None:
      # Without TIS the ratio pi / sampler and PPO's clip bound the sampler's
      # rounding (BENCHMARKS.md, "Decode in bfloat16"); with TIS its weight does.
      sample_logps = jnp.asarray(np.stack([rounds[r].sample_logps[k] for r, k in rows]))

    def trainer_old_logps():
      # Tunix's own old log-probs ignore the sampling temperature; the loss
      # applies it, so they would disagree before any update.
      model = self.rl_cluster.actor_trainer.model
      return jnp.concatenate([
          _sampling_logps(model, prompt_ids[s:s + logps_micro], completion_ids[s:s + logps_micro],
                          pad, eos, cfg.temperature, g)
          for s in range(0, len(rows), logps_micro)
      ])

    old_logps, tis_logps = behaviour_logps(
        sample_logps, tis=self._tis,
        trainer_old_logps=trainer_old_logps if self._off_policy else None)
    self._log_diagnostics(rounds, selection, advantages, mode, step)
    return _train_example(prompt_ids, completion_ids, advantages, ref_logps, old_logps,
                          tis_logps, pad, tool_mask)

  def example_like(self, rows: int) -> losses.TrainExample:
    """A train example of zeros shaped as a training step's (`rows` completions).

    What the update's program is compiled for ahead of the first rollout
    (cluster.precompile_update); the shapes follow the rollout config.
    """
    rollout_config = self.rl_cluster.get_rollout_config(Mode.TRAIN)
    return train_example_like(
        rows, prompt_width=rollout_config.max_prompt_length,
        completion_width=rollout_config.max_tokens_to_generate,
        pad=self.rl_cluster.rollout.pad_id(), with_ref=self._with_ref,
        sampler_logps=self._sampler_logps, tis=self._tis, off_policy=self._off_policy)

  def _log_diagnostics(self, rounds: list[_Round], selection: Selection,
                       advantages, mode, step: int) -> None:
    """Per-step health metrics (Tunix logs them as <group>/<mode>/<name>).

    Rewards, lengths and truncation cover every completion rolled out this
    step (refill rounds included: they describe the policy); advantages cover
    the training batch.
    """
    rewards = np.concatenate([r.rewards for r in rounds])
    lengths = np.concatenate([r.lengths for r in rounds])
    truncated = np.concatenate([r.truncated for r in rounds])
    advantages = np.asarray(advantages, dtype=np.float64)
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
    if self.algo_config.dynamic_sampling and mode == Mode.TRAIN:
      metrics.update({
          "diagnostics/dynamic_sampling/extra_rounds": (selection.extra_rounds, np.sum),
          "diagnostics/dynamic_sampling/dropped_groups": (selection.dropped, np.sum),
          "diagnostics/dynamic_sampling/padded_groups": (selection.padded, np.sum),
          "diagnostics/dynamic_sampling/surplus_groups": (selection.surplus, np.sum),
      })
    self.rl_cluster.buffer_metrics(metrics, mode=mode)
    if mode == Mode.TRAIN:
      self.last_rollout = RolloutStats(
          step=step + 1, completion_length=float(lengths.mean()),
          seconds=seconds, tokens=tokens)
