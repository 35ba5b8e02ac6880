"""The checkpoint's own tokenizer behind one small interface.

`tokenizer.json` is read with the Rust `tokenizers` library directly:
transformers' AutoTokenizer would give the same ids but would import and
initialise all of transformers at every start of a run, for nothing the Rust
library does not already do. A sentencepiece `tokenizer.model` is the fallback.
Tunix accepts any object with encode/decode/bos_id/eos_id/pad_id.
"""

from __future__ import annotations

import json
import pathlib
from typing import Sequence

import numpy as np
import sentencepiece as spm
import tokenizers

from gemma_grpo import errors

_GEMMA_SPECIALS = {"pad": "<pad>", "eos": "<eos>", "bos": "<bos>"}


class JsonTokenizer:
  """A `tokenizer.json` tokenizer; encode() adds <bos> like HF's does."""

  def __init__(self, directory: pathlib.Path):
    self._tok = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    self._ids = {}
    names = _special_token_names(directory)
    for role, default in _GEMMA_SPECIALS.items():
      piece = names.get(role, default)
      self._ids[role] = self._tok.token_to_id(piece) if piece else None
    if self._ids["pad"] is None:
      raise errors.UserError(f"model: {directory}/tokenizer.json defines no pad token")

  def encode(self, text: str, add_bos: bool = True) -> list[int]:
    return self._tok.encode(text, add_special_tokens=add_bos).ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

  def bos_id(self) -> int | None:
    return self._ids["bos"]

  def eos_id(self) -> int | None:
    return self._ids["eos"]

  def pad_id(self) -> int:
    return self._ids["pad"]

  def token_id(self, piece: str) -> int | None:
    return self._tok.token_to_id(piece)

  def vocab_size(self) -> int:
    return self._tok.get_vocab_size(with_added_tokens=True)


class SentencePieceTokenizer:
  """A sentencepiece `tokenizer.model`; encode() adds <bos>."""

  def __init__(self, path: pathlib.Path):
    self._sp = spm.SentencePieceProcessor(model_file=str(path))
    if self._sp.pad_id() < 0:
      raise errors.UserError(
          f"model: {path} defines no pad id (Gemma's has pad=0); use a"
          " tokenizer.json instead"
      )

  def encode(self, text: str, add_bos: bool = True) -> list[int]:
    ids = self._sp.EncodeAsIds(text)
    return [self._sp.bos_id(), *ids] if add_bos and self._sp.bos_id() >= 0 else ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    del skip_special_tokens  # sentencepiece never renders control pieces
    return self._sp.DecodeIds(list(ids))

  def bos_id(self) -> int | None:
    return self._sp.bos_id() if self._sp.bos_id() >= 0 else None

  def eos_id(self) -> int | None:
    return self._sp.eos_id() if self._sp.eos_id() >= 0 else None

  def pad_id(self) -> int:
    return self._sp.pad_id()

  def token_id(self, piece: str) -> int | None:
    i = self._sp.piece_to_id(piece)
    return None if i == self._sp.unk_id() and piece != self._sp.id_to_piece(i) else i

  def vocab_size(self) -> int:
    return self._sp.GetPieceSize()


Tokenizer = JsonTokenizer | SentencePieceTokenizer


def _special_token_names(directory: pathlib.Path) -> dict[str, str]:
  """bos/eos/pad token strings from tokenizer_config.json, if it names them."""
  config = directory / "tokenizer_config.json"
  if not config.exists():
    return {}
  values = json.loads(config.read_text())
  names = {}
  for role in _GEMMA_SPECIALS:
    value = values.get(f"{role}_token")
    if isinstance(value, dict):
      value = value.get("content")
    if isinstance(value, str):
      names[role] = value
  return names


# Parsed tokenizers by their files' identity. Gemma's tokenizer.json (262,144
# pieces) takes about a second to parse, and one process may load the same one
# several times: a notebook that trains, evaluates and exports, or the test
# suite's fork server, which parses it once for every run forked from it.
_LOADED: dict[tuple, Tokenizer] = {}
_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def _identity(directory: pathlib.Path) -> tuple:
  """The files a tokenizer is read from, with their size and change time."""
  ids = []
  for name in _FILES:
    path = directory / name
    if path.exists():
      stat = path.stat()
      ids.append((str(path.resolve()), stat.st_size, stat.st_mtime_ns))
  return tuple(ids)


def load(directory: str | pathlib.Path) -> Tokenizer:
  """The tokenizer in `directory`: tokenizer.json, else tokenizer.model.

  Parsed once per process while its files stay unchanged; tokenizers are
  read-only after loading, so the same object is returned to every caller.
  """
  directory = pathlib.Path(directory)
  key = _identity(directory)
  if key in _LOADED:
    return _LOADED[key]
  if (directory / "tokenizer.json").exists():
    tok = JsonTokenizer(directory)
  elif (directory / "tokenizer.model").exists():
    tok = SentencePieceTokenizer(directory / "tokenizer.model")
  else:
    raise errors.UserError(
        f"model: no tokenizer in {directory} (expected tokenizer.json or tokenizer.model)"
    )
  _LOADED[key] = tok
  return tok


def stop_token_ids(tok: Tokenizer) -> list[int]:
  """<eos> and <end_of_turn>: Gemma ends a chat turn with the latter."""
  ids = {tok.eos_id(), tok.token_id("<end_of_turn>")}
  return sorted(i for i in ids if i is not None and i >= 0)


def tokens_through(ids: Sequence[int], text: str, stop_text: str,
                   tok: Tokenizer) -> tuple[int, str] | None:
  """(n, text) of a completion cut right after the first `stop_text`, or None.

  `text` is the decoded completion of `ids`. n is the fewest leading tokens
  whose decoding contains `stop_text` (a binary search: containment only
  grows with the prefix), so the tokens after the stop can be dropped from
  the loss just as a stop token's followers are.
  """
  if not stop_text:
    return None
  at = text.find(stop_text)
  if at < 0:
    return None
  low, high = 1, len(ids)
  while low < high:
    mid = (low + high) // 2
    if stop_text in tok.decode(list(ids[:mid])):
      high = mid
    else:
      low = mid + 1
  return low, text[:at + len(stop_text)]


def apply_stop_text(texts: Sequence[str], token_ids: Sequence[Sequence[int]], limit: int,
                    stop_text: str, tok: Tokenizer) -> tuple[list[str], list[bool], list[int]]:
  """(texts, truncated, token counts) of completions cut after `stop_text`.

  The completions come from a sampler that already stops at stop tokens, so
  one with `limit` tokens and no `stop_text` ran out of room.
  """
  out_texts, truncated, counts = [], [], []
  for text, ids in zip(texts, token_ids, strict=True):
    cut = tokens_through(ids, text, stop_text, tok)
    n = len(ids) if cut is None else cut[0]
    out_texts.append(text if cut is None else cut[1])
    truncated.append(cut is None and n >= limit)
    counts.append(n)
  return out_texts, truncated, counts


def left_pad(rows: Sequence[np.ndarray], pad_id: int, width: int | None = None) -> np.ndarray:
  """Token rows stacked into [len(rows), width], each padded on the left.

  Prompts are left-padded so that every row's last token sits in the same
  column, where decoding starts. `width` defaults to the longest row.
  """
  width = max(len(r) for r in rows) if width is None else width
  return np.stack([np.pad(r, (width - len(r), 0), constant_values=pad_id) for r in rows])

