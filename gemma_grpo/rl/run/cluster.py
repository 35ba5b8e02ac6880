"""Tunix's RLCluster holding one copy of the frozen base weights.

The reference policy is the base model and the actor is the base plus LoRA,
so their frozen weights are the same numbers. Two things in Tunix 0.1.7 make
whole copies of them (the memory they cost, measured: docs/benchmarks/history.md,
"One GRPO step against TRL"):

- the cluster snapshots the whole actor state as an "anchor" for its own
  old-log-prob path at start-up and after every update. Our learner computes
  old log-probs itself from the live actor (before any update of the batch),
  so the anchor is never read;
- the actor trainer jits its step donating only the optimizer, so XLA writes
  every variable of the model, frozen ones included, to fresh buffers while
  the old ones are still alive (see `trainers`).

`SharedWeightsCluster` frees the anchor, has the actor's step donate the
model as well (the frozen weights then pass through the step in place), and
after each update points the reference's frozen weights at the actor's
arrays, which are the donated buffers under new handles.
"""

from __future__ import annotations

import contextlib
import functools
import os

from flax import nnx
import orbax.checkpoint as ocp
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.rollout import base_rollout
from tunix.sft import metrics_logger

from gemma_grpo import config as config_lib
from gemma_grpo import storage
from gemma_grpo.config import settings
from gemma_grpo.model import lora
from gemma_grpo.rl.engine import multi_turn
from gemma_grpo.rl.engine import rollout
from gemma_grpo.rl.run import optim
from gemma_grpo.rl.run import trainers
from gemma_grpo.runtime import host_memory
from gemma_grpo.seam import jax_mesh
from gemma_grpo.seam import tunix_cluster

class SharedWeightsCluster(rl_cluster_lib.RLCluster):
  """An RLCluster whose actor and reference share their frozen weights."""

  def __init__(self, *, actor, reference, tokenizer, cluster_config):
    super().__init__(actor=actor, reference=reference, tokenizer=tokenizer,
                     cluster_config=cluster_config)
    self._reference_model = reference
    tunix_cluster.drop_anchor_policy_state(self)
    # RLCluster builds its trainer itself and offers no way to choose the
    # class; this subclass changes only how the step is jitted.
    tunix_cluster.use_trainer_class(self, trainers.RLTrainer)
    # verl's mini-batches, which share one rollout, rather than Tunix's, each
    # rolled out just before its update.
    tunix_cluster.roll_out_whole_batches(self)
    if self.engine_holds_own_weights:
      # Tunix builds the rollout before its trainer restores a checkpoint's
      # adapters into the actor: the engine's copy must get them too.
      self.send_adapters()

  def update_actor(self, *args, **kwargs):
    # The update is the step's memory peak; start it without the free heap
    # the rollout and reference passes left behind.
    host_memory.release_free_memory()
    try:
      return super().update_actor(*args, **kwargs)
    finally:
      # The reference's arrays were donated with the actor's; even a failed
      # update leaves both pointing at the same (possibly deleted) buffers.
      lora.share_frozen_weights(source=self.actor_trainer.model, target=self._reference_model)

  def precompile_update(self, example) -> None:
    """Starts compiling the actor's train step for `example` (trainers.py)."""
    with jax_mesh.tunix_mesh(self.r2m[rl_cluster_lib.Role.ACTOR]):
      self.actor_trainer.precompile_train_step(example)

  @contextlib.contextmanager
  def in_update_context(self):
    """The mesh context Tunix's update_actor holds while the trainer's hooks run.

    JAX keys its traces on the stack of mesh contexts, and an eval run from
    a training hook generates inside this one: an eval outside training
    entered through it shares their compiled programs instead of compiling
    its own.
    """
    with jax_mesh.tunix_mesh(self.r2m[rl_cluster_lib.Role.ACTOR]):
      yield

  def sync_weights(self):
    """Tunix's sync (when rollout and actor do not share a model), no anchor."""
    self.send_adapters()
    # Steps count optimizer updates (grpo.num_iterations of them per batch),
    # so a batch's metrics land on the step of its first update.
    self.global_steps = self.actor_trainer.train_steps


  def send_adapters(self) -> None:
    """The actor's LoRA adapters to the engine: all a copy of its own needs
    (mesh.rollout_devices); the frozen base never moves."""
    filter_types = (nnx.LoRAParam,)
    self.rollout.update_params(nnx.state(self.actor_trainer.model, filter_types), filter_types)

  @property
  def engine_holds_own_weights(self) -> bool:
    """Whether the rollout decodes a copy on a device group of its own."""
    return isinstance(self.rollout, rollout.GroupedRollout) and self.rollout.holds_own_weights

  def generate(self, prompts, *args, mode=rl_cluster_lib.Mode.TRAIN, **kwargs):
    if mode == rl_cluster_lib.Mode.EVAL and self.engine_holds_own_weights:
      # An eval runs from the trainer's hooks, after the update and before
      # Tunix's sync: it must see the policy that update made.
      self.send_adapters()
    return super().generate(prompts, *args, mode=mode, **kwargs)

  def close(self):
    if isinstance(self.rollout, rollout.GroupedRollout):
      self.rollout.background.close()  # the last head start (run_ahead.py) ends here
    super().close()


