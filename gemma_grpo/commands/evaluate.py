"""How well a policy reasons on held-out problems: `gemma-grpo eval`.

  gemma-grpo eval --num-test 16     # the newest run under runs/ against its base
  gemma-grpo eval --config configs/gemma3_270m.py --num-test 16   # offline 270M
  gemma-grpo eval --workdir runs/gemma3_270m [--step 10] --data ...
  gemma-grpo eval --model hf:google/gemma-3-1b-it --num-samples 8 --temperature 0.8
  gemma-grpo eval --workdir runs/x --data ... --compare runs/eval/gguf_gemma-3-270m

The command: what to evaluate (a run's checkpoint or a model source), on
which problems, decoded how; the metrics themselves are gemma_grpo.tasks.scoring's
(listed there), the same as the in-training eval's.

Outputs in --out: eval.json (metrics, resolved settings, the config used,
"contaminated", timing) and samples.jsonl (one line per completion: prompt,
completion, extracted answer, gold, verdicts, rewards). Greedy decoding is
deterministic; sampling is reproducible for a fixed seed and batch size.
reasoning_gym:<task> problems are drawn from seeds past the training range
(data.reasoning_gym_seed + data.reasoning_gym_size), so none is a training
problem. A run trained on reasoning_gym:gsm_symbolic (templates taken from
GSM8K test) and scored on GSM8K test is flagged as contaminated.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import re
import sys
import time
from typing import Any, Callable

from huggingface_hub.utils import logging as hub_logging

import configs
from gemma_grpo.runtime import checkpoints
from gemma_grpo import config as config_lib
from gemma_grpo.tasks import data as data_lib
from gemma_grpo.runtime import distributed
from gemma_grpo import errors
from gemma_grpo.rl import eval_generation
from gemma_grpo.runtime import mesh as mesh_lib
from gemma_grpo.runtime import metrics as metrics_lib
from gemma_grpo.rl import multi_turn
from gemma_grpo.tasks import rewards
from gemma_grpo.tasks import scoring
from gemma_grpo import storage
from gemma_grpo.model import tokenizer as tokenizer_lib

DEFAULT_CONFIG = "configs/gemma3_270m.py"


# --- What to evaluate, on what ---------------------------------------------


@dataclasses.dataclass
class Target:
  """A model to evaluate: a training run's checkpoint, or a model source."""

  source: str  # model.source (a run's own for a work directory)
  workdir: pathlib.Path | None = None
  step: int | None = None  # the checkpoint, resolved, for a work directory
  trained_on: tuple[str, str] | None = None  # the run's (data.source, data.split)

  @property
  def label(self) -> str:
    if self.workdir is not None:
      return f"{self.workdir} step {self.step}"
    return self.source

  def default_out(self) -> pathlib.Path:
    if self.workdir is not None:
      return self.workdir / f"eval_step{self.step}"
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", self.source).strip("_.") or "model"
    return pathlib.Path("runs") / "eval" / name


