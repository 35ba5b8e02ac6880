"""Quantities a config implies but does not state: batch arithmetic and the mesh shape.

Each function takes the sections it reads: a validated config's settings
slices (config/settings.py), or, in validation, the ConfigDict sections of
the same names and fields.
"""

from __future__ import annotations

from gemma_grpo import errors
import gemma_grpo.config.settings as settings  # the module, not the package: no cycle


def completions_per_train_step(train: settings.TrainSettings, num_generations: int) -> int:
  """Rows of one call of the compiled train step: a micro-batch's completions."""
  t = train
  return (t.micro_batch_size or t.mini_batch_size or t.batch_size) * num_generations


def updates_per_batch(train: settings.TrainSettings, num_iterations: int) -> int:
  """Optimizer updates per rollout batch: grpo.num_iterations x its mini-batches."""
  return num_iterations * (train.batch_size // (train.mini_batch_size or train.batch_size))


def mesh_size_problems(mesh: settings.MeshSettings) -> list[str]:
  """What is wrong with the `mesh` section's sizes whatever the devices, one line each."""
  problems = [f"mesh.{name}={v}: use a positive size or -1"
              for name, v in (("fsdp", mesh.fsdp), ("tp", mesh.tp)) if v == 0 or v < -1]
  if mesh.fsdp == -1 and mesh.tp == -1:
    problems.append("mesh.fsdp and mesh.tp are both -1; fix one of them")
  return problems


def split_problems(rollout_devices: int, total: int, tp: int, option: str,
                   unsplit: str = "") -> list[str]:
  """What keeps `total` devices from splitting into a rollout group of
  `rollout_devices` and an update group of the rest, each a multiple of `tp`;
  `option` names the setting ("mesh.rollout_devices=" or "--rollout-devices "),
  `unsplit` how to do without a split, said where one cannot be made."""
  n = rollout_devices
  if total < 2:
    return [f"{option}{n}: a split needs at least 2 devices; there is {total}{unsplit}"]
  if not 0 < n < total:
    return [f"{option}{n}: must be between 1 and {total - 1} of the {total} devices"
            " (the rest run the update)"]
  if n % tp or (total - n) % tp:
    return [f"{option}{n}: each group ({n} and {total - n} devices) must be a multiple of"
            f" mesh.tp={tp}; choose a multiple of {tp}"]
  return []


def mesh_shape(mesh: settings.MeshSettings, num_devices: int) -> tuple[int, int]:
  """(fsdp, tp) with -1 resolved; raises UserError if it cannot fill the devices."""
  if problems := mesh_size_problems(mesh):
    raise errors.UserError(problems[0])
  fsdp, tp = mesh.fsdp, mesh.tp
  if fsdp == -1:
    fsdp, rem = divmod(num_devices, tp)
  elif tp == -1:
    tp, rem = divmod(num_devices, fsdp)
  else:
    rem = 0
  if rem or fsdp * tp != num_devices:
    raise errors.UserError(
        f"mesh.fsdp={mesh.fsdp} x mesh.tp={mesh.tp} does not fill the {num_devices}"
        f" available devices; make the product {num_devices} (or use -1 for one"
        " of them)"
    )
  return fsdp, tp
