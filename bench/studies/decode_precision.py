"""Decoding in bfloat16 (rollout.decode_dtype): how much faster, and how faithful.

  python bench/studies/decode_precision.py [--part speed|faithful|both] [--json OUT]

On the offline Gemma-3-270M LoRA policy (bench/rollout.py's build_policy,
float32, the policy the trainer samples from), with the rollout engine in
float32 and in bfloat16 in the same process:

speed      decode seconds per token for the fixed workload (bench/rollout.py's
           batch: 4 GSM8K prompts x 2 rows, 64 new tokens, never stopping):
           (rollout with 64 tokens - rollout with 1 token) / 63, median of
           --repeats, the two precisions interleaved; and each against the
           bandwidth bound of the bytes a token must read (decode weights + LM
           head at that precision; bandwidth measured here as in
           bench/roofline.py). About 4 min quiet.
faithful   greedy: the accuracy benchmark's 200 held-out equations
           (configs/gemma3_270m_accuracy.py, its prompts, stop text and token
           limit) decoded both ways: completions identical token for token,
           answers graded correct by each. Sampled: 8 steps' worth of the
           first command's training batches (2 problems x 8 rows, its
           temperature, top-k and token limit) drawn with the bfloat16 engine,
           then the trainer's float32 log-probs of the same tokens
           (gemma_grpo.rl.learner.logprobs, as the loss computes them): the per-token
           importance ratio pi_train / pi_sample, its quantiles, the share
           outside PPO's clip range [0.8, 1.28], and the per-sequence (GSPO)
           ratio; the float32 engine gives the measurement's floor. About
           10 min.

--smoke runs both parts on a random 2-layer Gemma-3 (figures meaningless).
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import common  # pylint: disable=g-import-not-at-top,wrong-import-position

DTYPES = ("float32", "bfloat16")
CLIP_LOW, CLIP_HIGH = 0.8, 1.28  # grpo.epsilon 0.2 and DAPO's epsilon_high 0.28


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--part", choices=("speed", "faithful", "both"), default="both")
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--sampled-steps", type=int, default=8)
  p.add_argument("--smoke", action="store_true", help="random 2-layer model; figures meaningless")
  p.add_argument("--json", type=pathlib.Path, help="write the raw figures here")
  return p.parse_args(argv)


def engines(actor, tokenizer, mesh):
  from gemma_grpo.rl.engine import rollout  # pylint: disable=g-import-not-at-top

  return {d: rollout.GroupedRollout(actor, tokenizer, mesh, decode_dtype=d,
                                    lora_scale=common.LORA_ALPHA / common.LORA_RANK)
          for d in DTYPES}


def bytes_per_token(actor, screened: dict[str, bool]) -> dict[str, int]:
  """Bytes one decode step must read at each precision: projections, LM head, norms.

  An engine that screens its float32 LM head (rollout.screen_lm_head) reads
  the head's bfloat16 copy instead (and 256 float32 rows, left out here).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from gemma_grpo.rl.engine import decode_layers  # pylint: disable=g-import-not-at-top
  from gemma_grpo.rl.engine import rollout  # pylint: disable=g-import-not-at-top

  out = {}
  for name in DTYPES:
    dtype = rollout.DECODE_DTYPES[name]
    weights = jax.eval_shape(lambda: decode_layers.decode_weights(actor, 1.0, dtype))  # pylint: disable=cell-var-from-loop
    layer_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(weights))
    head = actor.embedder.input_embedding.value
    head_dtype = jnp.bfloat16 if screened[name] else dtype
    out[name] = layer_bytes + head.size * jnp.dtype(head_dtype).itemsize
  return out


def cpu_bf16_flags() -> list[str]:
  """The bfloat16 instructions this CPU reports (/proc/cpuinfo): they decide whether bf16 dots are fast."""
  try:
    flags = pathlib.Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0].split()
  except (OSError, IndexError):
    return []
  return sorted(f for f in flags if "bf16" in f or f.startswith("amx"))


