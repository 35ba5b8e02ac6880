"""The four programs of a GRPO step, lowered by the trainer's own code for any mesh.

  update     the actor trainer's jitted step (forward, backward, optimizer on
             the LoRA parameters), tunix_trainer.jit_train_step
  reference  the reference model's log-probs of a batch, batch_logps.logps_program
  prefill    the rollout engine's prefill of the distinct prompts
  decode     the rollout engine's decode loop (cost counted per token)

Each is built from the same functions `train` calls, on abstract models
(shapes.build), with inputs shaped and sharded as a training step gives them.
"""

from __future__ import annotations

import copy
import dataclasses

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.sft import sharding_utils

from gemma_grpo.config import settings
from gemma_grpo import config as config_lib
from gemma_grpo.plan import shapes
from gemma_grpo.rl.engine import rollout as rollout_lib
from gemma_grpo.rl.learner import algorithms
from gemma_grpo.rl.learner import batch_logps
from gemma_grpo.rl.learner import train_examples
from gemma_grpo.rl.run import cluster as cluster_lib
from gemma_grpo.rl.run import trainers
from gemma_grpo.seam import jax_mesh
from gemma_grpo.seam import tunix_trainer

NAMES = ("update", "reference", "prefill", "decode")


class GemmaIds:
  """The Gemma tokenizer's special ids, which are all the programs read of a tokenizer."""

  def encode(self, text: str, add_bos: bool = True) -> list[int]:
    raise NotImplementedError("plan never tokenizes text")

  def decode(self, ids, skip_special_tokens: bool = False) -> str:
    raise NotImplementedError("plan never detokenizes")

  def bos_id(self) -> int:
    return 2

  def eos_id(self) -> int:
    return 1

  def pad_id(self) -> int:
    return 0

  def token_id(self, piece: str) -> int | None:
    return {"<start_of_turn>": 105, "<end_of_turn>": 106}.get(piece)


@dataclasses.dataclass(frozen=True)
class Workload:
  """How often each program runs in one training step, from the config.

  Attributes:
    rows: completions per step (prompts x G).
    update_rows: completions per call of the update (one micro-batch).
    update_calls: update calls per step (updates per batch x micro-batches).
    decode_tokens: decode iterations per rollout (at most max_new_tokens - 1:
      the prefill draws the first token).
  """

  rows: int
  update_rows: int
  update_calls: int
  decode_tokens: int


