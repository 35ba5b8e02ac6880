"""Tunix's RLCluster holding one copy of the frozen base weights.

The reference policy is the base model and the actor is the base plus LoRA,
so their frozen weights are the same numbers. Two things in Tunix 0.1.7 make
copies of them (1.07 GB each for Gemma-3-270M in float32):

- the cluster snapshots the whole actor state as an "anchor" for its own
  old-log-prob path at start-up and after every update. Our learner computes
  old log-probs itself from the live actor (before any update of the batch),
  so the anchor is never read;
- the actor trainer jits its step donating only the optimizer, so XLA writes
  every variable of the model, frozen ones included, to fresh buffers while
  the old ones are still alive: a second copy of the base at the very moment
  the update's own temporaries peak.

`SharedWeightsCluster` frees the anchor, has the actor's step donate the
model as well (the frozen weights then pass through the step in place), and
after each update points the reference's frozen weights at the actor's
arrays, which are the donated buffers under new handles.
"""

from __future__ import annotations

import functools

from flax import nnx
from jax.interpreters import pxla
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl import trainer as rl_trainer

from gemma_grpo import host_memory
from gemma_grpo import lora


class ModelDonatingTrainer(rl_trainer.Trainer):
  """Tunix's actor trainer whose jitted step donates the model too."""

  def jit_train_and_eval_step(self, skip_jit: bool = False, cache_nnx_graph: bool = False):
    if skip_jit or self._jitted_train_step_fn is not None:
      return super().jit_train_and_eval_step(skip_jit, cache_nnx_graph)
    # Tunix's own construction, but with the model among the donated arguments.
    self._shard_optimizer(pxla.thread_resources.env.physical_mesh)
    train_step = nnx.jit(self.create_train_step_fn(), donate_argnames=("model", "optimizer"))
    eval_step = nnx.jit(self.create_eval_step_fn())
    bind = nnx.cached_partial if cache_nnx_graph else functools.partial
    # Tunix's train() reads `.func.jitted_fn` of what this returns.
    self._jitted_train_step_fn = functools.partial(bind(train_step, self.model, self.optimizer))
    self._jitted_eval_step_fn = functools.partial(bind(eval_step, self.model))
    return self._jitted_train_step_fn, self._jitted_eval_step_fn


class SharedWeightsCluster(rl_cluster_lib.RLCluster):
  """An RLCluster whose actor and reference share their frozen weights."""

  def __init__(self, *, actor, reference, tokenizer, cluster_config):
    super().__init__(actor=actor, reference=reference, tokenizer=tokenizer,
                     cluster_config=cluster_config)
    self._reference_model = reference
    # Freed here; sync_weights below never rebuilds it. Tunix's
    # get_old_per_token_logps then refuses to run rather than read stale weights.
    self._anchor_policy_state = None
    # RLCluster builds its trainer itself and offers no way to choose the
    # class; this subclass changes only how the step is jitted.
    self.actor_trainer.__class__ = ModelDonatingTrainer

  def update_actor(self, *args, **kwargs):
    # The update is the step's memory peak; start it without the free heap
    # the rollout and reference passes left behind.
    host_memory.release_free_memory()
    try:
      return super().update_actor(*args, **kwargs)
    finally:
      # The reference's arrays were donated with the actor's; even a failed
      # update leaves both pointing at the same (possibly deleted) buffers.
      lora.share_frozen_weights(source=self.actor_trainer.model, target=self._reference_model)

  def sync_weights(self):
    """Tunix's sync (when rollout and actor do not share a model), no anchor."""
    filter_types = (nnx.LoRAParam,)
    self.rollout.update_params(nnx.state(self.actor_trainer.model, filter_types), filter_types)
    self.global_steps += 1
