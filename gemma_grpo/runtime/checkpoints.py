"""Checkpoints of a work directory: find, check, restore; the run's identity.

Layout (checkpoints written by Tunix's checkpoint manager, LoRA only):
  <workdir>/config.json   the resolved config of the latest start
  <workdir>/run.json      what the checkpoints belong to (model, adapter, algorithm)
  <workdir>/checkpoints/actor/<step>/{model_params,optimizer_state,_CHECKPOINT_METADATA}

Orbax writes a step into `<step>.orbax-checkpoint-tmp-*` and renames it when
complete, so a crash mid-save leaves only a tmp directory, which is ignored.
A step directory can still be damaged afterwards (a truncated or deleted
file); `set_aside_unreadable` finds that before Tunix restores, renames the
step to `<step>.corrupt` and falls back to the previous one.
"""

from __future__ import annotations

import dataclasses
import json
import logging as logging_lib
import sys
from typing import Any

from absl import logging
from etils import epath
from flax import nnx
import jax
import numpy as np
import orbax.checkpoint as ocp
from tunix.sft import checkpoint_manager

from gemma_grpo import config as config_lib
from gemma_grpo import errors
from gemma_grpo.config import settings
from gemma_grpo import storage

RUN_FILE = "run.json"
_TMP_MARKER = ".orbax-checkpoint-tmp"


def actor_dir(workdir: storage.PathLike) -> epath.Path:
  """Absolute (Orbax refuses relative paths at the first save, mid-run), or gs://."""
  return storage.path(workdir) / "checkpoints" / "actor"


def saved_steps(workdir: storage.PathLike) -> list[int]:
  """Steps with a finished checkpoint (Orbax renames a step's directory last)."""
  root = actor_dir(workdir)
  if not root.is_dir():
    return []
  return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir())


# --- Reading a step without a model, to tell a sound one from a damaged one --


@dataclasses.dataclass
class Saved:
  """The arrays of one checkpoint step, as numpy, keyed by parameter path."""

  params: dict[str, Any]  # "layers/0/attn/q_einsum/w_lora_a" -> ndarray
  optimizer: dict[str, Any]
  custom_metadata: dict[str, Any]