@dataclasses.dataclass
class Plan:
  """What every model of one command is evaluated on, and how."""

  problems: list[data_lib.Problem]  # the first --num-test of the data
  data: dict[str, Any]  # how they were chosen, for eval.json
  max_prompt_length: int  # tokens with <bos>; longer prompts are dropped
  decoding: Any  # eval_generation.Decoding
  num_samples: int
  batch_size: int
  reward_config: Any  # the config's `rewards` section

  def reward_fns(self) -> list[Callable]:
    return rewards.from_config(self.reward_config)


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog="gemma-grpo eval", description=__doc__.splitlines()[0],
      formatter_class=argparse.RawDescriptionHelpFormatter,
      epilog="Override any config key with --config.section.key=value.\n\n"
      + __doc__.split("\n\n", 3)[3],
  )
  which = p.add_argument_group("what to evaluate (default: the model of --config)")
  which.add_argument("--config", help=f"config file (default {DEFAULT_CONFIG}); not with --workdir")
  which.add_argument("--workdir", help="a training run: its latest (or --step) checkpoint")
  which.add_argument("--step", type=int, help="checkpoint step of --workdir")
  which.add_argument("--model", help="model source: gguf:gemma-3-270m | hf:<repo> | HF dir | random")
  on = p.add_argument_group("data")
  on.add_argument("--data", help="gsm8k (hub) | GSM8K-format .jsonl/.parquet | reasoning_gym:<task>"
                  " (default: the config's data.source when it is gsm8k, whose test split is"
                  " then used, or reasoning_gym:<task>, whose problems then come from past"
                  " the training range)")
  on.add_argument("--split", help="split of --data gsm8k (default test)")
  on.add_argument("--num-test", type=int, help="the first N problems (default all)")
  how = p.add_argument_group("decoding (default greedy; defaults from the config)")
  how.add_argument("--num-samples", type=int, default=1, help="k completions per problem: pass@k, maj@k")
  how.add_argument("--temperature", type=float, help="> 0 samples (default rollout.temperature when k > 1)")
  how.add_argument("--top-k", type=int, help="sampling: keep the K likeliest tokens, 0 = all (default rollout.top_k)")
  how.add_argument("--top-p", type=float, help="sampling: nucleus mass (default rollout.top_p)")
  how.add_argument("--seed", type=int, help="sampling seed (default 0)")
  how.add_argument("--batch-size", type=int, help="sequences (problems x samples) per generation batch (default eval.batch_size)")
  how.add_argument("--max-new-tokens", type=int, help="tokens per completion (default eval.max_new_tokens)")
  out = p.add_argument_group("output")
  out.add_argument("--out", help="output directory (default <workdir>/eval_step<N> or runs/eval/<source>)")
  out.add_argument("--compare", help="a baseline: an eval output directory, or a model source / work directory to evaluate first")

  distributed.add_flags(p)
  return p


def _check_positive(flag: str, value: int | None) -> None:
  if value is not None and value < 1:
    raise errors.UserError(f"{flag} {value}: must be >= 1")


def _workdir_target(path: str, step: int | None, flag: str = "--workdir"):
  """(Target, the run's config) of a work directory, its step checked."""
  workdir = storage.path(path)
  if not workdir.is_dir():
    raise errors.UserError(f"{flag} {path}: no such directory; pass a gemma-grpo training run")
  c = config_lib.load_saved(workdir / "config.json")
  steps = checkpoints.saved_steps(workdir)
  if not steps:
    raise errors.UserError(f"{flag} {path}: no checkpoint in {checkpoints.actor_dir(workdir)}; train first")
  if step is None:
    step = steps[-1]
  elif step not in steps:
    raise errors.UserError(f"--step {step}: no checkpoint at that step in {path}; saved steps: {steps}")
  return Target(c.model.source, workdir, step, (c.data.source, c.data.split)), c


def _default_config_path() -> str:
  if pathlib.Path(DEFAULT_CONFIG).is_file():
    return DEFAULT_CONFIG

  return str(pathlib.Path(configs.__file__).parent / pathlib.Path(DEFAULT_CONFIG).name)


def latest_run(runs: pathlib.Path) -> pathlib.Path | None:
  """The training run under `runs` whose newest checkpoint is the most recent."""
  found = []
  for actor_dir in runs.glob("*/checkpoints/actor"):
    steps = [d for d in actor_dir.iterdir() if d.is_dir() and d.name.isdigit()]
    if steps and (actor_dir.parent.parent / "config.json").is_file():
      found.append((max(d.stat().st_mtime for d in steps), actor_dir.parent.parent))
  return max(found)[1] if found else None


def _target_and_config(args, overrides: list[str]):
  """The Target of the command line and the config it is evaluated with."""
  if args.workdir and (args.model or args.config):
    raise errors.UserError(
        "--workdir brings its own model and config (config.json); drop --model/--config")
  if args.step is not None and not args.workdir:
    raise errors.UserError(f"--step {args.step}: only with --workdir")
  if not (args.workdir or args.model or args.config):
    latest = latest_run(pathlib.Path("runs"))
    if latest is not None:
      # The question after the first command: did it learn? Run vs its base.
      args.workdir = str(latest)
      print(f"evaluating the most recent run, {latest} (pass --workdir, --model or"
            " --config to choose another), against its base model", flush=True)
  if args.workdir:
    target, c = _workdir_target(args.workdir, args.step)
    fixed = [o for o in overrides if o.startswith(("--config.model.", "--config.lora."))]
    if fixed:
      raise errors.UserError(
          f"{fixed[0].split('=')[0]}: the model of a work directory comes from its"
          " config.json; only eval, rollout, rewards and mesh keys can be overridden")
  else:
    c = config_lib.load(args.config or _default_config_path())
  rest = config_lib.apply_overrides(c, overrides)
  if rest:
    raise errors.UserError(f"unrecognized arguments: {' '.join(rest)}")
  if not args.workdir:
    if args.model:
      with c.unlocked():
        c.model.source = args.model
    target = Target(c.model.source)
  return target, c


