"""Reward-function checks and stop signals."""

import inspect
import math
import os
import signal

import pytest

from gemma_grpo.runtime import guards


def reward_a(prompts, completions, answer, **kwargs):
  del prompts, answer, kwargs
  return [float(len(c)) for c in completions]


def reward_b(prompts, completions, answer, **kwargs):
  del prompts, answer, kwargs
  return [math.nan if c == "bad" else 1.0 for c in completions]


def test_finite_rewards_pass_values_through_and_keep_name_and_signature():
  (checked,) = guards.finite_rewards([reward_a], current_step=lambda: 1)
  assert checked.__name__ == "reward_a"
  assert inspect.signature(checked) == inspect.signature(reward_a)  # Tunix reads it
  assert checked(prompts=["p", "p"], completions=["ab", "c"], answer=["1", "1"]) == [2.0, 1.0]


@pytest.mark.parametrize("completions, index, shown", [
    (["ok", "bad"], 1, "nan"),
    (["bad", "bad", "ok"], 0, "nan"),
])
def test_non_finite_reward_names_step_function_and_completion(completions, index, shown):
  (checked,) = guards.finite_rewards([reward_b], current_step=lambda: 7)
  with pytest.raises(guards.NonFiniteError) as e:
    checked(prompts=["p"] * len(completions), completions=completions, answer=["1"] * len(completions))
  assert str(e.value).startswith(
      f"step 7: reward function reward_b returned {shown} for completion {index}")


def test_infinite_reward_is_caught():
  def explode(prompts, completions, **kwargs):
    del prompts, kwargs
    return [math.inf] * len(completions)
  (checked,) = guards.finite_rewards([explode], current_step=lambda: 3)
  with pytest.raises(guards.NonFiniteError, match="step 3: reward function explode returned inf"):
    checked(prompts=["p"], completions=["c"])


def test_stop_signal_marks_a_stop_and_the_guard_ends_the_batches():
  previous = signal.getsignal(signal.SIGTERM)
  stop = guards.StopSignal().install()
  try:
    batches = stop.guard(iter(range(10)))
    assert [next(batches), next(batches)] == [0, 1]
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.requested and stop.signum == signal.SIGTERM
    assert list(batches) == []
  finally:
    stop.uninstall()
  assert signal.getsignal(signal.SIGTERM) == previous


def test_a_second_ctrl_c_interrupts_at_once():
  # A shell's background job starts with SIGINT ignored: restore what was there.
  previous = signal.getsignal(signal.SIGINT)
  stop = guards.StopSignal().install()
  try:
    os.kill(os.getpid(), signal.SIGINT)
    assert stop.signum == signal.SIGINT
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)
  finally:
    stop.uninstall()
  assert signal.getsignal(signal.SIGINT) is previous
