"""Rollout throughput: our rollout engine on the LoRA policy vs Hugging Face `generate`.

  flock /tmp/gemma_grpo_heavy.lock python bench/rollout.py [--repeats 5] [--json OUT]
About 4 min on a quiet 2-core CPU (two model loads, a JIT compile, a warm-up
and 5 timed rollouts per side); --smoke does the same on a random 2-layer
Gemma-3 (timings meaningless).

The batch of one GRPO step: the first 4 GSM8K test problems rendered by
gemma_grpo.tasks.prompts.render_prompt, each repeated 2 times (8 sequences), exactly
64 new tokens each (the stop tokens <eos>/<end_of_turn> are forbidden on both
sides: `forbidden_tokens` in Tunix, min_new_tokens in HF), temperature 0.9,
top_k 50, float32 on CPU, prompts left-padded to the longest of the batch.

  ours  gemma_grpo.model.model_loading.build + gemma_grpo.model.lora.apply (the policy the trainer
        samples from: LoRA r=32 on every projection, B = 0 at start) driven
        by the trainer's rollout engine, gemma_grpo.rl.engine.rollout.GroupedRollout
        (--engine tunix: Tunix's tunix.generate.sampler.Sampler with the KV
        cache sized to prompt + completion). Ours never stops early (no stop
        token is a stop for it); Tunix's forbids the stop tokens
  hf    transformers AutoModelForCausalLM.generate on the same converted
        checkpoint, plain by default; --hf-lora wraps it in the same PEFT LoRA
        that TRL samples from

Each side runs in its own fresh process; tokens/s counts generated tokens
only (8 x 64 per rollout), median over the repeats after one warm-up rollout.
Ends with `rollout_speedup_vs_hf=X.XX` (our tokens/s / HF's). Prints figures;
asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import common  # pylint: disable=g-import-not-at-top,wrong-import-position

STOP_TOKEN_IDS = (1, 106)  # <eos>, <end_of_turn>: gemma_grpo.model.tokenizer.stop_token_ids


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(
      description=__doc__.splitlines()[0],
      epilog="Run real (non --smoke) benchmarks under flock " + common.HEAVY_LOCK)
  p.add_argument("--repeats", type=int, default=5, help="timed rollouts after one warm-up")
  p.add_argument("--prompts", type=int, default=common.PROMPTS_PER_STEP)
  p.add_argument("--generations", type=int, default=common.GENERATIONS)
  p.add_argument("--new-tokens", type=int, default=common.NEW_TOKENS)
  p.add_argument("--only", choices=("ours", "hf"), help="run one side only")
  p.add_argument("--engine", choices=("grouped", "tunix"), default="grouped",
                 help="our side: the trainer's engine (grouped) or Tunix's Sampler")
  p.add_argument("--hf-lora", action="store_true",
                 help="sample HF through a PEFT LoRA adapter (as TRL does)")
  p.add_argument("--smoke", action="store_true", help="random 2-layer Gemma-3: checks the plumbing")
  p.add_argument("--json", type=pathlib.Path, help="write the raw numbers here")
  p.add_argument("--side", choices=("ours", "hf"), help=argparse.SUPPRESS)  # child mode
  p.add_argument("--model-dir", type=pathlib.Path, help=argparse.SUPPRESS)
  p.add_argument("--out", type=pathlib.Path, help=argparse.SUPPRESS)
  return p.parse_args(argv)


def batch_texts(n_prompts: int, generations: int) -> list[str]:
  """Each prompt repeated `generations` times in a row, as a GRPO rollout batch."""
  from gemma_grpo.tasks import prompts  # pylint: disable=g-import-not-at-top

  records = common.gsm8k_records(n_prompts)
  return [prompts.render_prompt(r["question"]) for r in records for _ in range(generations)]


def build_policy(model_dir: pathlib.Path):
  """(actor, tokenizer, mesh): the workload's LoRA policy, as the trainer samples from it."""
  from configs import gemma3_270m  # pylint: disable=g-import-not-at-top
  from gemma_grpo.config import settings  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import lora  # pylint: disable=g-import-not-at-top
  from gemma_grpo.runtime import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import model_loading  # pylint: disable=g-import-not-at-top

  c = gemma3_270m.get_config()
  with c.unlocked():
    c.model.source = str(model_dir)
    c.model.dtype = "float32"
    c.lora.rank, c.lora.alpha = common.LORA_RANK, common.LORA_ALPHA
  c = settings.from_config(c)
  mesh_lib.enable_compilation_cache(str(model_loading.cache_root(c.model) / "xla"))
  mesh = mesh_lib.make_mesh(c.mesh)
  loaded = model_loading.build(c.model, mesh)
  return lora.apply(loaded.model, c.lora, mesh), loaded.tokenizer, mesh


