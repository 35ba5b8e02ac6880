"""GRPO on GSM8K from the SFT warm start, for the offline gemma-3-270m on CPU.

  gemma-grpo sft --config configs/gemma3_270m_sft.py \
      --config.data.source=/path/to/gsm8k/train.jsonl --workdir runs/gemma3_270m_sft
  python -m gemma_grpo.train --config configs/gemma3_270m_sft_grpo.py \
      --config.data.source=/path/to/gsm8k/train.jsonl --workdir runs/gemma3_270m_sft_grpo
The SFT adapter is merged into the base, which is also the KL reference, and
a fresh adapter is trained with the guarded reward preset. About 45 s per
step on a 2-core CPU (completions up to 256 tokens), 20 steps and two
held-out evals in about 20 minutes (measured: RESULTS.md).
"""

from configs import gemma3_270m


def get_config():
  c = gemma3_270m.get_config()
  c.model.init_lora_from = "runs/gemma3_270m_sft"
  c.data.source = "gsm8k"
  c.data.num_heldout = 32
  c.rewards.preset = "guarded"  # a correct answer outscores any well-formed wrong one
  c.grpo.num_generations = 4
  c.grpo.beta = 0.04
  c.train.batch_size = 2
  c.train.max_steps = 20
  # SFT solutions run to ~190 tokens at the 95th percentile; a cut completion
  # loses its answer tag and with it every reward.
  c.rollout.max_new_tokens = 256
  c.rollout.kv_cache_size = 512
  c.optim.peak_lr = 5e-6
  c.eval.every_steps = 10
  c.eval.num_examples = 16
  c.eval.max_new_tokens = 256
  c.ckpt.every_steps = 10
  return c
