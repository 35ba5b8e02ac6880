"""A policy ready to generate or train: base weights, and the adapters on them.

Above `model` (which loads base weights) and `checkpoints` (which finds and
reads a run's saved steps): the base model with an SFT run's adapter merged
in when `model.init_lora_from` names one, and a finished run's policy (its
base, LoRA applied, its adapter restored) for eval and export.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from absl import logging
from flax import nnx
import jax

from gemma_grpo.runtime import checkpoints
from gemma_grpo import config as config_lib
from gemma_grpo.config import settings as settings_lib
from gemma_grpo import errors
from gemma_grpo.model import lora
from gemma_grpo.model import model_loading
from gemma_grpo import storage


@dataclasses.dataclass
class Policy:
  """A trained LoRA policy restored from a work directory."""

  settings: settings_lib.Settings  # the run's, read back from its config.json
  loaded: model_loading.Loaded  # base model, tokenizer, directories
  actor: Any  # the base model with the restored LoRA adapters
  step: int


def load_base(model: settings_lib.ModelSettings, mesh) -> model_loading.Loaded:
  """`model_loading.build(model)`, then the adapter of `model.init_lora_from` merged in."""
  loaded = model_loading.build(model, mesh)
  if model.init_lora_from:
    step = merge_into_base(loaded.model, model.init_lora_from, mesh, source=model.source)
    logging.info("Merged the adapter of %s (step %d) into the base model", model.init_lora_from, step)
  return loaded


def saved_settings(workdir: storage.PathLike) -> settings_lib.Settings:
  """The settings of a run, from the config.json it saved."""
  return settings_lib.from_config(config_lib.load_saved(storage.path(workdir) / "config.json"))


def restore(workdir: storage.PathLike, mesh, step: int | None = None) -> Policy:
  """The policy of `workdir` at `step` (default: the newest readable checkpoint)."""
  workdir = storage.path(workdir)
  s = saved_settings(workdir)
  if not checkpoints.saved_steps(workdir):
    raise errors.UserError(f"{checkpoints.actor_dir(workdir)}: no checkpoint to restore")
  loaded = load_base(s.model, mesh)
  actor = lora.apply(loaded.model, s.lora, mesh)
  restored = checkpoints.restore_adapter(actor, workdir, step)
  return Policy(s, loaded, actor, restored)


def merge_into_base(base, workdir: storage.PathLike, mesh, *, source: str) -> int:
  """Folds the adapter of a finished run into `base`'s weights, in place.

  This is how GRPO starts from an SFT run: the merged model is both the
  starting policy and the KL reference, and GRPO trains a fresh adapter on
  top. Returns the step merged.
  """
  workdir = storage.path(workdir)
  where = f"model.init_lora_from={workdir}"
  if not (workdir / "config.json").is_file():
    raise errors.UserError(f"{where}: not a gemma-grpo work directory (no config.json)")
  c = saved_settings(workdir)
  if c.model.source != source or c.model.init_lora_from:
    raise errors.UserError(
        f"{where}: that run trained {c.model.source!r}"
        f"{' on top of another adapter' if c.model.init_lora_from else ''}, this one"
        f" loads {source!r}; start from a run on the same base model"
    )
  actor = lora.apply(base, c.lora, mesh)
  step = checkpoints.restore_adapter(actor, workdir)
  merged = lora.merged_params(actor, c.lora.scale)
  state = nnx.state(base)
  for path, variable in nnx.to_flat_state(state):
    old = variable.get_value()
    variable.set_value(jax.device_put(merged[".".join(map(str, path))].astype(old.dtype), old.sharding))
  nnx.update(base, state)
  return step
