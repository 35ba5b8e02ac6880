"""GRPO with a calculator: the offline google/gemma-3-270m learns to call a tool.

  python -m gemma_grpo.train --config configs/gemma3_270m_tools.py --workdir runs/tools
  gemma-grpo eval --workdir runs/tools --num-test 16

Multi-digit products from reasoning-gym ("Solve the following
multiplication: 4821 * 367. ..."), three or four digits a factor: a task the
270M base cannot do in its head. The instruction offers a calculator, and one
of three solved examples calls it, `<tool_call>calculator: 9051 * 736</tool_call>`,
answered by `<tool_result>6661536</tool_result>` (gemma_grpo/tasks/tools.py); the
result tokens are read by the model and masked out of the loss
(gemma_grpo/rl/engine/multi_turn.py). A failed call costs 0.25 reward
(rewards.tool_errors). The held-out problems are evaluated greedily, with
the tool, before the first step and after the last; bench/tools.py compares
this run with the same training without the tool (docs/results/tools,
RESULTS.md). Measured 2026-12-05 on a 2-core CPU, 200 held-out problems:
accuracy 0% -> 98.5% (seed 0) and 0% -> 100% (seed 1), every completion
calling the calculator (exact format 37.5% -> 1.5% and 0.0%); 39.7 min in
all for seed 0 (about 65 s a step), 50.6 min for seed 1 on a busier machine.
"""

import ml_collections

from configs import gemma3_270m
from gemma_grpo.tasks import prompts
from gemma_grpo.tasks import tools

# The instruction says how to call the calculator; the solved examples show
# it once, on a product too long to do in one's head, and work two short ones
# out in words. Hand-written, so no example is a training or held-out problem.
INSTRUCTION = (
    f"{prompts.SYSTEM_INSTRUCTION} You have a calculator: write"
    f" {tools.CALL_START}calculator: EXPRESSION{tools.CALL_END} and its value comes back as"
    f" {tools.RESULT_START}VALUE{tools.RESULT_END}."
)
EXAMPLES = (
    ("Solve the following multiplication: 12 * 4. Give only the result as your final answer.",
     "12 * 4 = 48.", "48"),
    ("Solve the following multiplication: 9051 * 736. Give only the result as your final answer.",
     "<tool_call>calculator: 9051 * 736</tool_call><tool_result>6661536</tool_result>"
     " So 9051 * 736 = 6661536.", "6661536"),
    ("Solve the following multiplication: 7 * 30. Give only the result as your final answer.",
     "7 * 30 = 210.", "210"),
)


def get_config():
  c = gemma3_270m.get_config()
  c.data.source = "reasoning_gym:products"
  c.data.reasoning_gym_options = ml_collections.ConfigDict(dict(
      min_terms=2, max_terms=2, min_digits=3, max_digits=4))
  c.data.few_shot = EXAMPLES
  c.data.instruction = INSTRUCTION
  c.data.num_heldout = 32
  c.data.heldout_unseen_by = "question"
  c.rollout.tools = "calculator"
  c.rollout.max_tool_calls = 2
  c.rollout.max_prompt_length = 448  # three solved examples
  c.rollout.max_new_tokens = 96  # tool results included
  c.rollout.kv_cache_size = 544
  c.eval.max_new_tokens = 96
  # One problem's 8 completions per forward/backward: with the examples'
  # 448-token prompt, the whole batch in one pass peaked at 16 GB.
  c.train.micro_batch_size = 1
  c.rewards.weights.tool_errors = 1.0
  # Few samples call the tool at first (6% at temperature 0.9 on 128):
  # a larger step than the first command's 2e-5 spreads them in fewer steps.
  c.optim.peak_lr = 5e-5
  return c