def speed(actor, tokenizer, mesh, repeats: int, smoke: bool) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  from tunix.rl.rollout import base_rollout  # pylint: disable=g-import-not-at-top

  import roofline  # pylint: disable=g-import-not-at-top
  import rollout as rollout_bench  # pylint: disable=g-import-not-at-top

  texts = rollout_bench.batch_texts(common.PROMPTS_PER_STEP, common.GENERATIONS)
  width = max(len(tokenizer.encode(t)) for t in texts)
  by_dtype = engines(actor, tokenizer, mesh)
  seconds = {(d, n): [] for d in DTYPES for n in (1, common.NEW_TOKENS)}
  with mesh:
    for i in range(repeats + 1):  # the first round compiles and warms up
      for d, engine in by_dtype.items():
        for n in (1, common.NEW_TOKENS):
          config = base_rollout.RolloutConfig(
              max_tokens_to_generate=n, max_prompt_length=width, kv_cache_size=width + n,
              temperature=common.TEMPERATURE, top_p=1.0, top_k=common.TOP_K, eos_tokens=[-1],
              seed=jax.random.fold_in(jax.random.PRNGKey(0), i))
          start = time.perf_counter()
          engine.generate(texts, config)
          if i:
            seconds[(d, n)].append(time.perf_counter() - start)
  bandwidth = roofline.machine(smoke)["bandwidth_bytes_per_s"]
  needed = bytes_per_token(actor, {d: e._screen for d, e in by_dtype.items()})  # pylint: disable=protected-access
  result = {"bandwidth_bytes_per_s": bandwidth, "rows": len(texts), "prompt_width": width,
            "cpu_bf16_flags": cpu_bf16_flags()}
  for d in DTYPES:
    per_token = (common.median(seconds[(d, common.NEW_TOKENS)]) - common.median(seconds[(d, 1)])) / (
        common.NEW_TOKENS - 1)
    bound = needed[d] / bandwidth
    result[d] = {"seconds_per_token": per_token, "bytes_per_token": needed[d],
                 "bound_seconds_per_token": bound, "times_bound": per_token / bound,
                 "rollout_seconds": common.median(seconds[(d, common.NEW_TOKENS)])}
  result["speedup"] = result["float32"]["seconds_per_token"] / result["bfloat16"]["seconds_per_token"]
  return result


def greedy_agreement(actor, tokenizer, mesh, smoke: bool, variants: dict | None = None) -> dict:
  """Greedy eval through two variants named float32 and bfloat16.

  `variants` maps each name to (policy, decode_dtype); by default the actor
  with each decode dtype. bench/matmul_precision.py passes its own.
  """
  from configs import gemma3_270m_accuracy  # pylint: disable=g-import-not-at-top
  from gemma_grpo.config import settings  # pylint: disable=g-import-not-at-top
  from gemma_grpo.tasks import data as data_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo.rl.eval import generation  # pylint: disable=g-import-not-at-top
  from gemma_grpo.rl.eval import scoring  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top

  variants = variants or {d: (actor, d) for d in DTYPES}
  c = gemma3_270m_accuracy.get_config()
  if smoke:
    c.data.num_heldout, c.eval.max_new_tokens = 8, 8
  data = settings.from_config(c).data
  problems = data_lib.build_splits(data, tokenizer, c.rollout.max_prompt_length).heldout
  out = {}
  for d in DTYPES:
    policy, decode_dtype = variants[d]
    generator = generation.Generator(
        policy, tokenizer, mesh, max_prompt_length=c.rollout.max_prompt_length,
        max_new_tokens=c.eval.max_new_tokens, stop_token_ids=tokenizer_lib.stop_token_ids(tokenizer),
        stop_text=c.rollout.stop_text, engine="grouped",
        lora_scale=common.LORA_ALPHA / common.LORA_RANK, decode_dtype=decode_dtype)
    start = time.perf_counter()
    with mesh:
      done = generator.generate([p.prompt for p in problems],
                                generation.Decoding(max_new_tokens=c.eval.max_new_tokens),
                                batch_size=c.eval.batch_size)
    metrics, samples = scoring.score(problems, done.texts, done.truncated, num_tokens=done.num_tokens)
    out[d] = {"token_ids": done.token_ids, "correct": [bool(s["correct"]) for s in samples],
              "accuracy": metrics["accuracy"], "seconds": time.perf_counter() - start}
  same = [a == b for a, b in zip(out["float32"]["token_ids"], out["bfloat16"]["token_ids"])]
  flips = [(a, b) for a, b in zip(out["float32"]["correct"], out["bfloat16"]["correct"]) if a != b]
  diff, low, high = scoring.paired_bootstrap([float(x) for x in out["float32"]["correct"]],
                                             [float(x) for x in out["bfloat16"]["correct"]])
  return {"problems": len(problems), "identical_completions": sum(same),
          "accuracy": {d: out[d]["accuracy"] for d in DTYPES},
          "correct_only_float32": sum(a for a, _ in flips), "correct_only_bfloat16": sum(b for _, b in flips),
          "accuracy_difference": [diff, low, high],
          "eval_seconds": {d: out[d]["seconds"] for d in DTYPES}}