# --- The cluster's configuration, from a validated config ----------------------


def rollout_configs(r: settings.RolloutSettings, eval_max_new_tokens: int,
                    stop_token_ids: list[int]):
  """{TRAIN: sampled rollouts, EVAL: greedy decoding} for Tunix's RLCluster."""
  common = dict(
      max_prompt_length=r.max_prompt_length,
      kv_cache_size=r.kv_cache_size,
      # No token id is -1: with ignore_eos every completion runs to the limit.
      eos_tokens=[-1] if r.ignore_eos else list(stop_token_ids),
  )
  train = base_rollout.RolloutConfig(
      max_tokens_to_generate=r.max_new_tokens,
      temperature=r.temperature,
      top_p=r.top_p,
      top_k=r.top_k or None,
      **common,
  )
  # top_p=None selects Tunix's greedy sampler.
  evaluation = base_rollout.RolloutConfig(
      max_tokens_to_generate=eval_max_new_tokens, top_p=None, top_k=None,
      **common,
  )
  return {rl_cluster_lib.Mode.TRAIN: train, rl_cluster_lib.Mode.EVAL: evaluation}


def rollout_engine(r: settings.RolloutSettings, lora_s: settings.LoraSettings):
  """What RLCluster builds its rollout with: Tunix's name or our engine class."""
  if r.engine == "tunix":
    return "vanilla"
  return functools.partial(rollout.GroupedRollout, lora_scale=lora_s.scale,
                           decode_dtype=r.decode_dtype,
                           screen_lm_head=r.screen_lm_head,
                           tool_runner=multi_turn.tool_runner(r),
                           max_tool_calls=r.max_tool_calls,
                           slots=r.slots, stop_text=r.stop_text)


def training_config(c: settings.Settings, workdir, writer):
  """Tunix's RLTrainingConfig (from the train, grpo, optim, ckpt and log settings);
  `workdir` None writes no checkpoints or metrics (plan)."""
  t = c.train
  # Tunix counts prompts; config counts completions and updates.
  micro_batch_prompts = (config_lib.completions_per_train_step(t, c.grpo.num_generations)
                         // c.grpo.num_generations)
  mini_batches_per_batch = config_lib.updates_per_batch(t, c.grpo.num_iterations) // c.grpo.num_iterations
  return rl_cluster_lib.RLTrainingConfig(
      actor_optimizer=optim.optimizer(c.optim, t.max_steps),
      max_steps=t.max_steps,
      # Read by the actor trainer only: SharedWeightsCluster hands the learner
      # whole batches.
      mini_batch_size=t.batch_size // mini_batches_per_batch,
      train_micro_batch_size=micro_batch_prompts,
      # Rollouts and log-probs take the whole batch even when the update is
      # split: decoding reads every weight per token whatever the batch size,
      # so two half batches would cost almost twice one full one.
      rollout_micro_batch_size=t.batch_size,
      compute_logps_micro_batch_size=t.batch_size,
      # In-training evaluation is ours (greedy, with accuracy); Tunix's only
      # recomputes the loss, so it never runs.
      eval_every_n_steps=10**9,
      checkpoint_root_directory=(
          None if workdir is None else os.fspath(storage.path(workdir) / "checkpoints")),
      checkpointing_options=ocp.CheckpointManagerOptions(
          # Checkpoints are written by step_hooks.RunHooks after a finiteness check.
          save_decision_policy=ocp.checkpoint_managers.SpecificStepsPolicy(steps=()),
          max_to_keep=c.ckpt.keep,
      ),
      metrics_logging_options=None if workdir is None else metrics_logger.MetricsLoggerOptions(
          log_dir=os.fspath(storage.path(workdir) / "tensorboard"),
          flush_every_n_steps=c.log.flush_every_steps,
          backend_kwargs={"custom_backend": [lambda: writer]},
      ),
      data_sharding_axis=("fsdp",),
  )


def cluster_config(c: settings.Settings, mesh, workdir, writer,
                   stop_token_ids: list[int], rollout_mesh=None):
  """Tunix's ClusterConfig: actor and reference on `mesh`, the rollout on
  `rollout_mesh` (mesh.rollout_devices) or the same mesh."""
  training = training_config(c, workdir, writer)
  roles = rl_cluster_lib.Role
  return rl_cluster_lib.ClusterConfig(
      role_to_mesh={roles.ACTOR: mesh, roles.REFERENCE: mesh,
                    roles.ROLLOUT: mesh if rollout_mesh is None else rollout_mesh},
      rollout_engine=rollout_engine(c.rollout, c.lora),
      offload_to_cpu=False,
      training_config=training,
      rollout_config=rollout_configs(c.rollout, c.eval.max_new_tokens, stop_token_ids),
  )
