"""Reading a completion: its format, its answer text and the number in it.

A completion the rewards score highest looks like

  <reasoning>Half of 36 is 18.</reasoning>
  <answer>18</answer><end_of_turn>

Everything here is pure and total: any input (None, bytes, a 100k-character
string, tag soup, Unicode digits) gives a value, never an exception. Work on
long text is bounded by scanning a fixed-size prefix or suffix.

Numbers. `parse_number` reads the first or the last number in a text:
  -3, −3 (U+2212)           negative; "10 - 3" is two numbers, 10 and 3
  1,234 and 1,234,567.5     comma is a thousands separator only ("0,5" is 0, 5)
  18.0, .5, 1.5e3           decimals and scientific notation
  $18, €5, 18 dollars, 18%  currency and units are ignored around the number
  3/4, -1/2, \\frac{3}{4}   simple fractions become their value
  \\boxed{18}               read like any other text
  ٤٢, ４２                  any Unicode decimal digits (Python's float reads them)
NaN, infinities, "1e999" and numbers too long for a float give None.
"""

import decimal
import functools
import itertools
import math
import re
import threading
from typing import Any

from gemma_grpo.tasks import prompts

# Deferred imports (sympy, math_verify): slow to import, only the LaTeX path
# needs them, and checking a config imports the rewards and so this module.

# How much of a text the number scanner reads: answers are short, and a bound
# keeps a 100k-character completion as cheap as a normal one.
SCAN_CHARS = 1000

# Markers Gemma may leave after its answer; tolerated by the exact format.
_TRAILERS = ("<eos>", prompts.END_OF_TURN)

# Digits with optional thousands groups; the lookahead stops "1,2345" from
# reading as 1,234 followed by 5. Every repetition is anchored by a literal, so
# matching is linear in the text length.
_DIGITS = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)"
_UNSIGNED = rf"(?:{_DIGITS}(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?"
# A minus right after a digit or a closing bracket (optionally one space
# between) is subtraction, not a sign: "10 - 3" holds 10 and 3.
_SIGN = r"(?<![\d)\]}%])(?<![\d)\]}%]\s)[-−+]"
_NUMBER_RE = re.compile(
    rf"(?:(?P<sign>{_SIGN})\s*)?(?:[$€£¥]\s*(?P<sign2>[-−])?\s*)?"
    rf"(?:\\[dt]?frac\{{\s*(?P<lnum>[-−]?{_UNSIGNED})\s*\}}"
    rf"\{{\s*(?P<lden>[-−]?{_UNSIGNED})\s*\}}"
    rf"|(?P<num>{_UNSIGNED})(?:\s*/\s*(?P<den>{_UNSIGNED}))?)")


def extract_answer(completion: Any) -> str | None:
  """The text in the first <answer>…</answer>, or after <answer> if unclosed.

  None when the completion is not a string or has no <answer> tag.
  """
  if not isinstance(completion, str):
    return None
  start = completion.find(prompts.ANSWER_START)
  if start < 0:
    return None
  start += len(prompts.ANSWER_START)
  end = completion.find(prompts.ANSWER_END, start)
  return completion[start:] if end < 0 else completion[start:end]


def tag_counts(completion: Any) -> tuple[int, int, int, int]:
  """How often <reasoning>, </reasoning>, <answer>, </answer> occur."""
  if not isinstance(completion, str):
    return (0, 0, 0, 0)
  count = completion.count
  return (count(prompts.REASONING_START), count(prompts.REASONING_END),
          count(prompts.ANSWER_START), count(prompts.ANSWER_END))


def has_exact_format(completion: Any) -> bool:
  """True for exactly "<reasoning>R</reasoning> <answer>A</answer>".

  Only whitespace may surround the two blocks; "<end_of_turn>" and then
  "<eos>" may follow. R and A must be non-blank and hold none of the four tags,
  so nested or repeated tags fail.
  """
  if not isinstance(completion, str):
    return False
  text = completion.strip()
  for trailer in _TRAILERS:  # <eos> first: it comes last.
    if text.endswith(trailer):
      text = text[:-len(trailer)].rstrip()
  if tag_counts(text) != (1, 1, 1, 1):
    return False
  if not (text.startswith(prompts.REASONING_START) and
          text.endswith(prompts.ANSWER_END)):
    return False
  # Each tag occurs once, the first and last are in place: split on the rest.
  reasoning, rest = text[len(prompts.REASONING_START):].split(
      prompts.REASONING_END)
  if prompts.ANSWER_START not in rest:  # <answer> came before </reasoning>
    return False
  between, answer = rest[:-len(prompts.ANSWER_END)].split(prompts.ANSWER_START)
  return bool(reasoning.strip() and answer.strip()) and not between.strip()


