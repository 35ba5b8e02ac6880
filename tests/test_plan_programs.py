"""`plan` lowers the programs training runs: the same StableHLO, program by program.

On the simulated 8-device CPU mesh, configs/tiny.py is planned (abstract
models, no weights) and then trained for one step by the trainer's own
construction, with spies recording what the rollout engine and the learner
actually lowered; the update is the trainer's step as compiled ahead of its
first call (tunix_trainer.DonatesModel.precompile_train_step's path).
"""

import pytest
from tunix.sft import sharding_utils

from conftest import device_mesh  # pylint: disable=g-importing-member
from gemma_grpo.rl.learner import algorithms
from gemma_grpo.rl.learner import batch_logps
from gemma_grpo.rl.run import cluster as cluster_lib
from gemma_grpo import config as config_lib
from gemma_grpo.config import settings
from gemma_grpo.tasks import data as data_lib
from gemma_grpo.rl.learner import learner as learner_lib
from gemma_grpo.model import lora
from gemma_grpo.runtime import metrics as metrics_lib
from gemma_grpo.model import model_loading
from gemma_grpo.rl.run import optim
from gemma_grpo.tasks import rewards
from gemma_grpo.rl.engine import lockstep
from gemma_grpo.rl.engine import rollout as rollout_lib
from gemma_grpo.model import tokenizer as tokenizer_lib
from gemma_grpo.plan import programs
from gemma_grpo.seam import jax_mesh
from gemma_grpo.seam import tunix_trainer

pytestmark = pytest.mark.slow


def spy(monkeypatch, module, name, seen):
  real = getattr(module, name)

  def recording(*args, **kwargs):
    seen.setdefault(name, real.lower(*args, **kwargs).as_text())
    return real(*args, **kwargs)

  monkeypatch.setattr(module, name, recording)


@pytest.mark.parametrize("overrides", [
    {},
    # A bfloat16 sampler with truncated importance sampling: other columns, another
    # decode; a stop text puts its table (rl/engine/stop_text.py) in the loop.
    {"rollout.decode_dtype": "bfloat16", "grpo.tis_cap": 2.0, "rollout.stop_text": "</answer>"},
])
def test_plan_lowers_the_programs_that_training_runs(tmp_path, monkeypatch, overrides):
  c = config_lib.load("configs/tiny.py")
  for key, value in overrides.items():
    config_lib.override(c, key, str(value))
  c.train.max_steps = 1
  c.train.batch_size = 4  # 8 completions: the batch splits over the 8 devices
  c = settings.from_config(c)
  mesh = device_mesh(fsdp=4, tp=2)

  builder = programs.Builder(c, mesh, screen_lm_head=c.rollout.screen_lm_head)
  planned = {"update": builder.update().as_text(), "reference": builder.reference().as_text()}
  prefill = builder.prefill()
  planned["_prefill"] = prefill.as_text()
  planned["decode"] = builder.decode(prefill.compile()).as_text()

  loaded = model_loading.build(c.model, mesh)
  actor = lora.apply(loaded.model, c.lora, mesh)
  writer = metrics_lib.Writer(tmp_path / "tensorboard", flush_every_steps=1, max_steps=1,
                              is_chief=True, learning_rates=optim.learning_rates(c.optim, 1))
  cluster = cluster_lib.SharedWeightsCluster(
      actor=actor, reference=loaded.model, tokenizer=loaded.tokenizer,
      cluster_config=cluster_lib.cluster_config(
          c, mesh, tmp_path, writer, tokenizer_lib.stop_token_ids(loaded.tokenizer)))
  learner = learner_lib.Learner(
      rl_cluster=cluster, algo_config=algorithms.algo_config(c.grpo),
      reward_fns=rewards.from_settings(c.rewards), rollout_seed=0,
      sampler_logps=c.rollout.decode_dtype != "float32")
  trainer = cluster.actor_trainer
  with jax_mesh.tunix_mesh(mesh):
    trainer.jit_train_and_eval_step(cache_nnx_graph=True)
    example = sharding_utils.shard_input(
        learner.example_like(config_lib.completions_per_train_step(c.train, c.grpo.num_generations)), ("fsdp",))
    trained = {"update": tunix_trainer.jit_train_step(trainer).lower(
        trainer.model, trainer.optimizer, example).as_text()}

  spy(monkeypatch, rollout_lib, "_prefill", trained)
  spy(monkeypatch, lockstep, "decode", trained)
  spy(monkeypatch, batch_logps, "logps_program", trained)
  splits = data_lib.build_splits(c.data, loaded.tokenizer, c.rollout.max_prompt_length)
  learner.train(iter(data_lib.train_batches(splits.train, c.train.batch_size, 0)))
  writer.close()
  trained["reference"] = trained.pop("logps_program")

  assert set(trained) == set(planned)
  for name in planned:
    assert planned[name] == trained[name], f"{name}: plan lowered another program than training"
