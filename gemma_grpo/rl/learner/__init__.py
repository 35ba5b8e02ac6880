"""The GRPO-family learner: its rollout-and-advantage step, the losses, log-probs and algorithms."""
