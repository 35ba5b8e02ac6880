"""Pure reward functions for GRPO on verifiable math, and their registry.

The policy is asked to answer in this format (see `prompts.render_answer`):

  <reasoning>She buys 3 packs of 6, so 3 * 6 = 18.</reasoning>
  <answer>18</answer><end_of_turn>

Every reward has the signature Tunix calls,
`fn(prompts, completions, answer, **kwargs) -> list[float]`, where `answer`
holds one gold string per completion ("72", "-3", "1,234"). Each is pure and
total: whatever the input, it returns one finite float per completion.

  format_exact         3.0 for exactly the format above, else 0.
  format_approx        +0.5 per tag present once, -0.5 per tag missing or
                       repeated: -2..+2.
  answer_correct       3.0 exact text, 1.5 equal after stripping or equal as a
                       number, 0.5 within 10%, 0.25 within 20%, -1.0 wrong,
                       -0.5 no number, 0.0 no <answer> tag.
  number_match         1.5 when the first number in <answer> equals the gold.
  math_verify_correct  3.0 when math-verify proves the answer equal to a
                       LaTeX gold (MATH-style data), else 0.
  tool_errors          -0.25 per tool call whose result is an error; in no
                       preset: weight it with rewards.weights.tool_errors.

Presets weight the raw values (`build_reward_fns` applies them):

  reference  1, 1, 1, 1 on the four GSM8K rewards: the public Tunix GRPO demo.
             Format can pay 3 + 2 = 5.0 while a sloppily formatted correct
             answer may earn only 3.0 + 1.5 - 2 = 2.5, so a perfectly
             formatted wrong answer (5.0 - 1.0 = 4.0 or more) beats it: the
             policy learns to format instead of to solve.
  guarded    (default) weights w_e, w_a, w_c, w_n on format_exact,
             format_approx, answer_correct, number_match. A completion whose
             answer is numerically correct scores at least
               0·w_e - 2·w_a + 1.5·w_c + 0·w_n
             (no exact format, every tag missing or repeated, the 1.5 tier,
             first number not the gold: "<answer>5 then 72<answer>").
             A wrong one scores at most
               3·w_e + 2·w_a + 0.5·w_c + 1.5·w_n
             (perfect format, within 10% of the gold, and a hedged first
             number equal to the gold: "<answer>72 or 75</answer>").
             Correct strictly wins iff w_c > 3·w_e + 4·w_a + 1.5·w_n. With
             w_e = w_a = w_n = 0.5 and w_c = 5: 6.5 > 5.75.
  math       math_verify_correct 1 with format_exact and format_approx at 0.1:
             a verified answer scores >= 3.0 - 0.2 = 2.8, any other <= 0.5.
"""

from collections.abc import Callable, Mapping, Sequence
import enum
import functools
import logging
import math
import numbers
from typing import Any

from gemma_grpo import config as config_lib
from gemma_grpo import errors
from gemma_grpo.config import settings
from gemma_grpo.tasks import answers
from gemma_grpo.tasks import tools
from gemma_grpo import user_code

RewardFn = Callable[..., list[float]]
Texts = Sequence[str]  # Tunix's batch columns; junk input is scored too.


class Grade(enum.Enum):
  """How an extracted answer compares with the gold, best first."""
  EXACT = "exact"            # same text
  STRIPPED = "stripped"      # same text after stripping whitespace
  EQUAL = "equal"            # same number, other text: "18.0", "$18" for "18"
  CLOSE = "close"            # guess / gold in [0.9, 1.1]
  NEAR = "near"              # guess / gold in [0.8, 1.2]
  WRONG = "wrong"            # any other number
  NO_NUMBER = "no_number"    # <answer> holds no readable number
  NO_ANSWER = "no_answer"    # no <answer> tag
  NO_GOLD = "no_gold"        # the gold itself holds no number: no signal


# A numerically equal answer in other words ("18.0" for "18") earns the
# stripped tier, not the exact one: the exact tier rewards the clean format the
# evaluation parser is sure to read, the 1.5 keeps the answer clearly correct.
_ANSWER_REWARD = {
    Grade.EXACT: 3.0, Grade.STRIPPED: 1.5, Grade.EQUAL: 1.5,
    Grade.CLOSE: 0.5, Grade.NEAR: 0.25, Grade.WRONG: -1.0,
    Grade.NO_NUMBER: -0.5, Grade.NO_ANSWER: 0.0, Grade.NO_GOLD: 0.0,
}
_CORRECT = frozenset({Grade.EXACT, Grade.STRIPPED, Grade.EQUAL})
_PARTIAL = _CORRECT | {Grade.CLOSE}
_RATIO_SLACK = 1e-9  # 19.8 / 18 is 1.1000000000000001 in floats: still 10%.


