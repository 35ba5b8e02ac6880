"""The accuracy benchmark: GRPO lifts held-out accuracy on 200 unseen problems.

  python bench/accuracy.py --seeds 0 1 2 --out docs/results/accuracy

(or `python -m gemma_grpo.train --config configs/gemma3_270m_accuracy.py`).
The first command's task and prompt (configs/gemma3_270m.py: reasoning-gym
simple_equations, values 1-10, three solved examples, offline 270M base),
run longer and scored on more: 200 held-out equations, each distinct, and no
training problem is one of them under another letter or wording
(data.heldout_unseen_by = "equation"; the ~100 other equations are trained
on). The 200 are evaluated greedily before the first step and after the
last; bench/accuracy.py prints the paired-bootstrap interval of the
difference. Measured on a 2-core CPU, seeds 0, 1, 2: accuracy 25.5% ->
54.0%, 50.0%, 51.5% (+28.5 [+22.0, +35.0], +24.5 [+18.0, +31.0], +26.0
[+18.5, +33.0] points, 95% intervals), exact format 98.0% -> 100%; 27 to 52
min a seed in all (two 200-problem evals, 20-40 s a step, by the machine's
load). RESULTS.md, docs/results/accuracy.
"""

from configs import gemma3_270m


def get_config():
  c = gemma3_270m.get_config()
  c.data.num_heldout = 200
  c.data.heldout_unseen_by = "equation"
  c.train.max_steps = 60
  c.eval.every_steps = 60  # and before the first step
  c.eval.num_examples = 200
  c.eval.batch_size = 40  # 5 batches; decode on CPU costs little more per row
  c.ckpt.every_steps = 20
  return c
