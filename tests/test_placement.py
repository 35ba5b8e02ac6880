"""The engine's own copy of the policy on a device group of its own (rl/engine/placement.py)."""

import jax
import numpy as np
from flax import nnx

from conftest import device_mesh
from gemma_grpo.rl.engine import placement
from gemma_grpo.rl.engine import rollout
from test_rollout import GROUPED, build, generate


def own_group(devices=(4,)):
  """A mesh of simulated devices the tiny actor (on device 0) does not use."""
  return jax.make_mesh((len(devices), 1), ("fsdp", "tp"),
                       devices=[jax.devices()[d] for d in devices],
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)


def flat(module, *filters):
  return {".".join(map(str, path)): v.get_value()
          for path, v in nnx.to_flat_state(nnx.state(module, *filters))}


def test_the_engine_decodes_a_copy_on_its_own_devices_and_receives_only_adapters():
  mesh = device_mesh()
  actor, tokenizer, shared = build(mesh)
  group = own_group()
  own = rollout.GroupedRollout(actor, tokenizer, group, lora_scale=shared._lora_scale)  # pylint: disable=protected-access
  assert own.holds_own_weights and not shared.holds_own_weights
  assert placement.lives_on(own.model(), group) and not placement.lives_on(own.model(), mesh)
  assert placement.lives_on(actor, mesh)
  # One device each: the same programs on another device, so the same tokens.
  want = generate(shared, mesh, GROUPED)
  got = generate(own, group, GROUPED)
  assert [t.tolist() for t in got.tokens] == [t.tolist() for t in want.tokens]

  # An update changes the actor's adapters; the sync sends those alone.
  base_before = flat(own.model(), nnx.Not(nnx.LoRAParam))
  nnx.update(actor, jax.tree.map(lambda x: x * 1.5, nnx.state(actor, nnx.LoRAParam)))
  stale = generate(own, group, GROUPED)
  assert [t.tolist() for t in stale.tokens] == [t.tolist() for t in got.tokens]  # a copy: not the live actor
  own.update_params(nnx.state(actor, nnx.LoRAParam), (nnx.LoRAParam,))
  base_after = flat(own.model(), nnx.Not(nnx.LoRAParam))
  assert base_after.keys() == base_before.keys()
  assert all(base_after[k] is base_before[k] for k in base_before)  # the frozen base never moved
  for path, value in flat(own.model(), nnx.LoRAParam).items():
    np.testing.assert_array_equal(value, flat(actor, nnx.LoRAParam)[path])
    assert set(value.sharding.device_set) == set(group.devices.flat)
  synced = generate(own, group, GROUPED)
  want = generate(shared, mesh, GROUPED)  # the live actor's new adapters
  assert [t.tolist() for t in synced.tokens] == [t.tolist() for t in want.tokens]
  assert [t.tolist() for t in synced.tokens] != [t.tolist() for t in got.tokens]


def test_a_sharded_copy_keeps_each_arrays_partition_spec():
  mesh = device_mesh(fsdp=4)
  actor, _, _ = build(mesh)
  group = own_group((4, 5, 6, 7))
  copy = placement.copy_to(actor, group)
  sharded = 0
  for path, value in flat(copy).items():
    source = flat(actor)[path].sharding
    # A value on one device (not placed by a partition spec) is replicated on the group.
    want = source.spec if isinstance(source, jax.sharding.NamedSharding) else jax.sharding.PartitionSpec()
    assert value.sharding.spec == want and value.sharding.mesh == group, path
    sharded += any(want)
    np.testing.assert_array_equal(value, flat(actor)[path])
  assert sharded > 10  # the embedding and every projection
