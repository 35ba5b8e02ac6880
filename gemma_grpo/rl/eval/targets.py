"""What `gemma-grpo eval` evaluates: a training run's checkpoint, or a model source."""

from __future__ import annotations

import dataclasses
import pathlib
import re

import ml_collections

from gemma_grpo import config as config_lib
from gemma_grpo import errors
from gemma_grpo import storage
from gemma_grpo.model import policy as policy_lib
from gemma_grpo.rl.eval import reports
from gemma_grpo.rl.eval import scoring
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


def workdir_target(path: str, step: int | None,
                   flag: str = "--workdir") -> tuple[Target, ml_collections.ConfigDict]:
  """(Target, the run's config) of a work directory, its step checked."""
  workdir = storage.path(path)
  if not workdir.is_dir():
    raise errors.UserError(f"{flag} {path}: no such directory; pass a gemma-grpo training run")
  c = config_lib.load_saved(workdir / "config.json")
  steps = checkpoints.saved_steps(workdir)
  if not steps:
    raise errors.UserError(f"{flag} {path}: no checkpoint in {checkpoints.actor_dir(workdir)}; train first")
  if step is None:
    step = steps[-1]
  elif step not in steps:
    raise errors.UserError(f"--step {step}: no checkpoint at that step in {path}; saved steps: {steps}")
  return Target(c.model.source, workdir, step, (c.data.source, c.data.split)), c


def latest_run(runs: pathlib.Path) -> pathlib.Path | None:
  """The training run under `runs` whose newest checkpoint is the most recent."""
  found = []
  for actor_dir in runs.glob("*/checkpoints/actor"):
    steps = [d for d in actor_dir.iterdir() if d.is_dir() and d.name.isdigit()]
    if steps and (actor_dir.parent.parent / "config.json").is_file():
      found.append((max(d.stat().st_mtime for d in steps), actor_dir.parent.parent))
  return max(found)[1] if found else None


def choose(c: ml_collections.ConfigDict | None, overrides: list[str], *, workdir: str | None = None,
           step: int | None = None, model: str | None = None) -> tuple[Target, ml_collections.ConfigDict]:
  """The Target and the config it is evaluated with, overrides applied.

  A work directory brings its own config (`c` is None then); otherwise `c`
  is the loaded config file, its model.source replaced by `model` if given.
  """
  if workdir:
    target, c = workdir_target(workdir, step)
    fixed = [o for o in overrides if o.startswith(("--config.model.", "--config.lora."))]
    if fixed:
      raise errors.UserError(
          f"{fixed[0].split('=')[0]}: the model of a work directory comes from its"
          " config.json; only eval, rollout, rewards and mesh keys can be overridden")
  rest = config_lib.apply_overrides(c, overrides)
  if rest:
    raise errors.UserError(f"unrecognized arguments: {' '.join(rest)}")
  if not workdir:
    if model:
      with c.unlocked():
        c.model.source = model
    target = Target(c.model.source)
  return target, c


def baseline(x: str, c: ml_collections.ConfigDict):
  """(eval.json report, None) or (None, (Target, its config)) for --compare X."""
  path = pathlib.Path(x).expanduser()
  if reports.is_report(path):
    return reports.read_report(path), None
  if path.is_dir() and (path / "checkpoints").is_dir():
    return None, workdir_target(x, None, flag="--compare")
  if x.startswith(("gguf:", "hf:")) or x == "random" or (path / "config.json").is_file():
    base = c.copy_and_resolve_references()
    with base.unlocked():
      base.model.source = x
    return None, (Target(x), base)
  raise errors.UserError(
      f"--compare {x}: neither an eval output directory (with {scoring.SUMMARY_FILE}),"
      " a work directory nor a model source (gguf:, hf:, random, an HF directory)")


def load_policy(target: Target, c: ml_collections.ConfigDict, mesh):
  """(model, tokenizer) of a target; a work directory's with its LoRA."""
  if target.workdir is not None:
    policy = policy_lib.restore(target.workdir, mesh, target.step)
    return policy.actor, policy.loaded.tokenizer
  loaded = policy_lib.load_base(c.model, mesh)
  return loaded.model, loaded.tokenizer
