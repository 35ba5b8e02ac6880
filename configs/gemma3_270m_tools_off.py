"""The control arm of bench/tools.py: configs/gemma3_270m_tools.py without the tool.

  python -m gemma_grpo.train --config configs/gemma3_270m_tools_off.py --workdir runs/no_tool

The same task, data, seeds and training; the instruction offers no tool, and
the solved example that called the calculator gives its product in words.
What the tool-trained model gains over this run is the tool's.
"""

from configs import gemma3_270m_tools

EXAMPLES = tuple(
    (question, f"{question.split(': ')[1].split('.')[0]} = {answer}.", answer)
    for question, _, answer in gemma3_270m_tools.EXAMPLES)  # the tool's example in words


def get_config():
  c = gemma3_270m_tools.get_config()
  c.data.few_shot = EXAMPLES
  c.data.instruction = ""  # the default: no calculator mentioned
  c.rollout.tools = ""
  c.rewards.weights.tool_errors = None
  return c