def _gold_text(gold: Any) -> str | None:
  if isinstance(gold, str):  # Gold answers are strings; numbers are printed.
    return gold
  if isinstance(gold, numbers.Real) and not isinstance(gold, bool):
    return str(gold)
  return None


def grade_answer(completion: Any, gold: Any) -> Grade:
  """Grades the text inside the completion's <answer> against `gold`.

  The whole answer text is read as a number when it is one, else its last
  number ("so the total is 18" -> 18), as `answers.parse_number` does. Against
  a gold of 0 the ratio is undefined: only an equal number counts. A guess of
  the other sign than the gold has a negative ratio, so it is WRONG.
  """
  guess = answers.extract_answer(completion)
  if guess is None:
    return Grade.NO_ANSWER
  gold_text = _gold_text(gold)
  if gold_text and gold_text.strip():  # A blank gold must not reward "".
    if guess == gold_text:
      return Grade.EXACT
    if guess.strip() == gold_text.strip():
      return Grade.STRIPPED
  target = answers.parse_number(gold_text)
  if target is None:
    return Grade.NO_GOLD
  value = answers.parse_number(guess)
  if value is None:
    return Grade.NO_NUMBER
  if answers.numbers_equal(value, target):
    return Grade.EQUAL
  if target == 0:
    return Grade.WRONG
  ratio = value / target
  if 0.9 - _RATIO_SLACK <= ratio <= 1.1 + _RATIO_SLACK:
    return Grade.CLOSE
  if 0.8 - _RATIO_SLACK <= ratio <= 1.2 + _RATIO_SLACK:
    return Grade.NEAR
  return Grade.WRONG


def is_correct(completion: Any, gold: Any) -> bool:
  """The answer equals the gold as text or as a number (accuracy)."""
  return grade_answer(completion, gold) in _CORRECT


def is_partially_correct(completion: Any, gold: Any) -> bool:
  """The answer is within 10% of the gold, correct answers included.

  So partial accuracy >= accuracy; against a gold of 0 only 0 counts.
  """
  return grade_answer(completion, gold) in _PARTIAL



def score_completion(completion: Any, gold: Any) -> dict[str, Any]:
  """What the evaluation reports about one completion.

  Returns {answer: text inside <answer> or None, number: the number read from
  it or None, grade: a `Grade` value such as "close", and the booleans
  correct, partial, exact_format of `is_correct`, `is_partially_correct` and
  `has_exact_format`}.
  """
  answer = answers.extract_answer(completion)
  grade = grade_answer(completion, gold)
  return {
      "answer": answer,
      "number": answers.parse_number(answer),
      "grade": grade.value,
      "correct": grade in _CORRECT,
      "partial": grade in _PARTIAL,
      "exact_format": answers.has_exact_format(completion),
  }


def _as_list(items: Any) -> list[Any]:
  """A batch column as a list: None is empty, a string or scalar one item."""
  if items is None:
    return []
  if isinstance(items, (str, bytes)):
    return [items]
  try:
    return list(items)
  except TypeError:
    return [items]


def _score_batch(score: Callable[[Any, Any], float], completions: Any,
                 answer: Any) -> list[float]:
  """Applies a per-completion score to a batch; never raises.

  A single gold is shared by every completion; missing golds are None.
  """
  completions, golds = _as_list(completions), _as_list(answer)
  if len(golds) == 1:
    golds = golds * len(completions)
  golds += [None] * (len(completions) - len(golds))
  scores = []
  for completion, gold in zip(completions, golds):
    try:
      value = float(score(completion, gold))
    except Exception as e:  # pylint: disable=broad-except
      # The last line of defence for totality: a reward bug must cost one
      # completion its score, not the training step. Tests assert it is unused.
      logging.getLogger(__name__).warning(
          "%s raised %s; scored 0.0", score.__name__, type(e).__name__)
      value = 0.0
    scores.append(value if math.isfinite(value) else 0.0)
  return scores


def _format_exact(completion: Any, gold: Any) -> float:
  del gold  # Format only.
  return 3.0 if answers.has_exact_format(completion) else 0.0


