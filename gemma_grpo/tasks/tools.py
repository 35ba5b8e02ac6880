"""Tool calls in a completion's text, and running them safely on the host.

A completion calls a tool by writing `<tool_call>name: arguments</tool_call>`;
the engine (rl/engine/multi_turn.py) runs it and feeds the result back as the next
tokens of the same completion:

  <tool_call>calculator: 4821 * 367</tool_call><tool_result>1769307</tool_result>

A malformed call, an unknown tool, an exception, a non-string return value or
a call past the time limit each give a result starting "error: "; nothing
here raises into the trainer. A tool is any `f(arguments: str) -> str`.

Trust model: tools run in the trainer's process, with the trainer's rights.
The built-in calculator is safe by construction (no eval; bounded input and
result). User tools are trusted code: the time limit cannot kill a hung thread.
"""

import ast
from collections.abc import Callable, Mapping
import dataclasses
import fractions
import operator
import re
import threading

from gemma_grpo import user_code

CALL_START = "<tool_call>"
CALL_END = "</tool_call>"
RESULT_START = "<tool_result>"
RESULT_END = "</tool_result>"

ToolFn = Callable[[str], str]

# --- The built-in calculator --------------------------------------------------

_MAX_INPUT_CHARS = 200
_MAX_DEPTH = 32            # nested parentheses; the parser's own limit is 200
_MAX_EXPONENT = 10_000     # |n| in a ** n
_MAX_BITS = 4_000          # any intermediate value: about 1200 digits
_MAX_RESULT_CHARS = 100    # the printed answer, well under a result's 200
_PLACES = 6                # decimals printed for a non-integral result
_ALLOWED_CHARS = frozenset("0123456789.+-*/%() \t\n")
_TIMES_X = re.compile(r"(?<=[\d)])\s*[xX]\s*(?=[\d(.])")  # "3 x 4", not "0x"
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")        # "1,234,567"
_LEADING_ZEROS = re.compile(r"(?<![\d.])0+(?=\d)")         # "007": a SyntaxError
_HELP = "use numbers and + - * / // % ** ( )"
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


class _CalcError(Exception):
  """A bad expression; its message is the model's error result."""


def _size(x: fractions.Fraction) -> int:  # bits of the larger of its two terms
  return max(x.numerator.bit_length(), x.denominator.bit_length())


def _power(base: fractions.Fraction, exponent: fractions.Fraction) -> fractions.Fraction:
  if exponent.denominator != 1:
    raise _CalcError("the exponent must be a whole number")
  n = exponent.numerator
  if abs(n) > _MAX_EXPONENT:
    raise _CalcError(f"exponent too large (at most {_MAX_EXPONENT} either way)")
  if base == 0 and n < 0:
    raise _CalcError("division by zero")
  trivial = base.denominator == 1 and abs(base.numerator) <= 1
  if not trivial and _size(base) * abs(n) > _MAX_BITS:  # checked before computing
    raise _CalcError("result too large")
  return base ** n


def _binary(op: ast.operator, a: fractions.Fraction, b: fractions.Fraction) -> fractions.Fraction:
  if isinstance(op, ast.Pow):
    return _power(a, b)
  if _size(a) + _size(b) > _MAX_BITS:  # bounds any + - * / // % result's size
    raise _CalcError("result too large")
  if isinstance(op, (ast.Div, ast.FloorDiv, ast.Mod)) and b == 0:
    raise _CalcError("division by zero")
  if type(op) not in _OPS:
    raise _CalcError(f"operator not allowed; {_HELP}")
  return fractions.Fraction(_OPS[type(op)](a, b))  # a // b is an int


def _evaluate(node: ast.AST, source: str) -> fractions.Fraction:
  """The whitelist walk: numbers, binary + - * / // % **, unary + -."""
  if isinstance(node, ast.Constant) and type(node.value) in (int, float):
    # Read the literal's own text so "0.1" is exactly 1/10, not a float.
    return fractions.Fraction(ast.get_source_segment(source, node))
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
    value = _evaluate(node.operand, source)
    return -value if isinstance(node.op, ast.USub) else value
  if isinstance(node, ast.BinOp):
    return _binary(node.op, _evaluate(node.left, source), _evaluate(node.right, source))
  raise _CalcError(f"not arithmetic; {_HELP}")


