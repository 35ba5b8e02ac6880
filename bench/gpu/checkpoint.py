"""Random Gemma-3 checkpoints that both gemma-grpo and transformers load, with no download.

The GPU machine reaches no network and the offline 270M's weights (227 MiB)
cannot travel with the call, so the first-light run writes its own: a
Hugging Face text checkpoint (config.json, model.safetensors) of the real
shapes, weights drawn from numpy's PCG64 with a fixed seed (the same bytes on
every machine, whatever torch or jax is installed), and a word-level
tokenizer with Gemma's special-token ids (`w<i>` is token i). Norm weights
are random too: a loader that dropped or swapped one would still match at 0.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

# google/gemma-3-270m and google/gemma-3-1b-it (their config.json), and the
# suite's tiny shapes (configs/tiny.py's model.random).
SHAPES = {
    "tiny": dict(num_layers=2, embed_dim=64, hidden_dim=128, num_heads=4, head_dim=16,
                 num_kv_heads=1, sliding_window=64, vocab_size=262144),
    "270m": dict(num_layers=18, embed_dim=640, hidden_dim=2048, num_heads=4, head_dim=256,
                 num_kv_heads=1, sliding_window=512, vocab_size=262144),
    "1b": dict(num_layers=26, embed_dim=1152, hidden_dim=6912, num_heads=4, head_dim=256,
               num_kv_heads=1, sliding_window=512, vocab_size=262144),
}
SPECIALS = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3,
            "<start_of_turn>": 105, "<end_of_turn>": 106}


def hf_config(s: dict) -> dict:
  """config.json of a Gemma3ForCausalLM with shapes `s` (transformers' Gemma3TextConfig keys)."""
  return {
      "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
      "vocab_size": s["vocab_size"], "hidden_size": s["embed_dim"],
      "intermediate_size": s["hidden_dim"], "num_hidden_layers": s["num_layers"],
      "num_attention_heads": s["num_heads"], "num_key_value_heads": s["num_kv_heads"],
      "head_dim": s["head_dim"], "sliding_window": s["sliding_window"],
      "query_pre_attn_scalar": s["head_dim"], "rms_norm_eps": 1e-6,
      "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0,
      "max_position_embeddings": 32768, "tie_word_embeddings": True,
      "pad_token_id": 0, "eos_token_id": [1, 106], "bos_token_id": 2,
      "hidden_activation": "gelu_pytorch_tanh", "torch_dtype": "float32",
  }


def tensors(s: dict, seed: int) -> dict[str, np.ndarray]:
  """HF-named weights: projections fan-in scaled, embedding unit-scaled rows, norms N(0, 0.5)."""
  rng = np.random.default_rng(seed)
  d, f, h, heads, kv = s["embed_dim"], s["hidden_dim"], s["head_dim"], s["num_heads"], s["num_kv_heads"]

  def normal(*shape, scale):
    return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)

  out = {"model.embed_tokens.weight": normal(s["vocab_size"], d, scale=1.0),
         "model.norm.weight": normal(d, scale=0.5)}
  for layer in range(s["num_layers"]):
    p = f"model.layers.{layer}."
    out.update({
        f"{p}self_attn.q_proj.weight": normal(heads * h, d, scale=d ** -0.5),
        f"{p}self_attn.k_proj.weight": normal(kv * h, d, scale=d ** -0.5),
        f"{p}self_attn.v_proj.weight": normal(kv * h, d, scale=d ** -0.5),
        f"{p}self_attn.o_proj.weight": normal(d, heads * h, scale=(heads * h) ** -0.5),
        f"{p}self_attn.q_norm.weight": normal(h, scale=0.5),
        f"{p}self_attn.k_norm.weight": normal(h, scale=0.5),
        f"{p}mlp.gate_proj.weight": normal(f, d, scale=d ** -0.5),
        f"{p}mlp.up_proj.weight": normal(f, d, scale=d ** -0.5),
        f"{p}mlp.down_proj.weight": normal(d, f, scale=f ** -0.5),
        **{f"{p}{norm}.weight": normal(d, scale=0.5) for norm in (
            "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
            "post_feedforward_layernorm")},
    })
  return out


def write_tokenizer(out: pathlib.Path, vocab_size: int) -> None:
  """A word-level tokenizer.json: `w<i>` is id i, Gemma's special ids, <bos> added."""
  from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors  # pylint: disable=g-import-not-at-top

  vocab = {f"w{i}": i for i in range(vocab_size)}
  for piece, i in SPECIALS.items():
    del vocab[f"w{i}"]
    vocab[piece] = i
  tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tok.add_special_tokens([AddedToken(p, special=True, normalized=False) for p in SPECIALS])
  tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
  tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
  tok.save(str(out / "tokenizer.json"))
  (out / "tokenizer_config.json").write_text(json.dumps(
      {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}))


def write(out: pathlib.Path, shapes: str, seed: int = 0) -> pathlib.Path:
  """Writes the checkpoint directory (a `model.source` for gemma-grpo and transformers)."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top

  s = SHAPES[shapes]
  out.mkdir(parents=True, exist_ok=True)
  save_file(tensors(s, seed), str(out / "model.safetensors"))
  (out / "config.json").write_text(json.dumps(hf_config(s), indent=1))
  write_tokenizer(out, s["vocab_size"])
  return out
