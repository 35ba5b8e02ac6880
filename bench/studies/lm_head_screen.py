"""The LM head's bfloat16 screen (rollout.screen_lm_head): decode speed, and the same tokens.

  flock /tmp/gemma_grpo_heavy.lock python bench/studies/lm_head_screen.py [--repeats 5] [--json OUT]

On the offline Gemma-3-270M LoRA policy (bench/rollout.py's build_policy,
float32), the grouped engine with the screen off and on, in one process:
the fixed workload's rollout (4 GSM8K prompts x 2 rows, 64 new tokens,
temperature 0.9, top-k 50, never stopping), each round drawn with its own key
by both engines, rounds alternating the two. Prints, per engine, decode
seconds per token ((64-token rollout - 1-token rollout) / 63, medians), the
64-token rollout, and for the screen the decode steps its proof did not
cover (each computed the whole float32 head); then whether both engines drew
identical tokens in every round, sampled and greedy. About 4 min quiet.

--smoke runs it on a random 2-layer Gemma-3 (figures meaningless).
Asserts nothing.
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

SETTINGS = ("off", "on")


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--smoke", action="store_true", help="random 2-layer model; figures meaningless")
  p.add_argument("--json", type=pathlib.Path, help="write the raw figures here")
  return p.parse_args(argv)


def policy(smoke: bool):
  import rollout as rollout_bench  # pylint: disable=g-import-not-at-top

  if not smoke:
    return rollout_bench.build_policy(common.offline_270m_dir())
  from configs import tiny  # pylint: disable=g-import-not-at-top
  from gemma_grpo.config import settings  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import lora  # pylint: disable=g-import-not-at-top
  from gemma_grpo.runtime import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import model_loading  # pylint: disable=g-import-not-at-top

  c = settings.from_config(tiny.get_config())
  mesh = mesh_lib.make_mesh(c.mesh)
  loaded = model_loading.build(c.model, mesh)
  return lora.apply(loaded.model, c.lora, mesh), loaded.tokenizer, mesh


def measure(repeats: int, smoke: bool) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  from tunix.rl.rollout import base_rollout  # pylint: disable=g-import-not-at-top

  import rollout as rollout_bench  # pylint: disable=g-import-not-at-top
  from gemma_grpo.rl.engine import rollout  # pylint: disable=g-import-not-at-top

  actor, tokenizer, mesh = policy(smoke)
  texts = rollout_bench.batch_texts(common.PROMPTS_PER_STEP, common.GENERATIONS)
  width = max(len(tokenizer.encode(t)) for t in texts)
  engines = {s: rollout.GroupedRollout(actor, tokenizer, mesh, screen_lm_head=s,
                                       lora_scale=common.LORA_ALPHA / common.LORA_RANK)
             for s in SETTINGS}

  def config(new_tokens: int, seed: int, greedy: bool = False):
    return base_rollout.RolloutConfig(
        max_tokens_to_generate=new_tokens, max_prompt_length=width, kv_cache_size=width + new_tokens,
        temperature=0.0 if greedy else common.TEMPERATURE, top_p=None if greedy else 1.0,
        top_k=None if greedy else common.TOP_K, eos_tokens=[-1],
        seed=jax.random.fold_in(jax.random.PRNGKey(0), seed))

  seconds = {(s, n): [] for s in SETTINGS for n in (1, common.NEW_TOKENS)}
  unproved, identical = [], []
  with mesh:
    for i in range(repeats + 1):  # the first round compiles and warms up
      tokens = {}
      for s, engine in engines.items():
        for n in (1, common.NEW_TOKENS):
          start = time.perf_counter()
          out = engine.generate(texts, config(n, i))
          if i:
            seconds[(s, n)].append(time.perf_counter() - start)
        tokens[s] = [t.tolist() for t in out.tokens]
        if s == "on":
          unproved.append(engine.full_head_steps)
      identical.append(tokens["off"] == tokens["on"])
    greedy = {s: [t.tolist() for t in e.generate(texts, config(common.NEW_TOKENS, 0, True)).tokens]
              for s, e in engines.items()}
  result = {"rows": len(texts), "prompt_width": width, "new_tokens": common.NEW_TOKENS,
            "unproved_steps_per_round": unproved, "identical_sampled_rounds": identical,
            "identical_greedy": greedy["off"] == greedy["on"], "seconds": {}}
  for s in SETTINGS:
    full, one = common.median(seconds[(s, common.NEW_TOKENS)]), common.median(seconds[(s, 1)])
    result["seconds"][s] = {"per_token": (full - one) / (common.NEW_TOKENS - 1), "rollout": full,
                            "rollouts": seconds[(s, common.NEW_TOKENS)]}
  result["speedup_per_token"] = (result["seconds"]["off"]["per_token"]
                                 / result["seconds"]["on"]["per_token"])
  return result


def print_results(r: dict) -> None:
  rows = [[s, common.fmt(1e3 * r["seconds"][s]["per_token"], 1), common.fmt(r["seconds"][s]["rollout"])]
          for s in SETTINGS]
  common.print_table(["screen", "decode ms/token", "64-token rollout s"], rows)
  print(f"screen on: {r['speedup_per_token']:.2f}x per token; decode steps not proved per "
        f"round (of {r['new_tokens'] - 1}): {r['unproved_steps_per_round']} (the first round warms up)")
  print(f"identical tokens, sampled rounds: {sum(r['identical_sampled_rounds'])} of "
        f"{len(r['identical_sampled_rounds'])}; greedy: {r['identical_greedy']}")


def main(argv=None) -> int:
  args = parse_args(argv)
  result = measure(args.repeats, args.smoke)
  print_results(result)
  if args.json:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
