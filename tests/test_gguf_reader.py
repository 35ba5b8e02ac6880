"""gguf_reader reads what gguf-py writes, value for value, as gguf-py's own reader does."""

import gguf
import numpy as np
import pytest

from gemma_grpo.model import gguf_reader


@pytest.fixture(scope="module")
def written(tmp_path_factory):
  """A GGUF file with a value of every kind, and tensors of four storage types."""
  path = tmp_path_factory.mktemp("gguf") / "m.gguf"
  rng = np.random.default_rng(0)
  writer = gguf.GGUFWriter(str(path), arch="gemma3")
  writer.add_uint8("t.u8", 200)
  writer.add_int8("t.i8", -5)
  writer.add_uint16("t.u16", 60_000)
  writer.add_int16("t.i16", -30_000)
  writer.add_uint32("t.u32", 4_000_000_000)
  writer.add_int32("t.i32", -2_000_000_000)
  writer.add_float32("t.f32", 0.1)
  writer.add_bool("t.bool", True)
  writer.add_uint64("t.u64", 2**63 + 5)
  writer.add_int64("t.i64", -(2**62))
  writer.add_float64("t.f64", 0.1)
  writer.add_string("t.text", "<start_of_turn>ünïcode ▁x")
  writer.add_array("t.pieces", ["<pad>", "▁a", "", "日本"])
  writer.add_array("t.scores", [0.0, -1.5, 2.25])
  writer.add_array("t.types", [1, 3, 6])
  writer.add_array("t.flags", [True, False])
  writer.add_array("t.nested", [[1, 2], ["a", "b"]])
  arrays = {
      "f32": rng.standard_normal((3, 64)).astype(np.float32),
      "f16": rng.standard_normal((2, 32)).astype(np.float16),
      "bf16": gguf.quants.quantize(rng.standard_normal((4, 32)).astype(np.float32),
                                   gguf.GGMLQuantizationType.BF16),
      "q8_0": gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32),
                                   gguf.GGMLQuantizationType.Q8_0),
  }
  raw_types = {"bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}
  for name, array in arrays.items():
    writer.add_tensor(name, array, raw_dtype=raw_types.get(name))
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return path


def test_metadata_matches_gguf_py(written):
  theirs = gguf.GGUFReader(str(written))
  ours = gguf_reader.read(written)
  keys = [k for k in theirs.fields if not k.startswith("GGUF.")]  # its header pseudo-fields
  assert list(ours.metadata) == keys
  for key in keys:
    if key != "t.nested":  # gguf-py's contents() flattens an array of arrays
      assert ours.metadata[key] == theirs.fields[key].contents(), key
  assert ours.metadata["t.nested"] == [[1, 2], ["a", "b"]]
  assert ours.metadata["t.text"] == "<start_of_turn>ünïcode ▁x"
  assert ours.metadata["t.pieces"] == ["<pad>", "▁a", "", "日本"]
  assert ours.metadata["t.u64"] == 2**63 + 5 and ours.metadata["t.bool"] is True
  assert ours.metadata["t.flags"] == [True, False]


def test_tensors_dequantize_as_gguf_py_reads_them(written):
  theirs = {t.name: t for t in gguf.GGUFReader(str(written)).tensors}
  ours = gguf_reader.read(written).tensors
  assert [t.name for t in ours] == list(theirs)
  for tensor in ours:
    reference = theirs[tensor.name]
    assert tensor.tensor_type == reference.tensor_type
    assert tensor.shape == tuple(reference.shape.tolist())
    np.testing.assert_array_equal(gguf.quants.dequantize(tensor.data, tensor.tensor_type),
                                  gguf.quants.dequantize(reference.data, reference.tensor_type),
                                  err_msg=tensor.name)


def test_a_file_that_is_not_gguf_is_named(tmp_path):
  path = tmp_path / "model.bin"
  path.write_bytes(b"PK\x03\x04" + bytes(60))
  with pytest.raises(ValueError, match=rf"{path}: not a GGUF file"):
    gguf_reader.read(path)


def test_an_unknown_version_is_named(written, tmp_path):
  path = tmp_path / "v9.gguf"
  data = bytearray(written.read_bytes())
  data[4:8] = (9).to_bytes(4, "little")
  path.write_bytes(bytes(data))
  with pytest.raises(ValueError, match=rf"{path}: GGUF version 9"):
    gguf_reader.read(path)
