"""GRPO on GSM8K for google/gemma-3-4b-it: the 1B config's workload and hyperparameters.

  export HF_TOKEN=...   # gemma-3-4b-it is gated: accept its licence first
  python -m gemma_grpo.train --config configs/gemma3_4b.py --workdir runs/g4b
Planned for a v5e-8 with `gemma-grpo plan --config configs/gemma3_4b.py
--topology v5e-8` (docs/results/plan/4b_v5e-8.txt): it fits at 3.80 of 16 GiB
per chip, and a step takes at least 0.80 s (the compiler's cost model: 3.37 s),
most of it decoding. Not yet run on any accelerator.
"""

from configs import gemma3_1b


def get_config():
  c = gemma3_1b.get_config()
  c.model.source = "hf:google/gemma-3-4b-it"
  return c
