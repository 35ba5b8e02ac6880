"""Per-step checks, checkpoint decisions and in-training eval timing of RunHooks."""

import math
import signal

from flax import nnx
import jax.numpy as jnp
import pytest

from gemma_grpo.runtime import guards
from gemma_grpo.rl.run import step_hooks


class Adapter(nnx.Module):

  def __init__(self, value: float):
    self.a = nnx.LoRAParam(jnp.full((2, 3), value))
    self.frozen = nnx.Param(jnp.zeros(2))


class FakeTrainer:
  """What RunHooks reads from Tunix's trainer: the step count and the model."""

  def __init__(self, value: float = 0.5):
    self.train_steps = 0
    self.model = Adapter(value)


class FakeWriter:

  def __init__(self):
    self.scalars_seen, self.finished = [], []

  def scalar(self, name, value, step):
    self.scalars_seen.append((name, step))

  def scalars(self, values, step):
    for name in values:
      self.scalar(name, values[name], step)

  def finish_through(self, step):
    self.finished.append(step)


def make_hooks(*, every=1, max_steps=5, stop=None):
  saved = []
  run_hooks = step_hooks.RunHooks(
      writer=FakeWriter(), max_steps=max_steps, checkpoint_every=every,
      eval_every=0, evaluate=None, stop=stop or guards.StopSignal(),
      save=lambda trainer, step: saved.append(step),
  )
  return run_hooks, saved


def test_finite_steps_are_checkpointed_every_n_and_at_the_end():
  run_hooks, saved = make_hooks(every=2, max_steps=5)
  trainer = FakeTrainer()
  run_hooks.on_train_start(trainer)
  for step in range(1, 6):
    trainer.train_steps = step
    run_hooks.on_train_end(trainer)
  assert saved == [2, 4, 5]
  assert run_hooks.last_good_step == 5


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_parameters_stop_without_overwriting_the_checkpoint(bad):
  run_hooks, saved = make_hooks(every=1)
  trainer = FakeTrainer()
  run_hooks.on_train_start(trainer)
  trainer.train_steps = 1
  run_hooks.on_train_end(trainer)
  trainer.model.a.set_value(trainer.model.a.get_value().at[1, 2].set(bad))
  trainer.train_steps = 2
  with pytest.raises(guards.NonFiniteError, match=r"^step 2: LoRA parameters became NaN/Inf"):
    run_hooks.on_train_end(trainer)
  assert saved == [1]  # step 2 was never written


def test_gradient_accumulation_acts_once_per_step():
  # Tunix calls on_train_end after every micro-batch; only the last of a step
  # moves train_steps on.
  run_hooks, saved = make_hooks(every=1)
  trainer = FakeTrainer()
  run_hooks.on_train_start(trainer)
  for step in (0, 1, 1, 2):  # micro-batches 1, 2 of step 1 and 2 ...
    trainer.train_steps = step
    run_hooks.on_train_end(trainer)
  assert saved == [1, 2]
  assert [s for name, s in run_hooks._writer.scalars_seen if name == "perf/train/step_seconds"] == [1, 2]


def test_a_requested_stop_checkpoints_the_step_regardless_of_the_period():
  stop = guards.StopSignal()
  run_hooks, saved = make_hooks(every=100, max_steps=10, stop=stop)
  trainer = FakeTrainer()
  run_hooks.on_train_start(trainer)
  trainer.train_steps = 1
  run_hooks.on_train_end(trainer)
  stop.signum = signal.SIGTERM
  trainer.train_steps = 2
  run_hooks.on_train_end(trainer)
  assert saved == [2]


@pytest.mark.parametrize("loss, ok", [(0.25, True), (None, True), (math.nan, False), (math.inf, False)])
def test_non_finite_loss_names_its_step(loss, ok):
  run_hooks, _ = make_hooks()
  if ok:
    run_hooks.on_train_step_end(FakeTrainer(), 4, loss)
  else:
    with pytest.raises(guards.NonFiniteError, match=r"^step 4: loss is (nan|inf)"):
      run_hooks.on_train_step_end(FakeTrainer(), 4, loss)