def _flat(tree) -> dict[str, Any]:
  """{'a/b/c': leaf} for a nested tree; a trailing 'value' level is dropped."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    parts = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
    if parts and parts[-1] == "value":
      parts.pop()
    out["/".join(parts)] = leaf
  return out


def _manager(workdir: storage.PathLike):
  # Same item layout as tunix.sft.checkpoint_manager; Orbax wants an absolute path.
  handlers = {
      "model_params": ocp.PyTreeCheckpointHandler(),
      "optimizer_state": ocp.PyTreeCheckpointHandler(),
  }
  return ocp.CheckpointManager(actor_dir(workdir), item_handlers=handlers)


def read(workdir: storage.PathLike, step: int) -> Saved:
  """Every array of `step` read into host memory; raises if any is unreadable."""
  # Installed before reading: a failed read's stale callbacks can fire while
  # the exception is still on its way out of Orbax.
  _silence_failed_read_noise()
  manager = _manager(workdir)
  try:
    item_metadata = manager.item_metadata(step)
    trees = {}
    for name in ("model_params", "optimizer_state"):
      if name not in item_metadata or item_metadata[name] is None:
        raise ValueError(f"{name} is missing")
      restore_args = jax.tree.map(
          lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item_metadata[name]
      )
      restored = manager.restore(step, args=ocp.args.Composite(**{
          name: ocp.args.PyTreeRestore(item=None, restore_args=restore_args),
      }))
      trees[name] = _flat(restored[name])
    metadata = manager.metadata(step)
    custom = dict(metadata.custom_metadata or {}) if metadata else {}
  finally:
    manager.close()
  return Saved(trees["model_params"], trees["optimizer_state"], custom)


class _DropOrphanedReadErrors(logging_lib.Filter):
  """Drops asyncio's report of a TensorStore read error nobody awaited.

  Arrays of one checkpoint share files, so one damaged file fails several of
  the reads Orbax runs at once. The first error reaches us; each of the others
  is logged with its traceback when its task is collected, at any later time.
  """

  def filter(self, record: logging_lib.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    return not (
        record.getMessage().startswith(("Task exception was never retrieved",
                                        "Future exception was never retrieved"))
        and any(mark in str(exc) for mark in ("OCDBT database", "tensorstore"))
    )


def _silence_failed_read_noise() -> None:
  """Drops the tracebacks a failed Orbax read leaves behind on stderr.

  When one array of a restore fails, the other reads are abandoned: those
  still in flight complete later and post to the restore's asyncio loop, gone
  by then (Python reports each as an unraisable "Event loop is closed"), and
  those that failed too are logged by asyncio when collected (see
  _DropOrphanedReadErrors). All are harmless once the first error is
  reported, and a user reading a traceback would think the run crashed.
  """
  asyncio_logger = logging_lib.getLogger("asyncio")
  if not any(isinstance(f, _DropOrphanedReadErrors) for f in asyncio_logger.filters):
    asyncio_logger.addFilter(_DropOrphanedReadErrors())

  previous = sys.unraisablehook
  if getattr(previous, "_drops_closed_loop_noise", False):
    return

  def hook(unraisable):
    e = unraisable.exc_value
    if isinstance(e, RuntimeError) and str(e) == "Event loop is closed":
      return
    previous(unraisable)

  hook._drops_closed_loop_noise = True  # pylint: disable=protected-access
  sys.unraisablehook = hook


@dataclasses.dataclass(frozen=True)
class Readable:
  """A checkpoint step that reads back whole, and the shapes of its adapters."""

  step: int
  lora_shapes: dict[str, tuple[int, ...]]


def _examine(workdir: storage.PathLike, step: int) -> Readable | str:
  """Checkpoint `step`, read once: what it holds, or why it cannot be resumed from."""
  try:
    saved = read(workdir, step)
  except Exception as e:  # pylint: disable=broad-exception-caught
    # Orbax/TensorStore raise ValueError, KeyError, OSError, JSONDecodeError...
    first_line = (str(e).strip().splitlines() or [""])[0][:200]
    return f"{type(e).__name__}: {first_line}"
  if not saved.params:
    return "no parameters saved"
  for name, array in saved.params.items():
    if not np.isfinite(np.asarray(array, dtype=np.float64)).all():
      return f"{name} holds NaN/Inf"
  return Readable(step, {k: tuple(np.shape(v)) for k, v in saved.params.items()})


def problem(workdir: storage.PathLike, step: int) -> str | None:
  """Why checkpoint `step` cannot be resumed from, or None if it can."""
  found = _examine(workdir, step)
  return found if isinstance(found, str) else None


def _set_aside(path: epath.Path) -> epath.Path:
  target = path.with_name(f"{path.name}.corrupt")
  n = 1
  while target.exists():
    target = path.with_name(f"{path.name}.corrupt{n}")
    n += 1
  path.rename(target)
  return target


def set_aside_unreadable(workdir: storage.PathLike, *, move: bool = True) -> Readable | None:
  """The newest checkpoint step that reads back whole (None if there is none).

  This is the one read of the checkpoint before Tunix restores it: the
  shapes it returns are what `check_fits` compares with the model.

  Newer steps that cannot be read are renamed to `<step>.corrupt` (never
  deleted) with a warning, so Tunix restores the previous one. If no step can
  be read at all, the cause is likely not one damaged save (a version or
  permission problem), so nothing is moved and a UserError says what failed.
  """
  root = actor_dir(workdir)
  if root.is_dir():
    for tmp in sorted(p for p in root.iterdir() if _TMP_MARKER in p.name):
      logging.warning("Ignoring %s: a checkpoint save was interrupted there", tmp)
  steps = saved_steps(workdir)
  bad: list[tuple[int, str]] = []
  for step in reversed(steps):
    found = _examine(workdir, step)
    if not isinstance(found, str):
      for bad_step, bad_reason in bad:
        where = root / str(bad_step)
        if move:
          where = _set_aside(where)
        logging.warning(
            "Checkpoint step %d is unreadable (%s); moved it to %s and"
            " resuming from step %d", bad_step, bad_reason, where, step)
      return found
    bad.append((step, found))
  if bad:
    step, reason = bad[0]
    raise errors.UserError(
        f"{root}: no checkpoint can be read (step {step}: {reason}); move the"
        " damaged steps aside to start over, or use a new --workdir"
    )
  return None


def check_fits(workdir: storage.PathLike, saved: Readable, actor) -> None:
  """Raises UserError unless checkpoint `saved` fits the LoRA params of `actor`.

  Catches a different rank or target set before Orbax's shape error; reads
  nothing (the shapes come from set_aside_unreadable's read).
  """
  saved_shapes = saved.lora_shapes
  wanted_shapes = {k: tuple(jax.numpy.shape(v))
                   for k, v in _flat(nnx.state(actor, nnx.LoRAParam)).items()}
  if saved_shapes == wanted_shapes:
    return
  where = actor_dir(workdir) / str(saved.step)
  missing = sorted(set(wanted_shapes) - set(saved_shapes))
  extra = sorted(set(saved_shapes) - set(wanted_shapes))
  if missing or extra:
    detail = (f"{len(missing)} adapter(s) of this config not in it (e.g. {(missing or extra)[0]})"
              if missing else f"{len(extra)} adapter(s) this config lacks (e.g. {extra[0]})")
  else:
    name = next(k for k in wanted_shapes if wanted_shapes[k] != saved_shapes[k])
    detail = f"{name} is {list(saved_shapes[name])} there, {list(wanted_shapes[name])} here"
  raise errors.UserError(
      f"{where}: checkpoint does not fit this model/LoRA config ({detail});"
      " use a new --workdir or the config the run was started with"
  )


# --- What a work directory's checkpoints belong to ---------------------------


def identity(model: settings.ModelSettings, lora: settings.LoraSettings, algorithm: str,
             model_shape: dict[str, int] | None = None) -> dict[str, Any]:
  """The settings a checkpoint is only valid with, as `field -> value`.

  Fields are config keys where there is one, so a mismatch can be reported
  with the exact override that fixes it; `algorithm` is grpo.algorithm.
  """
  ident = {
      "model.source": model.source,
      "model.init_lora_from": model.init_lora_from,
      "lora.rank": lora.rank,
      "lora.alpha": lora.alpha,
      "lora.targets": lora.targets,
      "grpo.algorithm": algorithm,
  }
  if model.source == "random":
    # Random weights are defined by these; a different seed is a different model.
    for key, value in sorted(dataclasses.asdict(model.random).items()):
      ident[f"model.random.{key}"] = value
  return with_model_shape(ident, model_shape or {})


def with_model_shape(ident: dict[str, Any], shape: dict[str, int]) -> dict[str, Any]:
  """`ident` with the loaded model's dimensions (model_shape) added."""
  return {**ident, **{f"model shape {key}": value for key, value in shape.items()}}


def model_shape(model) -> dict[str, int]:
  """The dimensions of a loaded Tunix Gemma-3 that a LoRA checkpoint depends on."""
  cfg = model.config
  return {k: int(getattr(cfg, k)) for k in (
      "num_layers", "num_embed", "embed_dim", "hidden_dim", "num_heads",
      "head_dim", "num_kv_heads")}


def saved_identity(workdir: storage.PathLike) -> dict[str, Any] | None:
  """The identity recorded in the work directory (run.json, else config.json)."""
  workdir = storage.path(workdir)
  run_file = workdir / RUN_FILE
  if run_file.is_file():
    try:
      return json.loads(run_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
      raise errors.UserError(
          f"{run_file}: not valid JSON; restore it, delete it to trust the"
          " checkpoints as they are, or use a new --workdir"
      ) from None
  if (workdir / "config.json").is_file():  # a work directory from before run.json
    saved = settings.from_config(config_lib.load_saved(workdir / "config.json"))
    return identity(saved.model, saved.lora, saved.grpo.algorithm)
  return None


def check_identity(workdir: storage.PathLike, current: dict[str, Any]) -> dict[str, Any] | None:
  """Raises UserError if `workdir` holds checkpoints of something else.

  Returns the identity it read (None when there is nothing to resume), so
  the fields known only once the model is loaded are compared with
  `compare_identity` without reading it again.
  """
  if not saved_steps(workdir):
    return None  # nothing to resume: whatever was there before is replaced
  saved = saved_identity(workdir)
  if saved is not None:
    compare_identity(workdir, saved, current)
  return saved


def compare_identity(workdir: storage.PathLike, saved: dict[str, Any],
                     current: dict[str, Any]) -> None:
  """Raises UserError naming each field present on both sides that differs."""
  diffs = [k for k in current if k in saved and saved[k] != current[k]]
  if not diffs:
    return
  what = ", ".join(f"{k}: {saved[k]!r} there, {current[k]!r} here" for k in diffs)
  overrides = [f"--config.{k}={saved[k]}" for k in diffs if not k.startswith("model shape")]
  fix = "use a new --workdir"
  if overrides and len(overrides) == len(diffs):
    fix += " or resume with " + " ".join(overrides)
  raise errors.UserError(
      f"--workdir {workdir} holds checkpoints of a different run ({what}); {fix}"
  )


def write_identity(workdir: storage.PathLike, ident: dict[str, Any]) -> None:
  storage.write_text(storage.path(workdir) / RUN_FILE,
                     json.dumps(ident, indent=2, sort_keys=True) + "\n")


# --- A training run's start: both sides of the checks, in two calls ----------


@dataclasses.dataclass(frozen=True)
class Resume:
  """What a work directory holds to resume from, each thing read once."""

  saved_identity: dict[str, Any] | None  # run.json of the checkpoints, if any
  readable: Readable | None  # the newest checkpoint that reads back whole

  @property
  def step(self) -> int | None:
    return self.readable.step if self.readable is not None else None


def examine(workdir: storage.PathLike, ident: dict[str, Any], *, move: bool) -> Resume:
  """The checks that need no model: whose checkpoints these are, which one reads.

  `ident` is this run's `identity`, without the model's shape. Raises
  UserError for checkpoints of another run or none readable; `move` sets
  unreadable newer steps aside (one process of a run does it).
  """
  saved = check_identity(workdir, ident)
  return Resume(saved, set_aside_unreadable(workdir, move=move))


def claim(workdir: storage.PathLike, found: Resume, ident: dict[str, Any], model, actor, *,
          write: bool) -> None:
  """The checks that need the model, then run.json names this run's checkpoints.

  `found` is what `examine` read: nothing is read again. `write` on one
  process of a run.
  """
  ident = with_model_shape(ident, model_shape(model))
  if found.saved_identity is not None:  # its config fields were compared by examine
    compare_identity(workdir, found.saved_identity, ident)
  if found.readable is not None:
    check_fits(workdir, found.readable, actor)
  if write:
    write_identity(workdir, ident)


def last_kept(workdir: storage.PathLike) -> str:
  """Where a failed run's last good checkpoint is, for its error line."""
  kept = saved_steps(workdir)
  if not kept:
    return "no checkpoint was saved"
  return f"the last good checkpoint, step {kept[-1]}, is kept in {actor_dir(workdir)}"


# --- Restoring a trained policy (eval, export) -------------------------------


def restore_adapter(actor, workdir: storage.PathLike, step: int | None = None) -> int:
  """Loads checkpoint `step` (default: the newest readable) into `actor`'s LoRA."""
  workdir = storage.path(workdir)
  steps = saved_steps(workdir)
  if not steps:
    raise errors.UserError(f"{actor_dir(workdir)}: no checkpoint to restore")
  if step is None:
    saved = set_aside_unreadable(workdir, move=False)
  elif step not in steps:
    raise errors.UserError(f"checkpoint step {step} not in {workdir}; saved steps: {steps}")
  elif isinstance(saved := _examine(workdir, step), str):
    raise errors.UserError(f"{actor_dir(workdir) / str(step)}: unreadable ({saved})")
  check_fits(workdir, saved, actor)
  step = saved.step
  manager = checkpoint_manager.CheckpointManager(root_directory=str(actor_dir(workdir)))
  try:
    restored, _ = manager.maybe_restore(actor, step=step, restore_only_lora_params=True)
  finally:
    manager.close()
  return restored
