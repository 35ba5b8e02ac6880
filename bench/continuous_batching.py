"""Continuous batching (rollout.slots) against lockstep decoding, on long-tailed completions.

  flock /tmp/gemma_grpo_heavy.lock python bench/continuous_batching.py [--prompts 2]
      [--generations 8] [--new-tokens 256] [--slots 4,8,16] [--rounds 2]
      [--stop-text "</answer>"] [--out docs/results/continuous_batching/gsm8k_270m.txt]
About 15 min on a 2-core CPU with the defaults (a model load, one compile
per engine, then rounds of one rollout per engine); --smoke does the same on
a random 2-layer Gemma-3 (timings meaningless).

The workload: the first --prompts GSM8K training problems, each rendered as
the offline 270M config renders its problems (three solved examples as
earlier chat turns, the offline config's data.few_shot), G = --generations
samples each, up to --new-tokens tokens, temperature 0.9, top-k 50, on
the offline Gemma-3-270M LoRA policy (bench/rollout.py's build_policy,
float32). Completions stop at <eos>, <end_of_turn> or "\\n\\n": the base 270M
never writes the first two, and after its "</answer>" it writes "\\n\\n" (or
rambles on to the limit), so completion lengths vary widely as on a
reasoning task. With --stop-text, completions stop at <eos>, <end_of_turn>
or right after the stop text, as the offline config's do (rollout.stop_text),
and an extra engine, "cut after", is lockstep decoding that stops at the
stop ids only and cuts after the stop text on the host (the engine before
rl/engine/stop_text.py); every engine's tokens are then the ones a learner
keeps, and ratios are to "cut after".

Engines: the grouped engine in lockstep (rollout.slots=0: every completion
decodes until the longest ends) and with continuous batching at each slot
count (each slot takes the next waiting completion when its own ends; as
many slots as completions never refills, so it measures the slot loop's own
cost against lockstep's). Each engine is compiled on a rollout of the same
shapes whose stop ids end most completions at their first token ("<", which
opens "<reasoning>"); then every round
runs one rollout per engine with the same key, the engines' order rotating
from round to round (the CPU is shared: only ratios within a round compare).
Prints per engine the medians over rounds of generated tokens per second
(tokens of the returned completions / rollout seconds), seconds, decode
steps, occupancy (slot-steps that made a kept token / all slot-steps) and
ms per decode step, and the median per-round ratio of tokens per second to
lockstep's; and whether every slot count drew the same completions as the
largest (they must: keys are per sample). Asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import platform
import statistics
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import common  # pylint: disable=g-import-not-at-top,wrong-import-position

GSM8K_TRAIN = pathlib.Path("/work/shared/data/gsm8k/train.jsonl")
STOP_IDS = (1, 106, 108)  # <eos>, <end_of_turn>, "\n\n"
WARM_STOP_IDS = (1, 106, 236820)  # "<": ends the compile rollout early; same shapes


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--prompts", type=int, default=2, help="distinct problems per rollout")
  p.add_argument("--generations", type=int, default=8, help="G: samples per problem")
  p.add_argument("--new-tokens", type=int, default=256, help="max_new_tokens")
  p.add_argument("--slots", default="4,8,16", help="slot counts for continuous batching")
  p.add_argument("--rounds", type=int, default=2, help="timed rollouts per engine")
  p.add_argument("--stop-text", default="", help="end completions right after this text")
  p.add_argument("--smoke", action="store_true", help="random 2-layer Gemma-3: the plumbing only")
  p.add_argument("--out", type=pathlib.Path, help="also write the output here (.txt)")
  return p.parse_args(argv)


def cpu_name() -> str:
  try:
    for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
      if line.startswith("Model name"):
        return line.split(":", 1)[1].strip()
  except (OSError, subprocess.CalledProcessError):
    pass
  return platform.processor() or "unknown CPU"


def workload(n_prompts: int, generations: int) -> list[str]:
  from gemma_grpo import config  # pylint: disable=g-import-not-at-top
  from gemma_grpo.tasks import prompts  # pylint: disable=g-import-not-at-top

  records = common.gsm8k_records(n_prompts, GSM8K_TRAIN)
  examples = config.offline_270m().data.few_shot
  return [prompts.render_prompt(r["question"], examples=examples)
          for r in records for _ in range(generations)]


def main(argv=None) -> int:
  args = parse_args(argv)
  say = common.Transcript()

  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tunix.rl.rollout import base_rollout  # pylint: disable=g-import-not-at-top

  from gemma_grpo.model import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo.rl.engine import rollout  # pylint: disable=g-import-not-at-top
  from gemma_grpo.rl.learner import rollout_rounds  # pylint: disable=g-import-not-at-top
  from rollout import build_policy  # bench/rollout.py  # pylint: disable=g-import-not-at-top

  started = datetime.datetime.now(datetime.timezone.utc)
  say(f"# python bench/continuous_batching.py {' '.join(sys.argv[1:] if argv is None else argv)}")
  say(f"# {started:%Y-%m-%d %H:%M} UTC, {cpu_name()}, {jax.device_count()} JAX device(s)")
  texts = workload(args.prompts, args.generations)
  model_dir = (common.tiny_hf_dir(pathlib.Path("/tmp/continuous_batching_tiny_hf")) if args.smoke
               else common.offline_270m_dir())
  actor, tokenizer, mesh = build_policy(model_dir)
  prompt_width = max(len(tokenizer.encode(t)) for t in texts) + 1
  slot_counts = [int(s) for s in args.slots.split(",") if s]
  names = ["lockstep"] + [f"slots={s}" for s in slot_counts]
  engines = {name: rollout.GroupedRollout(actor, tokenizer, mesh,
                                          lora_scale=common.LORA_ALPHA / common.LORA_RANK,
                                          slots=slots, stop_text=args.stop_text)
             for name, slots in zip(names, [0] + slot_counts)}
  stop_ids = STOP_IDS
  if args.stop_text:
    stop_ids = STOP_IDS[:2]
    names.insert(0, "cut after")
    engines["cut after"] = rollout.GroupedRollout(
        actor, tokenizer, mesh, lora_scale=common.LORA_ALPHA / common.LORA_RANK)
  base = names[0]

  def kept(tokens) -> list[int]:
    """A completion's tokens through its stop text (the learner's cut), or all."""
    tokens = tokens.tolist()
    cut = tokenizer_lib.tokens_through(tokens, tokenizer.decode(tokens), args.stop_text,
                                       tokenizer)
    return tokens if cut is None else tokens[:cut[0]]

  def run(engine, key, stop_ids=stop_ids) -> dict:
    config = base_rollout.RolloutConfig(
        max_tokens_to_generate=args.new_tokens, max_prompt_length=prompt_width,
        kv_cache_size=prompt_width + args.new_tokens, temperature=common.TEMPERATURE,
        top_p=1.0, top_k=common.TOP_K, eos_tokens=list(stop_ids), seed=key)
    start = time.perf_counter()
    with mesh:
      out = engine.generate(texts, config)
    seconds = time.perf_counter() - start  # tokens are on the host: synchronous
    [stats] = engine.take_decode_stats()
    completions = [kept(t) for t in out.tokens]
    lengths = [len(t) for t in completions]
    cut = [len(c) if len(c) < len(t) else -1 for c, t in zip(completions, out.tokens)]
    # Slot-steps that made a token the learner keeps (as learner.py counts them).
    [stats] = rollout_rounds.kept_through_stop_text([stats], np.array(cut))
    return {"seconds": seconds, "tokens": sum(lengths), "lengths": lengths,
            "steps": stats.steps, "occupancy": stats.kept / max(stats.steps * stats.slots, 1),
            "refills": stats.refills, "completions": completions}

  key = jax.random.PRNGKey(0)
  warm = {}
  for name, engine in engines.items():
    warm[name] = run(engine, jax.random.fold_in(key, 10_000), WARM_STOP_IDS)
    say(f"# warm-up (compile) {name}: {warm[name]['seconds']:.1f} s")
  rounds = []
  for r in range(args.rounds):
    order = names[r % len(names):] + names[:r % len(names)]
    rounds.append({name: run(engines[name], jax.random.fold_in(key, r)) for name in order})
    say(f"# round {r + 1}: " + ", ".join(
        f"{n} {rounds[-1][n]['seconds']:.1f} s" for n in order))

  lengths = np.array(rounds[0][base]["lengths"])
  say(f"{len(texts)} completions ({args.prompts} GSM8K problems x G={args.generations}),"
      f" max_new_tokens={args.new_tokens}, prompt width {prompt_width};"
      f" round 1's completion lengths: min {lengths.min()}, median {int(np.median(lengths))},"
      f" mean {lengths.mean():.0f}, max {lengths.max()}, at the limit"
      f" {(lengths >= args.new_tokens).sum()}/{len(lengths)}")
  med = lambda values: statistics.median(values)
  rows = []
  for name in names:
    runs = [rd[name] for rd in rounds]
    rate = med([x["tokens"] / x["seconds"] for x in runs])
    ratio = med([x["tokens"] / x["seconds"] / (rd[base]["tokens"] / rd[base]["seconds"])
                 for x, rd in zip(runs, rounds)])
    ms_step = med([1000 * x["seconds"] / max(x["steps"], 1) for x in runs])
    rows.append((name, f"{rate:.1f}", f"{ratio:.2f}", f"{med([x['seconds'] for x in runs]):.1f}",
                 int(med([x["steps"] for x in runs])), f"{med([x['occupancy'] for x in runs]):.2f}",
                 f"{ms_step:.0f}", int(med([x["refills"] for x in runs]))))
  header = ("engine", "tokens/s", f"vs {base}", "seconds", "decode steps", "occupancy",
            "ms/step", "refills")
  for line in common.table_lines(header, rows):
    say(line)
  largest = names[-1]
  same = all(rd[n]["completions"] == rd[largest]["completions"]
             for rd in rounds for n in names if n.startswith("slots"))
  say(f"every slot count drew the completions of {largest} (same key): {same}")
  if args.stop_text:
    same = all(rd["lockstep"]["completions"] == rd["cut after"]["completions"] for rd in rounds)
    say(f"lockstep with the stop text kept the tokens of cut after (same key): {same}")
  say(f"median ratio of tokens/s to {base}: "
      + ", ".join(f"{r[0]} {r[2]}x" for r in rows[1:]))
  say.write(args.out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
