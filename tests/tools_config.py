"""configs/gemma3_270m_tools.py, small, with every solved example calling the tool.

The offline 270M then calls the calculator in nearly every completion, which
tests/test_multi_turn.py needs to run the tool loop on a mesh of two
processes: one step of 2 problems x 2 samples, no reference pass, no eval.
"""

from configs import gemma3_270m_tools

EXAMPLES = tuple(
    (f"Solve the following multiplication: {a} * {b}. Give only the result as your final answer.",
     f"<tool_call>calculator: {a} * {b}</tool_call><tool_result>{a * b}</tool_result>"
     f" So {a} * {b} = {a * b}.", str(a * b))
    for a, b in ((482, 367), (9051, 736), (2718, 4096)))


def get_config():
  c = gemma3_270m_tools.get_config()
  c.data.few_shot = EXAMPLES
  c.data.num_heldout = 4
  c.data.heldout_unseen_by = "none"
  c.data.reasoning_gym_size = 64
  c.grpo.num_generations = 2
  c.grpo.beta = 0.0
  c.grpo.log_kl = False
  c.train.batch_size = 2
  c.train.max_steps = 1
  c.rollout.max_prompt_length = 512  # the instruction and three calls
  c.rollout.max_new_tokens = 72
  c.rollout.kv_cache_size = 512 + 72
  c.sft.max_length = 640  # unused here; must exceed the prompt length
  c.eval.every_steps = 0
  c.eval.num_examples = 4
  c.eval.max_new_tokens = 72
  c.ckpt.every_steps = 1
  return c