def _decoding(args, c):
  """eval_generation.Decoding and k from the flags, defaults from the config."""
  k = args.num_samples
  _check_positive("--num-samples", k)
  _check_positive("--max-new-tokens", args.max_new_tokens)
  _check_positive("--batch-size", args.batch_size)
  temperature = args.temperature
  if temperature is None:
    temperature = c.rollout.temperature if k > 1 else 0.0
  if temperature < 0 or (k > 1 and temperature == 0):
    raise errors.UserError(
        f"--temperature {temperature}: must be > 0 to draw --num-samples {k}"
        " different samples (0 = greedy, one completion per problem)")
  if temperature == 0:
    given = [f for f, v in (("--top-k", args.top_k), ("--top-p", args.top_p), ("--seed", args.seed)) if v is not None]
    if given:
      raise errors.UserError(f"{given[0]}: only for sampling; add --temperature T (> 0)")
  max_new_tokens = args.max_new_tokens or c.eval.max_new_tokens
  with c.unlocked():  # so the config saved in eval.json is the one used
    c.eval.max_new_tokens = max_new_tokens
    c.eval.batch_size = args.batch_size or c.eval.batch_size
  try:
    decoding = eval_generation.Decoding(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=c.rollout.top_p if args.top_p is None else args.top_p,
        top_k=c.rollout.top_k if args.top_k is None else args.top_k,
        seed=args.seed or 0,
    )
  except ValueError as e:
    raise errors.UserError(f"decoding (--temperature/--top-p/--top-k): {e}") from None
  return decoding, k


def is_gsm8k_test(source: str, split: str | None) -> bool:
  """GSM8K's test split: the hub's, or a file whose path says gsm8k and test."""
  if source == "gsm8k":
    return split == "test"
  if source.startswith("reasoning_gym:"):
    return False
  path = str(pathlib.Path(source).expanduser().resolve()).lower()
  return "gsm8k" in path and "test" in path


def contamination(target: Target, data_source: str, split: str | None) -> str | None:
  """Why a run's scores on this data overstate generalisation, or None.

  GSM-Symbolic's templates are GSM8K test questions with new numbers.
  """
  if target.trained_on is None or not is_gsm8k_test(data_source, split):
    return None
  source, train_split = target.trained_on
  if source == "reasoning_gym:gsm_symbolic":
    return ("this run trained on reasoning_gym:gsm_symbolic, whose templates"
            " derive from GSM8K test questions")
  if is_gsm8k_test(source, train_split):
    return f"this run trained on {source} (GSM8K test itself)"
  return None


def default_data(c) -> str:
  """--data when none is given: the config's own source, never its training problems."""
  source = c.data.source
  if source == "gsm8k" or source.startswith("reasoning_gym:"):
    return source
  raise errors.UserError(
      f"--data: required, because data.source={source!r} is a file of training"
      " problems; pass the matching test file (or gsm8k, reasoning_gym:<task>)")


def _load_problems(args, c) -> tuple[list[data_lib.Problem], dict[str, Any]]:
  """The first --num-test problems of --data, and their description."""
  source = args.data
  _check_positive("--num-test", args.num_test)
  if args.split is not None and source != "gsm8k":
    raise errors.UserError(f"--split {args.split}: only for --data gsm8k (a hub dataset)")
  info: dict[str, Any] = {"source": source, "num_test": args.num_test}
  if source == "gsm8k":
    split = args.split or "test"
    info["split"] = split
    problems = _load_gsm8k_hub(split)
  elif source.startswith("reasoning_gym:"):
    # Item i of a reasoning-gym dataset is drawn with Random(seed + i): starting
    # past the training range keeps every eval problem out of training's.
    seed = c.data.reasoning_gym_seed + c.data.reasoning_gym_size
    size = args.num_test or c.data.reasoning_gym_size
    info.update(seed=seed, size=size)
    # The run's difficulty knobs belong to its own task only.
    options = c.data.reasoning_gym_options.to_dict() if source == c.data.source else {}
    info["options"] = options
    problems = data_lib.load_problems(source, size=size, seed=seed, options=options)
  else:
    path = pathlib.Path(source).expanduser()
    if not path.is_file():
      raise errors.UserError(
          f"--data {source}: no such file; pass a GSM8K-format .jsonl/.parquet,"
          " gsm8k or reasoning_gym:<task>")
    info["path"] = str(path.resolve())
    problems = data_lib.load_problems(str(path))
  info["num_loaded"] = len(problems)
  info["few_shot"] = len(c.data.few_shot)
  problems = data_lib.with_examples(problems, c.data)
  return problems[:args.num_test] if args.num_test else problems, info


