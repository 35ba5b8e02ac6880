"""GRPO on GSM8K for google/gemma-3-12b-it: the 1B config's workload and hyperparameters.

  export HF_TOKEN=...   # gemma-3-12b-it is gated: accept its licence first
  python -m gemma_grpo.train --config configs/gemma3_12b.py --workdir runs/g12b
Planned for a v6e-8 with `gemma-grpo plan --config configs/gemma3_12b.py
--topology v6e-8` (docs/results/plan/12b_v6e-8.txt): it fits at 8.55 of 30 GiB
per chip, and a step takes at least 1.11 s (the compiler's cost model: 5.34 s),
most of it decoding. On a v5e-8 it fits too, at 8.69 of 16 GiB per chip, and
takes at least 2.40 s (cost model 10.29 s; docs/results/plan/12b_v5e-8.txt).
Not yet run on any accelerator.
"""

from configs import gemma3_1b


def get_config():
  c = gemma3_1b.get_config()
  c.model.source = "hf:google/gemma-3-12b-it"
  return c
