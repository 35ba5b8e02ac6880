"""The RL cluster keeps one copy of the frozen weights through an update."""

import dataclasses
import warnings

import jax
import numpy as np
import pytest
from flax import nnx
from tunix.rl.rl_cluster import Role

from gemma_grpo.rl.learner import algorithms
from gemma_grpo.rl.run import cluster as cluster_lib
from gemma_grpo import config as config_lib
from gemma_grpo.config import settings
from gemma_grpo.tasks import data as data_lib
from gemma_grpo.rl.learner import learner as learner_lib
from gemma_grpo.model import lora
from gemma_grpo.runtime import mesh as mesh_lib
from gemma_grpo.runtime import metrics as metrics_lib
from gemma_grpo.model import model_loading
from gemma_grpo.rl.run import optim
from gemma_grpo.tasks import rewards
from gemma_grpo.model import tokenizer as tokenizer_lib
from gemma_grpo.seam import jax_mesh


def frozen_leaves(model):
  return jax.tree.leaves(nnx.state(model, nnx.Not(nnx.LoRAParam)))


def lora_leaves(model):
  return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam))]


def test_actor_and_reference_share_frozen_weights_before_and_after_an_update(tmp_path):
  c = config_lib.load("configs/tiny.py")
  c.train.max_steps = 1
  c.eval.every_steps = 0
  c = settings.from_config(c)
  mesh = mesh_lib.make_mesh(c.mesh)
  loaded = model_loading.build(c.model, mesh)
  actor = lora.apply(loaded.model, c.lora, mesh)
  writer = metrics_lib.Writer(tmp_path / "tensorboard", flush_every_steps=1, max_steps=1,
                              is_chief=True, learning_rates=optim.learning_rates(c.optim, 1))
  cluster = cluster_lib.SharedWeightsCluster(
      actor=actor, reference=loaded.model, tokenizer=loaded.tokenizer,
      cluster_config=cluster_lib.cluster_config(
          c, mesh, tmp_path, writer, tokenizer_lib.stop_token_ids(loaded.tokenizer)))
  policy = cluster.actor_trainer.model
  # The rollout engine samples from the trained module itself, so no weight
  # sync is needed and none can be forgotten.
  assert cluster.rollout.model() is policy
  # The starting eval enters the actor's mesh as Tunix's update does, without
  # JAX's deprecation warning reaching the console of `python -m gemma_grpo.train`.
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    with cluster.in_update_context():
      assert jax_mesh.current_mesh() is cluster.r2m[Role.ACTOR]
  assert jax_mesh.current_mesh().empty
  assert all(a is b for a, b in zip(frozen_leaves(policy), frozen_leaves(loaded.model)))
  adapters_before = lora_leaves(policy)
  frozen_before = frozen_leaves(policy)
  frozen_values_before = [np.asarray(x) for x in frozen_before]

  learner = learner_lib.Learner(
      rl_cluster=cluster, algo_config=algorithms.algo_config(c.grpo),
      reward_fns=rewards.from_settings(c.rewards), rollout_seed=0)
  splits = data_lib.build_splits(c.data, loaded.tokenizer, c.rollout.max_prompt_length)
  learner.train(iter(data_lib.train_batches(splits.train, c.train.batch_size, 0)))
  writer.close()

  assert cluster.actor_trainer.train_steps == 1
  assert all(a is b for a, b in zip(frozen_leaves(policy), frozen_leaves(loaded.model)))
  # The step donated the frozen weight matrices (no second copy was written
  # next to them) and handed them back unchanged. (Norm scales replicated
  # over the 8-device mesh come back re-laid out, so those few bytes copy.)
  assert all(x.is_deleted() for x in frozen_before if x.ndim >= 2)
  assert all(np.array_equal(a, b) for a, b in zip(frozen_values_before, frozen_leaves(policy)))
  changed = [not np.array_equal(a, b) for a, b in zip(adapters_before, lora_leaves(policy))]
  assert any(changed), "the update left every adapter unchanged"
  rollout_adapters = lora_leaves(cluster.rollout.model())
  assert all(np.array_equal(a, b) for a, b in zip(rollout_adapters, lora_leaves(policy)))


@pytest.mark.parametrize("engine, want", [("tunix", "vanilla"), ("grouped", "GroupedRollout")])
def test_rollout_engine_picks_tunix_or_ours(engine, want):
  tiny = config_lib.load("configs/tiny.py")
  tiny.rollout.engine = engine
  tiny = settings.from_config(tiny)
  picked = cluster_lib.rollout_engine(tiny.rollout, tiny.lora)
  if want == "vanilla":
    assert picked == "vanilla"
  else:
    assert picked.func.__name__ == want
    assert picked.keywords == {"lora_scale": tiny.lora.alpha / tiny.lora.rank,
                               "decode_dtype": tiny.rollout.decode_dtype,
                               "screen_lm_head": tiny.rollout.screen_lm_head,
                               "tool_runner": None, "max_tool_calls": tiny.rollout.max_tool_calls,
                               "slots": 0, "stop_text": tiny.rollout.stop_text}


def test_the_rollout_engine_decodes_in_the_configured_dtype():
  tiny = settings.from_config(config_lib.load("configs/tiny.py"))
  rollout = dataclasses.replace(tiny.rollout, decode_dtype="bfloat16")
  assert cluster_lib.rollout_engine(rollout, tiny.lora).keywords["decode_dtype"] == "bfloat16"
