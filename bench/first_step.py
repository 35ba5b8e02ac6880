"""How long until the first step of README's command, with an empty and a warm compile cache?

  flock /tmp/gemma_grpo_heavy.lock python bench/first_step.py [--steps 4] [--start-eval]
About 6 min on a quiet 2-core CPU (8 with --start-eval).

Runs `python -m gemma_grpo.train --config configs/gemma3_270m.py` (the README
default with --config.train.max_steps=STEPS and, unless --start-eval, with
--config.eval.every_steps=0 so that the first step follows loading; with
--start-eval the command runs as README gives it, the eval of the starting
policy between loading and step 1, and step 1's seconds count from the end
of that eval) twice, one after the other, each in a
fresh work directory and process: first with an empty XLA compilation cache
(a fresh model.cache_dir whose converted 270M checkpoint is a link to the
usual one, so only compilation is cold), then again with the cache the
first run filled. For each it reads the console's phase line
"step 1: the first step, compilation included (X s; T s since start)" and
the later steps' perf/train/step_seconds, and prints: seconds from the
command to the end of step 1 (T), step 1's own seconds (X), the median of
steps 2..STEPS, and X / median.

Then where step 1's extra seconds go: the trainer runs under a listener of
JAX's own compile events (jax.monitoring time spans), and for step 1 (from
the "Training steps" line to the "step 1:" line) the script prints the wall
seconds spent tracing Python to jaxprs, lowering them to StableHLO, and in
XLA compilation or loading it from the persistent cache (each the union of
its spans, so nested traces count once), what remains, and the same three
for all later steps. The spans of every thread count, so compilation running
beside other work (the train step, compiled ahead beside the first rollout)
shows in these columns too, and "the rest" is the part of step 1 during
which nothing compiled. Last, each phase of step 1 (rollout, reference pass,
update: the run's perf/train/*_seconds) against its median in later steps.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
  sys.path.insert(0, str(REPO))

PHASES = ("rollout", "reference", "update")  # perf/train/<phase>_seconds of each step
FIRST_STEP = re.compile(r"step 1: the first step, compilation included \(([\d.]+) s; (\d+) s since start\)")


# `python -m gemma_grpo.train ARGS` with JAX's compile events recorded: every
# trace, lowering and compile (or cache load) span, and the log times of the
# lines that open and close step 1, written as JSON to $COMPILE_SPANS at exit.
TRAIN_WITH_SPANS = """
import atexit, json, logging, os, sys
from gemma_grpo.commands import train  # first: importing jax before it left stderr without the INFO lines (seen, not traced)
from jax import monitoring
spans, marks = [], {}
monitoring.register_event_time_span_listener(
    lambda event, start, end, **kw: spans.append((event.rsplit("/", 1)[1], start, end)))
def mark(record):  # a filter that keeps every record: handlers stay as they were
  text = record.getMessage()
  for key, prefix in (("start", "Training steps"), ("end", "step 1: the first step")):
    if text.startswith(prefix):
      marks[key] = record.created
  return True
logging.getLogger("absl").addFilter(mark)
atexit.register(lambda: json.dump({"spans": spans, "marks": marks},
                                  open(os.environ["COMPILE_SPANS"], "w")))
