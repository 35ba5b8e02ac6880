"""The grouped rollout engine of this checkout against the engine of a git revision, in one process.

  flock /tmp/gemma_grpo_heavy.lock python bench/studies/engine_ab.py --base REV [--repeats 8] [--json OUT]
      [--decode-dtype bfloat16 --logprobs] [--prompts 2 --generations 8 --prompt-width 384]

Loads `gemma_grpo/rl/engine/rollout.py` as it was at REV (`git show`) beside this
checkout's, builds both engines on the offline Gemma-3-270M LoRA policy
(bench/rollout.py's build_policy), and times the fixed workload's rollout (4
GSM8K prompts x 2 rows, 64 new tokens, temperature 0.9, top-k 50, never
stopping) and a 1-token rollout, rounds alternating the two engines, each
round drawn with the same key by both. Prints, per engine, decode seconds per
token ((64-token rollout - 1-token rollout) / 63) from the fastest and from
the median rounds (on a shared CPU, time stolen by other tenants only ever
adds, so the fastest round is the steadier figure), and whether both engines
drew identical tokens, sampled and greedy. About 1.5 min a round.

`--prompts 2 --generations 8 --prompt-width 384` times README's default
rollout instead (configs/gemma3_270m.py: 2 problems x 8 samples, prompts
padded to rollout.max_prompt_length).

`--decode-dtype bfloat16 --logprobs` times both engines as the trainer runs
them with rollout.decode_dtype=bfloat16 (which asks for the sampler's
log-probs); the default is the float32 engine, which the trainer runs
without them.

Only rollout.py is swapped: a change elsewhere in gemma_grpo is not compared,
and REV's rollout.py must import the module names this checkout has (those
since the engine moved into rl/engine/; for an older REV, run this script
from a checkout of that time). Asserts nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import common  # pylint: disable=g-import-not-at-top,wrong-import-position

REPO = pathlib.Path(__file__).resolve().parents[2]
ENGINES = ("base", "this")


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--base", required=True, help="git revision whose rollout.py is the baseline")
  p.add_argument("--repeats", type=int, default=8)
  p.add_argument("--json", type=pathlib.Path, help="write the raw figures here")
  p.add_argument("--decode-dtype", default="float32", help="rollout.decode_dtype of both engines")
  p.add_argument("--logprobs", action="store_true", help="ask for the sampler's log-probs")
  p.add_argument("--prompts", type=int, default=common.PROMPTS_PER_STEP,
                 help="distinct GSM8K prompts (README's default trains on 2)")
  p.add_argument("--generations", type=int, default=common.GENERATIONS,
                 help="rows per prompt (README's default: 8)")
  p.add_argument("--prompt-width", type=int, default=None,
                 help="pad prompts to this width, as rollout.max_prompt_length does (README's"
                      " default: 384); default: the longest prompt")
  return p.parse_args(argv)


def rollout_module_at(revision: str):
  """gemma_grpo/rl/engine/rollout.py as it was at `revision`, imported as its own module."""
  source = subprocess.run(["git", "-C", str(REPO), "show", f"{revision}:gemma_grpo/rl/engine/rollout.py"],
                          check=True, capture_output=True, text=True).stdout
  path = pathlib.Path(tempfile.mkdtemp()) / "rollout_base.py"
  path.write_text(source)
  spec = importlib.util.spec_from_file_location("rollout_base", path)
  module = importlib.util.module_from_spec(spec)
  sys.modules["rollout_base"] = module  # dataclasses look their module up here
  spec.loader.exec_module(module)
  return module


def measure(base: str, repeats: int, decode_dtype: str, logprobs: bool,
            prompts: int = common.PROMPTS_PER_STEP, generations: int = common.GENERATIONS,
            prompt_width: int | None = None) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  from tunix.rl.rollout import base_rollout  # pylint: disable=g-import-not-at-top

  import rollout as rollout_bench  # pylint: disable=g-import-not-at-top
  from gemma_grpo.rl.engine import rollout  # pylint: disable=g-import-not-at-top

  modules = {"base": rollout_module_at(base), "this": rollout}
  actor, tokenizer, mesh = rollout_bench.build_policy(common.offline_270m_dir())
  texts = rollout_bench.batch_texts(prompts, generations)
  width = prompt_width or max(len(tokenizer.encode(t)) for t in texts)
  engines = {e: m.GroupedRollout(actor, tokenizer, mesh,
                                 lora_scale=common.LORA_ALPHA / common.LORA_RANK,
                                 decode_dtype=decode_dtype)
             for e, m in modules.items()}

  def config(new_tokens: int, seed: int, greedy: bool = False):
    return base_rollout.RolloutConfig(
        max_tokens_to_generate=new_tokens, max_prompt_length=width, kv_cache_size=width + new_tokens,
        temperature=0.0 if greedy else common.TEMPERATURE, top_p=None if greedy else 1.0,
        top_k=None if greedy else common.TOP_K, eos_tokens=[-1], return_logprobs=logprobs,
        seed=jax.random.fold_in(jax.random.PRNGKey(0), seed))

  seconds = {(e, n): [] for e in ENGINES for n in (1, common.NEW_TOKENS)}
  identical, logp_gaps, logps = [], [], {}
  with mesh:
    for i in range(repeats + 1):  # the first round compiles and warms up
      tokens = {}
      for e in ENGINES:
        for n in (1, common.NEW_TOKENS):
          start = time.perf_counter()
          out = engines[e].generate(texts, config(n, i))
          if i:
            seconds[(e, n)].append(time.perf_counter() - start)
        tokens[e] = [t.tolist() for t in out.tokens]
        logps[e] = out.logprobs
      identical.append(tokens["base"] == tokens["this"])
      if logprobs and identical[-1]:  # the same tokens: their sampler log-probs compare
        logp_gaps.append(max(float(np.max(np.abs(a - b))) for a, b in zip(logps["base"], logps["this"])))
    greedy = {e: [t.tolist() for t in engines[e].generate(
        texts, config(common.NEW_TOKENS, 0, True)).tokens] for e in ENGINES}
  result = {"base": base, "decode_dtype": decode_dtype, "logprobs": logprobs, "rows": len(texts),
            "prompts": prompts, "prompt_width": width,
            "new_tokens": common.NEW_TOKENS, "identical_sampled_rounds": identical,
            "identical_greedy": greedy["base"] == greedy["this"],
            "max_abs_logp_gap": max(logp_gaps) if logp_gaps else None, "seconds": {}}
  steps = common.NEW_TOKENS - 1
  for e in ENGINES:
    full, one = seconds[(e, common.NEW_TOKENS)], seconds[(e, 1)]
    result["seconds"][e] = {
        "per_token_fastest": (min(full) - min(one)) / steps,
        "per_token_median": (common.median(full) - common.median(one)) / steps,
        "rollout_fastest": min(full), "rollout_median": common.median(full),
        "rollouts": full, "one_token_rollouts": one}
  return result


def print_results(r: dict) -> None:
  rows = [[e if e == "this" else f"base ({r['base']})",
           common.fmt(1e3 * r["seconds"][e]["per_token_fastest"], 1),
           common.fmt(1e3 * r["seconds"][e]["per_token_median"], 1),
           common.fmt(r["seconds"][e]["rollout_fastest"]), common.fmt(r["seconds"][e]["rollout_median"])]
          for e in ENGINES]
  common.print_table(["engine", "decode ms/token, fastest", "median", "64-token rollout s, fastest",
                      "median"], rows)
  s = r["seconds"]
  print(f"this engine faster per token: {s['base']['per_token_fastest'] / s['this']['per_token_fastest']:.2f}x"
        f" (fastest rounds), {s['base']['per_token_median'] / s['this']['per_token_median']:.2f}x (medians)")
  print(f"identical tokens, sampled rounds: {sum(r['identical_sampled_rounds'])} of "
        f"{len(r['identical_sampled_rounds'])}; greedy: {r['identical_greedy']}")
  if r["max_abs_logp_gap"] is not None:
    print(f"sampler log-probs, rounds with identical tokens: largest difference {r['max_abs_logp_gap']:.2e}")


def main(argv=None) -> int:
  args = parse_args(argv)
  result = measure(args.base, args.repeats, args.decode_dtype, args.logprobs, args.prompts,
                   args.generations, args.prompt_width)
  print_results(result)
  if args.json:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