def time_ours(args, texts: list[str]) -> dict:
  """Seconds and token counts of each rollout with our engine or Tunix's Sampler."""
  import jax  # pylint: disable=g-import-not-at-top
  from tunix.generate import sampler as sampler_lib  # pylint: disable=g-import-not-at-top

  actor, tokenizer, mesh = build_policy(args.model_dir)
  prompt_width = max(len(tokenizer.encode(t)) for t in texts)
  if args.engine == "grouped":
    return _time_grouped(args, texts, actor, tokenizer, mesh, prompt_width)
  config = actor.config
  sampler = sampler_lib.Sampler(actor, tokenizer, sampler_lib.CacheConfig(
      cache_size=prompt_width + args.new_tokens, num_layers=config.num_layers,
      num_kv_heads=config.num_kv_heads, head_dim=config.head_dim))
  key = jax.random.PRNGKey(0)
  runs = []
  with mesh:  # as Tunix's RLCluster runs its rollouts
    for i in range(args.repeats + 1):
      start = time.perf_counter()
      out = sampler(
          input_strings=texts, max_generation_steps=args.new_tokens,
          max_prompt_length=prompt_width, temperature=common.TEMPERATURE, top_p=1.0,
          top_k=common.TOP_K, seed=jax.random.fold_in(key, i),
          eos_tokens=list(STOP_TOKEN_IDS), forbidden_tokens=STOP_TOKEN_IDS)
      seconds = time.perf_counter() - start  # tokens are on the host: synchronous
      runs.append({"seconds": seconds, "tokens": [len(t) for t in out.tokens]})
  return {"prompt_width": prompt_width, "runs": runs}


def _time_grouped(args, texts, actor, tokenizer, mesh, prompt_width: int) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  from tunix.rl.rollout import base_rollout  # pylint: disable=g-import-not-at-top

  from gemma_grpo.rl.engine import rollout  # pylint: disable=g-import-not-at-top

  engine = rollout.GroupedRollout(actor, tokenizer, mesh,
                                  lora_scale=common.LORA_ALPHA / common.LORA_RANK)
  key = jax.random.PRNGKey(0)
  runs = []
  with mesh:
    for i in range(args.repeats + 1):
      config = base_rollout.RolloutConfig(
          max_tokens_to_generate=args.new_tokens, max_prompt_length=prompt_width,
          kv_cache_size=prompt_width + args.new_tokens, temperature=common.TEMPERATURE,
          top_p=1.0, top_k=common.TOP_K, eos_tokens=[-1], seed=jax.random.fold_in(key, i))
      start = time.perf_counter()
      out = engine.generate(texts, config)
      seconds = time.perf_counter() - start  # tokens are on the host: synchronous
      runs.append({"seconds": seconds, "tokens": [len(t) for t in out.tokens]})
  return {"prompt_width": prompt_width, "runs": runs}


