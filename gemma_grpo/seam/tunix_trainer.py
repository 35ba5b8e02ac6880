"""Touch 3: Tunix's PeftTrainer, whose jitted step rl/trainers.py rebuilds.

rl/trainers.RLTrainer re-implements PeftTrainer.jit_train_and_eval_step
(reading _jitted_train_step_fn, _jitted_eval_step_fn, _shard_optimizer and
jax.interpreters.pxla.thread_resources) to donate the model to the jitted
step, so the frozen base is not written out twice every step; and compiles
that step ahead of its first call for an example prepared as
PeftTrainer.train prepares each one (_prepare_inputs, then shard_input over
config.data_sharding_axis), so the first update does not wait for it.
Removed by: PeftTrainer donating the model (an option or the default) and
offering to compile its step for given input shapes.
"""

from __future__ import annotations

import inspect

from gemma_grpo.seam import versions

versions.check_versions()

# pylint: disable=g-import-not-at-top,wrong-import-position
from jax.interpreters import pxla
from tunix.sft import peft_trainer
# pylint: enable=g-import-not-at-top,wrong-import-position


def _jitted_step() -> None:
  trainer = peft_trainer.PeftTrainer
  versions.expect(
      versions.params(trainer.jit_train_and_eval_step) == ["self", "skip_jit", "cache_nnx_graph"],
      "3", f"PeftTrainer.jit_train_and_eval_step{inspect.signature(trainer.jit_train_and_eval_step)}")
  source = inspect.getsource(trainer)
  for name in ("self._jitted_train_step_fn", "self._jitted_eval_step_fn", "def _shard_optimizer",
               "def create_train_step_fn", "def create_eval_step_fn"):
    versions.expect(name in source, "3", f"PeftTrainer has no {name}")
  versions.expect(hasattr(pxla, "thread_resources"), "3",
                  "jax.interpreters.pxla.thread_resources is gone")
  # The example compiled ahead must be prepared as train() prepares each one.
  train = inspect.getsource(trainer.train)
  for text in ("self._prepare_inputs(", "sharding_utils.shard_input(",
               "self.config.data_sharding_axis"):
    versions.expect(text in train, "3", f"PeftTrainer.train no longer calls {text.rstrip('(')}")


CANARIES = {"3 PeftTrainer.jit_train_and_eval_step": _jitted_step}
