"""DAPO (arXiv 2503.14476) on the offline default's equations, on CPU.

  python -m gemma_grpo.train --config configs/gemma3_270m_dapo.py

The offline default (configs/gemma3_270m.py) with the whole DAPO recipe:
clip-higher (ratio in [1 - 0.2, 1 + 0.28]), token-level loss mean, no KL,
an overlong penalty over the last 16 tokens, dynamic sampling (groups whose
rewards are all equal are replaced by fresh prompts, up to 2 extra rollouts
per batch), and two updates per batch: from the second update on the ratio
leaves 1, so the asymmetric clip acts (`plots/clipping.png`). The paper
splits each rollout batch over 16 mini-batch updates; here each batch is
trained twice whole (grpo.num_iterations=2), the off-policy mode this
trainer has. Steps count updates: 14 steps are 7 rollout batches. Not
benchmarked: a step costs a rollout every other step plus the extra rounds
of dynamic sampling.
"""

from configs import gemma3_270m


def get_config():
  c = gemma3_270m.get_config()
  c.grpo.algorithm = "dapo"
  c.grpo.beta = 0.0
  c.grpo.epsilon = 0.2
  c.grpo.epsilon_high = 0.28
  c.grpo.overlong_buffer = 16
  c.grpo.overlong_penalty = 1.0
  c.grpo.dynamic_sampling = True
  c.grpo.max_resample_rounds = 2
  c.grpo.num_iterations = 2
  c.ckpt.every_steps = 14
  return c