def time_hf(args, texts: list[str]) -> dict:
  """Seconds and token counts of each rollout with transformers' generate."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  tokenizer = transformers.AutoTokenizer.from_pretrained(str(args.model_dir))
  model = transformers.AutoModelForCausalLM.from_pretrained(
      str(args.model_dir), dtype=torch.float32).eval()
  if args.hf_lora:
    import peft  # pylint: disable=g-import-not-at-top

    from trl_step import LORA_TARGETS  # pylint: disable=g-import-not-at-top
    model = peft.get_peft_model(model, peft.LoraConfig(
        r=common.LORA_RANK, lora_alpha=common.LORA_ALPHA, lora_dropout=0.0,
        target_modules=LORA_TARGETS, task_type="CAUSAL_LM")).eval()
  inputs = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
  prompt_width = inputs["input_ids"].shape[1]
  runs = []
  for i in range(args.repeats + 1):
    torch.manual_seed(i)
    start = time.perf_counter()
    with torch.inference_mode():
      out = model.generate(
          **inputs, do_sample=True, temperature=common.TEMPERATURE, top_k=common.TOP_K,
          top_p=1.0, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
          eos_token_id=list(STOP_TOKEN_IDS), pad_token_id=tokenizer.pad_token_id)
    seconds = time.perf_counter() - start
    completions = out[:, prompt_width:]
    tokens = [int((row != tokenizer.pad_token_id).sum()) for row in completions]
    runs.append({"seconds": seconds, "tokens": tokens})
  return {"prompt_width": prompt_width, "torch_threads": torch.get_num_threads(),
          "lora": args.hf_lora, "runs": runs}


def child(args) -> int:
  texts = batch_texts(args.prompts, args.generations)
  result = (time_ours if args.side == "ours" else time_hf)(args, texts)
  result["peak_rss_gib_self"] = common.self_peak_rss_gib()
  args.out.write_text(json.dumps(result))
  return 0


def summarize(side: str, raw: dict, peak_rss_gib: float) -> dict:
  timed = raw["runs"][1:]
  tokens = [sum(r["tokens"]) for r in timed]
  rates = [sum(r["tokens"]) / r["seconds"] for r in timed]
  return {"side": side, "seconds": common.median([r["seconds"] for r in timed]),
          "tokens_per_second": common.median(rates),
          "tokens_per_rollout": common.median(tokens),
          "min_tokens": min(min(r["tokens"]) for r in timed),
          "warmup_seconds": raw["runs"][0]["seconds"],
          "prompt_width": raw["prompt_width"], "peak_rss_gib": peak_rss_gib}


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.side:
    return child(args)
  with tempfile.TemporaryDirectory(prefix="rollout_") as tmp:
    work = pathlib.Path(tmp)
    model_dir = common.tiny_hf_dir(work / "tiny_hf") if args.smoke else common.offline_270m_dir()
    results, raws = [], {}
    for side in ("ours", "hf"):
      if args.only not in (None, side):
        continue
      out = work / f"{side}.json"
      cmd = [sys.executable, __file__, "--side", side, "--model-dir", model_dir, "--out", out,
             "--repeats", args.repeats, "--prompts", args.prompts,
             "--generations", args.generations, "--new-tokens", args.new_tokens]
      if args.hf_lora:
        cmd.append("--hf-lora")
      cmd += ["--engine", args.engine]
      run = common.run_child(cmd, log=work / f"{side}.log")
      if run.returncode or not out.exists():
        print(f"error: the {side} child exited with {run.returncode}", file=sys.stderr)
        continue
      raws[side] = json.loads(out.read_text())
      results.append(summarize(side, raws[side], run.peak_rss_gib))
  label = {"ours": "gemma-grpo (" + {"grouped": "GroupedRollout", "tunix": "Tunix Sampler"}[args.engine] + ", LoRA)",
           "hf": "HF generate" + (" + PEFT LoRA" if args.hf_lora else "")}
  sequences = args.prompts * args.generations
  print(f"\n{sequences} sequences x {args.new_tokens} new tokens, median of {args.repeats}")
  common.print_table(
      ("side", "seconds", "tokens/s", "tokens/rollout", "min tokens/seq", "warm-up s",
       "prompt width", "peak RSS GiB"),
      [(label[r["side"]], common.fmt(r["seconds"]), common.fmt(r["tokens_per_second"], 1),
        int(r["tokens_per_rollout"]), r["min_tokens"], common.fmt(r["warmup_seconds"], 1),
        r["prompt_width"], common.fmt(r["peak_rss_gib"])) for r in results])
  rates = {r["side"]: r["tokens_per_second"] for r in results}
  speedup = rates["ours"] / rates["hf"] if len(rates) == 2 else None
  if args.json:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"smoke": args.smoke, "summary": results, "raw": raws,
                                     "rollout_speedup_vs_hf": speedup}, indent=1))
  print(f"rollout_speedup_vs_hf={common.fmt(speedup)}")
  return 0 if len(results) == (1 if args.only else 2) else 1


if __name__ == "__main__":
  sys.exit(main())