def _load_gsm8k_hub(split: str) -> list[data_lib.Problem]:
  verbosity = hub_logging.get_verbosity()
  hub_logging.set_verbosity_error()  # no retry chatter
  try:
    return data_lib.load_gsm8k_hub(split)
  except errors.UserError:
    raise errors.UserError(
        f"--data gsm8k: cannot download {data_lib.GSM8K_HUB_ID} split {split!r}"
        " (offline?); pass a local GSM8K-format file instead, e.g. --data"
        " /path/to/gsm8k/test.jsonl") from None
  finally:
    hub_logging.set_verbosity(verbosity)


def _read_report(path: pathlib.Path) -> dict:
  file = path / scoring.SUMMARY_FILE if path.is_dir() else path
  try:
    report = json.loads(file.read_text())
  except (OSError, json.JSONDecodeError) as e:
    raise errors.UserError(f"--compare {path}: cannot read {file} ({e})") from None
  if not isinstance(report.get("metrics"), dict):
    raise errors.UserError(f"--compare {path}: {file} has no metrics; is it a gemma-grpo eval.json?")
  return report


def _read_samples(path: pathlib.Path) -> list[dict] | None:
  """The samples.jsonl beside a baseline's eval.json, if there is one."""
  file = (path if path.is_dir() else path.parent) / scoring.SAMPLES_FILE
  if not file.is_file():
    return None
  return [json.loads(line) for line in file.read_text().splitlines() if line.strip()]


def _compare_baseline(x: str, c):
  """(eval.json report, None) or (None, (Target, its config)) for --compare X."""
  path = pathlib.Path(x).expanduser()
  if (path.is_dir() and (path / scoring.SUMMARY_FILE).is_file()) or (path.is_file() and path.suffix == ".json"):
    return _read_report(path), None
  if path.is_dir() and (path / "checkpoints").is_dir():
    return None, _workdir_target(x, None, flag="--compare")
  if x.startswith(("gguf:", "hf:")) or x == "random" or (path / "config.json").is_file():
    base = c.copy_and_resolve_references()
    with base.unlocked():
      base.model.source = x
    return None, (Target(x), base)
  raise errors.UserError(
      f"--compare {x}: neither an eval output directory (with {scoring.SUMMARY_FILE}),"
      " a work directory nor a model source (gguf:, hf:, random, an HF directory)")


# --- Evaluation --------------------------------------------------------------


def _load_policy(target: Target, c, mesh):
  """(model, tokenizer) of a target; a work directory's with its LoRA."""
  from gemma_grpo.model import policy as policy_lib  # pylint: disable=g-import-not-at-top

  if target.workdir is not None:
    policy = policy_lib.restore(target.workdir, mesh, target.step)
    return policy.actor, policy.loaded.tokenizer
  loaded = policy_lib.load_base(c.model, mesh)
  return loaded.model, loaded.tokenizer


