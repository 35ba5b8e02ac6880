"""Rollouts that run ahead (rollout.max_staleness) against lockstep, on long-tailed completions.

  flock /tmp/gemma_grpo_heavy.lock python bench/async_rollouts.py [--batches 6]
      [--prompts 2] [--generations 8] [--new-tokens 256] [--slots 4,8]
      [--staleness 1,2] [--stop-text "</answer>"]
      [--out docs/results/async_rollouts/gsm8k_270m.txt]
About 25 min on a 2-core CPU with the defaults; --smoke runs the plumbing
on a random 2-layer Gemma-3 (timings meaningless).

The workload is bench/continuous_batching.py's (GSM8K training problems
rendered with the offline config's few-shot turns, the offline 270M LoRA
policy in float32, temperature 0.9, top-k 50, stops at <eos>,
<end_of_turn>, "\\n\\n" or right after --stop-text), as a stream of
--batches batches of --prompts new problems x G each: what a training run's
rollouts see, one batch per step. The weights stay fixed: this measures the
rollout engine, not learning (bench/accuracy.py-style runs measure that).

Engines, each given the batches in order, one call per batch:
  lockstep          rollout.slots=0: a call decodes until its longest completion ends
  lockstep logps    the same, keeping the sampler's log-probs (the whole float32
                    LM head every step): what running ahead pays for them
  slots=S           rollout.slots=S: S rows kept busy, but a call still drains
                    its last samples while other slots idle
  slots=S ahead=k   rollout.slots=S, rollout.max_staleness=k: a call stops when a
                    slot would idle and carries its unfinished samples into the
                    next call (rl/engine/carry_over.py); the call of batch j
                    finishes every sample of batch j - k, as the trainer does,
                    and keeps the sampler's log-probs, as the trainer must (its
                    tokens' behaviour policy): every step computes the whole
                    float32 LM head, where the others screen it
Each engine compiles on a first call that is not timed (a batch of its own),
then the batches run interleaved: batch j of every engine, the engines' order
rotating, so every ratio compares calls made minutes apart at most (the
CPU's speed moves). Per engine: tokens generated per second (decode steps
whose token a completion keeps, plus each new sample's first token, over
the calls' seconds), the median per-batch ratio of that to lockstep's,
seconds per batch (what a training step's rollout costs) and occupancy
(kept slot-steps / all slot-steps). Asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import common  # pylint: disable=g-import-not-at-top,wrong-import-position
import continuous_batching  # pylint: disable=g-import-not-at-top,wrong-import-position


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--batches", type=int, default=6, help="timed batches per engine")
  p.add_argument("--prompts", type=int, default=2, help="new problems per batch")
  p.add_argument("--generations", type=int, default=8, help="G: samples per problem")
  p.add_argument("--new-tokens", type=int, default=256, help="max_new_tokens")
  p.add_argument("--slots", default="4,8", help="slot counts")
  p.add_argument("--staleness", default="1,2", help="max_staleness values run ahead")
  p.add_argument("--stop-text", default="</answer>", help="end completions right after this text")
  p.add_argument("--smoke", action="store_true", help="random 2-layer Gemma-3: the plumbing only")
  p.add_argument("--out", type=pathlib.Path, help="also write the output here (.txt)")
  return p.parse_args(argv)


def main(argv=None) -> int:
  args = parse_args(argv)
  say = common.Transcript()

  import jax  # pylint: disable=g-import-not-at-top
  from tunix.rl.rollout import base_rollout  # pylint: disable=g-import-not-at-top

  from gemma_grpo.rl.engine import carry_over  # pylint: disable=g-import-not-at-top
  from gemma_grpo.rl.engine import rollout  # pylint: disable=g-import-not-at-top
  from rollout import build_policy  # bench/rollout.py  # pylint: disable=g-import-not-at-top

  started = datetime.datetime.now(datetime.timezone.utc)
  say(f"# python bench/async_rollouts.py {' '.join(sys.argv[1:] if argv is None else argv)}")
  say(f"# {started:%Y-%m-%d %H:%M} UTC, {continuous_batching.cpu_name()},"
      f" {jax.device_count()} JAX device(s)")
  per_batch = args.prompts * args.generations
  # Batch 0 compiles every engine; batches 1.. are timed.
  texts = continuous_batching.workload(args.prompts * (args.batches + 1), args.generations)
  batches = [texts[i:i + per_batch] for i in range(0, len(texts), per_batch)]
  model_dir = (common.tiny_hf_dir(pathlib.Path("/tmp/continuous_batching_tiny_hf")) if args.smoke
               else common.offline_270m_dir())
  actor, tokenizer, mesh = build_policy(model_dir)
  prompt_width = max(len(tokenizer.encode(t)) for t in texts) + 1
  scale = common.LORA_ALPHA / common.LORA_RANK
  slot_counts = [int(s) for s in args.slots.split(",") if s]
  ahead = [int(k) for k in args.staleness.split(",") if k]
  lockstep = rollout.GroupedRollout(actor, tokenizer, mesh, lora_scale=scale,
                                    stop_text=args.stop_text)
  engines = {"lockstep": (lockstep, 0), "lockstep logps": (lockstep, 0)}
  for s in slot_counts:
    engines[f"slots={s}"] = (rollout.GroupedRollout(actor, tokenizer, mesh, lora_scale=scale,
                                                    slots=s, stop_text=args.stop_text), 0)
    for k in ahead:
      engine = rollout.GroupedRollout(actor, tokenizer, mesh, lora_scale=scale, slots=s,
                                      stop_text=args.stop_text)
      engines[f"slots={s} ahead={k}"] = (carry_over.CarryOver(engine, s), k)
  names = list(engines)
  stop_ids = continuous_batching.STOP_IDS[:2] if args.stop_text else continuous_batching.STOP_IDS

  def call(name: str, j: int) -> dict:
    engine, k = engines[name]
    config = base_rollout.RolloutConfig(
        max_tokens_to_generate=args.new_tokens, max_prompt_length=prompt_width,
        kv_cache_size=prompt_width + args.new_tokens, temperature=common.TEMPERATURE,
        top_p=1.0, top_k=common.TOP_K, eos_tokens=list(stop_ids),
        seed=jax.random.fold_in(jax.random.PRNGKey(0), j),
        return_logprobs=bool(k) or name == "lockstep logps")
    start = time.perf_counter()
    with mesh:
      if k:
        out = engine.decode(batches[j], [(j, i) for i in range(per_batch)], config,
                            must_finish=lambda i: i[0] <= j - k)
        stats = out.stats
      else:
        engine.generate(batches[j], config)
        [stats] = engine.take_decode_stats()
    seconds = time.perf_counter() - start  # tokens are on the host: synchronous
    return {"seconds": seconds, "tokens": stats.kept + per_batch, "steps": stats.steps,
            "occupancy": stats.kept / max(stats.steps * stats.slots, 1)}

  for name in names:
    say(f"# warm-up (compile) {name}: {call(name, 0)['seconds']:.1f} s")
  runs = {name: [] for name in names}
  for j in range(1, args.batches + 1):
    order = names[j % len(names):] + names[:j % len(names)]
    for name in order:
      runs[name].append(call(name, j))
    say(f"# batch {j}: " + ", ".join(f"{n} {runs[n][-1]['seconds']:.1f} s" for n in order))

  say(f"{args.batches} batches of {per_batch} completions ({args.prompts} GSM8K problems x"
      f" G={args.generations}), max_new_tokens={args.new_tokens}, prompt width {prompt_width},"
      f" stop text {args.stop_text!r}; weights fixed")
  rows = []
  for name in names:
    mine = runs[name]
    rate = sum(x["tokens"] for x in mine) / sum(x["seconds"] for x in mine)
    ratio = statistics.median(
        x["tokens"] / x["seconds"] / (base["tokens"] / base["seconds"])
        for x, base in zip(mine, runs["lockstep"]))
    occupancy = (sum(x["occupancy"] * x["steps"] for x in mine)
                 / max(sum(x["steps"] for x in mine), 1))
    rows.append((name, f"{rate:.1f}", f"{ratio:.2f}",
                 f"{statistics.median(x['seconds'] for x in mine):.1f}", f"{occupancy:.2f}",
                 f"{1000 * statistics.median(x['seconds'] / max(x['steps'], 1) for x in mine):.0f}"))
  header = ("engine", "tokens/s", "vs lockstep", "s/batch", "occupancy", "ms/step")
  for line in common.table_lines(header, rows):
    say(line)
  say("tokens/s: over all batches; vs lockstep: the median of the per-batch ratios;"
      " s/batch: median seconds per call")
  say.write(args.out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