def workload(c: settings.Settings) -> Workload:
  t = c.train
  mini = t.mini_batch_size or t.batch_size
  micro = t.micro_batch_size or mini
  return Workload(
      rows=t.batch_size * c.grpo.num_generations,
      update_rows=config_lib.completions_per_train_step(t, c.grpo.num_generations),
      update_calls=config_lib.updates_per_batch(t, c.grpo.num_iterations) * (mini // micro),
      decode_tokens=max(c.rollout.max_new_tokens - 1, 0),
  )


def _data_sharded(x, mesh):
  """A ShapeDtypeStruct laid out as Tunix's shard_input lays out a batch on ("fsdp",)."""
  sharding = sharding_utils.get_sharding(np.zeros(x.shape, x.dtype), mesh,
                                         jax.sharding.PartitionSpec("fsdp"))
  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


def _unplaced(shape, dtype) -> jax.ShapeDtypeStruct:
  """An input the engine passes as a host array, which jit places itself."""
  return jax.ShapeDtypeStruct(shape, dtype)


class Builder:
  """Builds the trainer's objects for config `c` on `mesh` and lowers its programs."""

  def __init__(self, c: settings.Settings, mesh, *, screen_lm_head: str):
    self.c, self.mesh = c, mesh
    self.reference_model, self.actor = shapes.build(c, mesh)
    self.ids = GemmaIds()
    self.work = workload(c)
    self.algo = algorithms.algo_config(c.grpo)
    self.engine = rollout_lib.GroupedRollout(
        self.actor, self.ids, mesh, lora_scale=c.lora.scale,
        decode_dtype=c.rollout.decode_dtype, screen_lm_head=screen_lm_head)
    self.rollout_config = cluster_lib.rollout_configs(c.rollout, c.eval.max_new_tokens, self._stop_ids())[rl_cluster_lib.Mode.TRAIN]
    # As Tunix's GRPOLearner sets it: log-probs are of the sampling distribution.
    self.algo.temperature = self.rollout_config.temperature

  def _stop_ids(self) -> list[int]:
    return [self.ids.eos_id(), self.ids.token_id("<end_of_turn>")]

  # --- update ------------------------------------------------------------

  def update(self) -> jax.stages.Lowered:
    c = self.c
    training = cluster_lib.training_config(c, workdir=None, writer=None)
    # RLCluster hands its actor trainer a copy whose micro-batching it derives.
    actor_config = copy.deepcopy(training)
    # Its optimizer state is then described on the mesh (_optimizer_on).
    trainer = trainers.RLTrainer(
        model=shapes.with_host_adapters(self.actor), optimizer=actor_config.actor_optimizer,
        training_config=actor_config, custom_checkpoint_metadata_fn=dict)
    algorithms.wire_loss(trainer, self.algo, pad_id=self.ids.pad_id(), eos_id=self.ids.eos_id())
    optimizer = self.optimizer = _optimizer_on(trainer.optimizer, self.mesh)
    example = train_examples.train_example_like(
        self.work.update_rows, prompt_width=c.rollout.max_prompt_length,
        completion_width=c.rollout.max_new_tokens, pad=self.ids.pad_id(),
        **train_examples.example_columns(c.grpo, c.train, c.rollout.decode_dtype,
                                        c.rollout.max_staleness))
    example = jax.tree.map(lambda x: _data_sharded(jax.ShapeDtypeStruct(x.shape, x.dtype), self.mesh),
                           example)
    with jax_mesh.tunix_mesh(self.mesh):
      return tunix_trainer.jit_train_step(trainer).lower(self.actor, optimizer, example)

  # --- reference ------------------------------------------------------------

  def reference(self) -> jax.stages.Lowered:
    c, rows = self.c, self.work.rows
    prompt = _data_sharded(jax.ShapeDtypeStruct((rows, c.rollout.max_prompt_length), jnp.int32), self.mesh)
    completion = _data_sharded(jax.ShapeDtypeStruct((rows, c.rollout.max_new_tokens), jnp.int32), self.mesh)
    graphdef, state = nnx.split(self.reference_model)
    with jax_mesh.tunix_mesh(self.mesh):
      return batch_logps.logps_program.lower(
          graphdef, state, prompt, completion, pad_id=self.ids.pad_id(), eos_id=self.ids.eos_id(),
          temperature=self.algo.temperature, group_size=self.algo.num_generations)

  # --- rollout ----------------------------------------------------------------

  def _settings(self):
    """(sampling, with_logps, screen width) of a training rollout (GroupedRollout.settings)."""
    return self.engine.settings(self.rollout_config, train_examples.wants_sampler_logps(
        self.c.rollout.decode_dtype, self.c.grpo.tis_cap, self.c.rollout.max_staleness))

  def prefill(self) -> jax.stages.Lowered:
    c = self.c
    sampling, _, width = self._settings()
    fn, args, kwargs = self.engine.prefill_call(
        _unplaced((c.train.batch_size, c.rollout.max_prompt_length), jnp.int32),
        _unplaced((2,), jnp.uint32), rows_per_prompt=c.grpo.num_generations,
        sampling=sampling, screen_width=width)
    with jax_mesh.tunix_mesh(self.mesh):
      return fn.lower(*args, **kwargs)

  def decode(self, prefill: jax.stages.Compiled) -> jax.stages.Lowered:
    """The decode loop, fed what the compiled `prefill` returns."""
    sampling, with_logps, width = self._settings()
    outputs = jax.tree.map(
        lambda info, sharding: jax.ShapeDtypeStruct(info.shape, info.dtype, sharding=sharding),
        prefill.out_info, prefill.output_shardings)
    stop_ids = _unplaced((len(self.rollout_config.eos_tokens),), jnp.int32)
    stop_text = self.c.rollout.stop_text  # its table's shape only (rl/engine/stop_text.py)
    vocab = self.actor.embedder.input_embedding.get_value().shape[0]
    fn, args, kwargs = self.engine.decode_call(
        outputs, stop_ids, _unplaced((2,), jnp.uint32), new_tokens=self.c.rollout.max_new_tokens,
        sampling=sampling, with_logps=with_logps, screen_width=width,
        next_state_SxV=_unplaced((len(stop_text) + 1, vocab), jnp.int16) if stop_text else None)
    with jax_mesh.tunix_mesh(self.mesh):
      return fn.lower(*args, **kwargs)


def _optimizer_on(optimizer, mesh):
  """The trainer's optimizer as abstract state on `mesh`, sharded as the trainer shards it."""
  graphdef, state = nnx.split(optimizer)
  specs = nnx.get_partition_spec(state)
  placed = jax.tree.map(
      lambda x, spec: jax.ShapeDtypeStruct(
          np.shape(x), jnp.result_type(x), sharding=jax.sharding.NamedSharding(
              mesh, spec if isinstance(spec, jax.sharding.PartitionSpec)
              else jax.sharding.PartitionSpec())),
      state, specs)
  return nnx.merge(graphdef, placed)