def evaluate(target: Target, c, plan: Plan, mesh, *,
             contaminated: bool) -> tuple[dict, list[dict]]:
  """Generates and scores; returns the eval.json report and sample records."""
  start = time.perf_counter()
  model, tokenizer = _load_policy(target, c, mesh)
  stop_ids = tokenizer_lib.stop_token_ids(tokenizer)
  generator = eval_generation.Generator(
      model, tokenizer, mesh, max_prompt_length=plan.max_prompt_length,
      max_new_tokens=plan.decoding.max_new_tokens, stop_token_ids=stop_ids,
      stop_text=c.rollout.stop_text, engine=c.rollout.engine,
      lora_scale=c.lora.alpha / c.lora.rank, decode_dtype=c.rollout.decode_dtype,
      screen_lm_head=c.rollout.screen_lm_head,
      tool_runner=multi_turn.tool_runner(c.rollout), max_tool_calls=c.rollout.max_tool_calls,
  )
  kept = [p for p in plan.problems
          if generator.prompt_length(p.prompt) <= plan.max_prompt_length]
  dropped = len(plan.problems) - len(kept)
  if not kept:
    raise errors.UserError(
        f"rollout.max_prompt_length={plan.max_prompt_length}: all {dropped} prompts"
        " are longer; raise it with --config.rollout.max_prompt_length=N")
  loaded_s = time.perf_counter() - start

  k = plan.num_samples
  rendered = [p.prompt for p in kept for _ in range(k)]
  start = time.perf_counter()
  out = generator.generate(rendered, plan.decoding, batch_size=plan.batch_size,
                           progress=distributed.is_chief())
  generate_s = time.perf_counter() - start
  metrics, samples = scoring.score(
      kept, out.texts, out.truncated, num_tokens=out.num_tokens, num_samples=k,
      reward_fns=plan.reward_fns(), num_dropped=dropped, tools=bool(c.rollout.tools))

  d = plan.decoding
  report = {
      "metrics": metrics,
      "contaminated": contaminated,
      "settings": {
          "model": {"source": target.source,
                    "workdir": str(target.workdir) if target.workdir else None,
                    "step": target.step},
          "data": {**plan.data, "num_problems": len(kept), "num_dropped": dropped,
                   "max_prompt_length": plan.max_prompt_length},
          "decoding": {"mode": "greedy" if d.greedy else "sample",
                       "num_samples": k, "max_new_tokens": d.max_new_tokens,
                       "temperature": d.temperature,
                       "top_p": None if d.greedy else d.top_p,
                       "top_k": None if d.greedy else d.top_k,
                       "seed": None if d.greedy else d.seed,
                       "batch_size": plan.batch_size, "stop_token_ids": stop_ids,
                       "stop_text": c.rollout.stop_text, "engine": c.rollout.engine,
                       "tools": c.rollout.tools, "max_tool_calls": c.rollout.max_tool_calls},
          "rewards": {"preset": plan.reward_config.preset,
                      "functions": [fn.__name__ for fn in plan.reward_fns()]},
      },
      # Configs hold no secrets (tokens come from the environment, never read here).
      "config": json.loads(c.to_json_best_effort()),
      "timing": {"load_s": round(loaded_s, 2), "generate_s": round(generate_s, 2),
                 "generated_tokens": sum(out.num_tokens),
                 "tokens_per_s": round(sum(out.num_tokens) / max(generate_s, 1e-9), 2)},
  }
  return report, samples


# --- Console ------------------------------------------------------------------


def format_value(name: str, value: Any) -> str:
  if value is None:
    return "-"
  if name.startswith("num_"):
    return str(int(value))
  if name.startswith("mean_length"):
    return f"{value:.1f}"
  return f"{value:.4f}"


def format_delta(name: str, base: Any, value: Any) -> str:
  if base is None or value is None:
    return "-"
  delta = value - base
  if name.startswith("num_"):
    return f"{int(delta):+d}"
  return f"{delta:+.1f}" if name.startswith("mean_length") else f"{delta:+.4f}"


def table(metrics: dict[str, float], base: dict[str, float] | None = None,
          base_label: str = "base") -> str:
  """metric | value, or metric | base | this run | delta."""
  names = list(metrics) + [n for n in (base or {}) if n not in metrics]
  if base is None:
    rows = [("metric", "value")] + [(n, format_value(n, metrics[n])) for n in names]
  else:
    rows = [("metric", base_label, "this run", "delta")] + [
        (n, format_value(n, base.get(n)), format_value(n, metrics.get(n)),
         format_delta(n, base.get(n), metrics.get(n))) for n in names]
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                     for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
           for row in rows]
  lines.insert(1, "  ".join("-" * w for w in widths))
  return "\n".join(lines)


