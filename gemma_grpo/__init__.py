"""gemma-grpo: teach Gemma-3 to reason with GRPO on verifiable math, on Tunix."""

__version__ = "0.1.0"