def _normalize(text: str) -> str:
  """The forms a model writes, as Python arithmetic: "1,234 × 2^3 =" -> "1234 * 2**3"."""
  text = text.strip().removesuffix("=").strip()
  text = text.replace("×", "*").replace("÷", "/").replace("^", "**").replace("−", "-")
  text = _TIMES_X.sub("*", text)
  text = _THOUSANDS.sub("", text)
  return _LEADING_ZEROS.sub("", text)


def _format(value: fractions.Fraction) -> str:
  """An integer exactly; otherwise rounded to 6 places, trailing zeros dropped."""
  if value.denominator == 1:
    return str(value.numerator)
  scaled = round(value * 10 ** _PLACES)
  sign = "-" if scaled < 0 else ""
  whole, fraction = divmod(abs(scaled), 10 ** _PLACES)
  return f"{sign}{whole}.{fraction:0{_PLACES}d}".rstrip("0").rstrip(".")


def calculator(arguments: str) -> str:
  """Exact rational arithmetic on one expression; never raises, never evals.

  "4821 * 367" -> "1769307"; "1/3" -> "0.333333"; "1,234 × 2" -> "2468";
  "2^10" -> "1024"; "1/0" -> "error: division by zero".
  """
  if not isinstance(arguments, str):
    return "error: expected an arithmetic expression as text"
  if len(arguments) > _MAX_INPUT_CHARS:
    return f"error: expression longer than {_MAX_INPUT_CHARS} characters"
  text = _normalize(arguments)
  depth = 0
  for ch in text:
    if ch not in _ALLOWED_CHARS:
      return f"error: unexpected {ch!r}; {_HELP}"
    depth += (ch == "(") - (ch == ")")
    if depth > _MAX_DEPTH:
      return f"error: more than {_MAX_DEPTH} nested parentheses"
  try:
    tree = ast.parse(text, mode="eval")
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    return f"error: not an arithmetic expression; {_HELP}"
  try:
    value = _evaluate(tree.body, text)
  except _CalcError as e:
    return f"error: {e}"
  except (ArithmeticError, ValueError, RecursionError, MemoryError) as e:
    return f"error: {type(e).__name__}"
  result = _format(value)
  if len(result) > _MAX_RESULT_CHARS:
    return f"error: result has {len(result)} characters (at most {_MAX_RESULT_CHARS})"
  return result


BUILTIN_TOOLS: dict[str, ToolFn] = {"calculator": calculator}

# --- Loading tools from a config ------------------------------------------------

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def load_tools(spec: str) -> dict[str, ToolFn]:
  """The tools of `rollout.tools`: "calculator,my_tools:days_between" -> by name.

  Each comma-separated item is a built-in name or "module:function"; the
  model calls a function by its own name. "" gives no tools.

  Raises:
    ValueError: one line, "rollout.tools: ...", naming the item and the fix.
  """
  found: dict[str, ToolFn] = {}
  for item in (part.strip() for part in (spec or "").split(",")):
    if not item:
      continue
    if ":" not in item:
      if item not in BUILTIN_TOOLS:
        raise ValueError(f"rollout.tools: {item!r} is neither a built-in tool "
                         f"({', '.join(BUILTIN_TOOLS)}) nor 'module:function'")
      name, fn = item, BUILTIN_TOOLS[item]
    else:
      fn = user_code.named_function(item, "rollout.tools")
      name = getattr(fn, "__name__", "")
      if not _NAME.fullmatch(name):
        raise ValueError(f"rollout.tools: {item!r} is named {name!r}, which a call cannot"
                         " spell; define it with def and a plain name")
    if name in found:
      raise ValueError(f"rollout.tools: {item!r} clashes with another tool named {name!r}"
                       " (the model calls tools by name); rename it")
    found[name] = fn
  return found

# --- Calls in text, and running them ---------------------------------------------


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """One call as run: `ok` is False for any error result."""
  name: str
  arguments: str
  result: str
  ok: bool


_CALL = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*):(.*)", re.DOTALL)
_RESULT = re.compile(re.escape(RESULT_START) + r"(.*?)(?:" + re.escape(RESULT_END) + r"|\Z)",
                     re.DOTALL)
# A result must not end the model's turn or forge a call (removed until none is left).
_TAGS = re.compile("|".join(re.escape(t) for t in (
    CALL_START, CALL_END, RESULT_START, RESULT_END,
    "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>")))


