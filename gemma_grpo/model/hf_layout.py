"""A policy as plain Gemma-3: Tunix parameters in Hugging Face's names and layouts.

LoRA is merged in float32 before any cast (lora.merged_params: W' = W +
(alpha / r) * A·B in W's axes); the text config is the base model's, with
the shapes read off the merged tensors.
"""

from __future__ import annotations

import pathlib
import re

import numpy as np
from transformers import Gemma3TextConfig

from gemma_grpo.model import lora
from gemma_grpo.model import model_loading
from gemma_grpo.seam import tunix_gemma3


# Tunix Gemma-3 norm module -> HF module (same values: both compute x * (1 + w)).
_NORMS = {
    "pre_attention_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "pre_ffw_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    f"attn.{tunix_gemma3.QUERY_NORM}": "self_attn.q_norm",
    f"attn.{tunix_gemma3.KEY_NORM}": "self_attn.k_norm",
}
def _heads_to_rows(w_NDH: np.ndarray) -> np.ndarray:
  """Tunix [heads, embed, head_dim] -> HF [heads*head_dim, embed]."""
  n, d, h = w_NDH.shape
  return w_NDH.transpose(0, 2, 1).reshape(n * h, d)


def to_hf(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Tunix Gemma-3 parameters -> HF Gemma3ForCausalLM names and layouts.

  The inverse of tunix/models/gemma3/params_safetensors.py. Vision-tower and
  multimodal-projector parameters are dropped: the export is text-only.
  """
  out = {}
  for name, w in params.items():
    if name.startswith("vision_encoder.") or name.startswith("embedder.mm_"):
      continue
    if name == "embedder.input_embedding":
      out["model.embed_tokens.weight"] = w
      continue
    if name == "final_norm.scale":
      out["model.norm.weight"] = w
      continue
    m = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
    if not m:
      raise ValueError(f"unexpected Gemma-3 parameter {name!r}")
    p, rest = f"model.layers.{m[1]}.", m[2]
    if rest.endswith(".scale") and rest[: -len(".scale")] in _NORMS:
      out[f"{p}{_NORMS[rest[:-len('.scale')]]}.weight"] = w
    elif rest == "attn.q_einsum.w":  # [N, D, H]
      out[f"{p}self_attn.q_proj.weight"] = _heads_to_rows(w)
    elif rest == "attn.kv_einsum.w":  # [2, K, D, H]
      out[f"{p}self_attn.k_proj.weight"] = _heads_to_rows(w[0])
      out[f"{p}self_attn.v_proj.weight"] = _heads_to_rows(w[1])
    elif rest == "attn.qkv_einsum.w":  # [3, N, D, H]
      for i, proj in enumerate("qkv"):
        out[f"{p}self_attn.{proj}_proj.weight"] = _heads_to_rows(w[i])
    elif rest == "attn.attn_vec_einsum.w":  # [N, H, D] -> [D, N*H]
      out[f"{p}self_attn.o_proj.weight"] = w.reshape(-1, w.shape[-1]).T
    elif rest in ("mlp.gate_proj.kernel", "mlp.up_proj.kernel", "mlp.down_proj.kernel"):
      out[f"{p}{rest[: -len('.kernel')]}.weight"] = w.T  # [in, out] -> [out, in]
    else:
      raise ValueError(f"unexpected Gemma-3 parameter {name!r}")
  return {k: np.ascontiguousarray(v) for k, v in sorted(out.items(), key=lambda kv: _tensor_order(kv[0]))}


def _tensor_order(hf: str) -> tuple:
  m = re.match(r"model\.layers\.(\d+)\.", hf)
  if m:
    return (1, int(m[1]), hf)
  return (0 if "embed_tokens" in hf else 2, 0, hf)


def merged_tensors(policy) -> dict[str, np.ndarray]:
  """The policy's text model, LoRA merged, float32, HF names and layouts."""
  return to_hf(lora.merged_params(policy.actor, policy.settings.lora.scale))


def _base_hf_config(policy) -> dict:
  """The HF text config the run's base model was built from."""
  model_dir = policy.loaded.model_dir
  if model_dir is None:
    return model_loading.random_hf_config(policy.settings.model.random)
  return dict(model_loading.text_config(pathlib.Path(model_dir)))


def text_config(policy, tensors: dict[str, np.ndarray], dtype: str):
  """Gemma3TextConfig of the export; shapes are read off the tensors."""
  values = {
      k: v for k, v in _base_hf_config(policy).items()
      if k not in ("architectures", "model_type", "transformers_version",
                   "torch_dtype", "dtype", "auto_map", "_name_or_path")
  }
  embed = tensors["model.embed_tokens.weight"]
  q = tensors["model.layers.0.self_attn.q_proj.weight"]
  k = tensors["model.layers.0.self_attn.k_proj.weight"]
  head_dim = tensors["model.layers.0.self_attn.q_norm.weight"].shape[0]
  values.update(
      vocab_size=embed.shape[0],
      hidden_size=embed.shape[1],
      intermediate_size=tensors["model.layers.0.mlp.gate_proj.weight"].shape[0],
      num_hidden_layers=1 + max(
          int(m[1]) for n in tensors if (m := re.match(r"model\.layers\.(\d+)\.", n))
      ),
      num_attention_heads=q.shape[0] // head_dim,
      num_key_value_heads=k.shape[0] // head_dim,
      head_dim=head_dim,
      tie_word_embeddings=True,
  )
  if not {"rope_parameters", "rope_theta", "rope_local_base_freq", "rope_scaling"} & set(values):
    # What tunix_config assumed; left unset, transformers writes a malformed dict.
    values["rope_parameters"] = {
        "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    }
  config = Gemma3TextConfig.from_dict(values)
  config.architectures = ["Gemma3ForCausalLM"]
  config.dtype = dtype
  return config