def draw_batches(engine, tokenizer, mesh, c, steps: int):
  """(drawn, completion_BxT) for each of the first `steps` training batches of config `c`,
  with the engine's log-probs, seeded per step as the trainer seeds them."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tunix.rl.rollout import base_rollout  # pylint: disable=g-import-not-at-top

  from gemma_grpo.config import settings  # pylint: disable=g-import-not-at-top
  from gemma_grpo.tasks import data as data_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top

  r, g = c.rollout, c.grpo.num_generations
  train = data_lib.build_splits(settings.from_config(c).data, tokenizer, r.max_prompt_length).train
  for step in range(steps):
    batch = train[step * c.train.batch_size:(step + 1) * c.train.batch_size]
    texts = [p.prompt for p in batch for _ in range(g)]
    config = base_rollout.RolloutConfig(
        max_tokens_to_generate=r.max_new_tokens, max_prompt_length=r.max_prompt_length,
        kv_cache_size=r.kv_cache_size, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
        eos_tokens=tokenizer_lib.stop_token_ids(tokenizer), return_logprobs=True,
        seed=jax.random.fold_in(jax.random.PRNGKey(r.seed), step))
    with mesh:
      drawn = engine.generate(texts, config)
    width = max(len(t) for t in drawn.tokens)
    yield drawn, np.stack([np.pad(t, (0, width - len(t))) for t in drawn.tokens])


def sampled_ratios(actor, tokenizer, mesh, steps: int, smoke: bool) -> dict:
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from configs import gemma3_270m  # pylint: disable=g-import-not-at-top
  from gemma_grpo.rl.learner import logprobs  # pylint: disable=g-import-not-at-top

  c = gemma3_270m.get_config()
  if smoke:
    c.rollout.max_new_tokens = 8
  r = c.rollout
  by_dtype = engines(actor, tokenizer, mesh)
  out = {}
  for d, engine in by_dtype.items():
    log_ratios, sequence_ratios = [], []
    for sampled, completion_BxT in draw_batches(engine, tokenizer, mesh, c, steps):
      with mesh:
        train_BxT, _ = logprobs.per_token_logps(
            actor, jnp.asarray(sampled.left_padded_prompt_tokens), jnp.asarray(completion_BxT),
            engine.pad_id(), r.temperature)
      train_BxT = np.asarray(train_BxT)
      for row, sample_logps in enumerate(sampled.logprobs):
        diff = train_BxT[row, :len(sample_logps)] - np.asarray(sample_logps)
        log_ratios.extend(diff.tolist())
        sequence_ratios.append(float(np.exp(diff.mean())) if len(diff) else 1.0)
    ratio = np.exp(np.asarray(log_ratios))
    out[d] = {"tokens": len(ratio), "sequences": len(sequence_ratios),
              "mean_abs_log_ratio": float(np.abs(np.log(ratio)).mean()),
              "ratio_quantiles": {q: float(np.quantile(ratio, q)) for q in (0.001, 0.01, 0.5, 0.99, 0.999)},
              "ratio_min_max": [float(ratio.min()), float(ratio.max())],
              "outside_clip": float(np.mean((ratio < CLIP_LOW) | (ratio > CLIP_HIGH))),
              "sequence_ratio_min_max": [min(sequence_ratios), max(sequence_ratios)]}
  return out


def print_results(results: dict) -> None:
  if "speed" in results:
    s = results["speed"]
    print(f"decode, {s['rows']} rows, prompt width {s['prompt_width']}, bandwidth"
          f" {s['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, CPU bf16 flags:"
          f" {' '.join(s['cpu_bf16_flags']) or 'none'}:")
    for d in DTYPES:
      row = s[d]
      print(f"  {d:9} {row['seconds_per_token'] * 1e3:6.1f} ms/token; must read"
            f" {row['bytes_per_token'] / 1e6:6.0f} MB -> bound {row['bound_seconds_per_token'] * 1e3:5.1f}"
            f" ms ({row['times_bound']:.2f}x); 64-token rollout {row['rollout_seconds']:.2f} s")
    print(f"  decode_speedup_bfloat16={s['speedup']:.2f}")
  if "greedy" in results:
    g = results["greedy"]
    diff, low, high = g["accuracy_difference"]
    print(f"greedy, {g['problems']} held-out equations: {g['identical_completions']} completions"
          f" identical token for token; accuracy float32 {g['accuracy']['float32']:.1%},"
          f" bfloat16 {g['accuracy']['bfloat16']:.1%} ({g['correct_only_float32']} correct only in"
          f" float32, {g['correct_only_bfloat16']} only in bfloat16; difference {diff * 100:+.1f}"
          f" points [{low * 100:+.1f}, {high * 100:+.1f}]); eval seconds"
          f" {g['eval_seconds']['float32']:.0f} / {g['eval_seconds']['bfloat16']:.0f}")
  if "sampled" in results:
    for d, row in results["sampled"].items():
      q = row["ratio_quantiles"]
      print(f"sampled with {d:9}: {row['tokens']} tokens, {row['sequences']} sequences;"
            f" pi_train/pi_sample quantiles 0.1% {q[0.001]:.4f}, 1% {q[0.01]:.4f}, 50% {q[0.5]:.4f},"
            f" 99% {q[0.99]:.4f}, 99.9% {q[0.999]:.4f}; min {row['ratio_min_max'][0]:.4f}"
            f" max {row['ratio_min_max'][1]:.4f}; mean |log ratio| {row['mean_abs_log_ratio']:.2e};"
            f" outside [{CLIP_LOW}, {CLIP_HIGH}]: {row['outside_clip']:.3%}; sequence ratio"
            f" {row['sequence_ratio_min_max'][0]:.4f}-{row['sequence_ratio_min_max'][1]:.4f}")


def main(argv=None) -> int:
  args = parse_args(argv)
  import rollout as rollout_bench  # pylint: disable=g-import-not-at-top

  if args.smoke:
    model_dir = common.tiny_hf_dir(pathlib.Path(args.json.parent if args.json else "/tmp") / "tiny_hf")
  else:
    model_dir = common.offline_270m_dir()
  actor, tokenizer, mesh = rollout_bench.build_policy(model_dir)
  results = {}
  if args.part in ("speed", "both"):
    results["speed"] = speed(actor, tokenizer, mesh, args.repeats, args.smoke)
  if args.part in ("faithful", "both"):
    results["greedy"] = greedy_agreement(actor, tokenizer, mesh, args.smoke)
    results["sampled"] = sampled_ratios(actor, tokenizer, mesh, args.sampled_steps, args.smoke)
  print_results(results)
  if args.json:
    args.json.write_text(json.dumps(results, indent=1, default=str))
  return 0


if __name__ == "__main__":
  sys.exit(main())