def _format_approx(completion: Any, gold: Any) -> float:
  del gold  # Format only.
  return sum(0.5 if n == 1 else -0.5 for n in answers.tag_counts(completion))


def _answer_correct(completion: Any, gold: Any) -> float:
  return _ANSWER_REWARD[grade_answer(completion, gold)]


def _number_match(completion: Any, gold: Any) -> float:
  guess = answers.parse_number(answers.extract_answer(completion), first=True)
  target = answers.parse_number(_gold_text(gold))
  if guess is None or target is None:
    return 0.0
  return 1.5 if answers.numbers_equal(guess, target) else 0.0


def _math_verify_correct(completion: Any, gold: Any) -> float:
  return 3.0 if answers.math_equal(completion, _gold_text(gold)) else 0.0


def _tool_errors(completion: Any, gold: Any) -> float:
  del gold  # Tool use only.
  _, failed = tools.count_calls(completion)
  return -0.25 * failed


def format_exact(prompts: Texts, completions: Texts, answer: Texts,
                 **kwargs: Any) -> list[float]:
  """3.0 for exactly this, else 0.0:

    <reasoning>…</reasoning>
    <answer>…</answer><end_of_turn><eos>

  Only whitespace around and between the blocks; the trailing markers are
  optional; both blocks non-blank, no tag nested or repeated.
  """
  del prompts, kwargs  # Scored from the completion alone.
  return _score_batch(_format_exact, completions, answer)


def format_approx(prompts: Texts, completions: Texts, answer: Texts,
                  **kwargs: Any) -> list[float]:
  """+0.5 per tag present exactly once, -0.5 per tag missing or repeated.

  Tags: <reasoning>, </reasoning>, <answer>, </answer>; range -2.0..+2.0.
  "<reasoning>…</reasoning><answer>42</answer>" scores 2.0 in any order.
  """
  del prompts, kwargs  # Scored from the completion alone.
  return _score_batch(_format_approx, completions, answer)


def answer_correct(prompts: Texts, completions: Texts, answer: Texts,
                   **kwargs: Any) -> list[float]:
  """3.0 exact, 1.5 after stripping or equal as a number, partial by ratio.

  Reads "<answer>42</answer>" against gold "42": 3.0 for "42"; 1.5 for " 42 ",
  "42.0", "$42"; 0.5 if guess/gold in [0.9, 1.1]; 0.25 in [0.8, 1.2]; -1.0
  otherwise; -0.5 if no number; 0.0 without an <answer> tag. See `Grade`.
  """
  del prompts, kwargs  # Scored from the completion alone.
  return _score_batch(_answer_correct, completions, answer)


def number_match(prompts: Texts, completions: Texts, answer: Texts,
                 **kwargs: Any) -> list[float]:
  """1.5 when the first number after <answer> equals the gold number, else 0.

  Lenient about format: "<answer>42 apples" (unclosed) with gold "42" scores
  1.5; "<answer>6 * 7 = 42</answer>" scores 0.0, its first number being 6.
  """
  del prompts, kwargs  # Scored from the completion alone.
  return _score_batch(_number_match, completions, answer)


def math_verify_correct(prompts: Texts, completions: Texts, answer: Texts,
                        **kwargs: Any) -> list[float]:
  """3.0 when math-verify proves the answer equal to the LaTeX gold, else 0.

  Expects "<reasoning>…</reasoning><answer>\\frac{3}{4}</answer>" for gold
  "\\frac{3}{4}" ("0.75" and "\\boxed{3/4}" count too); without an <answer>
  tag, the last \\boxed{} or number of the completion is read. Safe to call
  from any thread; see `answers.math_equal` for the bounds on hostile input.
  """
  del prompts, kwargs  # Scored from the completion alone.
  return _score_batch(_math_verify_correct, completions, answer)


def tool_errors(prompts: Texts, completions: Texts, answer: Texts,
                **kwargs: Any) -> list[float]:
  """-0.25 per failed tool call: a result the tools answered with "error:".

  "<reasoning><tool_call>calculator: 1/0</tool_call><tool_result>error:
  division by zero</tool_result></reasoning><answer>?</answer>" scores -0.25;
  a completion without calls, or whose calls all succeeded, scores 0.0.
  """
  del prompts, kwargs  # Scored from the completion alone.
  return _score_batch(_tool_errors, completions, answer)


