"""Touch 3: Tunix's PeftTrainer, with the model donated to its jitted step.

`DonatesModel` (mixed into rl/run/trainers' classes) re-implements
PeftTrainer.jit_train_and_eval_step (reading _jitted_train_step_fn,
_jitted_eval_step_fn, _shard_optimizer and the mesh context, touch 12) to donate
the model to the jitted step. Tunix donates only the optimizer, so XLA
cannot alias the model's buffers: every step writes each model variable,
the frozen base included, to fresh buffers while the old ones are still
alive: a second copy of every weight, just when the step's temporaries
peak. Donated, the frozen weights pass through in place;
anything else that held the model's arrays (a reference sharing the base)
holds deleted buffers after a step and must be pointed at the new ones.

`precompile_train_step` compiles that step ahead of its first call, in a
thread beside the first rollout, for an example prepared as PeftTrainer.train
prepares each one (_prepare_inputs, then shard_input over
config.data_sharding_axis): otherwise the first update traces, lowers and
compiles it only after the rollout, on the first step's critical path
(BENCHMARKS.md, "The wait for the first step"). `prepare_inputs` is the public name of _prepare_inputs.

Removed by: PeftTrainer donating the model (an option or the default) and
offering to compile its step for given input shapes.
"""

from __future__ import annotations

import functools
import inspect
import threading

from gemma_grpo.seam import jax_mesh
from gemma_grpo.seam import versions

versions.check_versions()

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import logging
from flax import nnx
from tunix.sft import peft_trainer
from tunix.sft import sharding_utils
# pylint: enable=g-import-not-at-top,wrong-import-position


def jit_train_step(trainer):
  """The trainer's step, jitted with the model and the optimizer donated.

  Called as step(model, optimizer, example); what `train` runs and `plan` lowers.
  """
  return nnx.jit(trainer.create_train_step_fn(), donate_argnames=("model", "optimizer"))


class DonatesModel:
  """Mixed in before a PeftTrainer: its jitted step donates the model; the rest is Tunix's."""

  _precompiling: threading.Thread | None = None
  _train_step_jit = None  # the nnx.jit under _jitted_train_step_fn

  def prepare_inputs(self, input_data):
    """A train example as the step takes it (PeftTrainer._prepare_inputs by default)."""
    return super()._prepare_inputs(input_data)

  def _prepare_inputs(self, input_data):
    return self.prepare_inputs(input_data)

  def jit_train_and_eval_step(self, skip_jit: bool = False, cache_nnx_graph: bool = False):
    if self._precompiling is not None:
      # Its compiled program is in JAX's caches once it ends; calling before
      # would compile the step a second time.
      self._precompiling.join()
      self._precompiling = None
    if skip_jit or self._jitted_train_step_fn is not None:
      return super().jit_train_and_eval_step(skip_jit, cache_nnx_graph)
    # Tunix's construction, with the model among the donated arguments.
    self._shard_optimizer(jax_mesh.current_mesh())
    train_step = jit_train_step(self)
    self._train_step_jit = train_step
    eval_step = nnx.jit(self.create_eval_step_fn())
    bind = nnx.cached_partial if cache_nnx_graph else functools.partial
    # Tunix's train() reads `.func.jitted_fn` of what this returns.
    self._jitted_train_step_fn = functools.partial(bind(train_step, self.model, self.optimizer))
    self._jitted_eval_step_fn = functools.partial(bind(eval_step, self.model))
    return self._jitted_train_step_fn, self._jitted_eval_step_fn

  def precompile_train_step(self, example) -> None:
    """Starts compiling the train step for `example`'s shapes in a thread.

    Call under the trainer's mesh. `example` is a train example whose shapes,
    dtypes and structure are those of the first real one (its values are not
    read); it is prepared and sharded as PeftTrainer.train does. The first
    call of the step waits for the thread; a mismatched example only means
    that call compiles as it would have anyway.
    """
    self.jit_train_and_eval_step(cache_nnx_graph=True)  # as PeftTrainer.train calls it
    example = sharding_utils.shard_input(self._prepare_inputs(example),
                                         self.config.data_sharding_axis)
    mesh = jax_mesh.current_mesh()  # the mesh context is per thread
    train_step, model, optimizer = self._train_step_jit, self.model, self.optimizer

    def compile_step():
      try:
        with jax_mesh.tunix_mesh(mesh):
          train_step.lower(model, optimizer, example).compile()
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("compiling the train step ahead failed (%s: %s); it compiles"
                        " at its first call instead", type(e).__name__, str(e)[:200])

    self._precompiling = threading.Thread(target=compile_step, name="precompile-train-step")
    self._precompiling.start()


def _jitted_step() -> None:
  trainer = peft_trainer.PeftTrainer
  versions.expect(
      versions.params(trainer.jit_train_and_eval_step) == ["self", "skip_jit", "cache_nnx_graph"],
      "3", f"PeftTrainer.jit_train_and_eval_step{inspect.signature(trainer.jit_train_and_eval_step)}")
  source = inspect.getsource(trainer)
  for name in ("self._jitted_train_step_fn", "self._jitted_eval_step_fn", "def _shard_optimizer",
               "def create_train_step_fn", "def create_eval_step_fn"):
    versions.expect(name in source, "3", f"PeftTrainer has no {name}")
  # The example compiled ahead must be prepared as train() prepares each one.
  train = inspect.getsource(trainer.train)
  for text in ("self._prepare_inputs(", "sharding_utils.shard_input(",
               "self.config.data_sharding_axis"):
    versions.expect(text in train, "3", f"PeftTrainer.train no longer calls {text.rstrip('(')}")


CANARIES = {"3 PeftTrainer.jit_train_and_eval_step": _jitted_step}
