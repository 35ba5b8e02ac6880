"""SFT warm start of the offline google/gemma-3-270m on GSM8K worked solutions.

  gemma-grpo sft --config configs/gemma3_270m_sft.py \
      --config.data.source=/path/to/gsm8k/train.jsonl --workdir runs/gemma3_270m_sft
The pretrained base never writes <reasoning>/<answer>; 80 LoRA updates of 4
solutions each teach it the format (55.5% exact format on GSM8K test 1-256,
RESULTS.md). About 15-20 s per update on a 2-core CPU; the run of
2026-12-01 took 41 minutes with a benchmark sharing the machine for 24 of
them. `--config.sft.max_steps=400` trains five times longer (the
learning-rate schedule stretches with it). Without a data path it reads
openai/gsm8k from the hub. Then GRPO: configs/gemma3_270m_sft_grpo.py.
"""

from gemma_grpo import config


def gsm8k_270m():
  """The offline 270M on CPU, sized for GSM8K prompts: what both GSM8K configs share.

  (The settings configs/gemma3_270m.py had before it became the few-shot
  equations default; RESULTS.md's runs used them.)
  """
  c = config.defaults()
  c.model.source = "gguf:gemma-3-270m"
  c.model.dtype = "float32"  # bf16 is slower on CPU
  c.data.source = "gsm8k"  # training solutions; never GSM8K test
  c.data.num_heldout = 32
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


def get_config():
  c = gsm8k_270m()
  # 320 tokens keep ~96% of GSM8K train (prompt + solution); longer ones are
  # dropped rather than cut, so every target ends with its answer.
  c.sft.max_length = 320
  c.sft.max_steps = 80
  c.sft.batch_size = 4
  c.sft.peak_lr = 2e-4
  c.ckpt.every_steps = 20
  c.ckpt.keep = 2
  c.log.flush_every_steps = 10
  return c
