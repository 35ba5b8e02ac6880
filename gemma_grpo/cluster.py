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
  the old ones are still alive (see `trainers`).

`SharedWeightsCluster` frees the anchor, has the actor's step donate the
model as well (the frozen weights then pass through the step in place), and
after each update points the reference's frozen weights at the actor's
arrays, which are the donated buffers under new handles.
"""

from __future__ import annotations

from flax import nnx
from tunix.rl import rl_cluster as rl_cluster_lib

from gemma_grpo import host_memory
from gemma_grpo import lora
from gemma_grpo import trainers


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
    self.actor_trainer.__class__ = trainers.RLTrainer

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
    # Steps count optimizer updates (grpo.num_iterations of them per batch),
    # so a batch's metrics land on the step of its first update.
    self.global_steps = self.actor_trainer.train_steps
