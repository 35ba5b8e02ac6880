"""Checkpoints of a work directory: find them and restore a trained policy.

Layout (written by Tunix's checkpoint manager, LoRA parameters only):
  <workdir>/config.json
  <workdir>/checkpoints/actor/<step>/{model_params,optimizer_state,custom_metadata}
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

from gemma_grpo import config as config_lib
from gemma_grpo import errors


def actor_dir(workdir: str | pathlib.Path) -> pathlib.Path:
  return pathlib.Path(workdir) / "checkpoints" / "actor"


def saved_steps(workdir: str | pathlib.Path) -> list[int]:
  """Steps with a finished checkpoint (Orbax renames a step's directory last)."""
  root = actor_dir(workdir)
  if not root.is_dir():
    return []
  return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir())


@dataclasses.dataclass
class Policy:
  """A trained LoRA policy restored from a work directory."""

  config: Any  # ml_collections.ConfigDict of the run
  loaded: Any  # model.Loaded: base model, tokenizer, directories
  actor: Any  # the base model with the restored LoRA adapters
  step: int


def restore(workdir: str | pathlib.Path, mesh, step: int | None = None) -> Policy:
  """The policy of `workdir` at `step` (default: the latest checkpoint)."""
  from tunix.sft import checkpoint_manager  # pylint: disable=g-import-not-at-top

  from gemma_grpo import lora  # pylint: disable=g-import-not-at-top
  from gemma_grpo import model as model_lib  # pylint: disable=g-import-not-at-top

  workdir = pathlib.Path(workdir)
  c = config_lib.load_saved(workdir / "config.json")
  steps = saved_steps(workdir)
  if not steps:
    raise errors.UserError(f"{actor_dir(workdir)}: no checkpoint to restore")
  if step is None:
    step = steps[-1]
  elif step not in steps:
    raise errors.UserError(f"checkpoint step {step} not in {workdir}; saved steps: {steps}")
  loaded = model_lib.build(c.model, mesh)
  actor = lora.apply(loaded.model, c.lora, mesh)
  manager = checkpoint_manager.CheckpointManager(root_directory=str(actor_dir(workdir)))
  try:
    restored, _ = manager.maybe_restore(actor, step=step, restore_only_lora_params=True)
  finally:
    manager.close()
  return Policy(c, loaded, actor, restored)
