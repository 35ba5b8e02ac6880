"""The GRPO update's gradient program on Gemma-3-270M shapes, timed and broken down by op kind.

  flock /tmp/gemma_grpo_heavy.lock python bench/update_step.py [--profile] [--repeats 5] [--matmul-dtype bfloat16]
About 1.5 min on a quiet 2-core CPU (2.5 with --profile).

The program is the trainer's: value and LoRA gradient of losses.policy_loss
(grpo: beta 0.08, epsilon 0.2) on losses.per_token_logps_and_entropy of a
LoRA policy (r=32, alpha=32, lora.apply), jitted. Workload shapes are the
fixed workload's (bench/common.py): 4 prompts x 2 generations, prompts
--prompt-len tokens wide (157, the trainer's width on its first steps, by
default), 64 completion tokens. Weights are random, float32, in the 270M's
shapes (speed does not depend on their values); the adapters' B matrices are
set non-zero so that no product is trivially zero.

The jitted program also hands the model's state back (nnx.jit does); the
trainer donates it and this script does not, so every call here includes
copying it (the 671 MB embedding among it: ~70 ms of one thread).

Prints the compiled program's temporaries (XLA's memory_analysis(): the
buffers it needs besides its arguments and outputs, which is what the update
adds to the trainer's resident memory), the median seconds of --repeats
calls after one warm-up, and with
--profile one more call under jax.profiler, summed by XLA:CPU op kind (thread
seconds: both threads' time, so it exceeds the wall time): YNNPACK dot
fusions, copy/transpose fusions, and the rest. Also prints this machine's
float32 and bfloat16-in/float32-out matmul rates (a jitted 2048^3 product,
best of 5), which bound what a dot can do here.

To compare two commits, run this file with PYTHONPATH pointing at a checkout
of each (gemma_grpo is imported from the path, not from this file's repo).
Asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import pathlib
import re
import statistics
import sys
import tempfile
import time

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
from tunix.models.gemma3 import model as gemma3

# Appended, not prepended: a PYTHONPATH checkout (an A/B run) wins.
sys.path.append(str(pathlib.Path(__file__).resolve().parents[1]))

from configs import base  # pylint: disable=g-import-not-at-top,wrong-import-position
from gemma_grpo.config import settings
from gemma_grpo.model import gemma3_rl
from gemma_grpo.model import lora
from gemma_grpo.rl.learner import losses
from gemma_grpo.runtime import mesh as mesh_lib

PROMPTS, GENERATIONS, NEW_TOKENS, PAD = 4, 2, 64, 0


def policy(mesh):
  """The 270M-shaped float32 LoRA policy with non-zero adapters."""
  c = settings.from_config(base.get_config())
  config = dataclasses.replace(gemma3.ModelConfig.gemma3_270m(), param_dtype=jnp.float32)
  with jax.set_mesh(mesh):
    model = gemma3_rl.Gemma3(config, rngs=nnx.Rngs(0))
  actor = lora.apply(model, c.lora, mesh)
  adapters = nnx.state(actor, nnx.LoRAParam)
  nnx.update(actor, jax.tree.map(lambda x: x + 0.01, adapters))
  return actor


def batch(prompt_len: int) -> dict:
  rng = np.random.default_rng(0)
  prompts_UxP = rng.integers(10, 20000, (PROMPTS, prompt_len))
  prompts_UxP[:, :prompt_len // 4] = PAD  # left padding, as the shorter prompts have
  rows = PROMPTS * GENERATIONS
  return {
      "prompts": jnp.asarray(np.repeat(prompts_UxP, GENERATIONS, axis=0)),
      "completions": jnp.asarray(rng.integers(10, 20000, (rows, NEW_TOKENS))),
      "advantages": jnp.asarray(rng.normal(size=rows), jnp.float32),
      "ref_logps": jnp.asarray(rng.normal(size=(rows, NEW_TOKENS)) - 3.0, jnp.float32),
  }


def update_program(inputs: dict):
  def loss(model):
    logps_BxT, _ = losses.per_token_logps_and_entropy(
        model, inputs["prompts"], inputs["completions"], PAD, 1, 0.9, group_size=GENERATIONS)
    value, _ = losses.policy_loss(
        logps_BxT, inputs["advantages"], inputs["completions"] != PAD,
        ref_logps_BxT=inputs["ref_logps"], epsilon_low=0.2, epsilon_high=0.2, beta=0.08,
        sequence_ratio=False, aggregation="sequence-mean-token-mean")
    return value

  return nnx.jit(nnx.value_and_grad(loss, argnums=nnx.DiffState(0, nnx.LoRAParam)))


def matmul_rates() -> dict:
  size = 2048
  rates = {}
  for name, dtype in (("float32", jnp.float32), ("bfloat16 in, float32 out", jnp.bfloat16)):
    a = jnp.ones((size, size), dtype)
    product = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
    product(a, a).block_until_ready()
    best = float("inf")
    for _ in range(5):
      start = time.perf_counter()
      product(a, a).block_until_ready()
      best = min(best, time.perf_counter() - start)
    rates[name] = 2 * size ** 3 / best / 1e9
  return rates


def op_kind_seconds(trace_dir: str) -> dict[str, float]:
  """Thread seconds of the profiled call by XLA:CPU op kind."""
  path = sorted(pathlib.Path(trace_dir).rglob("*.xplane.pb"))[-1]
  profile = jax.profiler.ProfileData.from_file(str(path))
  totals = collections.Counter()
  for plane in profile.planes:
    if plane.name != "/host:CPU":
      continue
    for line in plane.lines:
      if line.name == "python":
        continue
      for event in line.events:
        if event.name.startswith(("ThunkExecutor", "SlinkyThreadPool", "ThreadpoolListener")):
          continue  # wrappers and waits around the ops themselves
        name = re.sub(r"\.\d+$", "", event.name)
        kind = ("dot (YNNPACK)" if name.startswith("ynn_fusion")
                else "copy/transpose" if name.startswith("copy") or "transpose" in name
                else "other")
        totals[kind] += event.duration_ns / 1e9
  return dict(totals)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  p.add_argument("--prompt-len", type=int, default=157)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--profile", action="store_true")
  p.add_argument("--matmul-dtype", choices=("float32", "bfloat16"), default="float32",
                 help="model.matmul_dtype of the policy")
  args = p.parse_args()
  c = settings.from_config(base.get_config())
  mesh = mesh_lib.make_mesh(c.mesh)
  actor = policy(mesh)
  actor.matmul_dtype = None if args.matmul_dtype == "float32" else args.matmul_dtype
  inputs = batch(args.prompt_len)
  step = update_program(inputs)
  result = {"gemma_grpo": gemma3_rl.__file__, "prompt_len": args.prompt_len,
            "matmul_dtype": args.matmul_dtype}
  with jax.set_mesh(mesh):
    memory = step.lower(actor).compile().memory_analysis()
    result["temporaries_mib"] = round(memory.temp_size_in_bytes / 2**20, 1)
    jax.block_until_ready(step(actor))
    times = []
    for _ in range(args.repeats):
      start = time.perf_counter()
      loss, _ = jax.block_until_ready(step(actor))
      times.append(time.perf_counter() - start)
    result["loss"] = float(loss)
    result["seconds"] = [round(t, 3) for t in times]
    result["median_seconds"] = round(statistics.median(times), 3)
    if args.profile:
      with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        jax.block_until_ready(step(actor))
        jax.profiler.stop_trace()
        result["thread_seconds_by_op_kind"] = {
            k: round(v, 2) for k, v in sorted(op_kind_seconds(trace_dir).items())}
  result["matmul_gflops"] = {k: round(v, 1) for k, v in matmul_rates().items()}
  print(json.dumps(result))


if __name__ == "__main__":
  main()
