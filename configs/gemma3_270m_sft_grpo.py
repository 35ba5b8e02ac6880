"""GRPO on GSM8K from the SFT warm start, for the offline gemma-3-270m on CPU.

  gemma-grpo sft --config configs/gemma3_270m_sft.py \
      --config.data.source=/path/to/gsm8k/train.jsonl --workdir runs/gemma3_270m_sft
  python -m gemma_grpo.train --config configs/gemma3_270m_sft_grpo.py \
      --config.data.source=/path/to/gsm8k/train.jsonl --workdir runs/gemma3_270m_sft_grpo
The SFT adapter is merged into the base, which is also the KL reference, and
a fresh adapter is trained. About a minute per step on a 2-core CPU
(completions up to 256 tokens): 20 steps and three 16-problem held-out evals
took 27.5 minutes on 2026-12-02 (bench/gsm8k.sh; RESULTS.md).

Rewards: the reference preset, not the guarded default. After SFT the 270M
answers ~1% of GSM8K correctly and loops until the length limit on ~45% of
problems under greedy decoding. With guarded weights a wrong answer costs 5
while a completion that never closes its tags costs ~0.5, so GRPO would learn
to stop answering; the reference weights pay for finishing the format, and
with accuracy this low there is no accuracy for format hacking to trade away
(RESULTS.md checks it did not fall).
"""

from configs import gemma3_270m_sft


def get_config():
  c = gemma3_270m_sft.gsm8k_270m()
  c.model.init_lora_from = "runs/gemma3_270m_sft"
  c.data.source = "gsm8k"
  c.data.num_heldout = 32
  c.rewards.preset = "reference"  # see the docstring
  c.grpo.num_generations = 4
  c.grpo.beta = 0.04
  c.train.batch_size = 2
  c.train.max_steps = 20
  # SFT solutions run to ~190 tokens at the 95th percentile; a cut completion
  # loses its answer tag and with it every reward.
  c.rollout.max_new_tokens = 256
  # At 0.9 nearly every sample is well formed and most groups carry no signal,
  # while greedy decoding (what eval measures) still loops on ~45% of
  # problems; closer to greedy, the loops show up in the samples and are
  # penalised.
  c.rollout.temperature = 0.5
  c.rollout.kv_cache_size = 512
  c.optim.peak_lr = 3e-5  # a fresh LoRA adapter; 20 updates
  c.eval.every_steps = 10
  c.eval.num_examples = 16
  c.eval.max_new_tokens = 256
  c.ckpt.every_steps = 10
  return c
