"""How far is each phase of a GRPO step from what this machine allows? A roofline report.

  flock /tmp/gemma_grpo_heavy.lock python bench/roofline.py [--json OUT]
About 6 min on a quiet 2-core CPU; --smoke runs the plumbing on a random
2-layer Gemma-3 in about 2 min (its figures mean nothing).

1. The machine, in this process: sustained read bandwidth (a jitted sum over
   a 1 GiB float32 array, best of 5) and the float32 matmul rate (a jitted
   2048 x 2048 x 2048 product, best of 5).
2. The fixed workload of bench/common.py (Gemma-3-270M float32, LoRA r=32,
   4 GSM8K prompts x 2 generations x 64 new tokens):
   - prefill and decode: the trainer's rollout engine
     (gemma_grpo.rl.engine.rollout.GroupedRollout) on the LoRA policy, timed with 1 and
     with 64 new tokens (median of --repeats after a warm-up); prefill = the
     1-token rollout, decode per token = the difference / 63;
   - reference pass and update: the trainer itself on the same workload
     (1 warm-up + --steps timed steps, its perf/train/reference_seconds and
     perf/train/update_seconds), in a child process.
3. Each phase's bound, from the model's dimensions (accounting() below):
   - decode per token: bytes it must read / bandwidth: every weight once (the
     tied embedding as LM head included, LoRA merged into the weights as the
     engine does) plus the KV cache: each prompt's keys and values once (a
     group's rows attend to them together, as the engine does since
     2026-12-03; earlier runs' tables counted them once per row) and every
     row's completion's; where the engine
     screens the LM head (rollout.screen_lm_head), the head's bfloat16 copy
     instead of the float32 head (runs before that have no "screened" key
     and are counted with the float32 head);
   - prefill, reference, update: FLOPs they must do / matmul rate: 2 x params
     x tokens for the projections (each group's prompt once, as the engine
     and gemma_grpo.rl.learner.logprobs do), 4 L H Dh S^2 for attention, 2 D V for each
     position that needs logits; the update is its forward plus the backward
     to the activations (the frozen weights need no weight gradients), i.e.
     twice the reference pass, a lower bound.
Prints a table: measured seconds, bound seconds, measured / bound; names the
phase furthest from its bound and the one with the most seconds above its
bound in a step (the next target). `--report FILE` recomputes the table from
an earlier run's --json. Asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import tempfile
import time
import types

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import common  # pylint: disable=g-import-not-at-top,wrong-import-position

BYTES_F32 = 4


@dataclasses.dataclass(frozen=True)
class Shape:
  """What the bounds depend on: the model's dimensions and the workload's sizes."""
  layers: int
  vocab: int
  width: int  # D
  hidden: int  # F, the MLP's inner width
  heads: int
  head_dim: int
  kv_heads: int
  prompts: int  # U, distinct prompts per step
  rows: int  # B = U x generations
  prompt_len: int  # P
  new_tokens: int  # T
  screened: bool = False  # decode reads the LM head's bfloat16 copy (rollout.screen_lm_head)


def layer_params(s: Shape) -> int:
  """q, k/v, o, gate, up, down of one layer."""
  attention = s.width * s.head_dim * (2 * s.heads + 2 * s.kv_heads)
  return attention + 3 * s.width * s.hidden


def accounting(s: Shape) -> dict[str, float]:
  """Bytes (decode per token) and FLOPs (the rest) each phase must move or do."""
  projections = s.layers * layer_params(s)
  cache = s.prompt_len + s.new_tokens
  attention = lambda queries, keys: 4 * s.layers * s.heads * s.head_dim * queries * keys
  lm_head = 2 * s.width * s.vocab
  head_bytes = (2 if s.screened else BYTES_F32) * s.vocab * s.width
  reference = (2 * projections * (s.prompts * s.prompt_len + s.rows * s.new_tokens)
               + attention(s.prompts * s.prompt_len, s.prompt_len)
               + attention(s.rows * s.new_tokens, cache)
               + lm_head * s.rows * s.new_tokens)
  return {
      "decode_bytes": head_bytes + BYTES_F32 * (
          projections + s.layers * 2 * s.kv_heads * s.head_dim
          * (s.prompts * s.prompt_len + s.rows * s.new_tokens)),
      "prefill_flops": (2 * projections * s.prompts * s.prompt_len
                        + attention(s.prompts * s.prompt_len, s.prompt_len) + lm_head * s.rows),
      "reference_flops": reference,
      "update_flops": 2 * reference,
  }


def best_seconds(fn, *args, repeats: int = 5) -> float:
  fn(*args).block_until_ready()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn(*args).block_until_ready()
    times.append(time.perf_counter() - start)
  return min(times)


def machine(smoke: bool) -> dict[str, float]:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  n = (1 << 24) if smoke else (1 << 28)  # 64 MiB / 1 GiB of float32
  x = jnp.ones((n,), jnp.float32)
  read = best_seconds(jax.jit(jnp.sum), x)
  del x
  m = 512 if smoke else 2048
  a = jnp.ones((m, m), jnp.float32)
  matmul = best_seconds(jax.jit(jnp.dot), a, a)
  return {"bandwidth_bytes_per_s": n * BYTES_F32 / read, "matmul_flops_per_s": 2 * m ** 3 / matmul,
          "devices": jax.device_count(), "platform": jax.devices()[0].platform}


def time_rollout(model_dir: pathlib.Path, repeats: int) -> dict:
  """Rollout seconds with 1 and NEW_TOKENS new tokens, and the model's dimensions."""
  import rollout as rollout_bench  # pylint: disable=g-import-not-at-top
  from gemma_grpo.rl.engine import rollout as rollout_lib  # pylint: disable=g-import-not-at-top

  actor, tokenizer, mesh = rollout_bench.build_policy(model_dir)
  texts = rollout_bench.batch_texts(common.PROMPTS_PER_STEP, common.GENERATIONS)
  width = max(len(tokenizer.encode(t)) for t in texts)
  seconds = {}
  for new_tokens in (1, common.NEW_TOKENS):
    args = types.SimpleNamespace(repeats=repeats, new_tokens=new_tokens)
    runs = rollout_bench._time_grouped(args, texts, actor, tokenizer, mesh, width)["runs"]  # pylint: disable=protected-access
    seconds[new_tokens] = common.median([r["seconds"] for r in runs[1:]])
  cfg = actor.config
  screened = rollout_lib.GroupedRollout(actor, tokenizer, mesh, lora_scale=1.0)._screen  # pylint: disable=protected-access
  return {"seconds": seconds, "prompt_width": width, "screened": screened, "dims": {
      "layers": cfg.num_layers, "vocab": cfg.num_embed, "width": cfg.embed_dim,
      "hidden": cfg.hidden_dim, "heads": cfg.num_heads, "head_dim": cfg.head_dim,
      "kv_heads": cfg.num_kv_heads}}


