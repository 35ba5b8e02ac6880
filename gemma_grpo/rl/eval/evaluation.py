"""How well a policy reasons on held-out problems: generate, score, report.

The metrics are gemma_grpo.rl.eval.scoring's (listed there), the same as the
in-training eval's. A report (eval.json) holds the metrics, the resolved
settings, the config used, "contaminated" and timing; the samples
(samples.jsonl) one record per completion: prompt, completion, extracted
answer, gold, verdicts, rewards. Greedy decoding is deterministic; sampling
is reproducible for a fixed seed and batch size.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import time
from typing import Any, Callable, Sequence

from gemma_grpo import errors
from gemma_grpo.config import settings
from gemma_grpo.model import policy as policy_lib
from gemma_grpo.rl.eval import generation
from gemma_grpo.rl.eval import problem_sets
from gemma_grpo.rl.eval import scoring
from gemma_grpo.rl.eval import targets
from gemma_grpo.runtime import distributed
from gemma_grpo.runtime import mesh as mesh_lib
from gemma_grpo.tasks import data as data_lib
from gemma_grpo.tasks import rewards


@dataclasses.dataclass
class Plan:
  """What every model of one command is evaluated on, and how."""

  problems: list[data_lib.Problem]  # the first --num-test of the data
  data: dict[str, Any]  # how they were chosen, for eval.json (problem_sets.load_problems)
  max_prompt_length: int  # tokens with <bos>; longer prompts are dropped
  decoding: generation.Decoding
  num_samples: int
  batch_size: int
  reward_settings: settings.RewardSettings  # the config's `rewards` section

  def reward_fns(self) -> list[Callable]:
    return rewards.from_settings(self.reward_settings)


def decoding(rollout: settings.RolloutSettings, *, num_samples: int, max_new_tokens: int,
             temperature: float | None = None, top_k: int | None = None,
             top_p: float | None = None, seed: int | None = None) -> generation.Decoding:
  """The Decoding of these flags (None: the rollout settings' default); greedy
  unless temperature > 0, and sampling from rollout.temperature when num_samples > 1.
  """
  k = num_samples
  if temperature is None:
    temperature = rollout.temperature if k > 1 else 0.0
  if temperature < 0 or (k > 1 and temperature == 0):
    raise errors.UserError(
        f"--temperature {temperature}: must be > 0 to draw --num-samples {k}"
        " different samples (0 = greedy, one completion per problem)")
  if temperature == 0:
    given = [f for f, v in (("--top-k", top_k), ("--top-p", top_p), ("--seed", seed)) if v is not None]
    if given:
      raise errors.UserError(f"{given[0]}: only for sampling; add --temperature T (> 0)")
  try:
    return generation.Decoding(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=rollout.top_p if top_p is None else top_p,
        top_k=rollout.top_k if top_k is None else top_k,
        seed=seed or 0,
    )
  except ValueError as e:
    raise errors.UserError(f"decoding (--temperature/--top-p/--top-k): {e}") from None


def plan(c: settings.Settings, problems: list[data_lib.Problem], data: dict[str, Any],
         decoding_: generation.Decoding, num_samples: int) -> Plan:
  """The Plan of `c` (its rollout.max_prompt_length, eval.batch_size, rewards), checked."""
  try:
    rewards.from_settings(c.rewards)
  except ValueError as e:
    raise errors.UserError(str(e)) from None
  p = Plan(problems, data, c.rollout.max_prompt_length, decoding_, num_samples,
           c.eval.batch_size, c.rewards)
  if p.max_prompt_length < 8:
    raise errors.UserError(f"rollout.max_prompt_length={p.max_prompt_length}: too small; use >= 128")
  return p


def evaluate(target: targets.Target, c: settings.Settings, plan_: Plan, mesh, *,
             contaminated: bool) -> tuple[dict, list[dict]]:
  """Generates and scores; returns the eval.json report and sample records."""
  start = time.perf_counter()
  model, tokenizer = targets.load_policy(target, c.model, mesh)
  generator = generation.Generator.from_settings(
      model, tokenizer, mesh, c.rollout, c.lora, max_new_tokens=plan_.decoding.max_new_tokens,
      max_prompt_length=plan_.max_prompt_length)  # one plan: a baseline's own config may differ
  kept = [p for p in plan_.problems
          if generator.prompt_length(p.prompt) <= plan_.max_prompt_length]
  dropped = len(plan_.problems) - len(kept)
  if not kept:
    raise errors.UserError(
        f"rollout.max_prompt_length={plan_.max_prompt_length}: all {dropped} prompts"
        " are longer; raise it with --config.rollout.max_prompt_length=N")
  loaded_s = time.perf_counter() - start

  k = plan_.num_samples
  rendered = [p.prompt for p in kept for _ in range(k)]
  start = time.perf_counter()
  out = generator.generate(rendered, plan_.decoding, batch_size=plan_.batch_size,
                           progress=distributed.is_chief())
  generate_s = time.perf_counter() - start
  metrics, samples = scoring.score(
      kept, out.texts, out.truncated, num_tokens=out.num_tokens, num_samples=k,
      reward_fns=plan_.reward_fns(), num_dropped=dropped, tools=bool(c.rollout.tools))

  d = plan_.decoding
  report = {
      "metrics": metrics,
      "contaminated": contaminated,
      "settings": {
          "model": {"source": target.source,
                    "workdir": str(target.workdir) if target.workdir else None,
                    "step": target.step},
          "data": {**plan_.data, "num_problems": len(kept), "num_dropped": dropped,
                   "max_prompt_length": plan_.max_prompt_length},
          "decoding": {"mode": "greedy" if d.greedy else "sample",
                       "num_samples": k, "max_new_tokens": d.max_new_tokens,
                       "temperature": d.temperature,
                       "top_p": None if d.greedy else d.top_p,
                       "top_k": None if d.greedy else d.top_k,
                       "seed": None if d.greedy else d.seed,
                       "batch_size": plan_.batch_size, "stop_token_ids": generator.stop_token_ids,
                       "stop_text": c.rollout.stop_text, "engine": c.rollout.engine,
                       "tools": c.rollout.tools, "max_tool_calls": c.rollout.max_tool_calls},
          "rewards": {"preset": plan_.reward_settings.preset,
                      "functions": [fn.__name__ for fn in plan_.reward_fns()]},
      },
      # Configs hold no secrets (tokens come from the environment, never read here).
      "config": json.loads(c.config_json),
      "timing": {"load_s": round(loaded_s, 2), "generate_s": round(generate_s, 2),
                 "generated_tokens": sum(out.num_tokens),
                 "tokens_per_s": round(sum(out.num_tokens) / max(generate_s, 1e-9), 2)},
  }
  return report, samples


def contaminated(target: targets.Target, plan_: Plan) -> str | None:
  """Why the target's scores on the plan's data overstate generalisation, or None."""
  return problem_sets.contamination(target.trained_on, plan_.data["source"], plan_.data.get("split"))


@dataclasses.dataclass
class Result:
  """A target's report and samples; its baseline's when one was evaluated."""

  report: dict
  samples: list[dict]
  base_report: dict | None = None
  base_samples: list[dict] | None = None


def run(target: targets.Target, c: settings.Settings, plan_: Plan, out: pathlib.Path,
        *, baseline: tuple[targets.Target, settings.Settings] | None = None) -> Result:
  """Evaluates `baseline` (if given) and then `target` on `plan_` on c.mesh;
  writes each one's eval.json and samples.jsonl (the baseline's to its
  default_out). Every process decodes the same problems; process 0 writes."""
  mesh_lib.enable_compilation_cache(os.path.join(c.model.cache_dir, "xla"))
  mesh = mesh_lib.make_mesh(c.mesh)
  result = Result({}, [])
  if baseline is not None:
    b_target, b_config = baseline
    result.base_report, result.base_samples = evaluate(
        b_target, b_config, plan_, mesh, contaminated=bool(contaminated(b_target, plan_)))
    if distributed.is_chief():
      scoring.write(b_target.default_out(), result.base_report, result.base_samples)
      print(f"baseline {b_target.label}: wrote {b_target.default_out()}", flush=True)
  result.report, result.samples = evaluate(
      target, c, plan_, mesh, contaminated=bool(contaminated(target, plan_)))
  if distributed.is_chief():
    scoring.write(out, result.report, result.samples)
  return result


def evaluate_policy(policy: policy_lib.Policy, problems: Sequence[data_lib.Problem], *,
                    max_new_tokens: int | None = None) -> dict[str, Any]:
  """Greedy completions of `problems` by a run's policy, scored as `gemma-grpo eval` scores them.

  Returns {"metrics": {...}, "samples": [...]} (gemma_grpo.api.evaluate).
  """
  c = policy.settings
  max_new_tokens = max_new_tokens or c.eval.max_new_tokens
  generator = generation.Generator.from_settings(
      policy.actor, policy.loaded.tokenizer, mesh_lib.make_mesh(c.mesh), c.rollout, c.lora,
      max_new_tokens=max_new_tokens)
  greedy = generation.Decoding(max_new_tokens=max_new_tokens)

  def generate(prompts):
    out = generator.generate(prompts, greedy, batch_size=c.eval.batch_size)
    return out.texts, out.truncated, out.num_tokens

  metrics, samples = scoring.run(generate, list(problems), c.eval.batch_size,
                                 reward_fns=rewards.from_settings(c.rewards),
                                 tools=bool(c.rollout.tools))
  return {"metrics": metrics, "samples": samples}
