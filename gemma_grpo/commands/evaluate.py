"""How well a policy reasons on held-out problems: `gemma-grpo eval`.

  gemma-grpo eval --num-test 16     # the newest run under runs/ against its base
  gemma-grpo eval --config configs/gemma3_270m.py --num-test 16   # offline 270M
  gemma-grpo eval --workdir runs/gemma3_270m [--step 10] --data ...
  gemma-grpo eval --model hf:google/gemma-3-1b-it --num-samples 8 --temperature 0.8
  gemma-grpo eval --workdir runs/x --data ... --compare runs/eval/gguf_gemma-3-270m

The command: what to evaluate (a run's checkpoint or a model source), on
which problems, decoded how; the metrics themselves are gemma_grpo.rl.eval.scoring's
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
import pathlib
import sys

from gemma_grpo import config as config_lib
from gemma_grpo import errors
from gemma_grpo.config import settings as settings_lib
from gemma_grpo import storage
from gemma_grpo.runtime import distributed

DEFAULT_CONFIG = "configs/gemma3_270m.py"  # what config_lib.offline_270m() returns


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
  which.add_argument("--model", help=f"model source: {config_lib.OFFLINE_MODEL} | hf:<repo> | HF dir | random")
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


def _check_flags(args) -> None:
  """What the flags alone get wrong, before anything slow is imported."""
  if args.workdir and (args.model or args.config):
    raise errors.UserError(
        "--workdir brings its own model and config (config.json); drop --model/--config")
  if args.step is not None and not args.workdir:
    raise errors.UserError(f"--step {args.step}: only with --workdir")
  for flag in ("num_samples", "max_new_tokens", "batch_size", "num_test"):
    value = getattr(args, flag)
    if value is not None and value < 1:
      raise errors.UserError(f"--{flag.replace('_', '-')} {value}: must be >= 1")


def main(argv: list[str] | None = None) -> int:
  """`gemma-grpo eval ...`: see the module docstring and --help."""
  argv = list(sys.argv[1:] if argv is None else argv)
  with errors.exit_on_user_error():
    args, overrides = _parser().parse_known_args(argv)
    _check_flags(args)
    c = None if args.workdir else (
        config_lib.load(args.config) if args.config else config_lib.offline_270m())
    # The library only now that the flags are sound: JAX and Tunix take seconds to import.
    from gemma_grpo.rl.eval import evaluation, problem_sets, reports, scoring, targets  # pylint: disable=g-import-not-at-top
    from gemma_grpo.runtime import metrics as metrics_lib  # pylint: disable=g-import-not-at-top

    picked = not (args.workdir or args.model or args.config)
    if picked and (latest := targets.latest_run(pathlib.Path("runs"))) is not None:
      # The question after the first command: did it learn? Run vs its base.
      args.workdir, c = str(latest), None
      print(f"evaluating the most recent run, {latest} (pass --workdir, --model or"
            " --config to choose another), against its base model", flush=True)
    target, c = _choose(c, overrides, workdir=args.workdir, step=args.step, model=args.model)
    if picked and target.workdir is not None and not args.compare:
      args.compare = c.model.source
    with c.unlocked():  # resolved into the config, so the one eval.json saves is the one used
      c.eval.max_new_tokens = args.max_new_tokens or c.eval.max_new_tokens
      c.eval.batch_size = args.batch_size or c.eval.batch_size
    s = settings_lib.from_config(c)
    args.data = args.data or problem_sets.default_data(s.data)
    if args.split is not None and args.data != "gsm8k":
      raise errors.UserError(f"--split {args.split}: only for --data gsm8k (a hub dataset)")
    decoding = evaluation.decoding(
        s.rollout, num_samples=args.num_samples, max_new_tokens=s.eval.max_new_tokens,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    problems, data_info = problem_sets.load_problems(args.data, s.data, split=args.split,
                                                  num_test=args.num_test)
    plan = evaluation.plan(s, problems, data_info, decoding, args.num_samples)
    base_report, baseline = _baseline(args.compare, c) if args.compare else (None, None)
    reason = evaluation.contaminated(target, plan)
    if reason:
      _warn_contaminated(reason)

    out = storage.path(args.out) if args.out else target.default_out()
    distributed.initialize(distributed.resolve_rank(args))
    metrics_lib.configure_logging()
    with distributed.failures_reported():
      result = evaluation.run(target, s, plan, out, baseline=baseline)
    distributed.finish(0)
    if not distributed.is_chief():
      return 0

  report, settings = result.report, result.report["settings"]
  print(f"eval {target.label} on {args.data}: {settings['data']['num_problems']} problems"
        f" ({settings['data']['num_dropped']} dropped), {settings['decoding']['mode']}"
        f" x{args.num_samples}, {decoding.max_new_tokens} new tokens; generated"
        f" {report['timing']['generated_tokens']} tokens in {report['timing']['generate_s']:.1f} s")
  base_report = result.base_report or base_report
  if base_report is None:
    print(reports.table(report["metrics"]))
  else:
    label = args.compare if len(args.compare) <= 40 else "..." + args.compare[-37:]
    print(reports.table(report["metrics"], base_report["metrics"], label))
    b_samples = result.base_samples or reports.read_samples(pathlib.Path(args.compare).expanduser())
    paired = scoring.paired_accuracy_line(b_samples, result.samples) if b_samples else None
    print(paired or "note: the baseline scored other problems; no paired interval")
    diffs = reports.setting_differences(base_report, report)
    if diffs:
      print(f"note: the baseline was evaluated differently: {'; '.join(diffs)}")
  print(f"wrote {out / scoring.SUMMARY_FILE} and {out / scoring.SAMPLES_FILE}", flush=True)
  if reason:
    _warn_contaminated(reason)
  return 0


def _choose(c, overrides: list[str], *, workdir: str | None, step: int | None,
            model: str | None):
  """The Target and the config it is evaluated with, overrides applied.

  A work directory brings its own config (`c` is None then); otherwise `c`
  is the loaded config file, its model.source replaced by `model` if given.
  """
  from gemma_grpo.rl.eval import targets  # pylint: disable=g-import-not-at-top

  if workdir:
    target = targets.workdir_target(workdir, step)
    c = config_lib.load_saved(target.workdir / "config.json")
    fixed = [o for o in overrides if o.startswith(("--config.model.", "--config.lora."))]
    if fixed:
      raise errors.UserError(
          f"{fixed[0].split('=')[0]}: the model of a work directory comes from its"
          " config.json; only eval, rollout, rewards and mesh keys can be overridden")
  rest = config_lib.apply_overrides(c, overrides)
  if rest:
    raise errors.UserError(f"unrecognized arguments: {' '.join(rest)}")
  if not workdir:
    if model:
      with c.unlocked():
        c.model.source = model
    target = targets.Target(c.model.source)
  return target, c


def _baseline(x: str, c):
  """(eval.json report, None) or (None, (Target, its settings)) for --compare X."""
  from gemma_grpo.rl.eval import reports, scoring, targets  # pylint: disable=g-import-not-at-top

  path = pathlib.Path(x).expanduser()
  if reports.is_report(path):
    return reports.read_report(path), None
  if path.is_dir() and (path / "checkpoints").is_dir():
    target = targets.workdir_target(x, None, flag="--compare")
    saved = config_lib.load_saved(target.workdir / "config.json")
    return None, (target, settings_lib.from_config(saved))
  if targets.is_model_source(x):
    base = c.copy_and_resolve_references()
    with base.unlocked():
      base.model.source = x
    return None, (targets.Target(x), settings_lib.from_config(base))
  raise errors.UserError(
      f"--compare {x}: neither an eval output directory (with {scoring.SUMMARY_FILE}),"
      " a work directory nor a model source (gguf:, hf:, random, an HF directory)")


def _warn_contaminated(reason: str) -> None:
  bar = "!" * 78
  print(f"{bar}\nWARNING: CONTAMINATED EVALUATION: {reason}; scores on GSM8K test"
        f" overstate generalisation (eval.json marks \"contaminated\": true).\n{bar}",
        file=sys.stderr, flush=True)


if __name__ == "__main__":
  sys.exit(main())