def _setting_differences(base: dict, report: dict) -> list[str]:
  """Settings under which two reports are not comparable."""
  keys = (("data", ("source", "split", "num_test", "num_problems", "max_prompt_length")),
          ("decoding", ("mode", "num_samples", "max_new_tokens", "temperature", "top_p", "top_k")),
          ("rewards", ("preset",)))
  diffs = []
  for section, names in keys:
    a, b = base.get("settings", {}).get(section, {}), report["settings"][section]
    diffs += [f"{section}.{n} {a.get(n)!r} vs {b.get(n)!r}" for n in names if a.get(n) != b.get(n)]
  return diffs


def _warn_contaminated(reason: str) -> None:
  bar = "!" * 78
  print(f"{bar}\nWARNING: CONTAMINATED EVALUATION: {reason}; scores on GSM8K test"
        f" overstate generalisation (eval.json marks \"contaminated\": true).\n{bar}",
        file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
  """`gemma-grpo eval ...`: see the module docstring and --help."""
  argv = list(sys.argv[1:] if argv is None else argv)
  with errors.exit_on_user_error():
    args, overrides = _parser().parse_known_args(argv)
    picked = not (args.workdir or args.model or args.config)
    target, c = _target_and_config(args, overrides)
    if picked and target.workdir is not None and not args.compare:
      args.compare = c.model.source
    if args.data is None:
      args.data = default_data(c)
    decoding, k = _decoding(args, c)
    problems, data_info = _load_problems(args, c)
    try:
      rewards.from_config(c.rewards)
    except ValueError as e:
      raise errors.UserError(str(e)) from None
    plan = Plan(problems, data_info, c.rollout.max_prompt_length, decoding, k,
                c.eval.batch_size, c.rewards)
    if plan.max_prompt_length < 8:
      raise errors.UserError(f"rollout.max_prompt_length={plan.max_prompt_length}: too small; use >= 128")
    base_report, base_target = _compare_baseline(args.compare, c) if args.compare else (None, None)
    reason = contamination(target, args.data, data_info.get("split"))
    if reason:
      _warn_contaminated(reason)

    out = storage.path(args.out) if args.out else target.default_out()
    distributed.initialize(distributed.resolve_rank(args))
    metrics_lib.configure_logging()
    with distributed.failures_reported():
      mesh_lib.enable_compilation_cache(os.path.join(c.model.cache_dir, "xla"))
      mesh = mesh_lib.make_mesh(c.mesh)
      # Every process decodes the same problems; process 0 writes the files.
      b_samples = None
      if base_target is not None:
        b_target, b_config = base_target
        b_reason = contamination(b_target, args.data, data_info.get("split"))
        base_report, b_samples = evaluate(b_target, b_config, plan, mesh,
                                          contaminated=bool(b_reason))
        if distributed.is_chief():
          scoring.write(b_target.default_out(), base_report, b_samples)
          print(f"baseline {b_target.label}: wrote {b_target.default_out()}", flush=True)
      report, samples = evaluate(target, c, plan, mesh, contaminated=bool(reason))
      if distributed.is_chief():
        scoring.write(out, report, samples)
    distributed.finish(0)
    if not distributed.is_chief():
      return 0

  settings = report["settings"]
  print(f"eval {target.label} on {args.data}: {settings['data']['num_problems']} problems"
        f" ({settings['data']['num_dropped']} dropped), {settings['decoding']['mode']}"
        f" x{k}, {decoding.max_new_tokens} new tokens; generated"
        f" {report['timing']['generated_tokens']} tokens in {report['timing']['generate_s']:.1f} s")
  if base_report is None:
    print(table(report["metrics"]))
  else:
    label = args.compare if len(args.compare) <= 40 else "..." + args.compare[-37:]
    print(table(report["metrics"], base_report["metrics"], label))
    if b_samples is None:
      b_samples = _read_samples(pathlib.Path(args.compare).expanduser())
    paired = scoring.paired_accuracy_line(b_samples, samples) if b_samples else None
    print(paired or "note: the baseline scored other problems; no paired interval")
    diffs = _setting_differences(base_report, report)
    if diffs:
      print(f"note: the baseline was evaluated differently: {'; '.join(diffs)}")
  print(f"wrote {out / scoring.SUMMARY_FILE} and {out / scoring.SAMPLES_FILE}", flush=True)
  if reason:
    _warn_contaminated(reason)
  return 0


if __name__ == "__main__":
  sys.exit(main())
