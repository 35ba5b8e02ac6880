"""Does README's first command teach, for every seed? Runs it and keeps the evidence.

  python bench/first_command.py --seeds 0 1 2 --out docs/results/first_command

Runs `python -m gemma_grpo.train --config configs/gemma3_270m.py` once per
seed (rollout.seed = lora.seed = S; seed 0 is the command exactly as README
gives it), one after another on this machine, and for each keeps in
OUT/seed_S: the held-out evals the run wrote (eval/step_*/eval.json and
samples.jsonl), tensorboard/metrics.jsonl, the reward and accuracy plots and console.txt (the
run's console with the seconds since start on every line). It prints one
row per seed: wall time, held-out accuracy and format before the first and
after the last update, and how many of the held-out problems were already
met in training as the same equation under another letter or wording
(simple_equations has ~300 distinct equations), with the accuracy on the
others. Nothing here asserts a figure. About 16 min per seed on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import shutil
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
  sys.path.insert(0, str(REPO))

CONFIG = "configs/gemma3_270m.py"


def equation(question: str) -> str:
  """"Solve for h: h + 6 = 7" and "Find the value of x ...: x + 6 = 7" -> "x + 6 = 7"."""
  return re.sub(r"\b[a-z]\b", "x", question.rsplit(":", 1)[-1].strip())


def trained_equations(max_steps: int, c=None) -> set[str]:
  """The equations of every problem the run of config `c` (default: the command's) draws for training."""
  from configs import gemma3_270m  # pylint: disable=g-import-not-at-top
  from gemma_grpo.config import settings  # pylint: disable=g-import-not-at-top
  from gemma_grpo.tasks import data  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import model_loading  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top

  c = settings.from_config(c or gemma3_270m.get_config())
  tok = tokenizer_lib.load(model_loading.offline_270m_dir(c.model))
  splits = data.build_splits(c.data, tok, c.rollout.max_prompt_length)
  batches = iter(data.train_batches(splits.train, c.train.batch_size, c.data.shuffle_seed))
  seen = set()
  for _ in range(max_steps):
    batch = next(batches)
    for prompt in batch["prompts"]:
      last_user_turn = prompt.rsplit("<start_of_turn>user\n", 1)[1].split("<end_of_turn>")[0]
      seen.add(equation(last_user_turn))
  return seen


def run_seed(seed: int, out: pathlib.Path, config: str = CONFIG, overrides=()) -> float:
  """Trains `config` with rollout and LoRA seed `seed` (and `--config.K=V` overrides); keeps its evidence in out/seed_S."""
  workdir = out / f"seed_{seed}"
  if workdir.exists():
    shutil.rmtree(workdir)
  run_dir = pathlib.Path("/tmp") / f"gemma_grpo_{pathlib.Path(config).stem}_seed_{seed}"
  if run_dir.exists():
    shutil.rmtree(run_dir)
  start = time.perf_counter()
  proc = subprocess.Popen(
      [sys.executable, "-m", "gemma_grpo.train", "--config", config, "--workdir", str(run_dir),
       f"--config.rollout.seed={seed}", f"--config.lora.seed={seed}",
       *[f"--config.{o}" for o in overrides]],
      cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  lines = []
  for line in proc.stdout:
    lines.append(f"{time.perf_counter() - start:6.0f}s {line}")
    if line.startswith(("step ", "held-out", "error")):
      print(f"  seed {seed}: {line.rstrip()}", flush=True)
  if proc.wait():
    raise SystemExit(f"seed {seed}: the run exited {proc.returncode}; see {run_dir}")
  seconds = time.perf_counter() - start
  workdir.mkdir(parents=True)
  shutil.copytree(run_dir / "eval", workdir / "eval")
  (workdir / "plots").mkdir()
  for name in ("rewards.png", "accuracy.png"):  # the two a reader looks at; ~70 kB each
    shutil.copy(run_dir / "plots" / name, workdir / "plots" / name)
  (workdir / "metrics.jsonl").write_bytes((run_dir / "tensorboard" / "metrics.jsonl").read_bytes())
  (workdir / "console.txt").write_text(
      "".join(line for line in lines if not line.split(" ", 1)[1].startswith(("WARNING", "I1", "W1"))))
  (workdir / "wall_time.json").write_text(json.dumps({"seconds": round(seconds, 1)}) + "\n")
  shutil.rmtree(run_dir)
  return seconds


def summarize(out: pathlib.Path, seeds: list[int], seen: set[str]) -> None:
  print("seed | wall time | accuracy start -> end | format start -> end | held-out met in"
        " training | accuracy on the others, start -> end | training reward, first 5 -> last 5 steps")
  for seed in seeds:
    workdir = out / f"seed_{seed}"
    evals = sorted((workdir / "eval").glob("step_*"))
    first, last = (
        [json.loads(line) for line in (d / "samples.jsonl").read_text().splitlines()]
        for d in (evals[0], evals[-1]))
    metrics = [json.loads((d / "eval.json").read_text())["metrics"] for d in (evals[0], evals[-1])]
    fresh = [i for i, s in enumerate(first) if equation(s["question"]) not in seen]
    wall = json.loads((workdir / "wall_time.json").read_text())["seconds"]
    rewards = [json.loads(line)["rewards/train/sum"]
               for line in (workdir / "metrics.jsonl").read_text().splitlines() if "rewards/train/sum" in line]
    print(f"{seed} | {wall / 60:.1f} min | {metrics[0]['accuracy']:.1%} -> {metrics[1]['accuracy']:.1%}"
          f" | {metrics[0]['format_accuracy']:.1%} -> {metrics[1]['format_accuracy']:.1%}"
          f" | {len(first) - len(fresh)} of {len(first)}"
          f" | {sum(first[i]['correct'] for i in fresh)}/{len(fresh)} ->"
          f" {sum(last[i]['correct'] for i in fresh)}/{len(fresh)}"
          f" | {sum(rewards[:5]) / 5:.2f} -> {sum(rewards[-5:]) / 5:.2f}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--out", type=pathlib.Path, default=REPO / "docs/results/first_command")
  parser.add_argument("--summarize-only", action="store_true",
                      help="print the table of runs already in --out")
  parser.add_argument("--config-override", action="append", default=[], metavar="KEY=VALUE",
                      help="passed to the command as --config.KEY=VALUE (repeatable); use"
                           " another --out, so README's evidence is not overwritten")
  args = parser.parse_args()
  if not args.summarize_only:
    for seed in args.seeds:
      minutes = run_seed(seed, args.out, overrides=args.config_override) / 60
      print(f"seed {seed}: {minutes:.1f} min", flush=True)
  from configs import gemma3_270m  # pylint: disable=g-import-not-at-top

  summarize(args.out, args.seeds, trained_equations(gemma3_270m.get_config().train.max_steps))


if __name__ == "__main__":
  main()
