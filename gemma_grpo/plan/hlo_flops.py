"""Matrix-multiply FLOPs of an HLO module, each loop body counted as often as it runs.

XLA's `cost_analysis()` counts the body of a `while` loop once, whatever its
trip count: a `lax.scan` over 16 vocabulary chunks reports one chunk's
work. This counts the `dot` instructions of the module as JAX lowered it
(before XLA's optimisations, so every product is a plain `dot` with its
operand shapes known), multiplying the body of each loop whose condition is
`counter < constant` (how `lax.scan` and `fori_loop` lower) by that
constant. A loop whose trip count is data-dependent (the rollout's
`while_loop`, which stops when every row has stopped) is counted once: one
iteration, which for the decode loop is one token.

Only products are counted (2 x output elements x contracted size per dot);
elementwise work is left to the compiler's own count, which this corrects.
"""

from __future__ import annotations

import dataclasses
import math
import re

_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_SHAPE = re.compile(r"^[a-z]\w*\[([0-9,]*)\]")
_DIMS = re.compile(r"(lhs_contracting_dims)=\{([0-9,]*)\}")


@dataclasses.dataclass
class _Instruction:
  name: str
  type: str
  opcode: str
  operands: list[str]
  attributes: str
  is_root: bool


@dataclasses.dataclass
class _Computation:
  name: str
  instructions: list[_Instruction]
  root: _Instruction | None


def _matching(text: str, start: int) -> int:
  """Index just past the parenthesis group opening at text[start]."""
  depth = 0
  for i in range(start, len(text)):
    if text[i] == "(":
      depth += 1
    elif text[i] == ")":
      depth -= 1
      if depth == 0:
        return i + 1
  raise ValueError(f"unbalanced parentheses in HLO: {text[:120]}")


def _parse_instruction(line: str) -> _Instruction | None:
  line = line.strip()
  is_root = line.startswith("ROOT ")
  if is_root:
    line = line[5:]
  if " = " not in line:
    return None
  name, rest = line.split(" = ", 1)
  if rest.startswith("("):
    end = _matching(rest, 0)
    type_, rest = rest[:end], rest[end:].lstrip()
  else:
    type_, _, rest = rest.partition(" ")
  paren = rest.find("(")
  if paren < 0:
    return None
  opcode = rest[:paren]
  end = _matching(rest, paren)
  operands = [op.strip().split(" ")[-1].lstrip("%") for op in _split_top(rest[paren + 1:end - 1])]
  return _Instruction(name.lstrip("%"), type_, opcode, operands, rest[end:], is_root)


def _split_top(text: str) -> list[str]:
  """Comma-separated items of `text`, ignoring commas inside brackets."""
  items, depth, start = [], 0, 0
  for i, ch in enumerate(text):
    if ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
    elif ch == "," and depth == 0:
      items.append(text[start:i])
      start = i + 1
  if text[start:].strip():
    items.append(text[start:])
  return items


def parse(hlo_text: str) -> dict[str, _Computation]:
  """Computations by name; the entry one also under the key '__entry__'."""
  computations: dict[str, _Computation] = {}
  current: _Computation | None = None
  for line in hlo_text.splitlines():
    if current is None:
      header = _HEADER.match(line)
      if header and not line.startswith("HloModule"):
        current = _Computation(header.group(2), [], None)
        if header.group(1):
          computations["__entry__"] = current
      continue
    if line.strip() == "}":
      computations[current.name] = current
      current = None
      continue
    instruction = _parse_instruction(line)
    if instruction is not None:
      current.instructions.append(instruction)
      if instruction.is_root:
        current.root = instruction
  return computations


def _dims(type_: str) -> list[int] | None:
  match = _SHAPE.match(type_)
  if match is None:
    return None
  return [int(d) for d in match.group(1).split(",") if d]


def _dot_flops(instruction: _Instruction, shapes: dict[str, str]) -> int:
  out = _dims(instruction.type)
  lhs = _dims(shapes.get(instruction.operands[0], ""))
  contracting = _DIMS.search(instruction.attributes)
  if out is None or lhs is None or contracting is None:
    return 0
  contracted = math.prod(lhs[int(d)] for d in contracting.group(2).split(",") if d)
  return 2 * math.prod(out) * contracted


def _called(attributes: str, key: str) -> list[str]:
  match = re.search(rf"{key}=\{{([^}}]*)\}}", attributes) or re.search(rf"{key}=%?([\w.\-]+)",
                                                                        attributes)
  if match is None:
    return []
  return [name.strip().lstrip("%") for name in match.group(1).split(",") if name.strip()]


def trip_count(condition: _Computation) -> int | None:
  """N for a loop condition `counter < N` with N a constant; None otherwise."""
  root = condition.root
  if root is None or root.opcode != "compare" or "direction=LT" not in root.attributes:
    return None
  by_name = {i.name: i for i in condition.instructions}
  if len(root.operands) != 2:
    return None
  counter, bound = by_name.get(root.operands[0]), by_name.get(root.operands[1])
  # The counter is an element of the loop state itself, not a value computed from it.
  if counter is None or counter.opcode != "get-tuple-element":
    return None
  source = by_name.get(counter.operands[0])
  if source is None or source.opcode != "parameter" or bound is None or bound.opcode != "constant":
    return None
  if bound is None or not re.fullmatch(r"-?\d+", bound.operands[0]):
    return None
  return int(bound.operands[0])


@dataclasses.dataclass(frozen=True)
class Count:
  """Matrix-multiply FLOPs of a module.

  Attributes:
    flops: every loop body counted as often as it runs.
    flops_bodies_once: every loop body counted once (cost_analysis' convention).
    unknown_trip_loops: loops whose trip count depends on data, counted once.
  """

  flops: int
  flops_bodies_once: int
  unknown_trip_loops: int


def count(hlo_text: str) -> Count:
  """Matmul FLOPs of the module `hlo_text` (JAX's `lowered.as_text(dialect="hlo")`)."""
  computations = parse(hlo_text)
  memo: dict[tuple[str, bool], tuple[int, int]] = {}

  def total(name: str, with_trips: bool) -> tuple[int, int]:
    key = (name, with_trips)
    if key in memo:
      return memo[key]
    computation = computations.get(name)
    if computation is None:
      return 0, 0
    shapes = {i.name: i.type for i in computation.instructions}
    flops, unknown = 0, 0
    for instruction in computation.instructions:
      attributes = instruction.attributes
      if instruction.opcode == "dot":
        flops += _dot_flops(instruction, shapes)
      elif instruction.opcode == "while":
        (body,), (condition,) = _called(attributes, "body"), _called(attributes, "condition")
        trips = trip_count(computations[condition]) if condition in computations else None
        if trips is None:
          unknown += 1
        body_flops, body_unknown = total(body, with_trips)
        flops += body_flops * (trips if (with_trips and trips) else 1)
        unknown += body_unknown
      elif instruction.opcode == "conditional":
        branches = (_called(attributes, "branch_computations")
                    or _called(attributes, "true_computation") + _called(attributes, "false_computation"))
        results = [total(b, with_trips) for b in branches]
        if results:
          flops += max(f for f, _ in results)
          unknown += max(u for _, u in results)
      else:
        for callee in _called(attributes, "to_apply") + _called(attributes, "calls"):
          callee_flops, callee_unknown = total(callee, with_trips)
          flops += callee_flops
          unknown += callee_unknown
    memo[key] = (flops, unknown)
    return memo[key]

  entry = computations["__entry__"].name
  flops, unknown = total(entry, True)
  return Count(flops=flops, flops_bodies_once=total(entry, False)[0], unknown_trip_loops=unknown)
