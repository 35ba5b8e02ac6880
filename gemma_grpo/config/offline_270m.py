"""The offline Gemma-3-270M settings: configs/gemma3_270m.py, and `gemma-grpo eval` without --config.

Here, not only in configs/, so that an installed package (which ships no
configs/ folder) still evaluates on the first command's task. What the
settings measure and how long they run: configs/gemma3_270m.py's docstring.
"""

import ml_collections

from gemma_grpo.config.defaults import defaults

# Hand-written, so no example is a training or held-out problem.
EXAMPLES = (
    ("Solve for x: x + 7 = 15",
     "x + 7 = 15. Subtract 7 from both sides: x = 15 - 7 = 8.", "8"),
    ("Find the value of k in the equation: k - 9 = 4",
     "k - 9 = 4. Add 9 to both sides: k = 4 + 9 = 13.", "13"),
    ("Determine the value of y that satisfies: 20 - y = 6",
     "20 - y = 6. Add y to both sides: 20 = 6 + y. Subtract 6 from both sides:"
     " y = 20 - 6 = 14.", "14"),
)


def offline_270m() -> ml_collections.ConfigDict:
  """The first command's settings: configs/gemma3_270m.py returns exactly these."""
  c = defaults()
  c.data.source = "reasoning_gym:simple_equations"
  c.data.reasoning_gym_options = ml_collections.ConfigDict(dict(
      min_terms=2, max_terms=2, min_value=1, max_value=10,
      operators=("+", "-"), operators_weights=(0.5, 0.5)))
  c.data.few_shot = EXAMPLES
  c.grpo.num_generations = 8
  c.grpo.beta = 0.04
  c.train.batch_size = 2
  c.train.max_steps = 20
  c.rollout.max_prompt_length = 384
  c.rollout.max_new_tokens = 64
  c.rollout.kv_cache_size = 448
  c.rollout.stop_text = "</answer>"
  c.optim.peak_lr = 2e-5
  c.optim.warmup_fraction = 0.0  # 20 steps: no step to spare at rate 0
  c.eval.every_steps = 20  # and before the first step
  c.eval.batch_size = 32  # all of eval.num_examples in one batch: a decode step reads every weight, whatever the rows
  c.eval.max_new_tokens = 64
  c.log.flush_every_steps = 1
  return c
