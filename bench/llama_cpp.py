"""llama.cpp on a run's GGUF exports: sizes, tokens per second, and agreement with float32.

  npm ci --prefix tests/llama_cpp
  flock /tmp/gemma_grpo_heavy.lock python bench/llama_cpp.py --workdir runs/gemma3_270m --out docs/results/llama_cpp
About 10 min on a quiet 2-core CPU for the 270M.

Restores the run's latest checkpoint once and writes it as four GGUF files
with the library call behind `gemma-grpo export --format gguf` (float32;
--dtype bfloat16; --quant q8_0; --quant q4_0) into OUT/exports, removed at the
end unless --keep. Decodes the run's first N held-out prompts greedily with
the engine `gemma-grpo eval` uses (stop at rollout.stop_text or
eval.max_new_tokens). Then one llama.cpp process (tests/llama_cpp/llama_cpp.mjs:
node-llama-cpp 3.21.1's prebuilt CPU build, THREADS threads) loads each file
once and completes the same prompts greedily.

Writes OUT/summary.txt: the command, the CPU's model name, the load average
before and after, then per file its size, load time, prompt tokens/s (prompt
tokens over the wall time to the first new token), decode tokens/s (new tokens
after the first over their wall time; the median over prompts), how many
completions equal ours token for token, how many answers equal the float32
file's, and accuracy. OUT/completions.jsonl holds every completion. Asserts
nothing: the suite's tests/test_llama_cpp.py does, on fewer prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shlex
import shutil
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
for path in (REPO, REPO / "tests"):
  if str(path) not in sys.path:
    sys.path.insert(0, str(path))

import llama_cpp_runtime  # pylint: disable=g-import-not-at-top,wrong-import-position

# (label, export options) in the order llama.cpp loads them; F32 first, the reference.
FILES = (("F32", dict(dtype="float32")), ("BF16", dict(dtype="bfloat16")),
         ("Q8_0", dict(quant="q8_0")), ("Q4_0", dict(quant="q4_0")))


def cpu_name() -> str:
  for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
    if line.startswith("model name"):
      return line.split(":", 1)[1].strip()
  return "unknown"


def load_average() -> str:
  return " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3])


def is_correct(answer: str | None, gold: str) -> bool:
  from gemma_grpo.tasks import answers  # pylint: disable=g-import-not-at-top

  value = answers.parse_number(answer) if answer is not None else None
  return value is not None and answers.numbers_equal(value, float(gold))


def ours(workdir: pathlib.Path, exports: pathlib.Path, num_prompts: int) -> dict:
  """Writes the four GGUFs and decodes the held-out prompts with our engine."""
  from gemma_grpo import api  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import hf_export  # pylint: disable=g-import-not-at-top
  from gemma_grpo.rl.eval import generation as eval_generation  # pylint: disable=g-import-not-at-top
  from gemma_grpo.runtime import mesh as mesh_lib  # pylint: disable=g-import-not-at-top

  run = api.Run(workdir)
  policy = run.policy()
  c = policy.settings
  problems = api.heldout(policy, num_prompts)
  generator = eval_generation.Generator.from_settings(
      policy.actor, policy.loaded.tokenizer, mesh_lib.make_mesh(c.mesh), c.rollout, c.lora,
      max_new_tokens=c.eval.max_new_tokens)
  start = time.perf_counter()
  out = generator.generate([p.prompt for p in problems],
                           eval_generation.Decoding(max_new_tokens=c.eval.max_new_tokens),
                           batch_size=c.eval.batch_size)
  print(f"our greedy decoding: {len(problems)} prompts in {time.perf_counter() - start:.1f} s", flush=True)
  files = {}
  for label, options in FILES:
    start = time.perf_counter()
    files[label] = hf_export.export_policy(policy, run.workdir, exports / f"{label.lower()}.gguf",
                                           fmt="gguf", overwrite=True, **options)
    print(f"exported {label}: {time.perf_counter() - start:.1f} s", flush=True)
  return {"step": policy.step, "prompts": [p.prompt for p in problems],
          "gold": [p.answer for p in problems], "ids": out.token_ids, "texts": out.texts,
          "max_new_tokens": c.eval.max_new_tokens, "stop_text": c.rollout.stop_text,
          "files": {label: str(path) for label, path in files.items()}}


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", type=pathlib.Path, default=REPO / "runs" / "gemma3_270m")
  parser.add_argument("--out", type=pathlib.Path, default=REPO / "bench" / "results" / "llama_cpp")
  parser.add_argument("--num-prompts", type=int, default=32)
  parser.add_argument("--threads", type=int, default=2)
  parser.add_argument("--keep", action="store_true", help="keep OUT/exports")
  args = parser.parse_args(argv)
  from gemma_grpo.tasks import answers  # pylint: disable=g-import-not-at-top

  llama_cpp_runtime.package_version()  # fail before the restore, not after
  args.out.mkdir(parents=True, exist_ok=True)
  exports = args.out / "exports"
  command = shlex.join(["python", "bench/llama_cpp.py", *(argv if argv is not None else sys.argv[1:])])
  ref = ours(args.workdir, exports, args.num_prompts)
  before = load_average()
  response = llama_cpp_runtime.run({
      "models": list(ref["files"].values()), "prompts": ref["prompts"],
      "maxTokens": ref["max_new_tokens"], "stopText": ref["stop_text"], "threads": args.threads,
  }, timeout=3600)
  after = load_average()

  n = len(ref["prompts"])
  f32_answers = [answers.extract_answer(c["text"]) for c in response["models"][0]["completions"]]
  lines = [
      f"# {command}",
      f"# {time.strftime('%Y-%m-%d %H:%M')}, run {args.workdir.name} step {ref['step']},"
      f" node-llama-cpp {llama_cpp_runtime.package_version()}, {args.threads} threads",
      f"# CPU: {cpu_name()} ({os.cpu_count()} cores); load average before {before}, after {after}",
      f"# {n} held-out prompts, greedy, stop at {ref['stop_text']!r} or {ref['max_new_tokens']} tokens",
      "file  size_MB  load_s  prompt_tok_per_s  decode_tok_per_s  same_tokens_as_ours  same_answer_as_F32  correct",
  ]
  records = []
  for (label, _), model in zip(FILES, response["models"]):
    completions = model["completions"]
    prompt_rates = [len(c["promptTokens"]) / c["promptSeconds"] for c in completions]
    decode_rates = [c["decodeSteps"] / c["decodeSeconds"] for c in completions if c["decodeSteps"]]
    theirs = [answers.extract_answer(c["text"]) for c in completions]
    same_tokens = sum(c["ids"] == ids for c, ids in zip(completions, ref["ids"]))
    same_answer = sum(a == b for a, b in zip(theirs, f32_answers))
    correct = sum(is_correct(a, gold) for a, gold in zip(theirs, ref["gold"]))
    size = pathlib.Path(model["path"]).stat().st_size
    lines.append(f"{label:4s}  {size / 1e6:7.1f}  {model['loadSeconds']:6.2f}"
                 f"  {statistics.median(prompt_rates):16.1f}  {statistics.median(decode_rates):16.1f}"
                 f"  {same_tokens:>16d}/{n}  {same_answer:>15d}/{n}  {correct:>5d}/{n}")
    records += [{"file": label, "prompt": i, "ids": c["ids"], "text": c["text"], "stop": c["stop"],
                 "prompt_seconds": c["promptSeconds"], "decode_seconds": c["decodeSeconds"],
                 "decode_steps": c["decodeSteps"]} for i, c in enumerate(completions)]
  summary = "\n".join(lines) + "\n"
  print(summary, end="")
  (args.out / "summary.txt").write_text(summary)
  (args.out / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  if not args.keep:
    shutil.rmtree(exports)
  return 0


if __name__ == "__main__":
  sys.exit(main())
