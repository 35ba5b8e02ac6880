"""gemma-grpo from Python (a notebook, a sweep script): train, read, evaluate, export.

  from gemma_grpo import api

  c = api.load_config("configs/gemma3_270m.py", {"train.max_steps": 4})
  run = api.train(c, "runs/notebook")          # resumes if the directory holds the run
  rows = run.metrics()                        # one dict per step, as in metrics.jsonl
  policy = run.policy()                       # its latest checkpoint: base model + LoRA
  report = api.evaluate(policy, api.heldout(policy, 16))
  api.export(run.workdir, "exported/notebook")

The same code paths as the CLI (`gemma-grpo train|eval|export`), one process;
failures raise instead of exiting: `errors.UserError` for bad input (the
message names the field and the fix), `TrainingStopped` for a run that ended
early (NaN, a failing reward function, a signal), its checkpoints kept.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any, Callable, Mapping, Sequence

import ml_collections

from gemma_grpo import config as config_lib
from gemma_grpo.config import settings
from gemma_grpo import errors
from gemma_grpo import storage
from gemma_grpo.model import hf_export
from gemma_grpo.model import policy as policy_lib
from gemma_grpo.rl.eval import evaluation
from gemma_grpo.rl.run import training_run
from gemma_grpo.runtime import mesh as mesh_lib
from gemma_grpo.runtime import metrics as metrics_lib
from gemma_grpo.runtime import workdir_lock
from gemma_grpo.tasks import data as data_lib
from gemma_grpo.tasks import rewards
from gemma_grpo.tasks import tools as tools_lib


class TrainingStopped(RuntimeError):
  """Training ended before train.max_steps; `exit_code` is the CLI's."""

  def __init__(self, exit_code: int, workdir: pathlib.Path):
    """The error of a run that stopped early.

    Args:
      exit_code: the code the CLI would exit with (commands/command.py lists them).
      workdir: the run's work directory, its checkpoints kept.
    """
    super().__init__(f"training in {workdir} stopped with exit code {exit_code}"
                     " (gemma_grpo/commands/command.py lists the codes); its checkpoints are kept")
    self.exit_code = exit_code


def load_config(path: str, overrides: Mapping[str, Any] | None = None) -> ml_collections.ConfigDict:
  """A config file with overrides applied, validated.

  Args:
    path: a config file (configs/*.py): a Python file whose get_config() returns it.
    overrides: `{"section.key": value}`, as `--config.section.key=value` on the
      command line; a string value is parsed as the command line parses it.

  Returns:
    The validated config, rewards included.

  Raises:
    errors.UserError: an unknown key, a bad value or an unknown reward, one line
      per problem.
  """
  c = config_lib.load(path)
  for key, value in (overrides or {}).items():
    config_lib.override(c, key, repr(value) if not isinstance(value, str) else value)
  _validated(c)
  return c


@dataclasses.dataclass
class Run:
  """A training run's work directory."""

  workdir: pathlib.Path

  @property
  def config(self) -> ml_collections.ConfigDict:
    """The config the run was trained with, read back from its config.json."""
    return config_lib.load_saved(self.workdir / "config.json")

  def metrics(self) -> list[dict[str, float]]:
    """The run's metrics.jsonl.

    Returns:
      One dict per step: rewards, loss, KL, lengths, timing and the eval/ values.
    """
    return metrics_lib.read_jsonl(self.workdir / "tensorboard" / "metrics.jsonl")

  def policy(self, step: int | None = None) -> policy_lib.Policy:
    """A checkpoint of the run as a policy: its base model with the trained LoRA.

    Args:
      step: the checkpoint's step; None for the latest that reads back whole.

    Returns:
      The policy, on a mesh built from the run's mesh settings.
    """
    mesh = mesh_lib.make_mesh(settings.from_config(self.config).mesh)
    return policy_lib.restore(self.workdir, mesh, step)


def _validated(c: ml_collections.ConfigDict) -> settings.Settings:
  """The settings of `c`, once config.validate and the rewards check pass."""
  config_lib.validate(c)
  s = settings.from_config(c)
  rewards.check(s.rewards)
  return s