def time_step(work: pathlib.Path, model_dir: pathlib.Path, steps: int) -> dict:
  """Median reference and update seconds of the trainer on the fixed workload."""
  records = common.gsm8k_records(common.PROMPTS_PER_STEP * (steps + common.WARMUP_STEPS))
  data = common.write_jsonl(records, work / "problems.jsonl")
  width = max(common.prompt_lengths(records, model_dir))
  run_dir = work / "run"
  child = common.run_child(common.ours_command(
      workdir=run_dir, data=data, model_source=str(model_dir),
      steps=steps + common.WARMUP_STEPS, prompt_length=width), log=work / "train.log")
  if child.returncode:
    raise SystemExit(f"the trainer exited {child.returncode}; see {work / 'train.log'}")
  timed = [s for s in common.ours_steps(run_dir) if s["step"] > common.WARMUP_STEPS]
  return {"prompt_width": width, "reference": common.median([s["reference"] for s in timed]),
          "update": common.median([s["update_logged"] for s in timed]),
          "step": common.median([s["step_seconds"] for s in timed])}


def report(bounds: dict, rollout: dict, step: dict) -> list[dict]:
  """Each phase against its bound; the rollout's own prompt width for prefill and decode."""
  def shape(prompt_len: int) -> Shape:
    return Shape(**rollout["dims"], screened=rollout.get("screened", False),
                 prompts=common.PROMPTS_PER_STEP,
                 rows=common.PROMPTS_PER_STEP * common.GENERATIONS,
                 prompt_len=prompt_len, new_tokens=common.NEW_TOKENS)
  sampled, trained = accounting(shape(rollout["prompt_width"])), accounting(shape(step["prompt_width"]))
  bandwidth, flops = bounds["bandwidth_bytes_per_s"], bounds["matmul_flops_per_s"]
  seconds = {int(k): v for k, v in rollout["seconds"].items()}
  one, full = seconds[1], seconds[common.NEW_TOKENS]
  rows = [
      ("prefill (one rollout of 1 token)", one, sampled["prefill_flops"] / flops, "matmul"),
      ("decode, per token (8 rows)", (full - one) / (common.NEW_TOKENS - 1),
       sampled["decode_bytes"] / bandwidth, "bandwidth"),
      ("reference pass", step["reference"], trained["reference_flops"] / flops, "matmul"),
      ("update", step["update"], trained["update_flops"] / flops, "matmul"),
  ]
  return [{"phase": name, "measured_s": measured, "bound_s": bound, "ratio": measured / bound,
           "bound_by": kind} for name, measured, bound, kind in rows]


