"""The engine's own copy of the policy, on a device group of its own (mesh.rollout_devices).

On one mesh the engine decodes with the trainer's live module. On a group of
its own it holds a copy: the frozen base is sent once, when the engine is
built, and each weight sync sends only the LoRA adapters (a few megabytes),
each onto the sharding its copy already has. The copy keeps the trainer's
partition specs, on the engine's mesh.
"""

from __future__ import annotations

from flax import nnx
import jax


def lives_on(model: nnx.Module, mesh: jax.sharding.Mesh) -> bool:
  """Whether every array of `model` is on `mesh`'s devices."""
  devices = set(mesh.devices.flat)
  return all(set(leaf.sharding.device_set) <= devices
             for leaf in jax.tree.leaves(nnx.state(model)) if isinstance(leaf, jax.Array))


def copy_to(model: nnx.Module, mesh: jax.sharding.Mesh) -> nnx.Module:
  """A copy of `model` on `mesh`, each array under its own partition spec there."""
  graphdef, state = nnx.split(model)
  shardings = jax.tree.map(lambda x: jax.sharding.NamedSharding(mesh, _spec(x)), state)
  return nnx.merge(graphdef, jax.device_put(state, shardings))


def send(params: nnx.State, onto: nnx.Module, filter_types=None) -> None:
  """Writes `params` (the trainer's module's state of `filter_types`, all of
  it if None) into `onto`, each array moved to where `onto` holds that variable."""
  target = nnx.state(onto, *filter_types) if filter_types else nnx.state(onto)
  shardings = jax.tree.map(lambda x: x.sharding, target)
  nnx.update(onto, jax.device_put(params, shardings))


def _spec(x: jax.Array) -> jax.sharding.PartitionSpec:
  sharding = x.sharding
  if isinstance(sharding, jax.sharding.NamedSharding):
    return sharding.spec
  return jax.sharding.PartitionSpec()  # single-device or replicated: replicated on the group
