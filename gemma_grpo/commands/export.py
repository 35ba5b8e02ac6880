"""`gemma-grpo export`: a run's LoRA policy merged into plain Gemma-3 weights.

  gemma-grpo export --workdir runs/gemma3_270m --out exports/gemma3_270m
  gemma-grpo export --workdir runs/gemma3_270m --out exports/g270m-gguf --format gguf

`--format hf` writes a text-only Gemma3ForCausalLM directory: safetensors
(sharded with an index above --max-shard-size), config.json,
generation_config.json, the run's tokenizer carrying the training chat
template, and a README.md model card. `--format gguf` writes one GGUF file
for llama.cpp: the file itself when --out ends in .gguf, else model.gguf and the
model card in the --out directory.

LoRA is merged in float32 before any cast (lora.merged_params: W' = W +
(alpha / r) * A·B in W's axes).

The work directory is only read; the export is built in a temporary sibling
of --out and renamed into place, so an interrupted export leaves nothing
half-written behind.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import sys
import tempfile
import uuid

from absl import logging
import numpy as np
import safetensors.numpy

from configs import base
from gemma_grpo import errors
from gemma_grpo.model import gguf_io
from gemma_grpo.runtime import hub
from gemma_grpo.model import lora
from gemma_grpo.runtime import mesh as mesh_lib
from gemma_grpo.runtime import metrics as metrics_lib
from gemma_grpo.model import model_card
from gemma_grpo.tasks import prompts
from gemma_grpo import seam
from gemma_grpo import storage

seam.check_versions()  # Tunix/Qwix internals below: other versions stop here (seam.py)

FORMATS = ("hf", "gguf")
DTYPES = ("float32", "bfloat16")
GGUF_FILE = model_card.GGUF_FILE
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

# Tunix Gemma-3 norm module -> HF module (same values: both compute x * (1 + w)).
_NORMS = {
    "pre_attention_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "pre_ffw_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "attn._query_norm": "self_attn.q_norm",
    "attn._key_norm": "self_attn.k_norm",
}
_SPECIAL_TOKENS = {"bos": "<bos>", "eos": "<eos>", "pad": "<pad>", "unk": "<unk>"}
_SIZE_UNITS = {
    "": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
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
  c = policy.config.lora
  return to_hf(lora.merged_params(policy.actor, c.alpha / c.rank))


# --- HF directory ------------------------------------------------------------


def parse_size(text: str) -> int:
  """'2GB' -> 2e9 bytes (KB/MB/GB are powers of 1000, KiB/MiB/GiB of 1024)."""
  m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B|B)?\s*", text, flags=re.I)
  if not m or float(m[1]) <= 0:
    raise errors.UserError(
        f"--max-shard-size={text!r}: expected a size such as 2GB, 500MB or 4GiB"
    )
  return int(float(m[1]) * _SIZE_UNITS[(m[2] or "").upper()])


def shard_names(tensors: dict[str, np.ndarray], max_bytes: int) -> list[list[str]]:
  """Consecutive groups of tensors of at most `max_bytes` each (a larger
  tensor gets a shard of its own)."""
  shards, size = [[]], 0
  for name, array in tensors.items():
    if shards[-1] and size + array.nbytes > max_bytes:
      shards.append([])
      size = 0
    shards[-1].append(name)
    size += array.nbytes
  return shards


def write_safetensors(tensors: dict[str, np.ndarray], out_dir: pathlib.Path,
                      max_bytes: int) -> list[str]:
  """model.safetensors, or shards plus model.safetensors.index.json."""
  shards = shard_names(tensors, max_bytes)
  metadata = {"format": "pt"}
  if len(shards) == 1:
    safetensors.numpy.save_file(tensors, out_dir / SINGLE_FILE, metadata=metadata)
    return [SINGLE_FILE]
  files, weight_map = [], {}
  for i, names in enumerate(shards, start=1):
    file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
    safetensors.numpy.save_file({n: tensors[n] for n in names}, out_dir / file, metadata=metadata)
    weight_map.update(dict.fromkeys(names, file))
    files.append(file)
  index = {
      "metadata": {"total_size": sum(a.nbytes for a in tensors.values())},
      "weight_map": dict(sorted(weight_map.items())),
  }
  (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
  return files + [INDEX_FILE]


def _base_hf_config(policy) -> dict:
  """The HF text config the run's base model was built from."""
  from gemma_grpo.model import model_loading  # pylint: disable=g-import-not-at-top

  model_dir = policy.loaded.model_dir
  if model_dir is None:
    return model_loading.random_hf_config(policy.config.model.random)
  return dict(model_loading.text_config(pathlib.Path(model_dir)))


def text_config(policy, tensors: dict[str, np.ndarray], dtype: str):
  """Gemma3TextConfig of the export; shapes are read off the tensors."""
  from transformers import Gemma3TextConfig  # pylint: disable=g-import-not-at-top

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


