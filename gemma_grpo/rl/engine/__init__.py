"""The rollout engine: each prompt prefilled once, decoding on merged weights, tool turns."""
