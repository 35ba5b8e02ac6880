"""The (fsdp, tp) device mesh over every device of every process."""

from __future__ import annotations

import os

from absl import logging
from flax import nnx
import jax

from gemma_grpo import config as config_lib
from gemma_grpo import errors
from gemma_grpo.config import settings

AXES = ("fsdp", "tp")


def make_mesh(mesh: settings.MeshSettings):
  """A mesh of every device, shaped (mesh.fsdp, mesh.tp), with Auto axis types.

  Tunix shards with `with_sharding_constraint` under the mesh, which needs Auto
  axes; jax 0.10 defaults to Explicit.
  """

  shape = config_lib.mesh_shape(mesh, jax.device_count())
  made = jax.make_mesh(
      shape, AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(AXES)
  )
  logging.info(
      "process %d/%d: %d local of %d devices (%s), mesh %s",
      jax.process_index(), jax.process_count(), jax.local_device_count(),
      jax.device_count(), jax.devices()[0].platform, dict(made.shape),
  )
  return made


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
