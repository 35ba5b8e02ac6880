"""Touches 1, 2 and 8: Tunix's RLCluster, as rl/run/cluster.py reshapes it.

1. RLCluster keeps `_anchor_policy_state`, a full copy of the actor's
   weights, for Tunix's own old-log-prob path, which
   our learner never reads: `drop_anchor_policy_state` sets it to None.
   Removed by: an RLCluster option not to keep the anchor.
2. RLCluster builds its actor trainer itself: `use_trainer_class` swaps the
   built trainer's class for ours (rl/run/trainers.py).
   Removed by: a trainer class (or factory) argument to RLCluster.
8. The actor trainer is built from a deep copy of the cluster's training
   config: the trainer updates every train.mini_batch_size prompts (its
   copy), while RLLearner.train, reading the cluster's config, takes the
   whole batch as one mini-batch and so rolls it out once (verl's
   mini-batches; Tunix rolls out each mini-batch before its update).
   Removed by: an RLTrainingConfig field for updates per rollout.
"""

from __future__ import annotations

import inspect

from gemma_grpo.seam import versions

versions.check_versions()

# pylint: disable=g-import-not-at-top,wrong-import-position
from tunix.rl import rl_cluster
from tunix.rl import rl_learner
from tunix.rl import trainer as rl_trainer
from tunix.sft import peft_trainer
# pylint: enable=g-import-not-at-top,wrong-import-position


def drop_anchor_policy_state(cluster: rl_cluster.RLCluster) -> None:
  """Frees the cluster's anchor copy of the actor's weights (touch 1).

  sync_weights never rebuilds it; Tunix's get_old_per_token_logps then
  refuses to run rather than read stale weights.
  """
  cluster._anchor_policy_state = None  # pylint: disable=protected-access


def use_trainer_class(cluster: rl_cluster.RLCluster, trainer_class: type) -> None:
  """Makes the actor trainer the cluster built an instance of `trainer_class` (touch 2).

  `trainer_class` must subclass rl_trainer.Trainer and add no state of its
  own to __init__: the object keeps the state Tunix's constructor gave it.
  """
  if not issubclass(trainer_class, rl_trainer.Trainer):
    raise TypeError(f"{trainer_class.__name__} is not a tunix.rl.trainer.Trainer")
  cluster.actor_trainer.__class__ = trainer_class


def roll_out_whole_batches(cluster: rl_cluster.RLCluster) -> None:
  """One rollout per batch, however many updates it feeds (touch 8).

  The actor trainer keeps the copy of the training config it was built with
  (an update every mini_batch_size prompts), while RLLearner.train, reading
  the cluster's, is told that a mini-batch is the whole batch
  (rollout_micro_batch_size, which the cluster config sets to the batch).
  """
  training = cluster.cluster_config.training_config
  batch = training.rollout_micro_batch_size
  if training.mini_batch_size != batch:
    training.mini_batch_size = batch
    training.gradient_accumulation_steps = batch // training.train_micro_batch_size


def _anchor_policy_state() -> None:
  versions.expect("self._anchor_policy_state" in inspect.getsource(rl_cluster.RLCluster),
                  "1", "RLCluster no longer keeps self._anchor_policy_state")


def _trainer_class_swap() -> None:
  versions.expect(
      isinstance(inspect.getattr_static(rl_cluster.RLCluster, "actor_trainer"), property)
      and "self._actor_trainer = rl_trainer.Trainer(" in inspect.getsource(rl_cluster.RLCluster),
      "2", "RLCluster no longer builds its actor trainer as rl_trainer.Trainer")
  versions.expect(issubclass(rl_trainer.Trainer, peft_trainer.PeftTrainer),
                  "2", "rl_trainer.Trainer is no longer a PeftTrainer")


def _one_rollout_per_batch() -> None:
  versions.expect("actor_config = copy.deepcopy(self.cluster_config.training_config)"
                  in inspect.getsource(rl_cluster.RLCluster),
                  "8", "RLCluster no longer builds its actor trainer from a copy of the training config")
  train = inspect.getsource(rl_learner.RLLearner.train)
  for name in ("self._training_config.mini_batch_size", '"gradient_accumulation_steps"'):
    versions.expect(name in train, "8", f"RLLearner.train no longer reads {name}")


CANARIES = {
    "1 RLCluster._anchor_policy_state": _anchor_policy_state,
    "2 RLCluster.actor_trainer class": _trainer_class_swap,
    "8 RLCluster's actor config copy": _one_rollout_per_batch,
}