def _to_float(digits: str) -> float:
  # float() reads any Unicode decimal digits; overflow gives inf, caught later.
  return float(digits.replace(",", "").replace("−", "-"))


def _match_value(match: re.Match[str]) -> float | None:
  """The value of one `_NUMBER_RE` match, or None if it is not finite."""
  if match["lnum"] is not None:
    num, den = _to_float(match["lnum"]), _to_float(match["lden"])
  else:
    num = _to_float(match["num"])
    den = 1.0 if match["den"] is None else _to_float(match["den"])
  if den == 0 or not (math.isfinite(num) and math.isfinite(den)):
    return None
  value = num / den
  # A sign before the currency symbol ("-$5") or after it ("$-5") negates.
  if (match["sign"] in ("-", "−")) != (match["sign2"] is not None):
    value = -value
  return value if math.isfinite(value) else None


def parse_number(text: Any, *, first: bool = False) -> float | None:
  """The last number in `text` (the first if `first`), or None.

  The last number is the natural reading of free text ("so she pays $18."),
  and of an answer that is a single number it is that number. Only the last
  (first) SCAN_CHARS characters are read. See the module docstring for the
  accepted forms.
  """
  if not isinstance(text, str):
    return None
  window = text[:SCAN_CHARS] if first else text[-SCAN_CHARS:]
  match = None
  for match in _NUMBER_RE.finditer(window):
    if first:
      break
  return None if match is None else _match_value(match)


def numbers_equal(a: float, b: float) -> bool:
  """Equal up to float rounding: "0.5" == "1/2", "18.0" == "18", 0 only == 0."""
  return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)


# --- LaTeX-aware equality with math-verify ---------------------------------

# math-verify's parser is superlinear in bracket depth and sympy computes
# towers such as 9^{9^{9^9}} for ever, so inputs are bounded before and after
# parsing (tests/test_answers.py feeds it the cases that used to hang). Real answers are short and shallow.
MATH_CHARS = 500
_MAX_DEPTH = 6
_MAX_NODES = 200
_MAX_POWER = 1e4  # product of numeric exponents along any path in the tree
_MAX_DEGREE = 64  # the same for powers of symbols: x^{9999}-1 is slow to factor
_MAX_TERMS = 200  # (a+b+c+d)^{12} has 455 terms, every one expanded to compare
_MAX_FACTORIAL = 1000
# Only the main thread can use math-verify's SIGALRM timeouts; elsewhere the
# bounds above are the only protection, so they must hold on their own.
_MAIN_THREAD_TIMEOUT_S = 2
# Two plain decimals compare exactly without sympy, far the costlier path
# (BENCHMARKS.md, "Reward functions"); GSM8K-style answers are almost all of this form.
_PLAIN_DECIMAL = re.compile(r"-?\d{1,50}(?:\.\d{1,50})?")
_MATH_MARKERS = re.compile(r"[-+*/=^(){}\[\]\\$%]")


def _bracket_depth(text: str) -> int:
  depth = deepest = 0
  for char in text:
    if char in "({[":
      depth += 1
      deepest = max(deepest, depth)
    elif char in ")}]":
      depth = max(0, depth - 1)
  return deepest


def _is_tame(expr: Any, power: float = 1.0) -> bool:
  """False for expressions sympy could spend unbounded time or memory on.

  `power` is the product of the numeric exponents above `expr`: the value of
  ((10^a)^b)^c has a·b·c zeros, so the product bounds its size.
  """
  import sympy  # pylint: disable=g-import-not-at-top

  if not isinstance(expr, sympy.Basic):
    return True
  if isinstance(expr, sympy.Pow) and not expr.exp.free_symbols:
    if not expr.exp.is_Number:  # a tower such as 9^{9^9}, or 2^{\sqrt 2}
      return False
    power *= max(1.0, abs(float(expr.exp)))
    limit = _MAX_DEGREE if expr.base.free_symbols else _MAX_POWER
    if not power <= limit:
      return False
  if isinstance(expr, (sympy.factorial, sympy.factorial2, sympy.binomial,
                       sympy.gamma, sympy.subfactorial)):
    if any(not arg.free_symbols and not (arg.is_Number and
                                         abs(arg) <= _MAX_FACTORIAL)
           for arg in expr.args):
      return False
  return all(_is_tame(arg, power) for arg in expr.args)