sys.exit(train.main(sys.argv[1:]))
"""
KINDS = {"jaxpr_trace_duration": "trace", "jaxpr_to_mlir_module_duration": "lower",
         "backend_compile_duration": "compile or load"}


def union_seconds(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
  """Seconds of [lo, hi] covered by at least one interval."""
  covered, reach = 0.0, lo
  clipped = sorted((max(s, lo), min(e, hi)) for s, e in intervals)
  for start, end in ((s, e) for s, e in clipped if e > s):
    if end > reach:
      covered += end - max(start, reach)
      reach = end
  return covered


def compile_breakdown(recorded: dict) -> dict:
  """Seconds of trace / lower / compile-or-load in step 1, and in the steps after it."""
  start, end = recorded["marks"]["start"], recorded["marks"]["end"]
  out = {}
  for window, (lo, hi) in (("step 1", (start, end)), ("later", (end, float("inf")))):
    every = []
    for event, kind in KINDS.items():
      intervals = [(s, e) for name, s, e in recorded["spans"] if name == event]
      every += intervals
      out[f"{window} {kind}"] = union_seconds(intervals, lo, hi)
    out[f"{window} any"] = union_seconds(every, lo, hi)
  return out


def run(cache_dir: pathlib.Path, workdir: pathlib.Path, steps: int, start_eval: bool) -> dict:
  from gemma_grpo.runtime import metrics  # pylint: disable=g-import-not-at-top

  spans_file = workdir.parent / f"{workdir.name}_spans.json"
  proc = subprocess.run(
      [sys.executable, "-c", TRAIN_WITH_SPANS, "--config", "configs/gemma3_270m.py",
       "--workdir", str(workdir), f"--config.model.cache_dir={cache_dir}",
       f"--config.train.max_steps={steps}", f"--config.ckpt.every_steps={steps}",
       *([] if start_eval else ["--config.eval.every_steps=0"])],
      cwd=REPO, capture_output=True, text=True, check=False,
      env={**os.environ, "COMPILE_SPANS": str(spans_file)})
  found = FIRST_STEP.search(proc.stderr)
  if proc.returncode or not found:
    raise SystemExit(f"the run exited {proc.returncode}:\n{proc.stderr[-3000:]}")
  records = list(metrics.read_jsonl(workdir / "tensorboard" / "metrics.jsonl"))
  later = [r["perf/train/step_seconds"] for r in records
           if r["step"] > 1 and "perf/train/step_seconds" in r]
  median = statistics.median(later)
  phases = {}
  for phase in PHASES:
    key = f"perf/train/{phase}_seconds"
    phases[f"step 1 {phase}"] = next(r[key] for r in records if r["step"] == 1 and key in r)
    phases[f"later {phase}"] = statistics.median(r[key] for r in records if r["step"] > 1 and key in r)
  return {"to_first_step_s": int(found.group(2)), "first_step_s": float(found.group(1)),
          "median_step_s": median, "ratio": float(found.group(1)) / median, **phases,
          **compile_breakdown(json.loads(spans_file.read_text()))}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=4)
  parser.add_argument("--start-eval", action="store_true",
                      help="keep the README default's eval of the starting policy before step 1")
  args = parser.parse_args()
  converted = pathlib.Path(os.path.expanduser("~/.cache/gemma_grpo/gemma-3-270m"))
  if not converted.is_dir():
    raise SystemExit(f"{converted} missing: run the README command once first")
  with tempfile.TemporaryDirectory(prefix="first_step_") as tmp:
    cache = pathlib.Path(tmp) / "cache"
    cache.mkdir()
    (cache / converted.name).symlink_to(converted)
    rows = [(label, run(cache, pathlib.Path(tmp) / label, args.steps, args.start_eval)) for label in ("cold", "warm")]
  print("cache | command -> end of step 1 | step 1 | median of steps 2.. | step 1 / median")
  for label, r in rows:
    print(f"{label} | {r['to_first_step_s']} s | {r['first_step_s']:.1f} s | {r['median_step_s']:.1f} s"
          f" | {r['ratio']:.2f}")
  print()
  print("cache | step 1: trace | lower | compile or load | any of the three | the rest"
        " | later steps: trace | lower | compile or load")
  for label, r in rows:
    rest = r["first_step_s"] - r["step 1 any"]
    print(f"{label} | {r['step 1 trace']:.1f} s | {r['step 1 lower']:.1f} s"
          f" | {r['step 1 compile or load']:.1f} s | {r['step 1 any']:.1f} s | {rest:.1f} s"
          f" | {r['later trace']:.1f} s | {r['later lower']:.1f} s | {r['later compile or load']:.1f} s")
  print()
  print("cache | " + " | ".join(f"{phase}: step 1 / median of later" for phase in PHASES))
  for label, r in rows:
    print(f"{label} | " + " | ".join(
        f"{r[f'step 1 {phase}']:.1f} / {r[f'later {phase}']:.1f} s" for phase in PHASES))
  return 0


if __name__ == "__main__":
  sys.exit(main())
