"""GRPO on GSM8K for google/gemma-3-1b-it with the reference hyperparameters.

  export HF_TOKEN=...   # gemma-3-1b-it is gated: accept its licence first
  python -m gemma_grpo.train --config configs/gemma3_1b.py --workdir runs/g1b
Needs the hub (weights and openai/gsm8k). 100 steps of 4 prompts x 2
completions x up to 512 tokens; on a TPU VM see launch/README.md. Planned
for a v5e-8 with `gemma-grpo plan` (docs/results/plan/1b_v5e-8.txt): it fits
at 1.74 of 16 GiB per chip, and a step takes at least 0.21 s, 0.17 s of it
decoding; the compiler's cost model gives 0.91 s. There, add
--config.mesh.tp=4 (fsdp 2 x tp 4): 0.59 s by the same model, 2.44 GiB per
chip (docs/results/plan/mesh/). The default mesh (fsdp over every device)
keeps the config valid on any device count. No accelerator step time is
measured yet (bench/gpu/run.sh measures one on a lent GPU).
"""

from gemma_grpo import config


def get_config():
  c = config.defaults()
  c.model.source = "hf:google/gemma-3-1b-it"
  c.model.dtype = "bfloat16"
  c.lora.rank = 32  # r
  c.lora.alpha = 32.0  # scale alpha / r = 1
  c.data.source = "gsm8k"
  c.data.shuffle_seed = 42
  c.optim.peak_lr = 3e-6
  c.optim.warmup_fraction = 0.1  # 10 of 100 steps, linear from 0
  c.optim.max_grad_norm = 0.1
  c.optim.weight_decay = 0.1
  c.optim.b1, c.optim.b2 = 0.9, 0.99
  c.train.max_steps = 100
  c.train.batch_size = 4  # prompts per step
  c.grpo.num_generations = 2  # G
  c.grpo.num_iterations = 1  # mu
  c.grpo.beta = 0.08  # KL weight
  c.grpo.epsilon = 0.2
  # TIS cap C: verl's token-level default (TRL 1.16's 3.0 is for its sequence-level default mode).
  c.grpo.tis_cap = 2.0
  c.rollout.temperature = 0.9
  c.rollout.top_p = 1.0
  c.rollout.top_k = 50
  c.rollout.decode_dtype = "bfloat16"  # the weights are bfloat16: a float32 copy doubles decode's reads; TIS corrects the rest
  c.rollout.max_prompt_length = 256
  c.rollout.max_new_tokens = 512
  c.rollout.kv_cache_size = 1024
  c.eval.every_steps = 25
  c.eval.max_new_tokens = 512
  c.log.flush_every_steps = 10
  return c
