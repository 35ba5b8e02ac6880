"""The train example an update reads, and which log-probs fill its columns.

The sampler's own log-probs (rollout_config.return_logprobs) serve one of two
ends, chosen by grpo.tis_cap (behaviour_logps):
  TIS off (0)  a sampler that rounds the policy (rollout.decode_dtype=
               "bfloat16") is the behaviour policy: its log-probs are the PPO
               ratio's denominator, and the clip bounds the difference.
  TIS on (C)   the ratio divides by the trainer's own old log-probs, and each
               token's loss is weighted by min(pi_old / pi_sampler, C)
               (losses.tis_weights), whatever the decode dtype.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from gemma_grpo import config as config_lib
from gemma_grpo.config import settings
from gemma_grpo.rl.learner import losses


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


def train_example(prompt_ids, completion_ids, advantages, ref_logps, old_logps,
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
  return train_example(
      jnp.full((rows, prompt_width), pad, jnp.int32),
      jnp.full((rows, completion_width), pad, jnp.int32),
      np.zeros(rows), logps if with_ref else None, old_logps, tis_logps, pad)


def wants_sampler_logps(decode_dtype: str, tis_cap: float, max_staleness: int = 0) -> bool:
  """Whether training asks the rollout engine for its own log-probs (Learner):
  with rollout.decode_dtype other than float32, grpo.tis_cap on, or
  rollouts run ahead (rollout.max_staleness)."""
  return decode_dtype != "float32" or tis_cap > 0 or max_staleness > 0


def example_columns(g: settings.AlgorithmSettings, train: settings.TrainSettings,
                    decode_dtype: str, max_staleness: int = 0) -> dict[str, bool]:
  """train_example_like's column choices, as the Learner that `train` builds makes them."""
  return dict(with_ref=bool(g.beta) or g.log_kl,
              sampler_logps=wants_sampler_logps(decode_dtype, g.tis_cap, max_staleness),
              tis=g.tis_cap > 0, off_policy=config_lib.updates_per_batch(train, g.num_iterations) > 1)
