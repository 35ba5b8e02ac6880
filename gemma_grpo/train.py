"""GRPO training: `python -m gemma_grpo.train --config configs/gemma3_270m.py`.

Builds the model, LoRA policy, data and a Tunix RLCluster (actor, reference,
vanilla rollout) and runs the chosen GRPO-family learner. Rerunning the same
command resumes from the latest checkpoint in the work directory, data
position included.
"""

from __future__ import annotations

import os
import pathlib
import signal
import sys

from absl import logging
import ml_collections

from gemma_grpo import config as config_lib
from gemma_grpo import errors

EXIT_NONFINITE = 3


def default_workdir(config_path: str) -> str:
  return os.path.join("runs", pathlib.Path(config_path).stem)


def train(c: ml_collections.ConfigDict, workdir: str) -> int:
  """Trains until `c.train.max_steps`; returns the process exit code."""
  import jax  # pylint: disable=g-import-not-at-top
  from tunix.rl import rl_cluster as rl_cluster_lib  # pylint: disable=g-import-not-at-top

  from gemma_grpo import data as data_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo import evaluate  # pylint: disable=g-import-not-at-top
  from gemma_grpo import hooks as hooks_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo import learner as learner_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo import lora  # pylint: disable=g-import-not-at-top
  from gemma_grpo import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo import metrics as metrics_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo import model as model_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo import rewards  # pylint: disable=g-import-not-at-top
  from gemma_grpo import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top

  config_lib.validate(c, jax.device_count())
  mesh_lib.enable_compilation_cache(os.path.join(c.model.cache_dir, "xla"))
  work = pathlib.Path(workdir)
  work.mkdir(parents=True, exist_ok=True)
  is_chief = jax.process_index() == 0
  if is_chief:
    config_lib.save(c, work / "config.json")

  mesh = mesh_lib.make_mesh(c.mesh)
  loaded = model_lib.build(c.model, mesh)
  actor = lora.apply(loaded.model, c.lora, mesh)
  logging.info("LoRA: %d trainable parameters", lora.num_lora_params(actor))
  splits = data_lib.build_splits(c.data, loaded.tokenizer, c.rollout.max_prompt_length)
  logging.info("data: %d train, %d held-out problems (%d dropped as too long)",
               len(splits.train), len(splits.heldout), splits.dropped)
  reward_fns = rewards.build_reward_fns(c.rewards.preset, dict(c.rewards.weights))
  stop_ids = tokenizer_lib.stop_token_ids(loaded.tokenizer)

  writer = metrics_lib.Writer(
      work / "tensorboard", flush_every_steps=c.log.flush_every_steps,
      max_steps=c.train.max_steps, is_chief=is_chief,
  )
  cluster = rl_cluster_lib.RLCluster(
      actor=actor,
      reference=loaded.model,
      tokenizer=loaded.tokenizer,
      cluster_config=config_lib.cluster_config(c, mesh, work, writer, stop_ids),
  )
  learner = learner_lib.Learner(
      rl_cluster=cluster,
      algo_config=learner_lib.algo_config(c.grpo),
      reward_fns=reward_fns,
      rollout_seed=c.rollout.seed,
  )
  trainer = cluster.actor_trainer
  # One update per step: align Tunix's step counter with the restored one.
  cluster.global_steps = trainer.train_steps
  if trainer.train_steps >= c.train.max_steps:
    logging.info("%s already holds step %d >= train.max_steps; nothing to do",
                 work, trainer.train_steps)
    cluster.close()
    writer.close()
    return 0
  if trainer.train_steps:
    logging.info("Resuming from step %d in %s", trainer.train_steps, work)

  heldout = splits.heldout[:c.eval.num_examples]

  def evaluate_heldout() -> dict[str, float]:
    def generate(batch_prompts):
      out = cluster.generate(batch_prompts, mode=rl_cluster_lib.Mode.EVAL)
      limit = c.eval.max_new_tokens
      return out.text, [len(t) >= limit for t in out.tokens]
    metrics, _ = evaluate.run(generate, heldout, c.eval.batch_size)
    return {f"eval/{k}": v for k, v in metrics.items()}

  stop = hooks_lib.StopSignal().install()
  run_hooks = hooks_lib.RunHooks(
      writer=writer,
      max_steps=c.train.max_steps,
      checkpoint_every=c.ckpt.every_steps,
      eval_every=c.eval.every_steps,
      evaluate=evaluate_heldout if heldout else None,
      stop=stop,
  )
  trainer.with_training_hooks(run_hooks)
  batches = data_lib.train_batches(splits.train, c.train.batch_size, c.data.shuffle_seed)
  try:
    learner.train(stop.guard(iter(batches)))
  except hooks_lib.NonFiniteError as e:
    trainer.checkpoint_manager.close()
    kept = run_hooks.last_good_step or trainer.checkpoint_manager.latest_step()
    print(f"error: {e}; training stopped, the last good checkpoint"
          f" (step {kept}) is kept in {work / 'checkpoints'}", file=sys.stderr)
    return EXIT_NONFINITE
  finally:
    stop.uninstall()
    writer.close()
  if stop.requested:
    name = signal.Signals(stop.signum).name
    print(f"{name}: stopped after step {trainer.train_steps}; checkpoint saved in"
          f" {work / 'checkpoints'}; rerun the same command to resume.",
          file=sys.stderr)
    return 128 + stop.signum
  logging.info("Done: %d steps in %s", trainer.train_steps, work)
  return 0


def main(argv: list[str] | None = None) -> int:
  """`python -m gemma_grpo.train --config FILE [--workdir DIR] [--config.x.y=v ...]`."""
  import argparse  # pylint: disable=g-import-not-at-top

  argv = list(sys.argv[1:] if argv is None else argv)
  parser = argparse.ArgumentParser(
      prog="gemma-grpo train", description=__doc__.splitlines()[0],
      epilog="Override any config key with --config.section.key=value.",
  )
  parser.add_argument("--config", required=True, help="config file, e.g. configs/gemma3_270m.py")
  parser.add_argument("--workdir", help="run directory (default runs/<config name>)")
  with errors.exit_on_user_error():
    known, rest = parser.parse_known_args(argv)
    c = config_lib.load(known.config)
    leftover = config_lib.apply_overrides(c, rest)
    if leftover:
      parser.error(f"unrecognized arguments: {' '.join(leftover)}")
    from gemma_grpo import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
    from gemma_grpo import metrics as metrics_lib  # pylint: disable=g-import-not-at-top

    mesh_lib.maybe_initialize_distributed()
    metrics_lib.configure_logging()
    return train(c, known.workdir or default_workdir(known.config))


if __name__ == "__main__":
  sys.exit(main())
