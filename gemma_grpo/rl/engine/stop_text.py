"""Stopping a row at `rollout.stop_text` inside the decode loop.

Without this, a row stops only at a stop token, and the learner cuts the
completion after its stop text on the host (tokenizer.tokens_through): a row
that has written "</answer>" goes on decoding, to be thrown away, until a
stop token or the token limit, and its batch with it.

The loop instead steps a string-matching automaton (Knuth-Morris-Pratt over
the stop text's characters, lifted to whole tokens): a row's state is the
length of the longest prefix of the stop text that its text so far ends
with, and `next_state_SxV[state, token]` is the state after the token's
text; state M (the stop text's length) means the stop text is complete, and
stays. Built
once per tokenizer and stop text on the host, it costs the loop one gather
per step.

A stop here must never come early: the learner's exact cut stays, and a row
the automaton stopped must hold the stop text (GroupedRollout checks it). A
token whose text cannot be told apart from its neighbours' (a lone byte of a
multi-byte character, or one that decodes differently next to another
token) resets the state to 0: the automaton may then miss a stop, and the
row decodes on as it did before.

Shapes: M stop-text characters, S = M + 1 states, V vocabulary.
"""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np

_ANCHOR = "a"  # a token with a plain one-character text, decoded before each token


def token_texts(tokenizer, vocab: int) -> list[str | None]:
  """Each token's text as it reads after another token; None where it is not its own.

  `tokenizer` has encode, decode and bos_id (ours, or Tunix's adapter of
  it). Decoding [anchor, v] and taking off the anchor's text keeps the
  leading space that some tokenizers' decoders strip from a text's first
  token. Ids at or past the tokenizer's size (padding rows of the
  embedding) are None.
  """
  anchor = [i for i in tokenizer.encode(_ANCHOR) if i != tokenizer.bos_id()]
  prefix = tokenizer.decode(anchor)
  texts = []
  for v in range(vocab):
    try:
      text = tokenizer.decode([*anchor, v])
    except (IndexError, KeyError, ValueError):  # an id the tokenizer does not know
      texts.append(None)
      continue
    own = text[len(prefix):] if text.startswith(prefix) else None
    texts.append(None if not own or "\ufffd" in own else own)
  return texts


def _borders(stop: str) -> list[list[int]]:
  """For each state s < M, every j >= 1 with stop[:j] a suffix of stop[:s], s first."""
  fail = [0] * (len(stop) + 1)  # KMP's failure function
  k = 0
  for i in range(1, len(stop)):
    while k and stop[i] != stop[k]:
      k = fail[k]
    if stop[i] == stop[k]:
      k += 1
    fail[i + 1] = k
  chains = []
  for s in range(len(stop)):
    chain, j = [], s
    while j:
      chain.append(j)
      j = fail[j]
    chains.append(chain)
  return chains


def transition_table(texts: Sequence[str | None], stop: str) -> np.ndarray:
  """next_state_SxV: the state after each token from each state; M = stop text complete.

  For a token of text p read in state s (the text so far ends with stop[:s],
  and with stop[:j] for each border j of s): the stop text completes if p
  holds it, or p starts with stop[j:] for such a j; otherwise the new state
  is the longest stop[:k] that the text ends with, either inside p (a suffix
  of p) or running on from a border j (p == stop[j:j + len(p)]).
  """
  m = len(stop)
  if not 0 < m < np.iinfo(np.int16).max:
    raise ValueError(f"stop text of {m} characters: must be 1 to 32766")
  borders = _borders(stop)
  holding = [[s for s in range(m) if j in borders[s]] for j in range(m)]  # states with border j
  next_SxV = np.zeros((m + 1, len(texts)), np.int16)
  firsts = set(stop)
  for v, p in enumerate(texts):
    if p is None:
      continue  # state 0: never a false stop
    if stop in p:
      next_SxV[:m, v] = m
      continue
    if stop[0] in p:  # a suffix of p may start the stop text
      next_SxV[:m, v] = max((k for k in range(1, min(len(p), m - 1) + 1) if p.endswith(stop[:k])),
                           default=0)
    if p[0] not in firsts:
      continue
    for j in range(1, m):
      if p.startswith(stop[j:]):
        next_SxV[holding[j], v] = m
      elif len(p) < m - j and stop.startswith(p, j):
        states = [s for s in holding[j] if next_SxV[s, v] < m]
        next_SxV[states, v] = np.maximum(next_SxV[states, v], j + len(p))
  next_SxV[m] = m
  return next_SxV


def step(next_state_SxV, state_B, token_B, done_B):
  """The decode loop's half: (each row's state after token_B, done_B with the
  rows whose stop text it completed)."""
  state_B = next_state_SxV[state_B, token_B].astype(jnp.int32)
  return state_B, done_B | (state_B == next_state_SxV.shape[0] - 1)


def length_through(next_state_SxV: np.ndarray, tokens: Sequence[int]) -> int | None:
  """How many of `tokens` the decode loop keeps: through the one that completes
  the stop text (the loop leaves what follows it unset); None if none does."""
  state, done = 0, next_state_SxV.shape[0] - 1
  for n, v in enumerate(tokens, start=1):
    state = int(next_state_SxV[state, v])
    if state == done:
      return n
  return None