def print_report(rows: list[dict]) -> None:
  common.print_table(("phase", "measured s", "bound s", "measured / bound", "bound by"),
                     [(r["phase"], f"{r['measured_s']:.4f}", f"{r['bound_s']:.4f}",
                       f"{r['ratio']:.1f}", r["bound_by"]) for r in rows])
  worst = max(rows, key=lambda r: r["ratio"])
  lost = max(rows, key=lambda r: r["measured_s"] - r["bound_s"] if "per token" not in r["phase"]
             else (r["measured_s"] - r["bound_s"]) * (common.NEW_TOKENS - 1))
  print(f"furthest from its bound: {worst['phase']} ({worst['ratio']:.1f}x)")
  print(f"most seconds above its bound per step: {lost['phase']} (decode counted over"
        f" {common.NEW_TOKENS - 1} tokens): the next target")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--repeats", type=int, default=3, help="timed rollouts per length")
  p.add_argument("--steps", type=int, default=3, help="timed trainer steps")
  p.add_argument("--smoke", action="store_true", help="random 2-layer Gemma-3: checks the plumbing")
  p.add_argument("--json", type=pathlib.Path, help="write the raw numbers here")
  p.add_argument("--report", type=pathlib.Path,
                 help="recompute the table from a --json file of an earlier run; measures nothing")
  args = p.parse_args(argv)
  if args.report:
    saved = json.loads(args.report.read_text())
    print_report(report(saved["machine"], saved["rollout"], saved["step"]))
    return 0
  with tempfile.TemporaryDirectory(prefix="roofline_") as tmp:
    work = pathlib.Path(tmp)
    model_dir = common.tiny_hf_dir(work / "tiny_hf") if args.smoke else common.offline_270m_dir()
    bounds = machine(args.smoke)
    print(f"machine: {bounds['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s read,"
          f" {bounds['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s float32 matmul"
          f" ({bounds['devices']} {bounds['platform']} device)", flush=True)
    rollout = time_rollout(model_dir, args.repeats)
    step = time_step(work, model_dir, args.steps)
  rows = report(bounds, rollout, step)
  print_report(rows)
  if args.json:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"smoke": args.smoke, "machine": bounds, "rollout": rollout,
                                     "step": step, "phases": rows}, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
