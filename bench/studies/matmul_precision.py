"""bfloat16 products in the trainer (model.matmul_dtype): what they change.

  python bench/studies/matmul_precision.py [--part greedy|sampled|both] [--json OUT]

On the offline Gemma-3-270M LoRA policy (bench/rollout.py's build_policy,
float32 weights, the policy the first step samples from), two copies of the
same arrays: one computing every product in float32, one with
model.matmul_dtype=bfloat16 (the feed-forward's frozen products and the LM
head's two vocabulary-sized products from bfloat16 operands, accumulated in
float32). The rollout engine's decode loop is float32 in both; its prefill
runs the model, so it changes too.

greedy    the accuracy benchmark's 200 held-out equations
          (configs/gemma3_270m_accuracy.py) decoded greedily through each:
          completions identical token for token, answers graded correct.
sampled   8 of the first command's training batches (2 problems x 8 rows,
          its temperature, top-k and token limit), each drawn by the engine
          on the mixed policy, as the trainer would with the setting on:
          - pi_train / pi_sample per token, the trainer's log-probs (mixed)
            over the engine's (the same tokens; a float32 engine and trainer
            give the measurement's floor, run too);
          - the mixed trainer's log-probs against float32's on the same
            tokens (how far each number the loss reads moves);
          - the policy-gradient loss's LoRA gradient (random group-normalised
            advantages, fixed seed) in both: cosine and norm ratio.
About 30 min on this 2-core CPU (2026-12-03: greedy 14 min, sampled 15 min,
most of it compiling: each batch's completion width is a new shape, as in
the trainer). --smoke: a random 2-layer Gemma-3
(figures meaningless). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import common  # pylint: disable=g-import-not-at-top,wrong-import-position

VARIANTS = ("float32", "bfloat16")
CLIP_LOW, CLIP_HIGH = 0.8, 1.28  # grpo.epsilon 0.2 and DAPO's epsilon_high 0.28


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--part", choices=("greedy", "sampled", "both"), default="both")
  p.add_argument("--sampled-steps", type=int, default=8)
  p.add_argument("--smoke", action="store_true", help="random 2-layer model; figures meaningless")
  p.add_argument("--json", type=pathlib.Path, help="write the raw figures here")
  return p.parse_args(argv)


def policies(actor) -> dict:
  """The actor as it is, and a clone sharing its arrays that multiplies in bfloat16."""
  from flax import nnx  # pylint: disable=g-import-not-at-top

  mixed = nnx.merge(*nnx.split(actor))
  mixed.matmul_dtype = "bfloat16"
  return {"float32": actor, "bfloat16": mixed}


def engine_for(policy, tokenizer, mesh):
  from gemma_grpo.rl.engine import rollout  # pylint: disable=g-import-not-at-top

  return rollout.GroupedRollout(policy, tokenizer, mesh,
                                lora_scale=common.LORA_ALPHA / common.LORA_RANK)


def _quantiles(x) -> dict:
  import numpy as np  # pylint: disable=g-import-not-at-top

  return {q: float(np.quantile(x, q)) for q in (0.001, 0.01, 0.5, 0.99, 0.999)}


def sampled(by_variant: dict, tokenizer, mesh, steps: int, smoke: bool) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from configs import gemma3_270m  # pylint: disable=g-import-not-at-top
  from gemma_grpo.rl.learner import logprobs  # pylint: disable=g-import-not-at-top
  from gemma_grpo.rl.learner import losses  # pylint: disable=g-import-not-at-top

  import decode_precision  # pylint: disable=g-import-not-at-top

  c = gemma3_270m.get_config()
  if smoke:
    c.rollout.max_new_tokens = 8
  r, g = c.rollout, c.grpo.num_generations

  @functools.partial(nnx.jit, static_argnames=("pad_id",))
  def logps(model, prompt_BxP, completion_BxT, pad_id):
    return logprobs.per_token_logps(model, prompt_BxP, completion_BxT, pad_id, r.temperature,
                                    group_size=g)[0]

  @functools.partial(nnx.jit, static_argnames=("pad_id",))
  def lora_gradient(model, prompt_BxP, completion_BxT, advantages_B, mask_BxT, pad_id):
    def loss(m):
      logps_BxT = logprobs.per_token_logps(m, prompt_BxP, completion_BxT, pad_id, r.temperature,
                                           group_size=g)[0]
      return losses.policy_loss(logps_BxT, advantages_B, mask_BxT, epsilon_low=0.2,
                                epsilon_high=0.2, beta=0.0, sequence_ratio=False,
                                aggregation="sequence-mean-token-mean")[0]
    return nnx.grad(loss, argnums=nnx.DiffState(0, nnx.LoRAParam))(model)

  ratios = {v: [] for v in VARIANTS}
  moved, cosines, norm_ratios = [], [], []
  for v, policy in by_variant.items():
    engine = engine_for(policy, tokenizer, mesh)
    batches = decode_precision.draw_batches(engine, tokenizer, mesh, c, steps)
    for step, (drawn, completion_BxT) in enumerate(batches):
      width = completion_BxT.shape[1]
      prompt_BxP = jnp.asarray(drawn.left_padded_prompt_tokens)
      completion_BxT = jnp.asarray(completion_BxT)
      pad = engine.pad_id()
      with mesh:
        train_BxT = np.asarray(logps(policy, prompt_BxP, completion_BxT, pad))
      for row, sample_logps in enumerate(drawn.logprobs):
        ratios[v].extend((train_BxT[row, :len(sample_logps)] - np.asarray(sample_logps)).tolist())
      if v != "bfloat16":
        continue
      # The same tokens through the float32 trainer, and both gradients.
      lengths = np.array([len(t) for t in drawn.tokens])
      mask_BxT = jnp.asarray(np.arange(width)[None] < lengths[:, None], jnp.float32)
      advantages = np.random.default_rng(step).normal(size=(len(lengths) // g, g))
      advantages = (advantages - advantages.mean(1, keepdims=True)) / advantages.std(1, keepdims=True)
      advantages_B = jnp.asarray(advantages.reshape(-1), jnp.float32)
      exact = by_variant["float32"]
      with mesh:
        exact_BxT = np.asarray(logps(exact, prompt_BxP, completion_BxT, pad))
        grads = [jnp.concatenate([x.reshape(-1) for x in jax.tree.leaves(
            lora_gradient(m, prompt_BxP, completion_BxT, advantages_B, mask_BxT, pad))])
                 for m in (exact, policy)]
      for row, n in enumerate(lengths):
        moved.extend((train_BxT[row, :n] - exact_BxT[row, :n]).tolist())
      g32, g16 = (np.asarray(x, np.float64) for x in grads)
      cosines.append(float(g32 @ g16 / np.linalg.norm(g32) / np.linalg.norm(g16)))
      norm_ratios.append(float(np.linalg.norm(g16) / np.linalg.norm(g32)))
  out = {}
  for v in VARIANTS:
    ratio = np.exp(np.asarray(ratios[v]))
    out[v] = {"tokens": len(ratio), "ratio_quantiles": _quantiles(ratio),
              "ratio_min_max": [float(ratio.min()), float(ratio.max())],
              "outside_clip": float(np.mean((ratio < CLIP_LOW) | (ratio > CLIP_HIGH)))}
  moved = np.asarray(moved)
  out["trainer_log_prob_change"] = {"tokens": len(moved), "mean_abs": float(np.abs(moved).mean()),
                                    "quantiles": _quantiles(moved)}
  out["gradient"] = {"cosine": cosines, "norm_ratio": norm_ratios}
  return out


def print_results(results: dict) -> None:
  if "greedy" in results:
    import decode_precision  # pylint: disable=g-import-not-at-top

    decode_precision.print_results({"greedy": results["greedy"]})
  if "sampled" in results:
    s = results["sampled"]
    for v in VARIANTS:
      row, q = s[v], s[v]["ratio_quantiles"]
      print(f"{v:8} engine and trainer: {row['tokens']} tokens; pi_train/pi_sample 0.1% {q[0.001]:.4f},"
            f" 1% {q[0.01]:.4f}, 50% {q[0.5]:.4f}, 99% {q[0.99]:.4f}, 99.9% {q[0.999]:.4f};"
            f" min {row['ratio_min_max'][0]:.4f} max {row['ratio_min_max'][1]:.4f};"
            f" outside [{CLIP_LOW}, {CLIP_HIGH}]: {row['outside_clip']:.3%}")
    m, q = s["trainer_log_prob_change"], s["trainer_log_prob_change"]["quantiles"]
    print(f"trainer log-probs, bfloat16 products minus float32, {m['tokens']} tokens: mean |d|"
          f" {m['mean_abs']:.2e}; 0.1% {q[0.001]:+.4f}, 1% {q[0.01]:+.4f}, 50% {q[0.5]:+.4f},"
          f" 99% {q[0.99]:+.4f}, 99.9% {q[0.999]:+.4f}")
    gr = s["gradient"]
    print("LoRA gradient of the policy loss, bfloat16 products against float32, per batch: cosine "
          + " ".join(f"{x:.4f}" for x in gr["cosine"]) + "; norm ratio "
          + " ".join(f"{x:.3f}" for x in gr["norm_ratio"]))


def main(argv=None) -> int:
  args = parse_args(argv)
  import decode_precision  # pylint: disable=g-import-not-at-top
  import rollout as rollout_bench  # pylint: disable=g-import-not-at-top

  if args.smoke:
    model_dir = common.tiny_hf_dir(pathlib.Path(args.json.parent if args.json else "/tmp") / "tiny_hf")
  else:
    model_dir = common.offline_270m_dir()
  actor, tokenizer, mesh = rollout_bench.build_policy(model_dir)
  by_variant = policies(actor)
  results = {}
  if args.part in ("greedy", "both"):
    results["greedy"] = decode_precision.greedy_agreement(
        actor, tokenizer, mesh, args.smoke,
        variants={name: (policy, "float32") for name, policy in by_variant.items()})
  if args.part in ("sampled", "both"):
    results["sampled"] = sampled(by_variant, tokenizer, mesh, args.sampled_steps, args.smoke)
  print_results(results)
  if args.json:
    args.json.write_text(json.dumps(results, indent=1, default=str))
  return 0


if __name__ == "__main__":
  sys.exit(main())