# The functions above by name, in the order of the config's list of them
# (config.REWARD_FUNCTIONS, the keys of rewards.weights).
REWARD_FUNCTIONS: dict[str, RewardFn] = {
    name: globals()[name] for name in config_lib.REWARD_FUNCTIONS}

DEFAULT_PRESET = config_lib.defaults().rewards.preset
PRESETS: dict[str, dict[str, float]] = {
    "reference": {"format_exact": 1.0, "format_approx": 1.0,
                  "answer_correct": 1.0, "number_match": 1.0},
    "guarded": {"format_exact": 0.5, "format_approx": 0.5,
                "answer_correct": 5.0, "number_match": 0.5},
    "math": {"math_verify_correct": 1.0, "format_exact": 0.1,
             "format_approx": 0.1},
}


def _weighted(fn: RewardFn, weight: float) -> RewardFn:
  """`fn` times `weight`, keeping `__name__` (Tunix logs rewards/<name>)."""

  @functools.wraps(fn)
  def weighted(prompts: Texts, completions: Texts, answer: Texts,
               **kwargs: Any) -> list[float]:
    scores = (weight * r for r in fn(prompts, completions, answer, **kwargs))
    return [s if math.isfinite(s) else 0.0 for s in scores]  # huge weights

  return weighted


def _check_weight(name: str, weight: Any) -> float:
  if name not in REWARD_FUNCTIONS:
    raise ValueError(f"rewards.weights.{name}: unknown reward function; "
                     f"choose from {', '.join(REWARD_FUNCTIONS)}")
  if (not isinstance(weight, numbers.Real) or isinstance(weight, bool) or
      not math.isfinite(weight)):
    raise ValueError(f"rewards.weights.{name}: {weight!r} is not a finite "
                     "number; use a float, or None for the preset's weight")
  return float(weight)


def build_reward_fns(preset: str = DEFAULT_PRESET,
                     weights: Mapping[str, float | None] | None = None
                     ) -> list[RewardFn]:
  """The weighted reward functions to hand to Tunix, in registry order.

  Args:
    preset: a key of PRESETS.
    weights: per-function overrides; None keeps the preset's weight. A
      function ends up in the list iff its weight is non-zero.

  Raises:
    ValueError: an unknown preset, function name or non-finite weight, or all
      weights zero; the message names the config field.
  """
  if not isinstance(preset, str) or preset not in PRESETS:
    raise ValueError(f"rewards.preset: unknown preset {preset!r}; "
                     f"choose from {', '.join(PRESETS)}")
  chosen = dict(PRESETS[preset])
  for name, weight in (weights.items() if weights else ()):
    if weight is not None or name not in REWARD_FUNCTIONS:
      chosen[name] = _check_weight(name, weight)
  fns = [_weighted(fn, chosen[name]) for name, fn in REWARD_FUNCTIONS.items()
         if chosen.get(name, 0.0) != 0.0]
  if not fns:
    raise ValueError("rewards.weights: every weight is zero; give at least "
                     f"one of {', '.join(REWARD_FUNCTIONS)} a non-zero weight")
  return fns


def load_custom(spec: str) -> list[RewardFn]:
  """Your own reward functions, `module:function[,module:function...]`.

  Each is called like the built-in ones, fn(prompts, completions, answer,
  **columns) -> list[float], with weight 1 (scale inside the function), and
  logged as rewards/<function name>.
  """
  fns = []
  for item in (part.strip() for part in (spec or "").split(",")):
    if not item:
      continue
    fn = user_code.named_function(item, "rewards.custom")
    if fn.__name__ in REWARD_FUNCTIONS or fn.__name__ in (f.__name__ for f in fns):
      raise ValueError(f"rewards.custom: {item!r} clashes with another reward named "
                       f"{fn.__name__!r} (metrics are keyed by name); rename it")
    fns.append(fn)
  return fns


def from_settings(r: settings.RewardSettings) -> list[RewardFn]:
  """The reward functions of a run's `rewards` settings."""
  return build_reward_fns(r.preset, dict(r.weights)) + load_custom(r.custom)


def check(r: settings.RewardSettings) -> None:
  """Raises UserError (one line) if the `rewards` settings name no valid set of rewards.

  Builds the functions once, so an unknown preset, weight name or custom
  function fails before the model loads; call it right after config.validate.
  """
  try:
    from_settings(r)
  except ValueError as e:
    raise errors.UserError(str(e)) from None