def use_tools(c: ml_collections.ConfigDict, *tool_fns: Callable[[str], str]) -> ml_collections.ConfigDict:
  """Lets the policy call these tools in `c`.

  Each is stored in rollout.tools by its import path ("module:function"; the
  built-in calculator by its name), so the saved run names them and a resume
  or `gemma-grpo eval` loads them again: a tool must be a module-level
  function (in a notebook, `__main__:f` serves this process only).

  Args:
    c: the config to change, in place.
    *tool_fns: the tools, each f(arguments: str) -> str.

  Returns:
    `c`, validated with its new rollout.tools.

  Raises:
    errors.UserError: a tool that is not a module-level function, or a config
      that is not valid with them.
  """
  names = []
  for fn in tool_fns:
    builtin = [name for name, tool in tools_lib.BUILTIN_TOOLS.items() if tool is fn]
    if builtin:
      names.append(builtin[0])
      continue
    qualname = getattr(fn, "__qualname__", "")
    if not qualname.isidentifier():
      raise errors.UserError(
          f"rollout.tools: {fn!r} is not a module-level function; define it with def at"
          " the top of a module so it can be loaded again by name")
    names.append(f"{fn.__module__}:{qualname}")
  c.rollout.tools = ",".join(names)
  try:
    tools_lib.load_tools(c.rollout.tools)
  except ValueError as e:
    raise errors.UserError(str(e)) from None
  _validated(c)
  return c


def train(c: ml_collections.ConfigDict, workdir: str | os.PathLike) -> Run:
  """Trains `c` up to train.max_steps, or resumes the run that `workdir` holds.

  Args:
    c: the config, as load_config returns it (checked again here).
    workdir: the run's directory, local or gs://; held with a lease while it trains.

  Returns:
    The run, its checkpoints and metrics in `workdir`.

  Raises:
    errors.UserError: a bad config, or a work directory in use or holding
      another run.
    TrainingStopped: NaN/Inf, a failing reward function or a signal stopped
      the run; its checkpoints are kept.
  """
  workdir = os.fspath(workdir)
  s = _validated(c)  # it may have changed since load_config
  with workdir_lock.held(storage.path(workdir), take=True):
    code = training_run.train(s, workdir)
  if code:
    raise TrainingStopped(code, pathlib.Path(workdir))
  return Run(pathlib.Path(workdir))


def heldout(policy: policy_lib.Policy, num_problems: int) -> list[data_lib.Problem]:
  """The held-out problems of the policy's own run: what its in-training eval scored.

  Args:
    policy: a run's policy (Run.policy).
    num_problems: how many, from the first.

  Returns:
    The first `num_problems` held-out problems of the run's data split.
  """
  s = policy.settings
  splits = data_lib.build_splits(s.data, policy.loaded.tokenizer, s.rollout.max_prompt_length)
  return splits.heldout[:num_problems]


def evaluate(policy: policy_lib.Policy, problems: Sequence[data_lib.Problem], *,
             max_new_tokens: int | None = None) -> dict[str, Any]:
  """Greedy completions of `problems`, scored as `gemma-grpo eval` scores them.

  Args:
    policy: the policy to complete with (Run.policy).
    problems: the problems, e.g. heldout(policy, n).
    max_new_tokens: tokens per completion; None for the policy's eval.max_new_tokens.

  Returns:
    {"metrics": {...}, "samples": [...]}: accuracy, format, rewards and
    lengths (gemma_grpo.rl.eval.scoring lists them); one record per problem
    (prompt, completion, grade).
  """
  return evaluation.evaluate_policy(policy, problems, max_new_tokens=max_new_tokens)


def export(workdir: str | os.PathLike, out: str | os.PathLike, *, fmt: str = "hf",
           dtype: str = "float32", step: int | None = None, overwrite: bool = False,
           quant: str | None = None) -> pathlib.Path:
  """Merges the run's LoRA into its base and writes the model to `out`.

  Args:
    workdir: a training run's directory.
    out: the directory to write (for gguf, also a file name ending .gguf).
    fmt: "hf" (safetensors, as transformers loads them) or "gguf" (llama.cpp).
    dtype: the saved weights' dtype, "float32" or "bfloat16", cast after merging.
    step: the checkpoint; None for the latest.
    overwrite: replace what `out` holds.
    quant: a GGUF block quantization ("q8_0", "q4_0"), as `--quant` takes; None
      keeps `dtype`.

  Returns:
    Where the export was written.

  Raises:
    errors.UserError: no such run or checkpoint, a bad option, or `out` not empty
      without `overwrite`.
  """
  return hf_export.export(workdir, out, step=step, dtype=dtype, fmt=fmt, overwrite=overwrite,
                          quant=quant)
