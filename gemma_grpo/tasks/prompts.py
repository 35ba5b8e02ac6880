"""The chat format the policy sees and the answer format the rewards expect.

Gemma has no system role: the instruction goes at the top of the first user
turn, as Gemma's own chat template does. Prompts are rendered to text here
(rather than by a tokenizer's template) so every checkpoint, whatever template
it ships, is trained and evaluated on byte-identical prompts.
"""

from typing import Sequence

REASONING_START = "<reasoning>"
REASONING_END = "</reasoning>"
ANSWER_START = "<answer>"
ANSWER_END = "</answer>"

START_OF_TURN = "<start_of_turn>"
END_OF_TURN = "<end_of_turn>"

SYSTEM_INSTRUCTION = (
    "Solve the math problem. First think it through step by step between "
    f"{REASONING_START} and {REASONING_END}. Then give only the final number "
    f"between {ANSWER_START} and {ANSWER_END}."
)

# Jinja chat template written into exported tokenizers; it renders exactly what
# `render_prompt` renders, so `apply_chat_template` users get the training format.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% set first = namespace(prefix='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{% set first.prefix = message['content'] + '\n\n' %}"
    "{% else %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "<start_of_turn>{{ role }}\n{{ first.prefix }}{{ message['content'] | trim }}"
    "<end_of_turn>\n"
    "{% set first.prefix = '' %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def _turn(role: str, text: str) -> str:
  return f"{START_OF_TURN}{role}\n{text}{END_OF_TURN}\n"


def render_prompt(question: str, system: str = SYSTEM_INSTRUCTION,
                  examples: Sequence[Sequence[str]] = ()) -> str:
  """The instruction and the question in a user turn, then the model turn.

  `examples` are solved problems, (question, reasoning, answer) each, shown
  first as earlier turns of the same chat: a base model that has never seen
  the answer format follows a few worked turns (and learns to end its turn),
  where an instruction alone leaves it rambling to the token limit.
  The tokenizer adds <bos>; it is not part of the text.
  """
  turns = [*examples, (question,)]
  text = []
  for i, (q, *solved) in enumerate(turns):
    user = f"{system}\n\n{q.strip()}" if system and i == 0 else q.strip()
    text.append(_turn("user", user))
    if solved:
      text.append(_turn("model", render_answer(*solved)))
  return "".join(text) + f"{START_OF_TURN}model\n"


def render_answer(reasoning: str, answer: str) -> str:
  """The completion format the rewards score highest, used for SFT targets."""
  return (
      f"{REASONING_START}{reasoning.strip()}{REASONING_END}\n"
      f"{ANSWER_START}{answer.strip()}{ANSWER_END}"
  )
