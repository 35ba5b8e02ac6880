"""Tunix's trainers with the model donated: the frozen base passes through."""

import jax
from flax import nnx
import numpy as np
import optax
from tunix.sft import peft_trainer

from configs import base
from gemma_grpo.model import lora
from gemma_grpo.runtime import mesh as mesh_lib
from gemma_grpo.model import model_loading
from gemma_grpo.sft import sft
from gemma_grpo.rl.run import trainers
from gemma_grpo.config import settings


def frozen(model):
  return jax.tree.leaves(nnx.state(model, nnx.Not(nnx.LoRAParam)))


def adapters(model):
  return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam))]


def one_step(trainer_class):
  c = base.get_config()
  c.model.source = "random"
  c.model.random.num_heads, c.model.random.head_dim = 4, 16
  c.lora.rank, c.lora.alpha = 4, 8.0
  c = settings.from_config(c)
  mesh = mesh_lib.make_mesh(c.mesh)
  with jax.set_mesh(mesh):
    actor = lora.apply(model_loading.build(c.model, mesh).model, c.lora, mesh)
    before = frozen(actor)
    values_before = [np.asarray(x) for x in before]
    adapters_before = adapters(actor)
    trainer = trainer_class(actor, optax.adam(1e-2), peft_trainer.TrainingConfig(
        eval_every_n_steps=10**9, max_steps=1))
    trainer.with_loss_fn(lambda model, tokens_BxL, target_mask_BxL: sft.loss_fn(
        model, tokens_BxL, target_mask_BxL, pad_id=0))
    trainer.with_gen_model_input_fn(
        lambda b: {"tokens_BxL": b["tokens"], "target_mask_BxL": b["target_mask"]})
    tokens = np.random.default_rng(0).integers(3, 200, size=(2, 12), dtype=np.int32)
    trainer.train([{"tokens": tokens, "target_mask": np.ones_like(tokens)}])
    trainer.close()
  return before, values_before, adapters_before, actor


def test_donating_trainer_updates_adapters_and_passes_the_base_through_in_place():
  before, values_before, adapters_before, actor = one_step(trainers.PeftTrainer)
  # Donated, so no second copy was written. (Norm scales, replicated over the
  # 8-device mesh, come back re-laid out: those few bytes are copied.)
  assert all(x.is_deleted() for x in before if x.ndim >= 2)
  assert all(np.array_equal(a, b) for a, b in zip(values_before, frozen(actor)))
  assert any(not np.array_equal(a, b) for a, b in zip(adapters_before, adapters(actor)))


def test_tunix_trainer_writes_a_fresh_copy_of_the_base():
  """What the subclass exists for: Tunix's own step leaves the old arrays."""
  before, _, _, actor = one_step(peft_trainer.PeftTrainer)
  assert not any(x.is_deleted() for x in before)
  assert all(a is not b for a, b in zip(before, frozen(actor)))


def test_global_batch_splits_the_rows_that_divide_and_replicates_the_rest():
  from conftest import device_mesh  # pylint: disable=g-import-not-at-top

  mesh = device_mesh(fsdp=4, tp=2)
  rows = np.arange(24, dtype=np.int32).reshape(8, 3)
  odd = np.arange(3, dtype=np.float32)
  moved = jax.device_put(np.ones((8, 2), np.float32), jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec("tp")))
  placed = trainers.global_batch({"rows": rows, "odd": odd, "moved": moved, "none": None},
                                 mesh, ("fsdp",))
  fsdp = jax.sharding.PartitionSpec("fsdp")
  assert placed["rows"].sharding == jax.sharding.NamedSharding(mesh, fsdp)
  assert placed["odd"].sharding == jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  assert placed["moved"].sharding == jax.sharding.NamedSharding(mesh, fsdp)  # from P("tp")
  assert placed["none"] is None
  np.testing.assert_array_equal(np.asarray(placed["rows"]), rows)
  np.testing.assert_array_equal(np.asarray(placed["odd"]), odd)
  # A row shard holds 2 of the 8 rows on each device.
  assert {s.data.shape for s in placed["rows"].addressable_shards} == {(2, 3)}
