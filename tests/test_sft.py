"""Supervised warm start: targets, masks, and a short run that learns."""

import numpy as np
import pytest

from conftest import run_cli
from gemma_grpo import checkpoints
from gemma_grpo import data
from gemma_grpo import errors
from gemma_grpo import metrics
from gemma_grpo import prompts
from gemma_grpo import sft


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


def test_sft_run_lowers_the_loss_and_writes_grpo_style_checkpoints(tmp_path):
  workdir = tmp_path / "sft"
  run_cli(["sft", "--config", "configs/tiny.py", "--workdir", str(workdir),
           "--config.data.reasoning_gym_size=8", "--config.data.num_heldout=0",
           "--config.eval.num_examples=0",
           "--config.sft.max_steps=6", "--config.sft.batch_size=2",
           "--config.sft.max_length=384", "--config.sft.peak_lr=0.02",
           "--config.optim.warmup_fraction=0", "--config.optim.max_grad_norm=1.0",
           "--config.ckpt.every_steps=3"])
  rows = metrics.read_jsonl(workdir / "tensorboard" / "metrics.jsonl")
  losses = [r["actor/train/loss"] for r in rows]
  # A random 2-layer model moves slowly; the run is deterministic, so a small
  # but clear drop from the uniform-distribution loss (ln 262144 = 12.48) is
  # the signal that gradients reach the adapters.
  assert len(losses) == 6 and losses[-1] < losses[0] - 0.03, losses
  assert min(losses[3:]) < min(losses[:3]), losses
  assert checkpoints.saved_steps(workdir)[-1] == 6
