"""DAPO (arXiv 2503.14476) on the offline default's equations, on CPU.

  python -m gemma_grpo.train --config configs/gemma3_270m_dapo.py

The offline default (configs/gemma3_270m.py) with the whole DAPO recipe:
clip-higher (ratio in [1 - 0.2, 1 + 0.28]), token-level loss mean, no KL,
an overlong penalty over the last 16 tokens, dynamic sampling (groups whose
rewards are all equal are replaced by fresh prompts, up to 2 extra rollouts
per batch), and, as in the paper, one rollout batch split over several
updates (train.mini_batch_size; the paper: 512 prompts in 16 mini-batches,
here 2 in 2): the second update scores samples of the policy before the
first, so the ratio leaves 1 and the asymmetric clip acts
(`plots/clipping.png`). Steps count updates: 20 steps are 10 rollout
batches. Not benchmarked: a step costs half a rollout plus the extra
rounds of dynamic sampling.
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
  c.train.mini_batch_size = 1  # of train.batch_size = 2: two updates per rollout
  c.ckpt.every_steps = 10
  return c
