"""Supervised warm start: targets, masks, and a short run that learns."""

import re

import numpy as np
import pytest

from conftest import run_cli
from gemma_grpo.runtime import checkpoints
from gemma_grpo.tasks import data
from gemma_grpo import errors
from gemma_grpo.config import settings
from gemma_grpo.runtime import guards
from gemma_grpo.runtime import metrics
from gemma_grpo.model import policy as policy_lib
from gemma_grpo.tasks import prompts
from gemma_grpo.sft import sft


class CharTokenizer:
  """One id per character (+1), <bos>=2, <pad>=0."""

  def pad_id(self):
    return 0

  def encode(self, text, add_bos=True):
    return ([2] if add_bos else []) + [ord(ch) + 1 for ch in text]


def test_target_is_the_rewarded_format_ending_the_turn():
  problem = data.Problem("Two plus two?", "4", "2 + 2 = 4.")
  assert sft.target_text(problem) == (
      "<reasoning>2 + 2 = 4.</reasoning>\n<answer>4</answer><end_of_turn>"
  )


def test_mask_covers_the_model_turn_only():
  problem = data.Problem("Q?", "1", "so 1")
  tok = CharTokenizer()
  prompt_len = len(tok.encode(prompts.render_prompt("Q?")))
  target_len = len(sft.target_text(problem))
  tokens, masks, dropped = sft.encode_examples([problem], tok, max_length=prompt_len + target_len + 5)
  assert dropped == 0 and tokens.shape == masks.shape == (1, prompt_len + target_len + 5)
  assert masks[0].tolist() == [0] * prompt_len + [1] * target_len + [0] * 5
  assert tokens[0, -5:].tolist() == [0] * 5
  assert "".join(chr(i - 1) for i in tokens[0][masks[0] == 1]) == sft.target_text(problem)


def test_long_or_unsolved_examples_are_dropped_not_cut():
  tok = CharTokenizer()
  short = data.Problem("Q?", "1", "so 1")
  unsolved = data.Problem("Q?", "1", "")
  long = data.Problem("Q?", "1", "x" * 500)
  tokens, _, dropped = sft.encode_examples([short, unsolved, long], tok, max_length=300)
  assert len(tokens) == 1 and dropped == 2
  with pytest.raises(errors.UserError, match="sft.max_length"):
    sft.encode_examples([long], tok, max_length=300)


def test_batches_cover_every_example_each_epoch():
  tokens = np.arange(6, dtype=np.int32)[:, None]
  masks = np.ones_like(tokens, dtype=np.float32)
  it = iter(sft.batches(tokens, masks, batch_size=3, seed=0))
  seen = sorted(int(t) for _ in range(2) for t in next(it)["tokens"][:, 0])
  assert seen == list(range(6))


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("sft") / "run"
  proc = run_cli(["sft", "--config", "configs/tiny.py", "--workdir", str(workdir),
           "--config.data.reasoning_gym_size=8", "--config.data.num_heldout=0",
           "--config.eval.num_examples=0",
           "--config.sft.max_steps=6", "--config.sft.batch_size=2",
           "--config.sft.max_length=384", "--config.sft.peak_lr=0.02",
           "--config.optim.warmup_fraction=0", "--config.optim.max_grad_norm=1.0",
           "--config.ckpt.every_steps=3"])
  (workdir.parent / "stderr.txt").write_text(proc.stderr)
  return workdir


def test_sft_prints_its_start_up_phases_with_seconds(sft_run):
  stderr = (sft_run.parent / "stderr.txt").read_text()
  for phase in ("model: random loaded", "LoRA: ", "sft data: ",
                "step 1: the first step, compilation included"):
    line = next((line for line in stderr.splitlines() if phase in line), "")
    assert re.search(r"\(\d+\.\d s; \d+ s since start\)$", line), (phase, line)


def test_sft_run_lowers_the_loss_and_writes_grpo_style_checkpoints(sft_run):
  rows = metrics.read_jsonl(sft_run / "tensorboard" / "metrics.jsonl")
  losses = [r["actor/train/loss"] for r in rows]
  # A random 2-layer model moves slowly; the run is deterministic, so a small
  # but clear drop from the uniform-distribution loss (ln 262144 = 12.48) is
  # the signal that gradients reach the adapters.
  assert len(losses) == 6 and losses[-1] < losses[0] - 0.03, losses
  assert min(losses[3:]) < min(losses[:3]), losses
  assert checkpoints.saved_steps(sft_run)[-1] == 6


@pytest.mark.slow
def test_grpo_starts_from_the_merged_sft_policy(sft_run, tmp_path):
  from flax import nnx  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from gemma_grpo import config as config_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo.runtime import mesh as mesh_lib  # pylint: disable=g-import-not-at-top

  c = config_lib.load("configs/tiny.py")
  c.model.init_lora_from = str(sft_run)
  c.mesh.fsdp = 8
  c = settings.from_config(c)
  mesh = mesh_lib.make_mesh(c.mesh)
  merged = policy_lib.load_base(c.model, mesh).model
  sft_policy = policy_lib.restore(sft_run, mesh).actor
  tokens = jnp.array([[2, 10, 11, 12, 13, 14]] * 8)
  positions = jnp.arange(6)[None].repeat(8, 0)
  mask = jnp.tril(jnp.ones((8, 6, 6), bool))
  forward = nnx.jit(lambda model: model(tokens, positions, None, mask)[0])  # eager can deadlock 8 CPU devices
  with jax.set_mesh(mesh):
    want, got = forward(sft_policy), forward(merged)
  np.testing.assert_allclose(got, want, atol=1e-4)

  workdir = tmp_path / "grpo"
  run_cli(["train", "--config", "configs/tiny.py", "--workdir", str(workdir),
           f"--config.model.init_lora_from={sft_run}", "--config.train.max_steps=1"])
  assert checkpoints.saved_steps(workdir) == [1]
  with pytest.raises(errors.UserError, match="not a gemma-grpo work directory"):
    policy_lib.merge_into_base(merged, tmp_path, mesh, source="random")
  with pytest.raises(errors.UserError, match="start from a run on the same base model"):
    policy_lib.merge_into_base(merged, sft_run, mesh, source="gguf:gemma-3-270m")


class RecordingWriter:

  def __init__(self):
    self.finished = []

  def finish_through(self, step):
    self.finished.append(step)


def test_progress_hooks_write_each_finished_step_and_stop_on_a_nan_loss():
  writer = RecordingWriter()
  reported = []
  progress = sft._Progress(writer, max_steps=3, on_step=reported.append)  # pylint: disable=protected-access
  progress.on_train_step_end(None, 1, 2.5)
  progress.on_train_step_end(None, 2, 2.0)
  assert writer.finished == [0, 1]
  assert reported == [1, 2]
  with pytest.raises(guards.NonFiniteError, match="sft step 3: loss is nan"):
    progress.on_train_step_end(None, 3, float("nan"))

