"""Gemma-3 for RL: loading (GGUF, Hugging Face), the tokenizer, LoRA, a run's policy."""
