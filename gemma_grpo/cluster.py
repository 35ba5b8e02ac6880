"""Tunix's RLCluster holding one copy of the frozen base weights.

The reference policy is the base model and the actor is the base plus LoRA,
so their frozen weights are the same numbers. Two things in Tunix 0.1.7 make
copies of them (1.07 GB each for Gemma-3-270M in float32):

- the cluster snapshots the whole actor state as an "anchor" for its own
  old-log-prob path at start-up and after every update. Our learner computes
  old log-probs itself from the live actor (before any update of the batch),
  so the anchor is never read;
- the actor trainer's jitted step returns fresh arrays for every variable of
  the model, frozen ones included, so after an update the actor no longer
  shares its frozen weights with the reference.

`SharedWeightsCluster` frees the anchor and, after each update, points the
actor's frozen weights back at the reference's arrays (same values), so the
extra copy lives only while the update runs.
"""

from __future__ import annotations

from flax import nnx
from tunix.rl import rl_cluster as rl_cluster_lib

from gemma_grpo import lora


class SharedWeightsCluster(rl_cluster_lib.RLCluster):
  """An RLCluster whose actor and reference share their frozen weights."""

  def __init__(self, *, actor, reference, tokenizer, cluster_config):
    super().__init__(actor=actor, reference=reference, tokenizer=tokenizer,
                     cluster_config=cluster_config)
    self._reference_model = reference
    # Freed here; sync_weights below never rebuilds it. Tunix's
    # get_old_per_token_logps then refuses to run rather than read stale weights.
    self._anchor_policy_state = None

  def update_actor(self, *args, **kwargs):
    result = super().update_actor(*args, **kwargs)
    lora.share_frozen_weights(source=self._reference_model, target=self.actor_trainer.model)
    return result

  def sync_weights(self):
    """Tunix's sync (when rollout and actor do not share a model), no anchor."""
    filter_types = (nnx.LoRAParam,)
    self.rollout.update_params(nnx.state(self.actor_trainer.model, filter_types), filter_types)
    self.global_steps += 1
