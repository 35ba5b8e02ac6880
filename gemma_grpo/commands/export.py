"""`gemma-grpo export`: a run's LoRA policy merged into plain Gemma-3 weights.

  gemma-grpo export --workdir runs/gemma3_270m --out exports/gemma3_270m
  gemma-grpo export --workdir runs/gemma3_270m --out exports/g270m-gguf --format gguf
  gemma-grpo export --workdir runs/gemma3_270m --out exports/g270m-q8_0.gguf --format gguf --quant q8_0

`--format hf` writes a text-only Gemma3ForCausalLM directory: safetensors
(sharded with an index above --max-shard-size), config.json,
generation_config.json, the run's tokenizer carrying the training chat
template, and a README.md model card. `--format gguf` writes one GGUF file
for llama.cpp: the file itself when --out ends in .gguf, else model.gguf and the
model card in the --out directory; --quant q8_0 or q4_0 quantizes it as llama.cpp
does (norms in F32, the tied embedding in Q8_0).

LoRA is merged in float32 before any cast (lora.merged_params: W' = W +
(alpha / r) * A·B in W's axes).

The work directory is only read; the export is built in a temporary sibling
of --out and renamed into place, so an interrupted export leaves nothing
half-written behind. The library: gemma_grpo.model.hf_export (files) and
gemma_grpo.model.hf_layout (names and layouts).
"""

from __future__ import annotations

import argparse
import sys

from gemma_grpo import errors
from gemma_grpo.model import export_formats
from gemma_grpo.runtime import metrics as metrics_lib

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
  parser.add_argument("--dtype", choices=export_formats.DTYPES, default="float32", help="saved weight dtype (cast after merging)")
  parser.add_argument("--format", choices=export_formats.FORMATS, default="hf", dest="fmt",
                      help="hf: safetensors directory; gguf: one GGUF file for llama.cpp")
  # Not argparse `choices`: a bad value gets the one-line error that names the fix (K-quants).
  parser.add_argument("--quant", metavar="|".join(export_formats.QUANTS),
                      help="quantize the GGUF (--format gguf): q8_0 (8-bit, near float32) or q4_0;"
                           " norms stay F32")
  parser.add_argument("--max-shard-size", default="2GB", help="largest safetensors shard (hf)")
  parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
  parser.add_argument("--push-to-hub", metavar="REPO_ID",
                      help="upload the export to this private hub repo (token: HF_TOKEN, else `hf auth login`)")
  args = parser.parse_args(argv)
  with errors.exit_on_user_error():
    metrics_lib.configure_logging()
    # JAX, Tunix and transformers load only once the arguments parse.
    from gemma_grpo.model import hf_export  # pylint: disable=g-import-not-at-top

    hf_export.export(args.workdir, args.out, step=args.step, dtype=args.dtype, fmt=args.fmt,
                     max_shard_size=args.max_shard_size, overwrite=args.overwrite,
                     push_to_hub_repo=args.push_to_hub, quant=args.quant)
  return 0


if __name__ == "__main__":
  sys.exit(main())
