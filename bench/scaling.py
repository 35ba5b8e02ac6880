"""How gemma-grpo's step time and peak memory grow with G and completion length.

  flock /tmp/gemma_grpo_heavy.lock python bench/scaling.py [--quick] [--png bench/results/scaling.png]
The full grid, generations per prompt G in (2, 4, 8) x new tokens T in (64,
128, 256), is 9 fresh training runs of 1 warm-up + 2 timed steps each: 1-2 h
on a 2-core CPU. The G=8 runs need more memory than a 24 GiB machine shared
with other jobs had (G=8, T=64 was killed at 17.8 GiB RSS); a run that fails
is a table row with its exit code and is left out of the plot. --quick runs
the two axes through (2, 64) only: G in (2, 4, 8) at T=64 and T in (128,
256) at G=2, about 25 min. --smoke runs a random 2-layer Gemma-3 through the
same grid in a few minutes (timings meaningless).

Everything else is the fixed workload of bench/common.py (Gemma-3-270M
float32, LoRA r=32, 4 GSM8K test prompts per step, temperature 0.9, top_k 50,
beta 0.08): each configuration is `python -m gemma_grpo.train` in a fresh
process; step seconds are perf/train/step_seconds (median of the timed
steps), peak RSS is the child's (wait4). Prints a table and writes a PNG (two panels: step
seconds and peak RSS against completion tokens per step, G and T sweeps
as separate lines). Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import common  # pylint: disable=g-import-not-at-top,wrong-import-position

GENERATIONS = (2, 4, 8)
NEW_TOKENS = (64, 128, 256)


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(
      description=__doc__.splitlines()[0],
      epilog="Run real (non --smoke) benchmarks under flock " + common.HEAVY_LOCK)
  p.add_argument("--quick", action="store_true",
                 help="only the two axes through G=2, T=64 (5 runs instead of 9)")
  p.add_argument("--generations", type=int, nargs="+", default=list(GENERATIONS))
  p.add_argument("--new-tokens", type=int, nargs="+", default=list(NEW_TOKENS))
  p.add_argument("--steps", type=int, default=2, help="timed steps after 1 warm-up step")
  p.add_argument("--smoke", action="store_true", help="random 2-layer Gemma-3: checks the plumbing")
  p.add_argument("--png", type=pathlib.Path,
                 default=common.REPO / "bench" / "results" / "scaling.png")
  p.add_argument("--json", type=pathlib.Path, help="write the raw per-step numbers here")
  p.add_argument("--workdir", type=pathlib.Path, help="keep run directories and logs here")
  return p.parse_args(argv)


def grid(args) -> list[tuple[int, int]]:
  if not args.quick:
    return [(g, t) for t in args.new_tokens for g in args.generations]
  g0, t0 = min(args.generations), min(args.new_tokens)
  return [(g, t0) for g in args.generations] + [(g0, t) for t in args.new_tokens if t != t0]


def plot(results: list[dict], path: pathlib.Path, model: str) -> None:
  """Step seconds and peak RSS against completion tokens per step (4 G T).

  Solid lines vary G at a fixed T, dashed lines vary T at a fixed G, so the
  two ways of buying more tokens per step can be compared directly.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  ok = [r for r in results if r["returncode"] == 0]
  tokens = lambda r: common.PROMPTS_PER_STEP * r["generations"] * r["new_tokens"]
  series = []
  for t in sorted({r["new_tokens"] for r in ok}):
    series.append((f"T={t}, G varies", "o-", [r for r in ok if r["new_tokens"] == t]))
  for g in sorted({r["generations"] for r in ok}):
    series.append((f"G={g}, T varies", "s--", [r for r in ok if r["generations"] == g]))
  fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(11, 4.2))
  for label, style, runs in series:
    if len(runs) < 2:
      continue
    runs = sorted(runs, key=tokens)
    timed = [r for r in runs if r["step_seconds"]]
    if timed:
      ax_time.plot([tokens(r) for r in timed], [r["step_seconds"] for r in timed], style, label=label)
    ax_mem.plot([tokens(r) for r in runs], [r["peak_rss_gib"] for r in runs], style, label=label)
  for ax, ylabel in ((ax_time, "median step seconds"), (ax_mem, "peak RSS (GiB)")):
    ax.set_xlabel("completion tokens per step (4 prompts x G x T)")
    ax.set_ylabel(ylabel)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({tokens(r) for r in ok}) or [1])
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.grid(alpha=0.3)
    if ax.get_lines():
      ax.legend(fontsize=8)
  fig.suptitle(f"gemma-grpo GRPO step on {model} (CPU, float32, LoRA r=32)")
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv=None) -> int:
  args = parse_args(argv)
  configs = grid(args)
  results = []
  with tempfile.TemporaryDirectory(prefix="scaling_") as tmp:
    work = args.workdir or pathlib.Path(tmp)
    work.mkdir(parents=True, exist_ok=True)
    records = common.gsm8k_records(common.PROMPTS_PER_STEP * (args.steps + common.WARMUP_STEPS))
    data = common.write_jsonl(records, work / "problems.jsonl")
    model_dir = common.tiny_hf_dir(work / "tiny_hf") if args.smoke else common.offline_270m_dir()
    width = max(common.prompt_lengths(records, model_dir))
    for g, t in configs:
      name = f"g{g}_t{t}"
      print(f"\n=== G={g} T={t} ===", flush=True)
      cmd = common.ours_command(
          workdir=work / name, data=data, model_source=str(model_dir),
          steps=args.steps + common.WARMUP_STEPS, prompt_length=width,
          generations=g, new_tokens=t)
      child = common.run_child(cmd, log=work / f"{name}.log")
      steps = common.ours_steps(work / name)
      results.append({"generations": g, "new_tokens": t, "returncode": child.returncode,
                      "wall_seconds": child.seconds, "peak_rss_gib": child.peak_rss_gib,
                      **common.summarize(steps), "steps": steps})
  print(f"\nprompt width {width} tokens, 4 prompts per step, median of {args.steps} timed steps")
  base = next((r for r in results if r["step_seconds"]), None)
  common.print_table(
      ("G", "T", "completion tok/step", "step s", "rollout s", "reference s", "train s",
       "x first", "peak RSS GiB", "wall s", "rc"),
      [(r["generations"], r["new_tokens"], common.PROMPTS_PER_STEP * r["generations"] * r["new_tokens"],
        common.fmt(r["step_seconds"]), common.fmt(r["rollout"]), common.fmt(r["reference"]),
        common.fmt(r["train"]),
        common.fmt(r["step_seconds"] / base["step_seconds"] if base and r["step_seconds"] else None),
        common.fmt(r["peak_rss_gib"]), common.fmt(r["wall_seconds"], 0), r["returncode"])
       for r in results])
  for r in results:
    if r["returncode"]:
      print(f"G={r['generations']} T={r['new_tokens']}: exit code {r['returncode']}"
            + (" (killed: out of memory?)" if r["returncode"] in (-9, 137) else "")
            + "; left out of the plot")
  plot(results, args.png, "a random 2-layer Gemma-3 (smoke)" if args.smoke else "Gemma-3-270M")
  print(f"wrote {args.png}")
  if args.json:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"smoke": args.smoke, "prompt_width": width,
                                     "results": results}, indent=1))
  return 0 if all(r["returncode"] == 0 for r in results) else 1


if __name__ == "__main__":
  sys.exit(main())
