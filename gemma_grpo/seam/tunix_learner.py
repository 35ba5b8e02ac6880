"""Touch 4: Tunix's GRPOLearner, whose step rl/learner.py takes over.

rl/learner.Learner overrides GRPOLearner._generate_and_compute_advantage and
reads _rollout_micro_batch_size / _compute_logps_micro_batch_size: dynamic
sampling, the stop text, grouped rollouts and per-step diagnostics need the
step between rollout and advantage. Removed by: public hooks around rollout
and advantage computation in RLLearner.
"""

from __future__ import annotations

import inspect

from gemma_grpo.seam import versions

versions.check_versions()

# pylint: disable=g-import-not-at-top,wrong-import-position
from tunix.rl.grpo import grpo_learner
# pylint: enable=g-import-not-at-top,wrong-import-position


def _learner_step() -> None:
  method = grpo_learner.GRPOLearner._generate_and_compute_advantage  # pylint: disable=protected-access
  versions.expect(versions.params(method) == ["self", "training_input", "mode"],
                  "4", f"GRPOLearner._generate_and_compute_advantage{inspect.signature(method)}")
  source = inspect.getsource(grpo_learner)
  for name in ("self._rollout_micro_batch_size", "self._compute_logps_micro_batch_size"):
    versions.expect(name in source, "4", f"GRPOLearner no longer sets {name}")


CANARIES = {"4 GRPOLearner._generate_and_compute_advantage": _learner_step}
