"""Supervised warm start: `gemma-grpo sft --config configs/gemma3_270m_sft.py`.

A pretrained base never writes <reasoning>/<answer> tags, so at first GRPO
has no format reward to compare between completions. Tulu 3 trains SFT
before RL with verifiable rewards; we do the same on worked solutions
(GSM8K's, calculator annotations removed, or reasoning-gym's) rewritten as

  <reasoning>…</reasoning>
  <answer>72</answer><end_of_turn>

with the loss on the model turn only. Checkpoints use the GRPO layout, so
`eval` and `export` read SFT runs too, and `train` starts GRPO from one with
`--config.model.init_lora_from=<sft workdir>` (the SFT adapter is merged
into the base, which then is also the KL reference).

Arguments and exit codes: gemma_grpo.commands.command (shared with `train`);
the training itself: gemma_grpo.sft.sft.
"""

from __future__ import annotations

import sys

import ml_collections

from gemma_grpo.commands import command
from gemma_grpo.config import settings

def sft(c: ml_collections.ConfigDict, workdir: str) -> int:
  """Runs supervised LoRA training on a validated config; returns the exit code."""
  # JAX and Tunix load only now, once the config is known to be good.
  from gemma_grpo.sft import sft as sft_lib  # pylint: disable=g-import-not-at-top

  command.freeze_loaded_modules()
  return sft_lib.sft(settings.from_config(c), workdir)


def main(argv: list[str] | None = None) -> int:
  """`gemma-grpo sft --config FILE [--workdir DIR] [--config.x.y=v ...]`."""
  return command.main(argv, prog="gemma-grpo sft", doc=__doc__, run=sft)


if __name__ == "__main__":
  sys.exit(main())
