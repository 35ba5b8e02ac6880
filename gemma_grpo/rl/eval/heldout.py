"""The held-out eval between training steps: greedy, on the run's own held-out slice.

It generates through the run's RLCluster (the rollout engine in eval mode)
and scores with gemma_grpo.rl.eval.scoring, as `gemma-grpo eval` does, so
its eval/ values compare with that command's on the same problems.
"""

from __future__ import annotations

from etils import epath
from tunix.rl import rl_cluster as rl_cluster_lib

from gemma_grpo.config import settings
from gemma_grpo.model import tokenizer as tokenizer_lib
from gemma_grpo.rl.eval import scoring
from gemma_grpo.tasks import rewards


class HeldoutEval:
  """Greedy eval of the held-out slice; its samples kept in WORKDIR/eval/step_N.

  Called with a step, it returns the eval/ scalars; `results` keeps every
  eval's metrics, the first being the starting point.
  """

  def __init__(self, eval_s: settings.EvalSettings, rollout: settings.RolloutSettings,
               rewards_s: settings.RewardSettings, data_source: str, cluster, tokenizer, heldout,
               work: epath.Path, is_chief: bool):
    self._eval, self._rollout, self._data_source = eval_s, rollout, data_source
    self._cluster, self._tokenizer = cluster, tokenizer
    self._work, self._is_chief = work, is_chief
    self.problems = heldout[:eval_s.num_examples]
    # The CLI's `eval` scores with the run's preset too: eval/ values compare.
    self._reward_fns = rewards.from_settings(rewards_s)
    self.results: list[dict[str, float]] = []

  def _generate(self, batch_prompts):
    e, r = self._eval, self._rollout
    out = self._cluster.generate(batch_prompts, mode=rl_cluster_lib.Mode.EVAL)
    texts, truncated, counts = tokenizer_lib.apply_stop_text(
        out.text, out.tokens, e.max_new_tokens, r.stop_text, self._tokenizer)
    if r.tools:  # lengths count the model's own tokens, not tool results
      turns = self._cluster.rollout.take_tool_turns()
      counts = [n - int(t.tool_mask[:n].sum()) for n, t in zip(counts, turns, strict=True)]
    return texts, truncated, counts

  def __call__(self, step: int) -> dict[str, float]:
    e, r = self._eval, self._rollout
    metrics, samples = scoring.run(self._generate, self.problems, e.batch_size,
                                   reward_fns=self._reward_fns, show_progress=self._is_chief,
                                   tools=bool(r.tools))
    self.results.append(metrics)
    if self._is_chief:
      scoring.write(self._work / "eval" / f"step_{step:06d}", {
          "metrics": metrics,
          "settings": {"step": step, "decoding": {"mode": "greedy", "max_new_tokens": e.max_new_tokens,
                                                  "stop_text": r.stop_text, "engine": r.engine},
                       "data": {"source": self._data_source, "heldout": len(self.problems)}},
      }, samples)
    return {f"eval/{k}": v for k, v in metrics.items()}


def summary(first: dict[str, float], last: dict[str, float], num_problems: int, step: int) -> str:
  """One line: the held-out metrics at the start of this run and at its end."""
  parts = [f"{name} {first[key]:.1%} -> {last[key]:.1%}"
           for name, key in (("accuracy", "accuracy"), ("format", "format_accuracy"),
                             ("truncated", "truncation_rate"))]
  return (f"held-out ({num_problems} problems, greedy), start -> step {step}: "
          + ", ".join(parts) + f"; reward {first['reward/sum']:.2f} -> {last['reward/sum']:.2f}")
