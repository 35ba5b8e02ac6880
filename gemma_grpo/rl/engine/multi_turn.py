"""Tool calls inside a completion: multi-turn decoding, mostly the host's half.

A completion may write `<tool_call>name: arguments</tool_call>`; the tool then
runs here, on the host, and its `<tool_result>…</tool_result>` is fed to the
model as the next tokens of the same row, which the model reads as it reads a
prompt and never samples; decoding then goes on, up to `max_calls` calls and
the completion's token budget.

The engine's decode loop (lockstep.loop) stops after any step in which
a row may have closed a call (a cheap necessary test on its last two tokens,
`CallEnds`, made on the device by `force_results`); `ToolTurns.resume` reads
each such row's text since its last tool result, runs the call if the text
holds a complete one, and writes the result's tokens into `forced_BxT` at the
row's next slots. The loop then resumes with every row where it was: rows at
different turns decode together.

Result tokens sit in the completion (the model reads them) but are marked in
`tool_mask`, which keeps them out of the loss, the KL term, the entropy and
the length metrics (learner.py).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np

from gemma_grpo.config import settings
from gemma_grpo.tasks import tools

_CLOSE = tools.CALL_END[:-1]  # "</tool_call": what precedes the closing ">"


@dataclasses.dataclass(frozen=True)
class CallEnds:
  """Per vocabulary entry, what the decode loop tests to pause a row.

  A row may have just closed a call when its new token's text has a ">"
  whose preceding text ends "</tool_call" (`ends_call_V`), or is a shorter
  tail of it whose next character backwards, `needs_char_V`, is the last
  character of the row's previous token (`last_char_V`). Characters are
  code points; -1 = none.
  """

  ends_call_V: np.ndarray  # bool
  needs_char_V: np.ndarray  # int32
  last_char_V: np.ndarray  # int32

  @classmethod
  def from_texts(cls, texts: Sequence[str]) -> "CallEnds":
    vocab = len(texts)
    ends_call_V = np.zeros(vocab, bool)
    needs_char_V = np.full(vocab, -1, np.int32)
    last_char_V = np.full(vocab, -1, np.int32)
    for i, text in enumerate(texts):
      if text:
        last_char_V[i] = ord(text[-1])
      at = text.find(">")
      while at >= 0:
        before = text[:at]
        if before.endswith(_CLOSE):
          ends_call_V[i] = True
        elif _CLOSE.endswith(before):
          needs_char_V[i] = ord(_CLOSE[len(_CLOSE) - len(before) - 1])
        at = text.find(">", at + 1)
    return cls(ends_call_V, needs_char_V, last_char_V)


def force_results(turns, t, token_B, tokens_BxT, done_B):
  """The decode loop's half, at completion slot t: (token_B with the tool
  results' tokens put in, from_tool_B: which rows took one, paused_B: which
  rows may have just closed a call).

  `turns` is (forced_BxT, ends_call_V, needs_char_V, last_char_V): the
  results' tokens (ToolTurns.forced_BxT, -1 where the model samples) and a
  CallEnds on the device; tokens_BxT holds the tokens before slot t.
  """
  forced_BxT, ends_call_V, needs_char_V, last_char_V = turns
  forced_B = forced_BxT[:, t]
  from_tool_B = (forced_B >= 0) & ~done_B
  token_B = jnp.where(from_tool_B, forced_B, token_B)
  # A necessary condition for the row's text to end "</tool_call>"
  # (CallEnds); the host reads the text to be sure.
  previous_B = tokens_BxT[:, t - 1]
  may_close_B = ends_call_V[token_B] | (
      (needs_char_V[token_B] >= 0) & (needs_char_V[token_B] == last_char_V[previous_B]))
  paused_B = may_close_B & ~from_tool_B & ~done_B
  return token_B, from_tool_B, paused_B


@dataclasses.dataclass(frozen=True)
class RowTurns:
  """What the tools did in one completion."""

  calls: tuple[tools.ToolCall, ...]
  tool_mask: np.ndarray  # [length] bool: the token is a tool result's, not the model's

  @property
  def failed_calls(self) -> int:
    return sum(not call.ok for call in self.calls)


class ToolTurns:
  """One batch's tool calls while it decodes: rows B, completion slots T."""

  def __init__(self, runner: tools.ToolRunner, decode: Callable[[list[int]], str],
               encode: Callable[[str], list[int]], *, max_calls: int, rows: int,
               width: int, banned_ids: Sequence[int]):
    """`encode` tokenizes a result (ids in `banned_ids`, such as <bos> or a
    stop token, are dropped: a result cannot end the model's turn)."""
    self._runner = runner
    self._decode = decode
    self._encode = encode
    self._max_calls = max_calls
    self._banned = np.asarray(sorted(set(banned_ids)), np.int64)
    self.forced_BxT = np.full((rows, width), -1, np.int32)
    self._turn_start_B = np.zeros(rows, np.int64)  # slot where the row's current turn began
    self._calls: list[list[tools.ToolCall]] = [[] for _ in range(rows)]

  def resume(self, tokens_BxT: np.ndarray, t: int, paused_B: np.ndarray) -> None:
    """Runs the complete calls of the paused rows, whose last token sits at slot t - 1."""
    width = self.forced_BxT.shape[1]
    for row in np.flatnonzero(paused_B):
      start = self._turn_start_B[row]
      body = tools.pending_call(self._decode(tokens_BxT[row, start:t].tolist()))
      if body is None:
        continue  # the test in the loop is necessary, not sufficient
      if len(self._calls[row]) >= self._max_calls:
        call = tools.ToolCall(name="", arguments=body, ok=False, result=(
            f"error: no tool calls left (at most {self._max_calls} per completion)"))
      else:
        call = self._runner.run(body)
      self._calls[row].append(call)
      ids = np.asarray(self._encode(tools.format_result(call)), np.int64)
      ids = ids[~np.isin(ids, self._banned)][:width - t]
      self.forced_BxT[row, t:t + len(ids)] = ids
      self._turn_start_B[row] = t + len(ids)

  def rows(self, lengths: Sequence[int]) -> list[RowTurns]:
    """Each row's calls and tool mask, the row cut to `lengths[b]` tokens."""
    return [RowTurns(tuple(calls), self.forced_BxT[row, :length] >= 0)
            for row, (calls, length) in enumerate(zip(self._calls, lengths))]


def tool_runner(r: settings.RolloutSettings) -> tools.ToolRunner | None:
  """The engine's tool runner for the `rollout` settings; None without tools.

  Raises ValueError naming rollout.tools for a tool that cannot be loaded.
  """
  if not r.tools:
    return None
  return tools.ToolRunner(tools.load_tools(r.tools), time_limit_s=r.tool_time_limit)
