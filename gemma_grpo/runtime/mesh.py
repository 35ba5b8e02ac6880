"""The (fsdp, tp) device mesh over every device of every process, or two
meshes over two groups of them (mesh.rollout_devices)."""

from __future__ import annotations

import os

from absl import logging
from flax import nnx
import jax
import numpy as np

from gemma_grpo import config as config_lib
from gemma_grpo import errors
from gemma_grpo.config import settings

AXES = ("fsdp", "tp")


def make_mesh(mesh: settings.MeshSettings):
  """A mesh of every device, shaped (mesh.fsdp, mesh.tp), with Auto axis types.

  Tunix shards with `with_sharding_constraint` under the mesh, which needs Auto
  axes; jax 0.10 defaults to Explicit.
  """

  made = mesh_over(config_lib.mesh_shape(mesh, jax.device_count()), jax.devices())
  logging.info(
      "process %d/%d: %d local of %d devices (%s), mesh %s",
      jax.process_index(), jax.process_count(), jax.local_device_count(),
      jax.device_count(), jax.devices()[0].platform, dict(made.shape),
  )
  return made


def mesh_over(shape: tuple[int, int], devices):
  """An (fsdp, tp) mesh of `shape` over `devices`, with Auto axes as in make_mesh."""
  return jax.make_mesh(shape, AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(AXES),
                       devices=np.asarray(devices))


def split_meshes(devices: list, rollout_devices: int, tp: int, *, option: str):
  """(rollout mesh, update mesh): the first `rollout_devices` devices and the rest.

  Each keeps `tp` and fills fsdp with its other devices. `option` names the
  setting in the one-line UserError raised when the groups cannot be formed.
  """
  n, total = rollout_devices, len(devices)
  if problems := config_lib.split_problems(n, total, tp, option):
    raise errors.UserError(problems[0])
  return (mesh_over((n // tp, tp), devices[:n]),
          mesh_over(((total - n) // tp, tp), devices[n:]))


def make_meshes(mesh: settings.MeshSettings):
  """(update mesh, rollout mesh) for training: one mesh twice, or with
  mesh.rollout_devices = N the first N devices for the rollout and the rest
  for the update and reference passes."""
  if not mesh.rollout_devices:
    made = make_mesh(mesh)
    return made, made
  if jax.process_count() > 1:
    raise errors.UserError(
        f"mesh.rollout_devices={mesh.rollout_devices} runs in one process for now, not"
        f" {jax.process_count()}; set --config.mesh.rollout_devices=0")
  _, tp = config_lib.mesh_shape(mesh, jax.device_count())
  rollout, update = split_meshes(jax.devices(), mesh.rollout_devices, tp,
                                 option="mesh.rollout_devices=")
  logging.info("%d devices (%s): the rollout on %d, mesh %s; the update and reference on %d,"
               " mesh %s", jax.device_count(), jax.devices()[0].platform, rollout.size,
               dict(rollout.shape), update.size, dict(update.shape))
  return update, rollout


def shard_model(model, mesh):
  """Places every parameter as its partition-spec metadata says.

  Modules created under a mesh carry their intended specs as metadata but
  start replicated; Tunix's reshard helper skips models already on the mesh.
  """

  graphdef, state = nnx.split(model)
  shardings = jax.tree.map(
      lambda spec: jax.sharding.NamedSharding(mesh, spec),
      nnx.get_partition_spec(state),
  )
  try:
    state = jax.device_put(state, shardings)
  except ValueError as e:
    raise errors.UserError(
        f"mesh: parameters cannot be split over mesh {dict(mesh.shape)} ({e});"
        " choose mesh.fsdp/mesh.tp that divide the model's dimensions"
    ) from None
  return nnx.merge(graphdef, state)


def enable_compilation_cache(directory: str) -> None:
  """Persists compiled XLA programs across runs, unless one was configured.

  Start-up is dominated by compiling many small programs (Qwix traces the
  model op by op, samplers and train steps compile once each); a warm cache
  cuts a tiny run's start-up by about half.
  """

  if jax.config.jax_compilation_cache_dir:
    return
  jax.config.update("jax_compilation_cache_dir", os.path.expanduser(directory))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
