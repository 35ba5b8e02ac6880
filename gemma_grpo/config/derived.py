"""Quantities a config implies but does not state: batch arithmetic and the mesh shape."""

from __future__ import annotations

import ml_collections

from gemma_grpo import errors


def completions_per_train_step(c: ml_collections.ConfigDict) -> int:
  """Rows of one call of the compiled train step: a micro-batch's completions."""
  t = c.train
  return (t.micro_batch_size or t.mini_batch_size or t.batch_size) * c.grpo.num_generations


def updates_per_batch(c: ml_collections.ConfigDict) -> int:
  """Optimizer updates per rollout batch: grpo.num_iterations x its mini-batches."""
  return c.grpo.num_iterations * (c.train.batch_size // (c.train.mini_batch_size or c.train.batch_size))


def mesh_size_problems(c: ml_collections.ConfigDict) -> list[str]:
  """What is wrong with the `mesh` section's sizes whatever the devices, one line each."""
  problems = [f"mesh.{name}={v}: use a positive size or -1"
              for name, v in (("fsdp", c.fsdp), ("tp", c.tp)) if v == 0 or v < -1]
  if c.fsdp == -1 and c.tp == -1:
    problems.append("mesh.fsdp and mesh.tp are both -1; fix one of them")
  return problems


def mesh_shape(c: ml_collections.ConfigDict, num_devices: int) -> tuple[int, int]:
  """(fsdp, tp) with -1 resolved; raises UserError if it cannot fill the devices."""
  if problems := mesh_size_problems(c):
    raise errors.UserError(problems[0])
  fsdp, tp = c.fsdp, c.tp
  if fsdp == -1:
    fsdp, rem = divmod(num_devices, tp)
  elif tp == -1:
    tp, rem = divmod(num_devices, fsdp)
  else:
    rem = 0
  if rem or fsdp * tp != num_devices:
    raise errors.UserError(
        f"mesh.fsdp={c.fsdp} x mesh.tp={c.tp} does not fill the {num_devices}"
        f" available devices; make the product {num_devices} (or use -1 for one"
        " of them)"
    )
  return fsdp, tp