def parse_call(body: str) -> tuple[str, str] | None:
  """(name, arguments) of "name: arguments", arguments stripped; None if malformed."""
  match = _CALL.fullmatch(body) if isinstance(body, str) else None
  return (match[1], match[2].strip()) if match else None


def pending_call(text: str) -> str | None:
  """The body of the call that `text` (this turn so far) has just closed, or None.

  None while no call is closed yet; "" for a CALL_END with no CALL_START
  before it, so the caller reports a malformed call.
  """
  start = text.rfind(CALL_START)
  if start < 0:
    return "" if CALL_END in text else None
  end = text.find(CALL_END, start + len(CALL_START))
  return None if end < 0 else text[start + len(CALL_START):end]


def _sanitize(result: str, max_chars: int) -> str:
  if len(result) > max_chars:
    result = result[:max_chars - 1] + "…"
  while True:  # "<tool_<eos>call>" must not become a tag once "<eos>" goes
    cleaned = _TAGS.sub("", result)
    if cleaned == result:
      return cleaned
    result = cleaned


class ToolRunner:
  """Runs calls against a set of tools, each within a time limit.

  The built-in calculator, bounded by construction, runs in the caller's
  thread. A user tool runs in a daemon thread of its own; past
  `time_limit_s` the call returns an error and that thread is left running
  (Python cannot kill it; being a daemon, it does not hold up the process's
  exit). After `max_hung` such threads still run, user tools are refused.
  """

  def __init__(self, tools: Mapping[str, ToolFn], *, time_limit_s: float = 1.0,
               max_result_chars: int = 200, max_hung: int = 16):
    if not time_limit_s > 0:
      raise ValueError(f"rollout.tool_time_limit: {time_limit_s!r} is not a positive"
                       " number of seconds")
    self.tools = dict(tools)
    self.time_limit_s = float(time_limit_s)
    self.max_result_chars = max_result_chars
    self.max_hung = max_hung
    self._hung: list[threading.Thread] = []

  def run(self, body: str) -> ToolCall:
    """Parses and runs one call body; never raises."""
    known = ", ".join(self.tools) or "none"
    parsed = parse_call(body)
    if parsed is None:
      return self._done("", body if isinstance(body, str) else "",
                        f"error: malformed call; a call is 'name: arguments' (tools: {known})")
    name, arguments = parsed
    fn = self.tools.get(name)
    if fn is None:
      return self._done(name, arguments, f"error: unknown tool {name!r}; tools: {known}")
    if fn is calculator:
      return self._done(name, arguments, calculator(arguments))
    return self._done(name, arguments, self._call_with_limit(name, fn, arguments))

  def _call_with_limit(self, name: str, fn: ToolFn, arguments: str) -> str:
    self._hung = [t for t in self._hung if t.is_alive()]
    if len(self._hung) >= self.max_hung:
      return f"error: {name} unavailable: {len(self._hung)} earlier calls still running"
    box: list[str] = []

    def target():
      try:
        value = fn(arguments)
        box.append(value if isinstance(value, str) else
                   f"error: {name} returned {type(value).__name__}, not str")
      except BaseException as e:  # pylint: disable=broad-except; the tool's bug, not ours
        try:
          box.append(f"error: {type(e).__name__}: {e}")
        except Exception:  # pylint: disable=broad-except; an exception whose str raises
          box.append(f"error: {type(e).__name__}")

    thread = threading.Thread(target=target, name=f"tool-{name}", daemon=True)
    thread.start()
    thread.join(self.time_limit_s)
    if thread.is_alive():
      self._hung.append(thread)
      return f"error: timed out after {self.time_limit_s:g} s"
    return box[0] if box else "error: the tool returned nothing"

  def _done(self, name: str, arguments: str, result: str) -> ToolCall:
    result = _sanitize(result, self.max_result_chars)
    return ToolCall(name=name, arguments=arguments, result=result,
                    ok=not result.startswith("error:"))


def format_result(call: ToolCall) -> str:
  """The text fed back to the model: "<tool_result>1769307</tool_result>"."""
  return RESULT_START + call.result + RESULT_END


def count_calls(completion: str) -> tuple[int, int]:
  """(calls, failed calls) read from a completion's results; a result cut off
  by the token budget counts; one starting "error:" failed."""
  if not isinstance(completion, str):
    return 0, 0
  results = _RESULT.findall(completion)
  return len(results), sum(r.startswith("error:") for r in results)
