"""Writing a run's merged policy: a Hugging Face directory or one GGUF file.

`--format hf` writes a text-only Gemma3ForCausalLM directory: safetensors
(sharded with an index above max_shard_size), config.json,
generation_config.json, the run's tokenizer carrying the training chat
template, and a README.md model card. `--format gguf` writes one GGUF file
for llama.cpp: the file itself when `out` ends in .gguf, else model.gguf and
the model card in the `out` directory.

The work directory is only read; the export is built in a temporary sibling
of `out` and renamed into place, so an interrupted export leaves nothing
half-written behind.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import tempfile
import uuid

from absl import logging
import ml_dtypes
import numpy as np
import safetensors.numpy

from gemma_grpo import config as config_lib
from gemma_grpo import errors
from gemma_grpo import storage
from gemma_grpo.model import export_formats
from gemma_grpo.model import gguf_io
from gemma_grpo.model import hf_layout
from gemma_grpo.model import model_card
from gemma_grpo.model import policy as policy_lib
from gemma_grpo.runtime import hub
from gemma_grpo.runtime import mesh as mesh_lib
from gemma_grpo.tasks import prompts

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_SPECIAL_TOKENS = {"bos": "<bos>", "eos": "<eos>", "pad": "<pad>", "unk": "<unk>"}
_SIZE_UNITS = {
    "": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
}


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
  GGUF's pieces and types exactly, without reading the GGUF file again, and
  the tokenizer training used.
  """
  if (tokenizer_dir / "tokenizer.model").is_file():
    return gguf_io.sentencepiece_vocabulary(tokenizer_dir / "tokenizer.model")
  if (tokenizer_dir / "tokenizer.json").is_file():
    return gguf_io.tokenizer_json_vocabulary(tokenizer_dir / "tokenizer.json")
  raise errors.UserError(f"{tokenizer_dir}: no tokenizer.json or tokenizer.model to export")


# --- Output directory ------------------------------------------------------------


def check_quant(quant: str | None, *, fmt: str, dtype: str) -> None:
  """Raises UserError unless `quant` is None or a quantization this export writes."""
  if quant is None:
    return
  if quant not in export_formats.QUANTS:
    raise errors.UserError(
        f"--quant={quant!r}: use one of {', '.join(export_formats.QUANTS)} (for K-quants such as q4_k_m, run"
        " llama.cpp's llama-quantize on the float32 GGUF: gguf-py cannot write them)")
  if fmt != "gguf":
    raise errors.UserError(f"--quant={quant}: only a GGUF is quantized; add --format gguf")
  if dtype != "float32":
    raise errors.UserError(
        f"--quant={quant}: quantizes the float32 merge; drop --dtype {dtype}")


def check_options(workdir: pathlib.Path, out: pathlib.Path, *, dtype: str, fmt: str,
                  max_shard_size: str, overwrite: bool, quant: str | None = None) -> None:
  """Raises UserError for bad options or an `out` that would clobber something."""
  if dtype not in export_formats.DTYPES:
    raise errors.UserError(f"--dtype={dtype!r}: use one of {export_formats.DTYPES}")
  if fmt not in export_formats.FORMATS:
    raise errors.UserError(f"--format={fmt!r}: use one of {export_formats.FORMATS}")
  check_quant(quant, fmt=fmt, dtype=dtype)
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
  tensors = hf_layout.merged_tensors(policy)
  config = hf_layout.text_config(policy, tensors, dtype)
  if dtype == "bfloat16":
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


def gguf_tensor_type(dtype: str, quant: str | None) -> str:
  """The GGUF file type of `--dtype` and `--quant`: F32, BF16, Q8_0 or Q4_0."""
  return quant.upper() if quant else {"float32": "F32", "bfloat16": "BF16"}[dtype]


def export_gguf(policy, workdir: pathlib.Path, out_dir: pathlib.Path, *,
                dtype: str = "float32", quant: str | None = None) -> list[str]:
  """Writes the merged policy into `out_dir` as one GGUF file (and a card)."""
  tensors = hf_layout.merged_tensors(policy)
  config = hf_layout.text_config(policy, tensors, dtype)
  tensor_type = gguf_tensor_type(dtype, quant)
  gguf_io.write_gguf(
      out_dir / export_formats.GGUF_FILE, tensors, config.to_dict(),
      gguf_vocabulary(pathlib.Path(policy.loaded.tokenizer_dir)),
      tensor_type=tensor_type,
      name=f"{model_card.base_model_id(policy.settings.model.source) or 'gemma-3'} GRPO step {policy.step}",
      chat_template=prompts.CHAT_TEMPLATE,
  )
  (out_dir / "README.md").write_text(model_card.write(policy, workdir, "gguf", tensor_type))
  return [export_formats.GGUF_FILE, "README.md"]


def export_policy(policy, workdir: str | os.PathLike, out: str | os.PathLike, *,
                  dtype: str = "float32", fmt: str = "hf", max_shard_size: str = "2GB",
                  overwrite: bool = False, quant: str | None = None) -> pathlib.Path:
  """Exports a restored policy to `out`, all or nothing.

  Built in a temporary sibling of `out` and renamed into place at the end.
  """
  workdir, out = storage.path(workdir), pathlib.Path(out).expanduser().absolute()
  check_options(workdir, out, dtype=dtype, fmt=fmt, max_shard_size=max_shard_size,
                overwrite=overwrite, quant=quant)
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
  try:
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private
    if fmt == "hf":
      files = export_hf(policy, workdir, tmp, dtype=dtype, max_shard_size=max_shard_size)
    else:
      files = export_gguf(policy, workdir, tmp, dtype=dtype, quant=quant)
    if fmt == "gguf" and out.suffix.lower() == ".gguf":
      # `--out model.gguf` names the file itself, as llama.cpp's tools expect;
      # the model card only comes with a directory.
      _publish(tmp / export_formats.GGUF_FILE, out)
      files = [out.name]
    else:
      _publish(tmp, out)
  finally:
    if tmp.exists():
      shutil.rmtree(tmp)
  logging.info("exported step %d to %s (%s, %s): %s", policy.step, out, fmt, quant or dtype, ", ".join(files))
  return out


def export(workdir: str | os.PathLike, out: str | os.PathLike, *, step: int | None = None,
           dtype: str = "float32", fmt: str = "hf", max_shard_size: str = "2GB",
           overwrite: bool = False, push_to_hub_repo: str | None = None,
           quant: str | None = None) -> pathlib.Path:
  """Restores `workdir`'s policy at `step`, merges it and writes `out`."""
  workdir = storage.path(workdir)
  if not workdir.is_dir():
    raise errors.UserError(f"--workdir {workdir}: no such directory")
  # Every check that needs no model runs before the (slow) restore.
  check_options(workdir, pathlib.Path(out).expanduser().absolute(), dtype=dtype, fmt=fmt,
                max_shard_size=max_shard_size, overwrite=overwrite, quant=quant)

  policy = policy_lib.restore(workdir, mesh_lib.make_mesh(config_lib.defaults().mesh), step)
  logging.info("restored step %d of %s", policy.step, workdir)
  out = export_policy(policy, workdir, out, dtype=dtype, fmt=fmt,
                      max_shard_size=max_shard_size, overwrite=overwrite, quant=quant)
  if push_to_hub_repo:
    url = hub.push_folder(out, push_to_hub_repo)
    logging.info("pushed %s to %s (private)", out, url)
  return out
