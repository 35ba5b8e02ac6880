"""What `gemma-grpo eval` evaluates: a training run's checkpoint, or a model source."""

from __future__ import annotations

import dataclasses
import pathlib
import re

from gemma_grpo import errors
from gemma_grpo.config import settings
from gemma_grpo import storage
from gemma_grpo.model import policy as policy_lib
from gemma_grpo.runtime import checkpoints


@dataclasses.dataclass
class Target:
  """A model to evaluate: a training run's checkpoint, or a model source."""

  source: str  # model.source (a run's own for a work directory)
  workdir: pathlib.Path | None = None
  step: int | None = None  # the checkpoint, resolved, for a work directory
  trained_on: tuple[str, str] | None = None  # the run's (data.source, data.split)

  @property
  def label(self) -> str:
    if self.workdir is not None:
      return f"{self.workdir} step {self.step}"
    return self.source

  def default_out(self) -> pathlib.Path:
    if self.workdir is not None:
      return self.workdir / f"eval_step{self.step}"
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", self.source).strip("_.") or "model"
    return pathlib.Path("runs") / "eval" / name


def workdir_target(path: str, step: int | None, flag: str = "--workdir") -> Target:
  """The Target of a work directory's checkpoint (default: its newest), its step checked."""
  workdir = storage.path(path)
  if not workdir.is_dir():
    raise errors.UserError(f"{flag} {path}: no such directory; pass a gemma-grpo training run")
  s = policy_lib.saved_settings(workdir)
  steps = checkpoints.saved_steps(workdir)
  if not steps:
    raise errors.UserError(f"{flag} {path}: no checkpoint in {checkpoints.actor_dir(workdir)}; train first")
  if step is None:
    step = steps[-1]
  elif step not in steps:
    raise errors.UserError(f"--step {step}: no checkpoint at that step in {path}; saved steps: {steps}")
  return Target(s.model.source, workdir, step, (s.data.source, s.data.split))


def latest_run(runs: pathlib.Path) -> pathlib.Path | None:
  """The training run under `runs` whose newest checkpoint is the most recent."""
  found = []
  for actor_dir in runs.glob("*/checkpoints/actor"):
    steps = [d for d in actor_dir.iterdir() if d.is_dir() and d.name.isdigit()]
    if steps and (actor_dir.parent.parent / "config.json").is_file():
      found.append((max(d.stat().st_mtime for d in steps), actor_dir.parent.parent))
  return max(found)[1] if found else None


def is_model_source(x: str) -> bool:
  """Whether --compare X names a model to load (rather than a report or a run)."""
  return x.startswith(("gguf:", "hf:")) or x == "random" or (pathlib.Path(x).expanduser() / "config.json").is_file()


def load_policy(target: Target, model: settings.ModelSettings, mesh):
  """(model, tokenizer) of a target: a work directory's with its LoRA, else
  the base that `model` (the settings it is evaluated with) loads."""
  if target.workdir is not None:
    policy = policy_lib.restore(target.workdir, mesh, target.step)
    return policy.actor, policy.loaded.tokenizer
  loaded = policy_lib.load_base(model, mesh)
  return loaded.model, loaded.tokenizer
