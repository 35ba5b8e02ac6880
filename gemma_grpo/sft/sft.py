"""Supervised warm start on worked solutions: what `gemma-grpo sft` runs.

Examples are `prompt + <reasoning>…</reasoning><answer>72</answer><end_of_turn>`
with the loss on the model turn only (gemma_grpo/commands/sft.py says why).
Checkpoints use the GRPO layout, so `eval`, `export` and `train` with
`--config.model.init_lora_from=<sft workdir>` read SFT runs too.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys

from absl import logging
import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from tunix.sft import hooks as tunix_hooks
from tunix.sft import metrics_logger
from tunix.sft import peft_trainer

from gemma_grpo import config as config_lib
from gemma_grpo import errors
from gemma_grpo import storage
from gemma_grpo.config import settings
from gemma_grpo.model import gemma3_rl
from gemma_grpo.model import lora
from gemma_grpo.model import policy as policy_lib
from gemma_grpo.rl.learner import logprobs
from gemma_grpo.rl.run import optim
from gemma_grpo.rl.run import trainers
from gemma_grpo.runtime import checkpoints
from gemma_grpo.runtime import console
from gemma_grpo.runtime import curves
from gemma_grpo.runtime import endings
from gemma_grpo.runtime import guards
from gemma_grpo.runtime import mesh as mesh_lib
from gemma_grpo.runtime import metrics as metrics_lib
from gemma_grpo.tasks import data as data_lib
from gemma_grpo.tasks import prompts


def target_text(problem: data_lib.Problem) -> str:
  """The completion SFT teaches for `problem`, ending the model's turn."""
  return prompts.render_answer(problem.solution, problem.answer) + prompts.END_OF_TURN


def encode_examples(problems, tokenizer, max_length: int):
  """Token ids [N, max_length] (right padded) and a mask of the model turn.

  Examples longer than `max_length` are dropped (and counted), never cut:
  a cut target would teach the model to stop mid-solution.
  """
  pad = tokenizer.pad_id()
  tokens, masks, dropped = [], [], 0
  for problem in problems:
    if not problem.solution:
      dropped += 1
      continue
    prompt = tokenizer.encode(problem.prompt)
    target = tokenizer.encode(target_text(problem), add_bos=False)
    ids = prompt + target
    if len(ids) > max_length:
      dropped += 1
      continue
    padding = max_length - len(ids)
    tokens.append(ids + [pad] * padding)
    masks.append([0] * len(prompt) + [1] * len(target) + [0] * padding)
  if not tokens:
    raise errors.UserError(
        f"sft.max_length={max_length}: no example fits (or the data has no worked"
        " solutions); raise sft.max_length"
    )
  return np.array(tokens, np.int32), np.array(masks, np.float32), dropped


def loss_fn(model, tokens_BxL, target_mask_BxL, pad_id: int):
  """Mean negative log-likelihood of the model-turn tokens."""
  positions_BxL, mask_BxLxL = gemma3_rl.positions_and_mask(tokens_BxL, pad_id)
  hidden_BxLxD = model.hidden_states(tokens_BxL, positions_BxL, mask_BxLxL)
  # The state after token t predicts token t + 1.
  logps_BxT, _ = logprobs.logps_and_entropy_from_hidden(
      hidden_BxLxD[:, :-1], model.embedder.input_embedding.get_value(), tokens_BxL[:, 1:],
      matmul_dtype=model.matmul_dtype,
  )
  weights_BxT = target_mask_BxL[:, 1:]
  return -(logps_BxT * weights_BxT).sum() / weights_BxT.sum().clip(min=1.0)


def batches(tokens, masks, batch_size: int, seed: int):
  """Endless, epoch-reshuffled batches; deterministic for resume."""
  if len(tokens) < batch_size:
    raise errors.UserError(
        f"sft.batch_size={batch_size}: only {len(tokens)} usable examples"
    )
  rows = grain.MapDataset.source(list(range(len(tokens)))).shuffle(seed=seed).repeat(None)
  return rows.batch(
      batch_size, drop_remainder=True,
      batch_fn=lambda idx: {"tokens": tokens[list(idx)], "target_mask": masks[list(idx)]},
  )


class _Progress(tunix_hooks.TrainingHooks):
  """Per-step rows (console, metrics.jsonl), the step bar, and a stop on a
  non-finite loss."""

  def __init__(self, writer, max_steps: int, on_step):
    self._writer, self._max_steps, self._on_step = writer, max_steps, on_step

  def on_train_start(self, train_ctx):
    pass

  def on_train_step_start(self, train_ctx):
    pass

  def on_train_step_end(self, train_ctx, train_step, train_loss):
    if train_loss is not None and not math.isfinite(float(train_loss)):
      raise guards.NonFiniteError(f"sft step {train_step}: loss is {float(train_loss)}")
    # Tunix reports a step's metrics while the next one runs.
    self._writer.finish_through(min(train_step, self._max_steps) - 1)
    self._on_step(min(train_step, self._max_steps))

  def on_eval_step_start(self, train_ctx):
    pass

  def on_eval_step_end(self, train_ctx, eval_loss):
    pass

  def on_train_end(self, train_ctx):
    pass