def _expanded_terms(expr: Any) -> int:
  """An upper bound on the terms of sympy.expand(expr), capped above _MAX_TERMS.

  (a+b+c+d)^8 has C(11, 3) = 165 terms; comparing expands and simplifies.
  """
  import sympy  # pylint: disable=g-import-not-at-top

  if not isinstance(expr, sympy.Basic) or not expr.args:
    return 1
  terms = [_expanded_terms(arg) for arg in expr.args]
  if isinstance(expr, sympy.Add):
    total = sum(terms)
  elif isinstance(expr, sympy.Mul):
    total = math.prod(terms)
  elif isinstance(expr, sympy.Pow) and expr.exp.is_Integer:
    n = min(abs(int(expr.exp)), _MAX_DEGREE)  # _is_tame has bounded it
    total = math.comb(n + terms[0] - 1, n)
  else:
    total = max(terms)
  return min(total, _MAX_TERMS + 1)


def _math_parse(text: str, timeout_s: int | None) -> list[Any]:
  """math-verify's parse, limited to bounded, tame input; [] when refused."""
  from math_verify import parse  # pylint: disable=g-import-not-at-top
  import sympy  # pylint: disable=g-import-not-at-top

  text = text[-MATH_CHARS:].replace("−", "-")
  if _bracket_depth(text) > _MAX_DEPTH:
    return []
  parsed = parse(text, parsing_timeout=timeout_s)
  for expr in parsed:
    if not isinstance(expr, sympy.Basic):
      continue
    nodes = itertools.islice(sympy.preorder_traversal(expr), _MAX_NODES + 1)
    if (sum(1 for _ in nodes) > _MAX_NODES or not _is_tame(expr) or
        _expanded_terms(expr) > _MAX_TERMS):
      return []
  return parsed


def math_equal(completion: Any, gold: Any) -> bool:
  """True if math-verify proves the completion's answer equal to `gold`.

  The answer is read inside <answer>…</answer> first (a bare expression there
  is read as LaTeX); only when nothing parses there is the whole completion
  (its last MATH_CHARS characters, where \\boxed{} answers sit) read, so a
  model cannot hedge with a second answer elsewhere.
  """
  if not (isinstance(completion, str) and isinstance(gold, str)):
    return False
  try:
    return _math_equal(completion, gold)
  except Exception:  # pylint: disable=broad-except
    # sympy raises on odd input (NaN comparisons, huge rationals); that is a
    # wrong answer, not a crashed training step.
    return False


def _numeric_verdict(completion: str, answer: str | None, gold: str) -> bool | None:
  """The verdict without sympy when both sides are plain numbers, else None.

  Covers a decimal gold against an <answer> that is a lone number (units and
  thousands separators allowed, no operators), or, with no <answer>, against
  the last number of a completion without LaTeX: what math-verify would
  read there too.
  """
  if not _PLAIN_DECIMAL.fullmatch(gold):
    return None
  if answer is not None and answer.strip():
    text = answer.strip()
    if _PLAIN_DECIMAL.fullmatch(text):
      return decimal.Decimal(text) == decimal.Decimal(gold)
    # A lone leading "$" is currency ("$1,234"); a pair is LaTeX ("$x^2$").
    bare = text[1:] if text.startswith("$") and text.count("$") == 1 else text
    if _MATH_MARKERS.search(bare.lstrip("-")) or len(_NUMBER_RE.findall(bare)) != 1:
      return None
  else:
    text = completion[-MATH_CHARS:]
    if "\\" in text or "$" in text:
      return None
  value = parse_number(text)
  return value is not None and numbers_equal(value, float(gold))


@functools.lru_cache(maxsize=1024)
def _gold_parse(gold: str, timeout_s: int | None) -> tuple[Any, ...]:
  """A gold answer, parsed once: the G completions of a prompt share it."""
  return tuple(_math_parse(f"${gold}$", timeout_s) or _math_parse(gold, timeout_s))


def _math_equal(completion: str, gold: str) -> bool:
  from math_verify import verify  # pylint: disable=g-import-not-at-top

  in_main = threading.current_thread() is threading.main_thread()
  timeout_s = _MAIN_THREAD_TIMEOUT_S if in_main else None
  answer = extract_answer(completion)
  quick = _numeric_verdict(completion, answer, gold.strip())
  if quick is not None:
    return quick
  target = _gold_parse(gold, timeout_s)
  if not target:
    return False
  guess: list[Any] = []
  if answer is not None and answer.strip():
    answer = answer.strip()[:MATH_CHARS]
    bare = "$" not in answer and "\\boxed" not in answer
    guess = _math_parse(answer, timeout_s)
    if bare:
      guess = guess + _math_parse(f"${answer}$", timeout_s)
  if not guess:
    guess = _math_parse(completion, timeout_s)
  return bool(guess) and verify(list(target), guess, timeout_seconds=timeout_s)
