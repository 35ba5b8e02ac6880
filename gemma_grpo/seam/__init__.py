"""Where gemma-grpo reaches past the public APIs of Tunix, Qwix and JAX.

Each reach (a "touch") is a named function, class or constant in one module
of this package, beside a canary that checks the internal still has the
shape the touch expects. Nothing else in gemma-grpo touches a private name
of those libraries: tests/test_seam.py reads the package's source for it.

Supported: google-tunix 0.1.7 and qwix 0.1.8 (pyproject.toml pins them).
Each module checks the installed versions before it imports an internal,
so another version stops there with one line (UnsupportedVersion).

  tunix_cluster     1, 2, 8  RLCluster: the anchor copy, the trainer class, one rollout a batch
  tunix_trainer     3        PeftTrainer: the jitted step, donated and compiled ahead
  tunix_learner     4        GRPOLearner: the step between rollout and advantage
  tunix_gemma3      5, 6, 10 Gemma-3: last-token embedding, q/k norms, the LoRA feed-forward
  qwix_lora         7, 9     Qwix: adapters created compiled, its interception held open
  jax_distributed   11       JAX: the coordination service's key-value client
  jax_mesh          12       JAX: the legacy `with mesh:` context that Tunix reads its mesh from

Each module's docstring says, per touch, why it is there and which upstream
change would remove it. `canaries()` checks every touch against the
installed packages; tests/test_seam.py runs them, and a failure names the
versions and the touch in one line.
"""

from __future__ import annotations

import importlib
from typing import Callable

from gemma_grpo.seam.versions import SUPPORTED
from gemma_grpo.seam.versions import TouchChanged
from gemma_grpo.seam.versions import UnsupportedVersion
from gemma_grpo.seam.versions import check_versions
from gemma_grpo.seam.versions import fingerprint

__all__ = ["SUPPORTED", "TouchChanged", "UnsupportedVersion", "canaries", "check_versions",
           "fingerprint"]

TOUCH_MODULES = ("tunix_cluster", "tunix_trainer", "tunix_learner", "tunix_gemma3", "qwix_lora",
                 "jax_distributed", "jax_mesh")


def canaries() -> dict[str, Callable[[], None]]:
  """{touch: check}; a check raises TouchChanged when the internal changed shape."""
  # Imported here, not above: a touch module imports internals, which only a
  # supported version may reach, and `check_versions` must be importable first.
  modules = [importlib.import_module(f"gemma_grpo.seam.{name}") for name in TOUCH_MODULES]
  checks = {touch: check for module in modules for touch, check in module.CANARIES.items()}
  return dict(sorted(checks.items(), key=lambda item: int(item[0].split()[0])))
