"""The stop-text automaton against reading the text itself, on the real Gemma tokenizer."""

import random

import numpy as np
import pytest

from configs import base
from gemma_grpo.config import settings
from gemma_grpo.model import model_loading
from gemma_grpo.model import tokenizer as tokenizer_lib
from gemma_grpo.rl.engine import stop_text

# The default's, and texts whose prefixes recur inside them (KMP's borders).
STOPS = ["</answer>", "aab", "abab", "####", " The answer is"]


def final_state(next_state_SxV, tokens) -> int:
  """The state after `tokens`, stepped through the table."""
  state = 0
  for v in tokens:
    state = int(next_state_SxV[state, v])
  return state


def reference_states(texts, stop, tokens):
  """The state after each token, reading the text one character at a time."""
  states, text = [], ""
  for v in tokens:
    if states and states[-1] == len(stop):
      states.append(len(stop))
    elif texts[v] is None:
      text = ""  # as the table: a token not its own forgets the match so far
      states.append(0)
    else:
      text += texts[v]
      states.append(len(stop) if stop in text
                    else max(k for k in range(len(stop)) if text.endswith(stop[:k])))
  return states


@pytest.fixture(scope="module")
def gemma():
  return tokenizer_lib.load(model_loading.offline_270m_dir(
      settings.from_config(base.get_config()).model))


@pytest.fixture(scope="module")
def texts(gemma):
  return stop_text.token_texts(gemma, gemma.vocab_size())


def sequences(gemma, texts, stop, count, length=40, seed=0):
  """Random token sequences, mostly of short tokens sharing characters with
  `stop`, half of them with the stop text's own tokens, or its first half's,
  spliced in."""
  near = [v for v, p in enumerate(texts) if p and len(p) <= 6 and set(p) & set(stop)]
  parts = [gemma.encode(stop, add_bos=False), gemma.encode(stop[:len(stop) // 2], add_bos=False)]
  rng = random.Random(seed)
  out = []
  for i in range(count):
    tokens = [rng.choice(near) if rng.random() < 0.9 else rng.randrange(len(texts))
              for _ in range(length)]
    if i % 2:
      at = rng.randrange(length)
      tokens[at:at] = parts[i % 4 // 2]
    out.append(tokens[:length])
  return out


@pytest.mark.parametrize("stop", STOPS)
def test_the_table_stops_exactly_where_the_decoded_text_first_holds_the_stop_text(
    gemma, texts, stop):
  table = stop_text.transition_table(texts, stop)
  assert table.shape == (len(stop) + 1, gemma.vocab_size()) and table.dtype == np.int16
  stopped = 0
  for tokens in sequences(gemma, texts, stop, 60):
    states = [final_state(table, tokens[:n]) for n in range(1, len(tokens) + 1)]
    assert states == reference_states(texts, stop, tokens)
    for n, state in enumerate(states, start=1):
      assert (state == len(stop)) == (stop in gemma.decode(tokens[:n])), (stop, tokens[:n])
    stopped += states[-1] == len(stop)
  assert 0 < stopped < 60  # both outcomes were tried


def test_a_stop_text_split_across_tokens_is_found_and_a_near_miss_is_not(gemma, texts):
  table = stop_text.transition_table(texts, "</answer>")
  whole = gemma.encode("so <answer>42</answer> ok", add_bos=False)
  assert len(whole) > 8  # "</", "answer", ">" are separate tokens
  ends = [final_state(table, whole[:n]) == 9 for n in range(1, len(whole) + 1)]
  assert ends.index(True) == len(gemma.encode("so <answer>42</answer>", add_bos=False)) - 1
  near = gemma.encode("</answe r> </ answer> <answer>", add_bos=False)
  assert final_state(table, near) < 9


class StrippingTokenizer:
  """Pieces joined, the text's first space dropped (as Llama-style decoders do); id 3 is a lone byte."""

  pieces = ("<bos>", " x", "</a>", "\ufffd", "a", " </a>")

  def encode(self, text):
    return [0, self.pieces.index(text)]

  def decode(self, ids):
    return "".join(self.pieces[i] for i in ids if i != 0).removeprefix(" ")  # IndexError past 5

  def bos_id(self):
    return 0


def test_token_texts_keep_the_leading_space_a_decoder_strips_and_drop_lone_bytes():
  texts = stop_text.token_texts(StrippingTokenizer(), 7)
  # <bos> reads as nothing and id 6 is past the vocabulary: neither is its own
  # text, so both reset the match (a stop may be missed, never invented).
  assert texts == [None, " x", "</a>", None, "a", " </a>", None]
  table = stop_text.transition_table(texts, " </a>")
  assert final_state(table, [5]) == 5  # the single decode's "</a>" would miss it
  assert final_state(table, [1, 2]) == 0  # " x</a>"
  table = stop_text.transition_table(texts, "x</a>")
  assert final_state(table, [1, 2]) == 5
  assert final_state(table, [1, 3, 2]) == 0  # a lone byte between: unknown text
