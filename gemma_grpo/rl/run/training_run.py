"""A GRPO training run from a validated config to its last step.

Builds the model, LoRA policy, data and a Tunix RLCluster (actor, reference,
and an in-process rollout: gemma_grpo.rl.engine.rollout, or Tunix's vanilla sampler with
rollout.engine=tunix) and runs the chosen GRPO-family learner. Rerunning on the
same work directory resumes from its latest checkpoint, data position and
sampling keys included, so an interrupted run continues exactly as the
uninterrupted one would have.

`train(s, workdir)` is what `gemma-grpo train` and `api.train` run, on the
settings of a validated config (config.settings.from_config); it returns the
exit code (0, or one of runtime/endings.py's). As the run's orchestrator it
takes every settings slice and hands each part the one it needs.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import traceback

from absl import logging
from etils import epath
import jax

from gemma_grpo import config as config_lib
from gemma_grpo import errors
from gemma_grpo import storage
from gemma_grpo.config import settings
from gemma_grpo.model import lora
from gemma_grpo.model import model_loading
from gemma_grpo.model import policy as policy_lib
from gemma_grpo.model import tokenizer as tokenizer_lib
from gemma_grpo.rl.engine import multi_turn
from gemma_grpo.rl.eval import heldout
from gemma_grpo.rl.learner import algorithms
from gemma_grpo.rl.learner import learner as learner_lib
from gemma_grpo.rl.run import cluster as cluster_lib
from gemma_grpo.rl.run import optim
from gemma_grpo.rl.run import run_ahead
from gemma_grpo.rl.run import step_hooks
from gemma_grpo.runtime import checkpoints
from gemma_grpo.runtime import console
from gemma_grpo.runtime import curves
from gemma_grpo.runtime import endings
from gemma_grpo.runtime import guards
from gemma_grpo.runtime import mesh as mesh_lib
from gemma_grpo.runtime import metrics as metrics_lib
from gemma_grpo.tasks import data as data_lib
from gemma_grpo.tasks import rewards


@dataclasses.dataclass(frozen=True)
class Start:
  """What preflight learned about the work directory, each thing read once."""

  work: epath.Path
  found: checkpoints.Resume  # its identity, and the newest checkpoint that reads back whole


def preflight(c: settings.Settings, workdir: str | os.PathLike) -> Start:
  """Every check of the input that needs no model, on a validated config.

  Runs in seconds, so bad input fails before minutes of loading: the mesh
  against the devices, a local data file, the work directory's identity and
  its checkpoints (the newest is read whole once, here).
  """
  fsdp, _ = config_lib.mesh_shape(c.mesh, jax.device_count())
  rows = config_lib.completions_per_train_step(c.train, c.grpo.num_generations)
  if rows % fsdp:
    # Tunix replicates inputs it cannot split (sharding_utils.get_sharding):
    # correct, but every device then computes the whole micro-batch.
    logging.warning(
        "train.micro_batch_size x grpo.num_generations = %d completions do not"
        " split over mesh fsdp=%d; each device will process all of them", rows, fsdp)
  data_lib.check_source(c.data.source)
  check_tools(c.rollout)
  work = storage.path(workdir)
  if work.exists() and not work.is_dir():
    raise errors.UserError(f"--workdir {workdir}: exists and is not a directory")
  storage.check_writable(work)
  return Start(work, checkpoints.examine(work, _identity(c), move=jax.process_index() == 0))


def _identity(c: settings.Settings) -> dict:
  return checkpoints.identity(c.model, c.lora, c.grpo.algorithm)


def check_tools(r: settings.RolloutSettings) -> None:
  """Loads rollout.tools once before the model does, so a bad name fails in a second."""
  try:
    multi_turn.tool_runner(r)
  except ValueError as e:
    raise errors.UserError(str(e)) from None


def train(c: settings.Settings, workdir: str | os.PathLike) -> int:
  """Trains until `c.train.max_steps`; returns the process exit code.

  `c` is the settings of a validated config (config.validate: the `train`
  command and api.train do it); the caller holds the work directory's lease.
  """
  start = preflight(c, workdir)
  if start.found.step is not None and start.found.step >= c.train.max_steps:
    # Checkpoint steps count updates, as Tunix's train_steps do: a finished
    # run is known before minutes of loading the model.
    logging.info("%s already holds step %d >= train.max_steps; nothing to do",
                 start.work, start.found.step)
    return 0
  # From here on a signal means "stop at the next safe point", even while loading.
  stop = guards.StopSignal().install()
  try:
    return _train(c, start, stop)
  finally:
    stop.uninstall()


@dataclasses.dataclass
class _Parts:
  """What a run is built from, once loaded."""

  loaded: model_loading.Loaded
  actor: object
  splits: data_lib.Splits
  cluster: cluster_lib.SharedWeightsCluster
  writer: metrics_lib.Writer


def _train(c: settings.Settings, start: Start, stop: guards.StopSignal) -> int:
  work = start.work
  mesh_lib.enable_compilation_cache(os.path.join(c.model.cache_dir, "xla"))
  work.mkdir(parents=True, exist_ok=True)
  is_chief = jax.process_index() == 0
  if is_chief:
    storage.write_text(work / "config.json", c.config_json)
  phases = console.Phases()
  parts = _build(c, start, phases, is_chief)
  cluster, writer = parts.cluster, parts.writer
  trainer = cluster.actor_trainer
  batches = data_lib.train_batches(parts.splits.train, c.train.batch_size, c.data.shuffle_seed)
  # The rollout reads ahead of the trainer (rollout.max_staleness); the stop
  # guard stays between the trainer and the data, so a stop still lands between steps.
  lookahead = run_ahead.Lookahead(batches)
  learner = learner_lib.Learner(
      rl_cluster=cluster,
      algo_config=algorithms.algo_config(c.grpo),
      reward_fns=guards.finite_rewards(
          rewards.from_settings(c.rewards),
          current_step=lambda: trainer.train_steps + 1,
      ),
      rollout_seed=c.rollout.seed,
      refill_problems=parts.splits.train,  # fresh prompts for grpo.dynamic_sampling
      stop_text=c.rollout.stop_text,
      updates_per_batch=config_lib.updates_per_batch(c.train, c.grpo.num_iterations),
      sampler_logps=c.rollout.decode_dtype != "float32",
      tools=bool(c.rollout.tools),
      decode_stats=c.rollout.engine == "grouped",
      run_ahead=run_ahead.RunAhead(
          cluster.rollout, lookahead, max_staleness=c.rollout.max_staleness,
          num_generations=c.grpo.num_generations,
          rollout_key=jax.random.PRNGKey(c.rollout.seed),
          last_step=c.train.max_steps) if c.rollout.max_staleness else None,
  )
  # Steps count updates: align Tunix's step counter with the restored one.
  cluster.global_steps = trainer.train_steps
  if stop.agree() or trainer.train_steps >= c.train.max_steps:
    cluster.close()
    writer.close()
    if stop.requested:
      return endings.stopped(stop, checkpoints.actor_dir(work), trainer.train_steps)
    logging.info("%s already holds step %d >= train.max_steps; nothing to do",
                 work, trainer.train_steps)
    return 0
  if trainer.train_steps:
    logging.info("Resuming from step %d in %s", trainer.train_steps, work)

  # The update's program compiles beside the starting eval and the first
  # rollout instead of after them (trainers.py).
  cluster.precompile_update(learner.example_like(
      config_lib.completions_per_train_step(c.train, c.grpo.num_generations)))

  evaluate = heldout.HeldoutEval(c.eval, c.rollout, c.rewards, c.data.source, cluster,
                                 parts.loaded.tokenizer, parts.splits.heldout, work, is_chief)
  if evaluate.problems and c.eval.every_steps and trainer.train_steps == 0:
    # The starting point: what every later eval (and the end line) compares with.
    logging.info("Evaluating the starting policy on %d held-out problems", len(evaluate.problems))
    with cluster.in_update_context():  # where later evals run: one program for all
      writer.scalars(evaluate(0), 0)
    writer.finish_through(0)
    phases.done("held-out eval of the starting policy")

  trainer.with_training_hooks(step_hooks.RunHooks(
      writer=writer,
      max_steps=c.train.max_steps,
      checkpoint_every=c.ckpt.every_steps,
      eval_every=c.eval.every_steps,
      evaluate=evaluate if evaluate.problems else None,
      stop=stop,
      updates_per_batch=config_lib.updates_per_batch(c.train, c.grpo.num_iterations),
      on_step=console.step_reporter(phases, c.train.max_steps, trainer.train_steps, is_chief),
  ))
  # A step's line prints once Tunix reports its metrics, during the next step:
  # say what is running meanwhile.
  logging.info("Training steps %d-%d: %d problems x %d samples each; the first step"
               " also compiles, and each step's line appears after the next one",
               trainer.train_steps + 1, c.train.max_steps, c.train.batch_size,
               c.grpo.num_generations)
  code = _run_steps(learner, trainer, stop.guard(lookahead), work, writer)
  if code is not None:
    return code
  if stop.agree():
    return endings.stopped(stop, checkpoints.actor_dir(work), trainer.train_steps)
  logging.info("Done: %d steps in %s", trainer.train_steps, work)
  evals = evaluate.results
  if is_chief and len(evals) >= 2:
    print(heldout.summary(evals[0], evals[-1], len(evaluate.problems), trainer.train_steps),
          flush=True)
  if is_chief:
    logging.info("Plots: %s", ", ".join(str(p) for p in curves.write_plots(work)))
  return 0


def _build(c: settings.Settings, start: Start, phases: console.Phases,
           is_chief: bool) -> _Parts:
  """Model, LoRA policy, data and the RL cluster, each phase with its line."""
  work = start.work
  mesh, rollout_mesh = mesh_lib.make_meshes(c.mesh)  # one mesh twice unless mesh.rollout_devices
  loaded = policy_lib.load_base(c.model, mesh)
  phases.done(f"model: {c.model.source} loaded ({c.model.dtype})")
  actor = lora.apply(loaded.model, c.lora, mesh)
  phases.done(f"LoRA: {lora.num_lora_params(actor)} trainable parameters")
  checkpoints.claim(work, start.found, _identity(c), loaded.model, actor, write=is_chief)
  splits = data_lib.build_splits(c.data, loaded.tokenizer, c.rollout.max_prompt_length)
  phases.done(f"data: {len(splits.train)} train, {len(splits.heldout)} held-out problems"
              f" ({splits.dropped} dropped as too long)")
  stop_ids = tokenizer_lib.stop_token_ids(loaded.tokenizer)

  writer = metrics_lib.Writer(
      work / "tensorboard", flush_every_steps=c.log.flush_every_steps,
      max_steps=c.train.max_steps, is_chief=is_chief,
      learning_rates=optim.learning_rates(c.optim, c.train.max_steps),
  )
  try:
    cluster = cluster_lib.SharedWeightsCluster(
        actor=actor,
        reference=loaded.model,
        tokenizer=loaded.tokenizer,
        cluster_config=cluster_lib.cluster_config(c, mesh, work, writer, stop_ids, rollout_mesh),
    )
  except ValueError as e:
    writer.close()
    if start.found.step is not None and "stored shape" in str(e):
      raise errors.UserError(
          f"{checkpoints.actor_dir(work)}: checkpoint step {start.found.step} does not"
          f" fit this config ({str(e).splitlines()[0][:160]}); use a new --workdir"
      ) from None
    raise
  phases.done("RL cluster: actor, reference and rollout ready")
  return _Parts(loaded, actor, splits, cluster, writer)


def _run_steps(learner, trainer, batches, work: epath.Path, writer) -> int | None:
  """Runs the learner over `batches`; an exit code if a guard stopped it, else None."""
  try:
    # On success Tunix closes the cluster: the last checkpoint is written and
    # Orbax's asynchronous save has finished when this returns.
    learner.train(batches)
  except (guards.NonFiniteError, guards.RewardFunctionError) as e:
    trainer.checkpoint_manager.close()  # waits for a save still in flight
    print(f"error: {e}; training stopped; {checkpoints.last_kept(work)}", file=sys.stderr, flush=True)
    if isinstance(e, guards.NonFiniteError):
      return endings.EXIT_NONFINITE
    _print_user_frames(e.__cause__)
    return endings.EXIT_REWARD_FUNCTION
  except BaseException:
    trainer.checkpoint_manager.close()
    raise
  finally:
    writer.close()
  return None


def _print_user_frames(error: BaseException) -> None:
  """The traceback of a user's reward function, without Tunix's or our frames."""
  ours = (os.path.dirname(os.path.dirname(__file__)), os.sep + "tunix" + os.sep)  # gemma_grpo/
  frames = [f for f in traceback.extract_tb(error.__traceback__)
            if not any(part in f.filename for part in ours)]
  if frames:
    print("".join(traceback.format_list(frames)).rstrip(), file=sys.stderr, flush=True)