def sft(c: settings.Settings, workdir: str) -> int:
  """Runs supervised LoRA training; returns the exit code (0, or runtime/endings.py's).

  `c` is the settings of a validated config (the `sft` command validates
  it); the caller holds the work directory's lease.
  """
  config_lib.mesh_shape(c.mesh, jax.device_count())  # the rest: validated by the caller
  mesh_lib.enable_compilation_cache(os.path.join(c.model.cache_dir, "xla"))
  work = storage.path(workdir)
  storage.check_writable(work)
  work.mkdir(parents=True, exist_ok=True)
  if jax.process_index() == 0:
    storage.write_text(work / "config.json", c.config_json)
  phases = console.Phases()
  mesh = mesh_lib.make_mesh(c.mesh)
  loaded = policy_lib.load_base(c.model, mesh)
  phases.done(f"model: {c.model.source} loaded ({c.model.dtype})")
  actor = lora.apply(loaded.model, c.lora, mesh)
  phases.done(f"LoRA: {lora.num_lora_params(actor)} trainable parameters")
  splits = data_lib.build_splits(c.data, loaded.tokenizer, c.rollout.max_prompt_length)
  tokens, masks, dropped = encode_examples(splits.train, loaded.tokenizer, c.sft.max_length)
  phases.done(f"sft data: {len(tokens)} examples ({dropped} dropped: no solution or longer"
              f" than {c.sft.max_length} tokens)")

  optim_c = dataclasses.replace(c.optim, peak_lr=c.sft.peak_lr)
  writer = metrics_lib.Writer(
      work / "tensorboard", flush_every_steps=c.log.flush_every_steps,
      max_steps=c.sft.max_steps, is_chief=jax.process_index() == 0,
      learning_rates=optim.learning_rates(optim_c, c.sft.max_steps),
  )
  training = peft_trainer.TrainingConfig(
      eval_every_n_steps=10**9,
      max_steps=c.sft.max_steps,
      checkpoint_root_directory=os.fspath(checkpoints.actor_dir(work)),
      checkpointing_options=ocp.CheckpointManagerOptions(
          save_interval_steps=c.ckpt.every_steps, max_to_keep=c.ckpt.keep
      ),
      metrics_logging_options=metrics_logger.MetricsLoggerOptions(
          log_dir=os.fspath(work / "tensorboard"),
          flush_every_n_steps=c.log.flush_every_steps,
          backend_kwargs={"custom_backend": [lambda: writer]},
      ),
      metrics_prefix="actor",
      data_sharding_axis=("fsdp",),
  )
  pad_id = loaded.tokenizer.pad_id()
  with jax.set_mesh(mesh):
    # The base model's arrays are donated with the actor's at the first step;
    # only its tokenizer is used from here on.
    trainer = trainers.PeftTrainer(actor, optim.optimizer(optim_c, c.sft.max_steps), training)

    def loss(model, tokens_BxL, target_mask_BxL):  # nnx.grad needs named args
      return loss_fn(model, tokens_BxL, target_mask_BxL, pad_id)

    trainer.with_loss_fn(loss)
    trainer.with_training_hooks(_Progress(writer, c.sft.max_steps, console.step_reporter(
        phases, c.sft.max_steps, trainer.train_steps, jax.process_index() == 0)))
    trainer.with_gen_model_input_fn(
        lambda b: {"tokens_BxL": b["tokens"], "target_mask_BxL": b["target_mask"]}
    )
    if trainer.train_steps >= c.sft.max_steps:
      logging.info("%s already holds step %d; nothing to do", work, trainer.train_steps)
      trainer.close()
      return 0
    stop = guards.StopSignal().install()
    try:
      trainer.train(stop.guard(iter(batches(tokens, masks, c.sft.batch_size, c.data.shuffle_seed))))
    except guards.NonFiniteError as e:
      trainer.checkpoint_manager.close()  # waits for a save still in flight
      kept = checkpoints.saved_steps(work)
      where = (f"the last good checkpoint, step {kept[-1]}, is kept" if kept
               else "no checkpoint was saved")
      print(f"error: {e}; SFT stopped; {where}", file=sys.stderr, flush=True)
      return endings.EXIT_NONFINITE
    finally:
      stop.uninstall()
      writer.close()
  if stop.agree():
    return endings.stopped(stop, checkpoints.actor_dir(work), trainer.train_steps)
  logging.info("SFT done: %d steps in %s", trainer.train_steps, work)
  if jax.process_index() == 0:
    logging.info("Plots: %s", ", ".join(str(p) for p in curves.write_plots(work)))
  return 0