def save_tokenizer(tokenizer_dir: pathlib.Path, out_dir: pathlib.Path) -> list[str]:
  """Copies the run's tokenizer files, with the training chat template set.

  The template goes into tokenizer_config.json, which every transformers
  version reads; the files are copied rather than round-tripped through
  AutoTokenizer, which would take seconds and may rewrite them.
  """
  names = ("tokenizer.json", "tokenizer.model", "special_tokens_map.json", "added_tokens.json")
  copied = [n for n in names if (tokenizer_dir / n).is_file()]
  if not {"tokenizer.json", "tokenizer.model"} & set(copied):
    raise errors.UserError(f"{tokenizer_dir}: no tokenizer.json or tokenizer.model to export")
  for name in copied:
    shutil.copyfile(tokenizer_dir / name, out_dir / name)
  config_file = tokenizer_dir / "tokenizer_config.json"
  config = json.loads(config_file.read_text()) if config_file.is_file() else {}
  config.setdefault("tokenizer_class", "GemmaTokenizer")
  for role, piece in _SPECIAL_TOKENS.items():
    config.setdefault(f"{role}_token", piece)
  config["chat_template"] = prompts.CHAT_TEMPLATE
  (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
  return copied + ["tokenizer_config.json"]


# --- GGUF ------------------------------------------------------------------------


def gguf_vocabulary(tokenizer_dir: pathlib.Path):
  """(pieces, scores, types) of the run's tokenizer for GGUF metadata.

  A sentencepiece tokenizer.model gives them exactly (as llama.cpp's own
  converter reads them); otherwise they are derived from tokenizer.json, with
  scores that reproduce its merge order. For the offline model this gives the
  GGUF's pieces and types exactly (re-reading the 262k-entry arrays with
  GGUFReader would take ~30 s), and the tokenizer training used.
  """
  if (tokenizer_dir / "tokenizer.model").is_file():
    return gguf_io.sentencepiece_vocabulary(tokenizer_dir / "tokenizer.model")
  if (tokenizer_dir / "tokenizer.json").is_file():
    return gguf_io.tokenizer_json_vocabulary(tokenizer_dir / "tokenizer.json")
  raise errors.UserError(f"{tokenizer_dir}: no tokenizer.json or tokenizer.model to export")


# --- Output directory ------------------------------------------------------------


def check_options(workdir: pathlib.Path, out: pathlib.Path, *, dtype: str, fmt: str,
                  max_shard_size: str, overwrite: bool) -> None:
  """Raises UserError for bad options or an `out` that would clobber something."""
  if dtype not in DTYPES:
    raise errors.UserError(f"--dtype={dtype!r}: use one of {DTYPES}")
  if fmt not in FORMATS:
    raise errors.UserError(f"--format={fmt!r}: use one of {FORMATS}")
  parse_size(max_shard_size)
  w, o = (out.resolve(), out.resolve()) if storage.is_remote(workdir) else (
      pathlib.Path(workdir).resolve(), out.resolve())
  if not storage.is_remote(workdir) and (o == w or w in o.parents or o in w.parents):
    raise errors.UserError(
        f"--out {out}: must lie outside the work directory {workdir} (export never writes into a run)"
    )
  if out.is_dir() and not any(out.iterdir()):
    return
  if (out.exists() or out.is_symlink()) and not overwrite:
    kind = "directory is not empty" if out.is_dir() else "exists and is not a directory"
    raise errors.UserError(f"--out {out}: {kind}; pass --overwrite to replace it or choose another path")


def _publish(tmp: pathlib.Path, out: pathlib.Path) -> None:
  """Moves the finished export into place, replacing what was there."""
  old = None
  if out.exists() or out.is_symlink():
    old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
    out.rename(old)
  tmp.rename(out)
  if old is not None:
    if old.is_dir() and not old.is_symlink():
      shutil.rmtree(old)
    else:
      old.unlink()


def export_hf(policy, workdir: pathlib.Path, out_dir: pathlib.Path, *,
              dtype: str = "float32", max_shard_size: str = "2GB") -> list[str]:
  """Writes the merged policy into `out_dir` as an HF Gemma3ForCausalLM."""
  max_bytes = parse_size(max_shard_size)
  tensors = merged_tensors(policy)
  config = text_config(policy, tensors, dtype)
  if dtype == "bfloat16":
    import ml_dtypes  # pylint: disable=g-import-not-at-top

    for name in list(tensors):  # one tensor at a time: no second full copy
      tensors[name] = tensors[name].astype(ml_dtypes.bfloat16)
  files = write_safetensors(tensors, out_dir, max_bytes)
  del tensors
  config.save_pretrained(str(out_dir))
  gguf_io.write_generation_config(out_dir)
  files += ["config.json", "generation_config.json"]
  files += save_tokenizer(pathlib.Path(policy.loaded.tokenizer_dir), out_dir)
  (out_dir / "README.md").write_text(model_card.write(policy, workdir, "hf", dtype))
  return files + ["README.md"]


def export_gguf(policy, workdir: pathlib.Path, out_dir: pathlib.Path, *,
                dtype: str = "float32") -> list[str]:
  """Writes the merged policy into `out_dir` as one GGUF file (and a card)."""
  tensors = merged_tensors(policy)
  config = text_config(policy, tensors, dtype)
  gguf_io.write_gguf(
      out_dir / GGUF_FILE, tensors, config.to_dict(),
      gguf_vocabulary(pathlib.Path(policy.loaded.tokenizer_dir)),
      tensor_type={"float32": "F32", "bfloat16": "BF16"}[dtype],
      name=f"{model_card.base_model_id(policy.config.model.source) or 'gemma-3'} GRPO step {policy.step}",
      chat_template=prompts.CHAT_TEMPLATE,
  )
  (out_dir / "README.md").write_text(model_card.write(policy, workdir, "gguf", dtype))
  return [GGUF_FILE, "README.md"]


def export_policy(policy, workdir: str | os.PathLike, out: str | os.PathLike, *,
                  dtype: str = "float32", fmt: str = "hf", max_shard_size: str = "2GB",
                  overwrite: bool = False) -> pathlib.Path:
  """Exports a restored policy to `out`, all or nothing.

  Built in a temporary sibling of `out` and renamed into place at the end.
  """
  workdir, out = storage.path(workdir), pathlib.Path(out).expanduser().absolute()
  check_options(workdir, out, dtype=dtype, fmt=fmt, max_shard_size=max_shard_size,
                overwrite=overwrite)
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
  try:
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private
    if fmt == "hf":
      files = export_hf(policy, workdir, tmp, dtype=dtype, max_shard_size=max_shard_size)
    else:
      files = export_gguf(policy, workdir, tmp, dtype=dtype)
    if fmt == "gguf" and out.suffix.lower() == ".gguf":
      # `--out model.gguf` names the file itself, as llama.cpp's tools expect;
      # the model card only comes with a directory.
      _publish(tmp / GGUF_FILE, out)
      files = [out.name]
    else:
      _publish(tmp, out)
  finally:
    if tmp.exists():
      shutil.rmtree(tmp)
  logging.info("exported step %d to %s (%s, %s): %s", policy.step, out, fmt, dtype, ", ".join(files))
  return out


def export(workdir: str | os.PathLike, out: str | os.PathLike, *, step: int | None = None,
           dtype: str = "float32", fmt: str = "hf", max_shard_size: str = "2GB",
           overwrite: bool = False, push_to_hub_repo: str | None = None) -> pathlib.Path:
  """Restores `workdir`'s policy at `step`, merges it and writes `out`."""
  from gemma_grpo.model import policy as policy_lib  # pylint: disable=g-import-not-at-top

  workdir = storage.path(workdir)
  if not workdir.is_dir():
    raise errors.UserError(f"--workdir {workdir}: no such directory")
  # Every check that needs no model runs before the (slow) restore.
  check_options(workdir, pathlib.Path(out).expanduser().absolute(), dtype=dtype, fmt=fmt,
                max_shard_size=max_shard_size, overwrite=overwrite)

  policy = policy_lib.restore(workdir, mesh_lib.make_mesh(base.get_config().mesh), step)
  logging.info("restored step %d of %s", policy.step, workdir)
  out = export_policy(policy, workdir, out, dtype=dtype, fmt=fmt,
                      max_shard_size=max_shard_size, overwrite=overwrite)
  if push_to_hub_repo:
    url = hub.push_folder(out, push_to_hub_repo)
    logging.info("pushed %s to %s (private)", out, url)
  return out


def main(argv: list[str] | None = None) -> int:
  """`gemma-grpo export --workdir DIR --out DIR [options]`."""
  argv = list(sys.argv[1:] if argv is None else argv)
  parser = argparse.ArgumentParser(
      prog="gemma-grpo export", description=__doc__.splitlines()[0],
  )
  parser.add_argument("--workdir", required=True, help="training run directory or gs:// URL")
  parser.add_argument("--out", required=True,
                      help="output directory (must be new or empty); with --format gguf, a path"
                           " ending in .gguf writes that one file")
  parser.add_argument("--step", type=int, help="checkpoint step (default: the latest)")
  parser.add_argument("--dtype", choices=DTYPES, default="float32", help="saved weight dtype (cast after merging)")
  parser.add_argument("--format", choices=FORMATS, default="hf", dest="fmt",
                      help="hf: safetensors directory; gguf: one GGUF file for llama.cpp")
  parser.add_argument("--max-shard-size", default="2GB", help="largest safetensors shard (hf)")
  parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
  parser.add_argument("--push-to-hub", metavar="REPO_ID",
                      help="upload the export to this private hub repo (token: HF_TOKEN, else `hf auth login`)")
  args = parser.parse_args(argv)
  with errors.exit_on_user_error():
    metrics_lib.configure_logging()
    export(args.workdir, args.out, step=args.step, dtype=args.dtype, fmt=args.fmt,
           max_shard_size=args.max_shard_size, overwrite=args.overwrite,
           push_to_hub_repo=args.push_to_hub)
  return 0


if __name__ == "__main__":
  sys.exit(main())
