"""The optimizer of every trainer: warmup-cosine AdamW with global-norm clipping.

Each function takes the `optim` settings (SFT's with its own peak rate).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gemma_grpo.config import settings


def learning_rate(c: settings.OptimizerSettings, max_steps: int):
  """Linear warmup from 0 over warmup_fraction of the steps, then cosine."""
  warmup = int(c.warmup_fraction * max_steps)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=c.peak_lr, warmup_steps=warmup,
      decay_steps=max(max_steps, warmup + 1), end_value=c.end_lr,
  )


def learning_rates(c: settings.OptimizerSettings, max_steps: int) -> np.ndarray:
  """The rate of every update 1..max_steps, computed in one go (for logging)."""
  return np.asarray(jax.vmap(learning_rate(c, max_steps))(jnp.arange(max_steps)), dtype=np.float64)


def optimizer(c: settings.OptimizerSettings, max_steps: int):
  """Global-norm clip, then AdamW on the `learning_rate` schedule.

  The rate is injected as a hyperparameter so Tunix logs it.
  """

  def clipped_adamw(learning_rate):
    return optax.chain(
        optax.clip_by_global_norm(c.max_grad_norm),
        optax.adamw(learning_rate, b1=c.b1, b2=c.b2, weight_decay=c.weight_decay),
    )

  return optax.inject_hyperparams(clipped_adamw)(learning_rate=learning_rate(c, max_steps))
