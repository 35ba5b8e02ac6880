"""One GRPO step of the fixed workload: gemma-grpo vs TRL's GRPOTrainer + PEFT.

  flock /tmp/gemma_grpo_heavy.lock python bench/peer_step.py [--json bench/results/peer_step.json]
About 8-10 min on a quiet 2-core CPU (each framework loads, compiles or warms
up, then runs 1 warm-up + 4 timed steps); --smoke runs every code path on a
random 2-layer Gemma-3 in a few minutes (its timings mean nothing).

Workload (bench/common.py): Gemma-3-270M float32, LoRA r=32 alpha=32 on q,
k/v, o, gate, up, down; 4 GSM8K test prompts x 2 generations per step, exactly
64 new tokens, temperature 0.9, top_k 50, beta 0.08, epsilon 0.2, one
iteration, AdamW 3e-6, clip 0.1, the guarded reward preset on both sides.

Each framework runs in a fresh child process, one after the other, so its
peak RSS is its own (wait4 on that child). Both get the same 4 x (steps + 1)
problems, the first of GSM8K test in file order, rendered by
gemma_grpo.tasks.prompts.render_prompt and tokenized identically (TRL gets the plain
string; trl_step.py checks the token ids match). TRL takes them in file order;
gemma-grpo's loader shuffles its training set with data.shuffle_seed, so it
sees the same problems grouped differently. gemma-grpo pads every prompt to
rollout.max_prompt_length, set here to the longest prompt of the set (TRL pads
to the longest of each batch): the table shows both widths.

Columns (medians over the timed steps; seconds unless named):
  step       wall time from the end of one step to the end of the next
  rollout    sampling the 8 completions (tokenize, generate, detokenize)
  reference  reference-policy log-probs of the completions
  train      step - rollout - reference: rewards, loss, backward, optimizer
  wall       the whole child process: start-up, load, compile, all steps
  peak RSS   the child's maximum resident set size
gemma-grpo's figures are the trainer's own perf/train/{step,rollout,
reference}_seconds (bench/common.py reads older names too and prints n/a for a
metric a version does not log); TRL's are measured by bench/trl_step.py.
gemma-grpo runs with rollout.ignore_eos=true where the config has that key.
Ends with `speedup_vs_trl=X.XX` (TRL's median step / ours). Prints figures;
asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import common  # pylint: disable=g-import-not-at-top,wrong-import-position


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(
      description=__doc__.splitlines()[0],
      epilog="Run real (non --smoke) benchmarks under flock " + common.HEAVY_LOCK,
      formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--steps", type=int, default=4, help="timed steps, after 1 warm-up step (default 4)")
  p.add_argument("--only", choices=("ours", "trl"), help="run one framework only")
  p.add_argument("--json", type=pathlib.Path, help="write the raw per-step numbers here")
  p.add_argument("--smoke", action="store_true",
                 help="a random 2-layer Gemma-3 instead of the 270M: checks the plumbing")
  p.add_argument("--trl-gradient-checkpointing", action="store_true",
                 help="TRL's default; off by default since gemma-grpo does not rematerialise")
  p.add_argument("--trl-bf16", action="store_true",
                 help="TRL's bfloat16 autocast (its default), the peer of"
                      " --ours-override model.matmul_dtype=bfloat16")
  p.add_argument("--ours-override", action="append", default=[], metavar="KEY=VALUE",
                 help="passed to our trainer as --config.KEY=VALUE (repeatable), e.g."
                      " rollout.decode_dtype=bfloat16; recorded in --json")
  p.add_argument("--workdir", type=pathlib.Path,
                 help="keep run directories and logs here (default: a temporary directory)")
  return p.parse_args(argv)


def run_ours(args, work: pathlib.Path, data: pathlib.Path, model_dir: pathlib.Path,
             prompt_width: int) -> dict:
  run_dir = work / "ours"
  cmd = common.ours_command(
      workdir=run_dir, data=data, model_source=str(model_dir),
      steps=args.steps + common.WARMUP_STEPS, prompt_length=prompt_width,
      extra=[f"--config.{o}" for o in args.ours_override])
  child = common.run_child(cmd, log=work / "ours.log")
  steps = common.ours_steps(run_dir)
  return {"framework": "gemma-grpo", "returncode": child.returncode,
          "wall_seconds": child.seconds, "peak_rss_gib": child.peak_rss_gib,
          "prompt_width": prompt_width, "overrides": args.ours_override,
          "ignore_eos": common.has_config_key("rollout.ignore_eos"),
          "steps": steps, "summary": common.summarize(steps)}


def run_trl(args, work: pathlib.Path, data: pathlib.Path, model_dir: pathlib.Path) -> dict:
  out = work / "trl.json"
  cmd = [sys.executable, str(common.REPO / "bench" / "trl_step.py"), "--model-dir", model_dir,
         "--data", data, "--steps", args.steps, "--out", out]
  if args.trl_gradient_checkpointing:
    cmd.append("--gradient-checkpointing")
  if args.trl_bf16:
    cmd.append("--bf16")
  child = common.run_child(cmd, log=work / "trl.log",
                           env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
  raw = json.loads(out.read_text()) if out.exists() else {"steps": []}
  widths = [s["prompt_width"] for s in raw["steps"] if s["step"] > common.WARMUP_STEPS]
  return {**raw, "framework": "trl", "bf16": args.trl_bf16, "returncode": child.returncode,
          "wall_seconds": child.seconds, "peak_rss_gib": child.peak_rss_gib,
          "prompt_width": common.median(widths),
          "summary": common.summarize(raw["steps"])}


def report(results: list[dict], new_tokens: int) -> float | None:
  header = ("framework", "step", "rollout", "reference", "train", "wall", "peak RSS GiB",
            "completion tok", "prompt width", "timed steps", "rc")
  rows = []
  for r in results:
    s = r["summary"]
    rows.append((r["framework"], common.fmt(s["step_seconds"]), common.fmt(s["rollout"]),
                 common.fmt(s["reference"]), common.fmt(s["train"]), common.fmt(r["wall_seconds"], 0),
                 common.fmt(r["peak_rss_gib"]), common.fmt(s["completion_tokens"], 1),
                 common.fmt(r["prompt_width"], 0), s["timed_steps"], r["returncode"]))
  print()
  common.print_table(header, rows)
  for r in results:
    tokens = r["summary"]["completion_tokens"]
    if tokens is not None and abs(tokens - new_tokens) > 1e-6:
      print(f"note: {r['framework']} generated {tokens:.1f} tokens per completion on median,"
            f" not {new_tokens}: its rollout stopped at end-of-turn tokens"
            + ("" if r["framework"] == "trl" else
               " (no rollout.ignore_eos in this version)" if not r.get("ignore_eos") else ""))
    if r.get("prompt_token_mismatches"):
      print(f"note: {r['prompt_token_mismatches']} prompts tokenized differently by TRL")
  by_name = {r["framework"]: r["summary"]["step_seconds"] for r in results}
  ours, trl = by_name.get("gemma-grpo"), by_name.get("trl")
  return trl / ours if ours and trl else None


def main(argv=None) -> int:
  args = parse_args(argv)
  with tempfile.TemporaryDirectory(prefix="peer_step_") as tmp:
    work = args.workdir or pathlib.Path(tmp)
    work.mkdir(parents=True, exist_ok=True)
    records = common.gsm8k_records(common.PROMPTS_PER_STEP * (args.steps + common.WARMUP_STEPS))
    data = common.write_jsonl(records, work / "problems.jsonl")
    model_dir = (common.tiny_hf_dir(work / "tiny_hf") if args.smoke
                 else common.offline_270m_dir())
    lengths = common.prompt_lengths(records, model_dir)
    print(f"{len(records)} prompts, {min(lengths)}-{max(lengths)} tokens;"
          f" model {model_dir}", flush=True)
    results = []
    if args.only in (None, "ours"):
      results.append(run_ours(args, work, data, model_dir, max(lengths)))
    if args.only in (None, "trl"):
      results.append(run_trl(args, work, data, model_dir))
  speedup = report(results, common.NEW_TOKENS)
  if args.json:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "smoke": args.smoke, "steps": args.steps, "prompt_lengths": lengths,
        "results": results, "speedup_vs_trl": speedup}, indent=1))
  print(f"speedup_vs_trl={common.fmt(speedup)}")
  return 0 if all(r["returncode"] == 0 for r in results) else 1


if __name__ == "__main__":
  sys.exit(main())
