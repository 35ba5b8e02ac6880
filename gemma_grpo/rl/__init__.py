"""The RL library, one subpackage per job (docs/architecture.md):

  run/      a training run: the loop, its hooks, the RLCluster, the optimizer
  eval/     evaluation, in training and for `gemma-grpo eval`
  engine/   the rollout engine: prefill, decode, sampling, tool turns
  learner/  the GRPO-family learner and its maths: losses, log-probs, algorithms

run imports the other three, eval imports the engine, and the engine and
the learner import neither each other nor anything above them
(tests/test_architecture.py).
"""
