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
    super().__init__(f"training in {workdir} stopped with exit code {exit_code}"
                     " (gemma_grpo/commands/command.py lists the codes); its checkpoints are kept")
    self.exit_code = exit_code


def load_config(path: str, overrides: Mapping[str, Any] | None = None) -> ml_collections.ConfigDict:
  """A config file with `{"section.key": value}` overrides applied, validated."""
  c = config_lib.load(path)
  for key, value in (overrides or {}).items():
    config_lib.override(c, key, repr(value) if not isinstance(value, str) else value)
  config_lib.validate(c)
  rewards.check_config(c.rewards)
  return c


@dataclasses.dataclass
class Run:
  """A training run's work directory."""

  workdir: pathlib.Path

  @property
  def config(self) -> ml_collections.ConfigDict:
    return config_lib.load_saved(self.workdir / "config.json")

  def metrics(self) -> list[dict[str, float]]:
    """One row per step: rewards, loss, KL, lengths, timing, eval/ values."""
    return metrics_lib.read_jsonl(self.workdir / "tensorboard" / "metrics.jsonl")

  def policy(self, step: int | None = None) -> policy_lib.Policy:
    """The policy at checkpoint `step` (default: the latest readable one)."""
    return policy_lib.restore(self.workdir, mesh_lib.make_mesh(self.config.mesh), step)


def use_tools(c: ml_collections.ConfigDict, *tool_fns: Callable[[str], str]) -> ml_collections.ConfigDict:
  """Lets the policy call these tools, f(arguments: str) -> str, in `c`; returns `c`.

  Each is stored in rollout.tools by its import path ("module:function"; the
  built-in calculator by its name), so the saved run names them and a resume
  or `gemma-grpo eval` loads them again: a tool must be a module-level
  function (in a notebook, `__main__:f` serves this process only).
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
  config_lib.validate(c)
  rewards.check_config(c.rewards)
  return c


def train(c: ml_collections.ConfigDict, workdir: str | os.PathLike) -> Run:
  """Trains `c` into `workdir` up to train.max_steps (or resumes there)."""
  workdir = os.fspath(workdir)
  config_lib.validate(c)  # it may have changed since load_config
  rewards.check_config(c.rewards)
  with workdir_lock.held(storage.path(workdir), take=True):
    code = training_run.train(c, workdir)
  if code:
    raise TrainingStopped(code, pathlib.Path(workdir))
  return Run(pathlib.Path(workdir))


def heldout(policy: policy_lib.Policy, num_problems: int) -> list[data_lib.Problem]:
  """The first `num_problems` held-out problems of the policy's own data source."""
  c = policy.config
  splits = data_lib.build_splits(c.data, policy.loaded.tokenizer, c.rollout.max_prompt_length)
  return splits.heldout[:num_problems]


def evaluate(policy: policy_lib.Policy, problems: Sequence[data_lib.Problem], *,
             max_new_tokens: int | None = None) -> dict[str, Any]:
  """Greedy completions of `problems`, scored as `gemma-grpo eval` scores them.

  Returns {"metrics": {...}, "samples": [...]}: accuracy, format, rewards
  and lengths; one record per problem (prompt, completion, grade).
  """
  return evaluation.evaluate_policy(policy, problems, max_new_tokens=max_new_tokens)


def export(workdir: str | os.PathLike, out: str | os.PathLike, *, fmt: str = "hf",
           dtype: str = "float32", step: int | None = None, overwrite: bool = False) -> pathlib.Path:
  """Merges the run's LoRA into its base and writes HF safetensors (or GGUF) to `out`."""
  return hf_export.export(workdir, out, step=step, dtype=dtype, fmt=fmt, overwrite=overwrite)
