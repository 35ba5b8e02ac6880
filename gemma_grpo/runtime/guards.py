"""What stops a run safely: non-finite values, failing reward functions, signals.

A NaN or Inf in the loss, the LoRA parameters or a reward raises
NonFiniteError naming the step; a reward function that raises becomes a
RewardFunctionError naming the function and the step; SIGTERM/SIGINT ask for
a stop at the next step boundary that every process agrees on. The command
turns each into its exit code (gemma_grpo/commands/command.py) after the last good
checkpoint is safe.
"""

from __future__ import annotations

import functools
import signal
from typing import Callable, Iterable, Iterator, Sequence

from absl import logging
import jax
import jax.numpy as jnp
from flax import nnx
import numpy as np

from gemma_grpo.runtime import distributed


class NonFiniteError(RuntimeError):
  """Training produced NaN or Inf; the message names the step."""


class RewardFunctionError(RuntimeError):
  """A reward function raised; the message names it and the step.

  The function's own exception is the __cause__, for its frames.
  """


class StopSignal:
  """SIGTERM/SIGINT ask training to stop at the next safe point.

  TPU VMs are preempted with SIGTERM. The first signal lets the current step
  finish and be checkpointed; a second SIGINT interrupts at once.
  """

  def __init__(self):
    self.signum: int | None = None
    self._previous = {}

  @property
  def requested(self) -> bool:
    return self.signum is not None

  def _handle(self, signum, frame):
    del frame
    if self.signum is not None and signum == signal.SIGINT:
      raise KeyboardInterrupt
    self.signum = signum
    logging.warning(
        "%s received: finishing the current step, then checkpointing and"
        " exiting (press Ctrl-C again to abort now)",
        signal.Signals(signum).name,
    )

  def install(self) -> "StopSignal":
    for sig in (signal.SIGTERM, signal.SIGINT):
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def uninstall(self) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous.clear()

  def agree(self) -> bool:
    """Whether to stop, the same in every process: a stop asked of any one.

    A signal reaches the processes of a run at slightly different times; they
    must still stop after the same step, or one would wait in a collective
    the others never join. A collective itself: every process calls it at the
    same points (each step's end and each batch drawn). The answer is latched
    into `signum` so later local checks agree too.
    """
    signum = distributed.largest(self.signum or 0)
    if signum and self.signum is None:
      self.signum = signum
    return bool(signum)

  def guard(self, batches: Iterable) -> Iterator:
    """Yields batches until a stop is agreed; Tunix then ends the run.

    Tunix draws a step's whole batch before its rollout, so a stop lands
    between steps, never inside one.
    """
    for batch in batches:
      if self.agree():
        return
      yield batch


def params_are_finite(model) -> bool:
  """True when every trainable (LoRA) parameter is finite.

  Reduced on the devices: the parameters may span other processes' devices,
  whose values this process cannot fetch; the answer is replicated.
  """
  return bool(_all_finite(nnx.state(model, nnx.LoRAParam)))


@jax.jit
def _all_finite(tree) -> jax.Array:
  checks = [jnp.isfinite(x).all() for x in jax.tree.leaves(tree)]
  return jnp.stack(checks).all() if checks else jnp.array(True)


def finite_rewards(reward_fns: Sequence[Callable], current_step: Callable[[], int]) -> list[Callable]:
  """Reward functions that raise NonFiniteError instead of returning NaN/Inf.

  Tunix sums the functions with np.nansum, so a NaN from one function would
  silently count as 0 and an Inf would poison the advantages. Our rewards are
  total and finite; a user-supplied one may not be. The wrapper keeps the
  name and signature Tunix inspects.
  """

  def checked(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
      try:
        values = fn(*args, **kwargs)
      except Exception as e:  # pylint: disable=broad-exception-caught
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise RewardFunctionError(
            f"step {current_step()}: reward function {fn.__name__} raised"
            f" {type(e).__name__}: {first}") from e
      array = np.asarray(values, dtype=np.float64).reshape(-1)
      bad = np.flatnonzero(~np.isfinite(array))
      if bad.size:
        raise NonFiniteError(
            f"step {current_step()}: reward function {fn.__name__} returned"
            f" {array[bad[0]]} for completion {bad[0]} ({bad.size} of"
            f" {array.size} non-finite); rewards must be finite floats"
        )
      return values

    return wrapper

  return [checked(fn) for fn in reward_fns]
