"""GRPO training: `python -m gemma_grpo.train --config configs/gemma3_270m.py`.

Builds the model, LoRA policy, data and a Tunix RLCluster (actor, reference,
and an in-process rollout: gemma_grpo.rl.rollout, or Tunix's vanilla sampler with
rollout.engine=tunix) and runs the chosen GRPO-family learner. Rerunning the same
command resumes from the latest checkpoint in the work directory, data
position and sampling keys included, so an interrupted run continues exactly
as the uninterrupted one would have.

Arguments and exit codes: gemma_grpo.commands.command (shared with `sft`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import traceback

from absl import logging
from etils import epath
import ml_collections

from gemma_grpo.runtime import checkpoints
from gemma_grpo.commands import command
from gemma_grpo import config as config_lib
from gemma_grpo.runtime import console
from gemma_grpo.tasks import data as data_lib
from gemma_grpo import errors
from gemma_grpo.model import lora
from gemma_grpo.runtime import mesh as mesh_lib
from gemma_grpo.runtime import metrics as metrics_lib
from gemma_grpo.rl import multi_turn
from gemma_grpo.commands import plots
from gemma_grpo.tasks import rewards
from gemma_grpo.tasks import scoring
from gemma_grpo import storage
from gemma_grpo.model import tokenizer as tokenizer_lib



@dataclasses.dataclass(frozen=True)
class Start:
  """What preflight learned about the work directory, each thing read once."""

  work: epath.Path
  saved_identity: dict | None  # run.json of the checkpoints to resume, if any
  resume: checkpoints.Readable | None  # the newest checkpoint that reads back whole


def preflight(c: ml_collections.ConfigDict, workdir: str | os.PathLike) -> Start:
  """Every check of the input that needs no model, on a validated config.

  Runs in seconds, so bad input fails before minutes of loading: the mesh
  against the devices, a local data file, the work directory's identity and
  its checkpoints (the newest is read whole once, here).
  """
  import jax  # pylint: disable=g-import-not-at-top

  config_lib.mesh_shape(c.mesh, jax.device_count())
  fsdp, _ = config_lib.mesh_shape(c.mesh, jax.device_count())
  rows = config_lib.completions_per_train_step(c)
  if rows % fsdp:
    # Tunix replicates inputs it cannot split (sharding_utils.get_sharding):
    # correct, but every device then computes the whole micro-batch.
    logging.warning(
        "train.micro_batch_size x grpo.num_generations = %d completions do not"
        " split over mesh fsdp=%d; each device will process all of them", rows, fsdp)
  data_lib.check_source(c.data)
  check_tools(c.rollout)
  work = storage.path(workdir)
  if work.exists() and not work.is_dir():
    raise errors.UserError(f"--workdir {workdir}: exists and is not a directory")
  storage.check_writable(work)
  saved_identity = checkpoints.check_identity(work, checkpoints.identity(c))
  resume = checkpoints.set_aside_unreadable(work, move=jax.process_index() == 0)
  return Start(work, saved_identity, resume)


def check_tools(r: ml_collections.ConfigDict) -> None:
  """Loads rollout.tools once before the model does, so a bad name fails in a second."""
  try:
    multi_turn.tool_runner(r)
  except ValueError as e:
    raise errors.UserError(str(e)) from None


def train(c: ml_collections.ConfigDict, workdir: str) -> int:
  """Trains until `c.train.max_steps`; returns the process exit code.

  `c` must be validated (config.validate: `command` and api.train do it).
  """
  start = preflight(c, workdir)
  if start.resume is not None and start.resume.step >= c.train.max_steps:
    # Checkpoint steps count updates, as Tunix's train_steps do: a finished
    # run is known before minutes of loading the model.
    logging.info("%s already holds step %d >= train.max_steps; nothing to do",
                 start.work, start.resume.step)
    return 0

  from gemma_grpo.runtime import guards  # pylint: disable=g-import-not-at-top

  # From here on a signal means "stop at the next safe point", even while loading.
  stop = guards.StopSignal().install()
  try:
    return _train(c, start, stop)
  finally:
    stop.uninstall()


def _train(c: ml_collections.ConfigDict, start: Start, stop) -> int:
  import jax  # pylint: disable=g-import-not-at-top
  from tunix.rl import rl_cluster as rl_cluster_lib  # pylint: disable=g-import-not-at-top

  from gemma_grpo.rl import cluster as cluster_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo.runtime import guards  # pylint: disable=g-import-not-at-top
  from gemma_grpo.rl import step_hooks  # pylint: disable=g-import-not-at-top
  from gemma_grpo.rl import learner as learner_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo.rl import optim  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import policy as policy_lib  # pylint: disable=g-import-not-at-top

  work = start.work
  mesh_lib.enable_compilation_cache(os.path.join(c.model.cache_dir, "xla"))
  work.mkdir(parents=True, exist_ok=True)
  is_chief = jax.process_index() == 0
  if is_chief:
    config_lib.save(c, work / "config.json")

  phases = console.Phases()
  mesh = mesh_lib.make_mesh(c.mesh)
  loaded = policy_lib.load_base(c.model, mesh)
  phases.done(f"model: {c.model.source} loaded ({c.model.dtype})")
  ident = checkpoints.identity(c, checkpoints.model_shape(loaded.model))
  if start.saved_identity is not None:  # its config fields were compared in preflight
    checkpoints.compare_identity(work, start.saved_identity, ident)
  actor = lora.apply(loaded.model, c.lora, mesh)
  phases.done(f"LoRA: {lora.num_lora_params(actor)} trainable parameters")
  resume_step = start.resume.step if start.resume else None
  if start.resume is not None:
    checkpoints.check_fits(work, start.resume, actor)
  if is_chief:
    checkpoints.write_identity(work, ident)
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
        cluster_config=cluster_lib.cluster_config(c, mesh, work, writer, stop_ids),
    )
  except ValueError as e:
    writer.close()
    if resume_step is not None and "stored shape" in str(e):
      raise errors.UserError(
          f"{checkpoints.actor_dir(work)}: checkpoint step {resume_step} does not"
          f" fit this config ({str(e).splitlines()[0][:160]}); use a new --workdir"
      ) from None
    raise
  trainer = cluster.actor_trainer
  phases.done("RL cluster: actor, reference and rollout ready")
  learner = learner_lib.Learner(
      rl_cluster=cluster,
      algo_config=learner_lib.algo_config(c.grpo),
      reward_fns=guards.finite_rewards(
          rewards.from_config(c.rewards),
          current_step=lambda: trainer.train_steps + 1,
      ),
      rollout_seed=c.rollout.seed,
      refill_problems=splits.train,  # fresh prompts for grpo.dynamic_sampling
      stop_text=c.rollout.stop_text,
      updates_per_batch=config_lib.updates_per_batch(c),
      sampler_logps=c.rollout.decode_dtype != "float32",
      tools=bool(c.rollout.tools),
  )
  # Steps count updates: align Tunix's step counter with the restored one.
  cluster.global_steps = trainer.train_steps
  if stop.agree() or trainer.train_steps >= c.train.max_steps:
    cluster.close()
    writer.close()
    if stop.requested:
      return command.stopped(stop, checkpoints.actor_dir(work), trainer.train_steps)
    logging.info("%s already holds step %d >= train.max_steps; nothing to do",
                 work, trainer.train_steps)
    return 0
  if trainer.train_steps:
    logging.info("Resuming from step %d in %s", trainer.train_steps, work)

  # The update's program compiles beside the starting eval and the first
  # rollout instead of after them (trainers.py).
  cluster.precompile_update(learner.example_like(config_lib.completions_per_train_step(c)))

  heldout = splits.heldout[:c.eval.num_examples]

  # The CLI's `eval` scores with the run's preset too: eval/ values compare.
  eval_reward_fns = rewards.from_config(c.rewards)

  def evaluate_heldout(step: int) -> dict[str, float]:
    """Greedy eval of the held-out slice; its samples kept in WORKDIR/eval/step_N."""
    def generate(batch_prompts):
      out = cluster.generate(batch_prompts, mode=rl_cluster_lib.Mode.EVAL)
      texts, truncated, counts = tokenizer_lib.apply_stop_text(
          out.text, out.tokens, c.eval.max_new_tokens, c.rollout.stop_text, loaded.tokenizer)
      if c.rollout.tools:  # lengths count the model's own tokens, not tool results
        turns = cluster.rollout.take_tool_turns()
        counts = [n - int(t.tool_mask[:n].sum()) for n, t in zip(counts, turns, strict=True)]
      return texts, truncated, counts
    metrics, samples = scoring.run(generate, heldout, c.eval.batch_size, reward_fns=eval_reward_fns,
                                    show_progress=is_chief, tools=bool(c.rollout.tools))
    evals.append(metrics)
    if is_chief:
      scoring.write(work / "eval" / f"step_{step:06d}", {
          "metrics": metrics,
          "settings": {"step": step, "decoding": {"mode": "greedy", "max_new_tokens": c.eval.max_new_tokens,
                                                  "stop_text": c.rollout.stop_text, "engine": c.rollout.engine},
                       "data": {"source": c.data.source, "heldout": len(heldout)}},
      }, samples)
    return {f"eval/{k}": v for k, v in metrics.items()}

  evals: list[dict[str, float]] = []
  if heldout and c.eval.every_steps and trainer.train_steps == 0:
    # The starting point: what every later eval (and the end line) compares with.
    logging.info("Evaluating the starting policy on %d held-out problems", len(heldout))
    with cluster.in_update_context():  # where later evals run: one program for all
      writer.scalars(evaluate_heldout(0), 0)
    writer.finish_through(0)
    phases.done("held-out eval of the starting policy")

  run_hooks = step_hooks.RunHooks(
      writer=writer,
      max_steps=c.train.max_steps,
      checkpoint_every=c.ckpt.every_steps,
      eval_every=c.eval.every_steps,
      evaluate=evaluate_heldout if heldout else None,
      stop=stop,
      updates_per_batch=config_lib.updates_per_batch(c),
      on_step=console.step_reporter(phases, c.train.max_steps, trainer.train_steps, is_chief),
  )
  trainer.with_training_hooks(run_hooks)
  batches = data_lib.train_batches(splits.train, c.train.batch_size, c.data.shuffle_seed)
  # A step's line prints once Tunix reports its metrics, during the next step:
  # say what is running meanwhile.
  logging.info("Training steps %d-%d: %d problems x %d samples each; the first step"
               " also compiles, and each step's line appears after the next one",
               trainer.train_steps + 1, c.train.max_steps, c.train.batch_size,
               c.grpo.num_generations)
  try:
    # On success Tunix closes the cluster: the last checkpoint is written and
    # Orbax's asynchronous save has finished when this returns.
    learner.train(stop.guard(iter(batches)))
  except (guards.NonFiniteError, guards.RewardFunctionError) as e:
    trainer.checkpoint_manager.close()  # waits for a save still in flight
    kept = checkpoints.saved_steps(work)
    where = (f"the last good checkpoint, step {kept[-1]}, is kept in"
             f" {checkpoints.actor_dir(work)}" if kept else "no checkpoint was saved")
    print(f"error: {e}; training stopped; {where}", file=sys.stderr, flush=True)
    if isinstance(e, guards.NonFiniteError):
      return command.EXIT_NONFINITE
    _print_user_frames(e.__cause__)
    return command.EXIT_REWARD_FUNCTION
  except BaseException:
    trainer.checkpoint_manager.close()
    raise
  finally:
    writer.close()
  if stop.agree():
    return command.stopped(stop, checkpoints.actor_dir(work), trainer.train_steps)
  logging.info("Done: %d steps in %s", trainer.train_steps, work)
  if is_chief and len(evals) >= 2:
    print(heldout_summary(evals[0], evals[-1], len(heldout), trainer.train_steps), flush=True)
  if is_chief:
    logging.info("Plots: %s", ", ".join(str(p) for p in plots.write_plots(work)))
  return 0


def heldout_summary(first: dict[str, float], last: dict[str, float], num_problems: int,
                    step: int) -> str:
  """One line: the held-out metrics at the start of this run and at its end."""
  parts = [f"{name} {first[key]:.1%} -> {last[key]:.1%}"
           for name, key in (("accuracy", "accuracy"), ("format", "format_accuracy"),
                             ("truncated", "truncation_rate"))]
  return (f"held-out ({num_problems} problems, greedy), start -> step {step}: "
          + ", ".join(parts) + f"; reward {first['reward/sum']:.2f} -> {last['reward/sum']:.2f}")


def _print_user_frames(error: BaseException) -> None:
  """The traceback of a user's reward function, without Tunix's or our frames."""
  ours = (os.path.dirname(os.path.dirname(__file__)), os.sep + "tunix" + os.sep)  # gemma_grpo/
  frames = [f for f in traceback.extract_tb(error.__traceback__)
            if not any(part in f.filename for part in ours)]
  if frames:
    print("".join(traceback.format_list(frames)).rstrip(), file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
  """`python -m gemma_grpo.train --config FILE [--workdir DIR] [--config.x.y=v ...]`."""
  return command.main(argv, prog="gemma-grpo train", doc=__doc__, run=train)


if __name__ == "__main__":
  sys.exit(main())
