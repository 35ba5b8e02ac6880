"""The GRPO-family learner: Tunix's GRPOLearner with our rollout step.

`Learner` replaces Tunix's rollout-and-advantage step to add what Tunix lacks:
a per-step sampling key, DAPO's overlong penalty counted in tokens, dynamic
sampling (dynamic_sampling.py), temperature-consistent old log-probs,
truncated importance sampling (train_examples.py), and per-step diagnostics
(rollout_rounds.py). The algorithms and their settings are in algorithms.py.
"""

from __future__ import annotations

import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tunix.rl import rl_cluster as rl_cluster_lib

from gemma_grpo.model import tokenizer as tokenizer_lib
from gemma_grpo.rl.learner import algorithms
from gemma_grpo.rl.learner import batch_logps
from gemma_grpo.rl.learner import dynamic_sampling
from gemma_grpo.rl.learner import losses
from gemma_grpo.rl.learner import rollout_rounds
from gemma_grpo.rl.learner import train_examples
from gemma_grpo.seam import jax_mesh
from gemma_grpo.seam import tunix_learner
from gemma_grpo.tasks import data as data_lib

Mode = rl_cluster_lib.Mode


class Learner(tunix_learner.StepLearner):
  """Tunix's GRPO learner with our rollout step; see the module docstring.

  Step s samples round k of call c with key fold_in(seed, s, c, k), so every
  step draws fresh noise and a resumed run draws exactly the samples the
  uninterrupted run would have drawn.
  """

  def __init__(self, *args, rollout_seed: int,
               refill_problems: Sequence[data_lib.Problem] | None = None,
               stop_text: str = "", updates_per_batch: int = 1,
               sampler_logps: bool = False, tools: bool = False,
               decode_stats: bool = False, run_ahead=None, **kwargs):
    """A learner over `rl_cluster`, stepping with our rollout-and-advantage.

    Args:
      *args: Tunix's GRPOLearner arguments: rl_cluster, algo_config (an
        algorithms.AlgoConfig, from algorithms.algo_config(c.grpo)) and
        reward_fns.
      rollout_seed: rollout.seed, the root of every step's sampling keys.
      refill_problems: the training problems that dynamic sampling draws
        refill prompts from; needed when grpo.dynamic_sampling is on.
      stop_text: rollout.stop_text: a completion ends right after it.
      updates_per_batch: optimizer updates per rollout batch
        (config.updates_per_batch); above 1 the later ones are off-policy.
      sampler_logps: the sampler rounds the policy (bfloat16 decoding), so its
        own log-probs are the importance ratio's denominator.
      tools: completions call tools (rollout.tools): their results are masked
        out of the loss.
      decode_stats: the engine (ours, rollout.engine="grouped") reports what
        its decode loop did (`take_decode_stats`), logged as rollout/occupancy.
      run_ahead: with rollout.max_staleness > 0, what makes each training
        step's rollout, ahead of the update in the engine's carried slots
        (rl/run/run_ahead.RunAhead); None: each step samples its own batch.
      **kwargs: passed on to GRPOLearner.

    Raises:
      TypeError: algo_config is not an AlgoConfig.
      ValueError: metric_fns were given, or dynamic sampling has no refill problems.
    """
    super().__init__(*args, **kwargs)
    cfg = self.algo_config
    if not isinstance(cfg, algorithms.AlgoConfig):
      raise TypeError("Learner needs algorithms.algo_config(c.grpo), an AlgoConfig")
    if self.metric_fns:
      raise ValueError("metric_fns are not supported; add metrics in rollout_rounds.diagnostics")
    if cfg.dynamic_sampling and cfg.max_resample_rounds and not refill_problems:
      raise ValueError("grpo.dynamic_sampling needs refill_problems (the training problems)")
    self._rollout_seed = rollout_seed
    if cfg.num_iterations > 1:
      # Checkpoints fall on batch boundaries (config.validate).
      self.resume_by_batches(cfg.num_iterations)
    self._stop_text = stop_text
    # The engine's tool calls (rollout.tools): their results are masked out.
    self._tools = tools
    self._decode_stats = decode_stats
    # Updates after a batch's first see samples of an older policy: they need
    # the sampling policy's log-probs for the importance ratio.
    self._off_policy = updates_per_batch > 1
    # sampler_logps: a sampler that rounds the policy (rollout.decode_dtype=
    # "bfloat16") is a behaviour policy of its own. Its log-probs are the
    # ratio's denominator, or with TIS (which asks for them whatever the
    # sampler) the weight's (train_examples.behaviour_logps).
    self._tis = cfg.tis_cap > 0
    # Running ahead, the sampler is the behaviour policy of every token.
    self._sampler_logps = sampler_logps or self._tis or run_ahead is not None
    self._run_ahead = run_ahead
    self._rollout_key = jax.random.PRNGKey(rollout_seed)
    self._refill_problems = refill_problems
    self._call = (-1, 0)  # (step, calls made during it)
    self._with_ref = bool(cfg.beta) or cfg.log_kl
    trainer = self.rl_cluster.actor_trainer
    algorithms.wire_loss(trainer, cfg, pad_id=self.rl_cluster.rollout.pad_id(),
                         eos_id=self.rl_cluster.rollout.eos_id())
    trainer.with_rl_metrics_to_log(algorithms.loss_metrics(self._with_ref, self._tis))

  # --- one rollout round -----------------------------------------------------

  def _rollout(self, inputs: dict, mode, key) -> rollout_rounds.Round:
    cfg = self.algo_config
    rollout_config = self.rl_cluster.get_rollout_config(mode)
    rollout_config.seed = key
    rollout_config.return_logprobs = self._sampler_logps and mode == Mode.TRAIN
    if self._decode_stats:
      # Other generate() calls on this engine (the held-out eval's) leave
      # their stats too: only this call's count for its rows.
      self.rl_cluster.rollout.take_decode_stats()
    start = time.perf_counter()
    out = self.rl_cluster.generate(
        prompts=inputs["prompts"], mode=mode,
        micro_batch_size=self.rollout_micro_batch_size * cfg.num_generations,
    )
    seconds = time.perf_counter() - start
    turns = self.rl_cluster.rollout.take_tool_turns() if self._tools else None
    decode_stats = self.rl_cluster.rollout.take_decode_stats() if self._decode_stats else None
    return self._round(inputs, mode, rollout_config, out, seconds, turns, decode_stats)

  def _rollout_ahead(self, inputs: dict, step: int) -> rollout_rounds.Round:
    """A training step's round from rollouts run ahead (rollout.max_staleness)."""
    rollout_config = self.rl_cluster.get_rollout_config(Mode.TRAIN)
    rollout_config.return_logprobs = True  # every token's behaviour policy is the sampler
    if self._decode_stats:
      self.rl_cluster.rollout.take_decode_stats()  # the held-out eval's, if any: not ours
    with jax_mesh.tunix_mesh(self.rl_cluster.r2m[rl_cluster_lib.Role.ROLLOUT]):
      ahead = self._run_ahead.rollout(step, list(inputs["prompts"]), rollout_config,
                                      version=self.rl_cluster.actor_trainer.train_steps)
    self.rl_cluster.buffer_metrics(ahead.metrics, mode=Mode.TRAIN)
    # The stats count each call's slot-steps, not the batch's rows: the engine
    # already cut them at the stop text.
    return self._round(inputs, Mode.TRAIN, rollout_config, ahead.out, ahead.seconds, None,
                       ahead.stats, cut_stats=False)

  def _round(self, inputs: dict, mode, rollout_config, out, seconds: float, turns,
             decode_stats, cut_stats: bool = True) -> rollout_rounds.Round:
    """The round of `out`, the rollout of `inputs`: cut, scored, its columns built."""
    cfg = self.algo_config
    limit = rollout_config.max_tokens_to_generate
    pad = self.rl_cluster.rollout.pad_id()
    n = len(out.tokens)
    completion_ids = np.full((n, limit), pad, dtype=np.int32)
    tool_mask = np.zeros((n, limit), dtype=bool) if turns is not None else None
    lengths = np.zeros(n, dtype=np.int64)  # the model's own tokens
    cut_at = np.full(n, -1, dtype=np.int64)  # tokens left where stop_text cut a completion
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
        cut_at[row] = cut[0]
      completion_ids[row, :len(tokens)] = tokens
      if sample_logps is not None:
        sample_logps[row, :len(tokens)] = np.asarray(out.logprobs[row])[:len(tokens)]
      lengths[row] = len(tokens)
      if tool_mask is not None:
        tool_mask[row, :len(tokens)] = turns[row].tool_mask[:len(tokens)]
        lengths[row] -= tool_mask[row].sum()
      truncated[row] = (cut is None and len(tokens) >= limit
                        and not np.isin(tokens, stops).any())

    if decode_stats is not None and cut_stats:
      decode_stats = rollout_rounds.kept_through_stop_text(decode_stats, cut_at)
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
      penalty = rollout_rounds.overlong_penalty(used, limit, cfg.overlong_buffer,
                                                cfg.overlong_penalty)
      fn_rewards["overlong"] = penalty
      self.rl_cluster.buffer_metrics({"rewards/overlong": (penalty, np.mean)}, mode=mode)
      rewards = rewards + penalty
    tool_calls = failed = None
    if turns is not None:
      tool_calls = np.array([len(t.calls) for t in turns])
      failed = np.array([t.failed_calls for t in turns])
    return rollout_rounds.Round(inputs, np.asarray(out.left_padded_prompt_tokens),
                                completion_ids, lengths, truncated, rewards, fn_rewards, seconds,
                                sample_logps, tool_mask, tool_calls, failed, decode_stats)

  # --- the step between rollout and advantage (seam.tunix_learner) -----------

  def rollout_and_advantage(self, training_input, mode=Mode.TRAIN):
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
    if self._run_ahead is not None and mode == Mode.TRAIN:
      rounds = [self._rollout_ahead(inputs, step)]
    else:
      rounds = [self._rollout(inputs, mode, jax.random.fold_in(step_key, 0))]

    def roll_more(round_: int) -> np.ndarray:
      more = dynamic_sampling.refill_batch(
          self._refill_problems, num_groups=num_groups, num_generations=g,
          seed=self._rollout_seed, step=step, call=call, round_=round_, columns=inputs)
      rounds.append(self._rollout(more, mode, jax.random.fold_in(step_key, round_)))
      return rounds[-1].rewards.reshape(-1, g)

    refills = cfg.dynamic_sampling and mode == Mode.TRAIN and self._refill_problems
    selection = dynamic_sampling.select_groups(
        rounds[0].rewards.reshape(-1, g), roll_more if refills else None, num_groups,
        cfg.max_resample_rounds)
    rows = selection.rows(g)
    pad, eos = self.rl_cluster.rollout.pad_id(), self.rl_cluster.rollout.eos_id()
    prompt_ids = tokenizer_lib.left_pad([rounds[r].prompt_ids[k] for r, k in rows], pad)
    completion_ids = rollout_rounds.stack_rows(rounds, rows, "completion_ids")
    tool_mask = rollout_rounds.stack_rows(rounds, rows, "tool_mask")
    advantages = algorithms.advantages(cfg, rollout_rounds.stack_rows(rounds, rows, "rewards"))

    grouped = prompt_ids.reshape(-1, g, prompt_ids.shape[-1])
    if not (grouped == grouped[:, :1]).all():
      # The loss runs each group's prompt once (logprobs.per_token_logps).
      raise AssertionError("rows of a group must share one prompt")
    prompt_ids, completion_ids = jnp.asarray(prompt_ids), jnp.asarray(completion_ids)
    roles = rl_cluster_lib.Role

    def logps(model, role):
      return batch_logps.micro_batched_logps(
          model, self.rl_cluster.r2m[role], prompt_ids, completion_ids,
          micro_batch=(self.logps_micro_batch_size or num_groups) * g,
          pad_id=pad, eos_id=eos, temperature=cfg.temperature, group_size=g)

    ref_logps = None
    if self._with_ref:
      start = time.perf_counter()
      # Tunix's reference path materialises [B, P + T, V] logits; ours does not.
      reference = self.rl_cluster.inference_worker.get_model("reference")
      ref_logps = logps(reference, roles.REFERENCE).block_until_ready()
      self.rl_cluster.buffer_metrics(
          {"perf/reference_seconds": (time.perf_counter() - start, np.sum)}, mode=mode)
    sample_logps = rollout_rounds.stack_rows(rounds, rows, "sample_logps")
    if sample_logps is not None:
      # Without TIS the ratio pi / sampler and PPO's clip bound the sampler's
      # rounding (BENCHMARKS.md, "Decode in bfloat16"); with TIS its weight does.
      sample_logps = jnp.asarray(sample_logps)

    def trainer_old_logps():
      # Tunix's own old log-probs ignore the sampling temperature; the loss
      # applies it, so they would disagree before any update.
      return logps(self.rl_cluster.actor_trainer.model, roles.ACTOR)

    old_logps, tis_logps = train_examples.behaviour_logps(
        sample_logps, tis=self._tis,
        trainer_old_logps=trainer_old_logps if self._off_policy else None)
    diagnostics = rollout_rounds.diagnostics(
        rounds, selection, advantages, dynamic=cfg.dynamic_sampling and mode == Mode.TRAIN)
    self.rl_cluster.buffer_metrics(diagnostics, mode=mode)
    return train_examples.train_example(prompt_ids, completion_ids, advantages, ref_logps,
                                        old_logps, tis_logps, pad, tool_mask)

  def example_like(self, rows: int) -> losses.TrainExample:
    """A train example of zeros shaped as a training step's (`rows` completions).

    What the update's program is compiled for ahead of the first rollout
    (cluster.precompile_update); the shapes follow the rollout config.
    """
    rollout_config = self.rl_cluster.get_rollout_config(Mode.TRAIN)
    return train_examples.train_example_like(
        rows, prompt_width=rollout_config.max_prompt_length,
        completion_width=rollout_config.max_tokens_to_generate,
        pad=self.rl_cluster.rollout.pad_id(), with_ref=self._with_ref,
        sampler_logps=self._sampler_logps, tis=self._tis, off_policy=self._off_policy)
