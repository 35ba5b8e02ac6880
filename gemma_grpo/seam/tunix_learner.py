"""Touch 4: Tunix's GRPOLearner, whose step rl/learner/learner.py takes over.

`StepLearner` is GRPOLearner with its private rollout-and-advantage step
(_generate_and_compute_advantage) handed to a public method,
`rollout_and_advantage`, which rl/learner/learner.Learner implements: dynamic
sampling, the stop text, grouped rollouts and per-step diagnostics need the
step between rollout and advantage. It also names what that step reads
(_rollout_micro_batch_size, _compute_logps_micro_batch_size) and lets a
learner with several updates per batch resume its data iterator by batches
(_last_iter_step counts the trainer's updates). Removed by: public hooks
around rollout and advantage computation in RLLearner.
"""

from __future__ import annotations

import inspect

from gemma_grpo.seam import versions

versions.check_versions()

# pylint: disable=g-import-not-at-top,wrong-import-position
from tunix.rl import rl_cluster
from tunix.rl import rl_learner
from tunix.rl.grpo import grpo_learner
# pylint: enable=g-import-not-at-top,wrong-import-position


class StepLearner(grpo_learner.GRPOLearner):
  """GRPOLearner whose step between rollout and advantage is `rollout_and_advantage`."""

  def rollout_and_advantage(self, training_input, mode):
    """A batch's train example: rollouts, rewards, advantages, log-probs."""
    raise NotImplementedError

  def _generate_and_compute_advantage(self, training_input, mode=rl_cluster.Mode.TRAIN):
    return self.rollout_and_advantage(training_input, mode)

  @property
  def rollout_micro_batch_size(self) -> int:
    """Prompts per rollout call, as the cluster's training config sets it."""
    return self._rollout_micro_batch_size

  @property
  def logps_micro_batch_size(self) -> int | None:
    """Prompts per log-prob pass; None for the whole batch."""
    return self._compute_logps_micro_batch_size

  def resume_by_batches(self, updates_per_batch: int) -> None:
    """Resume the data iterator at batches done, not updates done.

    Tunix skips as many batches as the trainer made updates; with several
    updates per batch only updates / updates_per_batch were consumed.
    """
    self._last_iter_step //= updates_per_batch


def _learner_step() -> None:
  method = grpo_learner.GRPOLearner._generate_and_compute_advantage  # pylint: disable=protected-access
  versions.expect(versions.params(method) == ["self", "training_input", "mode"],
                  "4", f"GRPOLearner._generate_and_compute_advantage{inspect.signature(method)}")
  source = inspect.getsource(grpo_learner)
  for name in ("self._rollout_micro_batch_size", "self._compute_logps_micro_batch_size"):
    versions.expect(name in source, "4", f"GRPOLearner no longer sets {name}")
  # The resumed data iterator skips _last_iter_step batches (resume_by_batches).
  base = inspect.getsource(rl_learner.RLLearner)
  for text in ("self._last_iter_step = self.rl_cluster.actor_trainer.iter_steps",
               "self._iter_steps < self._last_iter_step"):
    versions.expect(text in base, "4", f"RLLearner no longer does {text}")


CANARIES = {"4 GRPOLearner._generate_and_compute_advantage": _learner_step}
