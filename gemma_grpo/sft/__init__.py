"""Supervised LoRA training on worked solutions (`gemma-grpo sft`), beside RL."""
