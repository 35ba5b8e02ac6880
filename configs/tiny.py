"""A tiny random-init Gemma-3 for tests and smoke checks (offline).

  python -m gemma_grpo.train --config configs/tiny.py --workdir /tmp/tiny
Two steps on a 2-core CPU in about 20 s with a warm compilation cache, 40 s
cold (measured: BENCHMARKS.md). Uses the offline Gemma tokenizer, converted on first use.
"""

from gemma_grpo import config


def get_config():
  c = config.defaults()
  c.model.source = "random"
  c.model.random.num_layers = 2
  c.model.random.embed_dim = 64
  c.model.random.hidden_dim = 128
  c.model.random.num_heads = 4
  c.model.random.head_dim = 16
  c.model.random.num_kv_heads = 1
  c.lora.rank = 4
  c.lora.alpha = 4.0
  c.data.source = "reasoning_gym:gsm_symbolic"
  c.data.reasoning_gym_size = 64
  c.data.num_heldout = 4
  c.grpo.num_generations = 2
  c.rollout.max_prompt_length = 192
  c.rollout.max_new_tokens = 16
  c.rollout.kv_cache_size = 208
  c.optim.peak_lr = 1e-3  # random weights: let the update be visible
  c.train.max_steps = 2
  c.train.batch_size = 2
  c.eval.every_steps = 0
  c.eval.num_examples = 4
  c.eval.batch_size = 4
  c.eval.max_new_tokens = 16
  c.log.flush_every_steps = 1
  c.ckpt.every_steps = 1
  return c
