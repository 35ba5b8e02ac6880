"""gemma-grpo's GRPO step on an accelerator: Gemma-3-1B shapes, random weights.

  python bench/gpu.py [--steps 3] [--json OUT]     # on a machine with a GPU/TPU
  python bench/gpu.py --smoke                      # tiny shapes on CPU, ~1.5 min
On one H100/H200 expect a few minutes, most of it XLA compilation; nothing is
downloaded: the weights are random (Gemma-3-1B shapes, bfloat16) and the
tokenizer is a synthetic word-level one with Gemma's special-token ids, built
in a temporary directory, so neither the GGUF nor the hub nor GSM8K is needed.

It runs the real trainer in this process (`gemma_grpo.commands.train.main` with
configs/gemma3_1b.py and `--config.model.source=random` plus the 1B shapes as
`--config.model.random.*` overrides), 1 warm-up + --steps timed steps of 4
prompts x 2 generations x 512 new tokens (the 1B config's workload), prompts
of exactly --prompt-tokens tokens, and then reads:
  step, rollout, reference, train seconds   metrics.jsonl (perf/...; train =
                                            step - rollout - reference)
  rollout tokens/s                          completion tokens / rollout seconds
  peak device memory                        jax.local_devices()[0].memory_stats()
                                            ["peak_bytes_in_use"] after the run
  MFU                                       model FLOPs / seconds / peak FLOP/s

FLOPs, per sequence of S = P + T positions (P prompt width, T new tokens), with
N = the layers' projection parameters (q, k/v, o, gate, up, down), L layers,
H heads of size Dh, d model width, V vocabulary, r the LoRA rank:
  forward   F = 2 N S  +  4 L S^2 H Dh  +  2 d V T
            (projections; Q K^T and A V over the dense S x S mask the model
            computes; the tied LM head on the T completion positions only, as
            gemma_grpo.rl.logprobs does)
  reference = F (frozen base model, no gradient)
  train     = 2 (2 N S + 2 d V T) + 3 (4 L S^2 H Dh) + 6 N_lora S
            frozen weights need only activation gradients in the backward pass
            (dX = dY W^T, as many FLOPs as the forward; no dW), attention's
            backward costs twice its forward (both operands are activations),
            the LoRA adapters cost the usual 6 per parameter per position.
Recomputation (jax.checkpoint on the log-prob chunks) is not counted: this is
model FLOPs utilisation. Peak is --peak-tflops (default 989: H100/H200 SXM
dense BF16). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import common  # pylint: disable=g-import-not-at-top,wrong-import-position

# google/gemma-3-1b (tunix ModelConfig.gemma3_1b_it).
GEMMA3_1B = dict(num_layers=26, embed_dim=1152, hidden_dim=6912, num_heads=4, head_dim=256,
                 num_kv_heads=1, sliding_window=512, vocab_size=262144)
TINY = dict(num_layers=2, embed_dim=64, hidden_dim=128, num_heads=4, head_dim=16,
            num_kv_heads=1, sliding_window=64, vocab_size=262144)
SPECIALS = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3,
            "<start_of_turn>": 105, "<end_of_turn>": 106}


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--smoke", action="store_true", help="tiny shapes, few tokens: runs on CPU")
  p.add_argument("--steps", type=int, default=3, help="timed steps after 1 warm-up step")
  p.add_argument("--batch-size", type=int, default=4, help="prompts per step")
  p.add_argument("--generations", type=int, default=2)
  p.add_argument("--new-tokens", type=int, help="default 512 (16 with --smoke)")
  p.add_argument("--prompt-tokens", type=int, help="default 256 (64 with --smoke)")
  p.add_argument("--dtype", default=None, help="default bfloat16 (float32 with --smoke)")
  p.add_argument("--peak-tflops", type=float, default=None,
                 help="accelerator peak for MFU (default 989; none with --smoke)")
  p.add_argument("--json", type=pathlib.Path, help="write the raw numbers here")
  p.add_argument("--workdir", type=pathlib.Path, help="keep the run directory here")
  args = p.parse_args(argv)
  args.new_tokens = args.new_tokens or (16 if args.smoke else 512)
  args.prompt_tokens = args.prompt_tokens or (64 if args.smoke else 256)
  args.dtype = args.dtype or ("float32" if args.smoke else "bfloat16")
  if args.peak_tflops is None and not args.smoke:
    args.peak_tflops = 989.0
  return args


# --- FLOPs ---------------------------------------------------------------------


def projection_params(s: dict) -> int:
  """N: q, k/v, o, gate, up, down weights of all layers (no embedding, no norms)."""
  d, f, h, k, dh = s["embed_dim"], s["hidden_dim"], s["num_heads"], s["num_kv_heads"], s["head_dim"]
  per_layer = d * h * dh + 2 * d * k * dh + h * dh * d + 3 * d * f
  return s["num_layers"] * per_layer


def lora_params(s: dict, rank: int) -> int:
  """Adapter parameters, r (in + out) per adapted projection."""
  d, f, h, k, dh = s["embed_dim"], s["hidden_dim"], s["num_heads"], s["num_kv_heads"], s["head_dim"]
  per_layer = rank * ((d + h * dh) + (d + 2 * k * dh) + (h * dh + d) + 3 * (d + f))
  return s["num_layers"] * per_layer


def step_flops(s: dict, *, sequences: int, prompt: int, new_tokens: int, rank: int) -> dict:
  """Model FLOPs of the reference pass and of the training pass (module docstring)."""
  n, seq = projection_params(s), prompt + new_tokens
  projections = 2 * n * seq
  attention = 4 * s["num_layers"] * seq**2 * s["num_heads"] * s["head_dim"]
  head = 2 * s["embed_dim"] * s["vocab_size"] * new_tokens
  reference = projections + attention + head
  train = 2 * (projections + head) + 3 * attention + 6 * lora_params(s, rank) * seq
  return {"reference": sequences * reference, "train": sequences * train,
          "projection_params": n, "lora_params": lora_params(s, rank)}


# --- synthetic inputs --------------------------------------------------------


def synthetic_tokenizer(out: pathlib.Path, vocab_size: int) -> pathlib.Path:
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
  out.mkdir(parents=True, exist_ok=True)
  tok.save(str(out / "tokenizer.json"))
  (out / "tokenizer_config.json").write_text(json.dumps(
      {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}))
  return out


def synthetic_problems(path: pathlib.Path, tokenizer_dir: pathlib.Path, n: int,
                       prompt_tokens: int) -> pathlib.Path:
  """GSM8K-format problems whose rendered prompt is exactly `prompt_tokens` tokens."""
  import random  # pylint: disable=g-import-not-at-top

  from gemma_grpo.tasks import prompts  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top

  tok = tokenizer_lib.load(tokenizer_dir)
  rng = random.Random(0)
  overhead = len(tok.encode(prompts.render_prompt("w1000")))  # instruction, turns, <bos>
  words = prompt_tokens - overhead + 1
  if words < 1:
    raise SystemExit(f"error: --prompt-tokens={prompt_tokens}: the instruction alone is {overhead}")
  records = []
  for _ in range(n):
    question = " ".join(f"w{rng.randrange(1000, 200000)}" for _ in range(words))
    assert len(tok.encode(prompts.render_prompt(question))) == prompt_tokens
    records.append({"question": question, "answer": f"#### {rng.randrange(100)}"})
  return common.write_jsonl(records, path)


# --- run ---------------------------------------------------------------------


def train_flags(args, shapes: dict, data: pathlib.Path, workdir: pathlib.Path) -> list[str]:
  flags = {
      "model.source": "random",
      "model.dtype": args.dtype,
      **{f"model.random.{k}": v for k, v in shapes.items()},
      "data.source": data,
      "data.num_heldout": 0,
      "lora.rank": common.LORA_RANK,
      "lora.alpha": common.LORA_ALPHA,
      "train.batch_size": args.batch_size,
      "train.max_steps": args.steps + common.WARMUP_STEPS,
      "grpo.num_generations": args.generations,
      "grpo.beta": common.BETA,
      "rollout.max_prompt_length": args.prompt_tokens,
      "rollout.max_new_tokens": args.new_tokens,
      "rollout.kv_cache_size": args.prompt_tokens + args.new_tokens,
      "optim.warmup_fraction": 0.0,
      "eval.every_steps": 0,
      "eval.num_examples": 0,
      "eval.max_new_tokens": args.new_tokens,
      "ckpt.every_steps": 1000,
      "log.flush_every_steps": 1,
  }
  if common.has_config_key("rollout.ignore_eos"):
    flags["rollout.ignore_eos"] = True
  return (["--config", str(common.REPO / "configs" / "gemma3_1b.py"), "--workdir", str(workdir)]
          + [f"--config.{k}={v}" for k, v in flags.items()])


def device_memory() -> dict:
  import jax  # pylint: disable=g-import-not-at-top

  device = jax.local_devices()[0]
  stats = device.memory_stats() or {}
  return {"device": f"{device.platform}:{device.device_kind}",
          "peak_bytes_in_use": stats.get("peak_bytes_in_use"),
          "bytes_limit": stats.get("bytes_limit")}


def main(argv=None) -> int:
  args = parse_args(argv)
  shapes = TINY if args.smoke else GEMMA3_1B
  with tempfile.TemporaryDirectory(prefix="gpu_bench_") as tmp:
    work = args.workdir or pathlib.Path(tmp)
    work.mkdir(parents=True, exist_ok=True)
    tokenizer_dir = synthetic_tokenizer(work / "tokenizer", shapes["vocab_size"])
    data = synthetic_problems(work / "problems.jsonl", tokenizer_dir,
                              args.batch_size * (args.steps + common.WARMUP_STEPS),
                              args.prompt_tokens)
    from gemma_grpo.model import model_loading  # pylint: disable=g-import-not-at-top
    from gemma_grpo.commands import train  # pylint: disable=g-import-not-at-top

    # Random weights take their tokenizer from the offline 270M directory;
    # point that at the synthetic one so nothing is converted or downloaded.
    model_loading.offline_270m_dir = lambda unused_c: tokenizer_dir
    run_dir = work / "run"
    code = train.main(train_flags(args, shapes, data, run_dir))
    memory = device_memory()
    steps = common.ours_steps(run_dir)
  summary = common.summarize(steps)
  sequences = args.batch_size * args.generations
  flops = step_flops(shapes, sequences=sequences, prompt=args.prompt_tokens,
                     new_tokens=args.new_tokens, rank=common.LORA_RANK)
  peak = args.peak_tflops * 1e12 if args.peak_tflops else None

  def mfu(phase: str) -> float | None:
    seconds = summary[phase]
    return flops[phase] / seconds / peak if peak and seconds else None

  tokens = summary["completion_tokens"]
  rollout_rate = (tokens * sequences / summary["rollout"]
                  if tokens and summary["rollout"] else None)
  print(f"\n{memory['device']}, {'tiny' if args.smoke else 'Gemma-3-1B'} shapes, {args.dtype},"
        f" {args.batch_size} prompts x {args.generations} x {args.new_tokens} new tokens,"
        f" prompts of {args.prompt_tokens} tokens, median of {summary['timed_steps']} steps")
  peak_gib = (common.gib(memory["peak_bytes_in_use"])
              if memory["peak_bytes_in_use"] is not None else None)
  common.print_table(
      ("step s", "rollout s", "reference s", "train s", "rollout tok/s", "completion tok",
       "reference MFU", "train MFU", "peak device GiB", "peak RSS GiB"),
      [(common.fmt(summary["step_seconds"]), common.fmt(summary["rollout"]),
        common.fmt(summary["reference"]), common.fmt(summary["train"]),
        common.fmt(rollout_rate, 1), common.fmt(tokens, 1),
        common.fmt(mfu("reference"), 3), common.fmt(mfu("train"), 3),
        common.fmt(peak_gib), common.fmt(common.self_peak_rss_gib()))])
  print(f"model FLOPs per step: reference {flops['reference']:.3e}, train {flops['train']:.3e}"
        f" (N = {flops['projection_params']:,} projection + {flops['lora_params']:,} LoRA"
        f" parameters); peak {common.fmt(args.peak_tflops, 0)} TFLOP/s")
  if args.json:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "args": {k: str(v) for k, v in vars(args).items()}, "shapes": shapes,
        "memory": memory, "flops": flops, "summary": summary,
        "rollout_tokens_per_second": rollout_rate,
        "mfu": {"reference": mfu("reference"), "train": mfu("train")},
        "steps": steps, "exit_code": code}, indent=1))
  return code


if __name__ == "__main__":
  sys.exit(main())
