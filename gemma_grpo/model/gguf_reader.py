"""Reading a GGUF file: its metadata as Python values, its tensors as byte views.

gguf-py's GGUFReader makes a numpy view of every value it parses, three for
each of the 262,144 pieces of Gemma-3's vocabulary, a Python object each.
This reader parses the same format (GGUF versions 2 and 3, little-endian)
with `struct` over one read-only mmap, making only the values, and leaves
the tensor bytes in the file until they are dequantized.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import struct
from typing import Any

import gguf
import numpy as np

_MAGIC = gguf.GGUF_MAGIC.to_bytes(4, "little")  # b"GGUF"
_VERSIONS = (2, 3)
_STRING, _ARRAY = gguf.GGUFValueType.STRING, gguf.GGUFValueType.ARRAY
_T = gguf.GGUFValueType
# The other value types: little-endian struct formats.
_SCALAR_FORMATS = {_T.UINT8: "<B", _T.INT8: "<b", _T.UINT16: "<H", _T.INT16: "<h",
                   _T.UINT32: "<I", _T.INT32: "<i", _T.FLOAT32: "<f", _T.BOOL: "<?",
                   _T.UINT64: "<Q", _T.INT64: "<q", _T.FLOAT64: "<d"}


@dataclasses.dataclass(frozen=True)
class Tensor:
  name: str
  tensor_type: gguf.GGMLQuantizationType
  shape: tuple[int, ...]  # GGUF's order: the innermost (contiguous) dimension first
  data: np.ndarray  # its bytes in the file, uint8, as gguf.quants.dequantize takes them


@dataclasses.dataclass(frozen=True)
class GGUFContents:
  metadata: dict[str, Any]  # key -> int, float, bool, str or a list of them
  tensors: list[Tensor]


class _Cursor:
  """Reads GGUF's little-endian values from `buffer`, advancing `pos`."""

  def __init__(self, buffer: mmap.mmap, path: str):
    self.buffer, self.path, self.pos = buffer, path, 0

  def unpack(self, fmt: str) -> tuple:
    values = struct.unpack_from(fmt, self.buffer, self.pos)
    self.pos += struct.calcsize(fmt)
    return values

  def string(self) -> str:
    (length,) = self.unpack("<Q")
    end = self.pos + length
    text = self.buffer[self.pos:end].decode("utf-8")
    self.pos = end
    return text

  def value(self, kind: int) -> Any:
    if kind == _STRING:
      return self.string()
    if kind == _ARRAY:
      item_kind, count = self.unpack("<IQ")
      if item_kind in _SCALAR_FORMATS:  # one numpy read, not `count` struct calls
        dtype = np.dtype(_SCALAR_FORMATS[item_kind].replace("?", "b1"))
        items = np.frombuffer(self.buffer, dtype, count, self.pos)
        self.pos += items.nbytes
        return items.tolist()
      return [self.value(item_kind) for _ in range(count)]
    if kind not in _SCALAR_FORMATS:
      raise ValueError(f"{self.path}: unknown GGUF value type {kind} at byte {self.pos}")
    return self.unpack(_SCALAR_FORMATS[kind])[0]


def read(path: str | os.PathLike) -> GGUFContents:
  """Every metadata value of the GGUF file at `path`, and its tensors' places."""
  path = str(path)
  with open(path, "rb") as f:
    buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
  cursor = _Cursor(buffer, path)
  if buffer[:4] != _MAGIC:
    raise ValueError(f"{path}: not a GGUF file (it does not start with {_MAGIC!r})")
  cursor.pos = 4
  version, tensor_count, kv_count = cursor.unpack("<IQQ")
  if version not in _VERSIONS:
    raise ValueError(f"{path}: GGUF version {version} (byte-swapped if huge); "
                     f"this reader takes little-endian versions {_VERSIONS}")
  metadata = {}
  for _ in range(kv_count):
    key = cursor.string()
    (kind,) = cursor.unpack("<I")
    metadata[key] = cursor.value(kind)
  infos = []
  for _ in range(tensor_count):
    name = cursor.string()
    (n_dims,) = cursor.unpack("<I")
    shape = cursor.unpack(f"<{n_dims}Q")
    kind, offset = cursor.unpack("<IQ")
    infos.append((name, gguf.GGMLQuantizationType(kind), shape, offset))
  alignment = metadata.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT)
  data_start = -(-cursor.pos // alignment) * alignment
  tensors = []
  for name, kind, shape, offset in infos:
    block_size, type_size = gguf.GGML_QUANT_SIZES[kind]
    n_bytes = int(np.prod(shape)) * type_size // block_size
    data = np.frombuffer(buffer, np.uint8, n_bytes, data_start + offset)
    byte_shape = gguf.quants.quant_shape_to_byte_shape(tuple(reversed(shape)), kind)
    tensors.append(Tensor(name, kind, tuple(shape), data.reshape(byte_shape)))
  return GGUFContents(metadata, tensors)
