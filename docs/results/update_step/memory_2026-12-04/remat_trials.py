# Evidence, committed with its output in 97c6b66: it imports the module paths and signatures of then
# (they have moved since). To rerun it: git worktree add /tmp/at-97c6b66 97c6b66
"""Ad hoc (2026-12-04): XLA temporaries of the update program under jax.checkpoint policies.

  PYTHONPATH=<checkout before f368d0a> python remat_trials.py {none,gateup,nothing}

Runs against a checkout from before the recomputed feed-forward (it wraps
that checkout's gemma3_rl._feed_forward, which used _linear), on the
shapes of bench/update_step.py (270M, float32, random weights). Prints the
compiled value-and-grad program's temp size, the loss, and the median of 3
calls. `none` is the checkout as it is; `gateup` wraps the feed-forward in
jax.checkpoint saving only the gate and up outputs; `nothing` saves nothing.
With XLA_FLAGS=--xla_dump_to=DIR, aggregate_buffers.py DIR lists the
largest buffer kinds of the program.
"""
import functools
import json
import pathlib
import statistics
import sys
import time

sys.path.append(str(pathlib.Path(__file__).resolve().parents[4] / "bench"))
sys.path.append(str(pathlib.Path(__file__).resolve().parents[4]))

from flax import nnx  # noqa: E402
import jax  # noqa: E402
from jax.ad_checkpoint import checkpoint_name  # noqa: E402
from tunix.utils import sharding_utils  # noqa: E402

import update_step as us  # noqa: E402
from configs import base  # noqa: E402
from gemma_grpo import gemma3_rl, losses  # noqa: E402
from gemma_grpo import mesh as mesh_lib  # noqa: E402

policy_name = sys.argv[1]


def named_feed_forward(mlp, x, lora_scale, matmul_dtype):
  linear = functools.partial(gemma3_rl._linear, lora_scale=lora_scale, matmul_dtype=matmul_dtype)
  gate = checkpoint_name(linear(mlp.gate_proj, x), "ffw_gate")
  up = checkpoint_name(linear(mlp.up_proj, x), "ffw_up")
  return linear(mlp.down_proj, sharding_utils.shard(nnx.gelu(gate) * up, mlp.config.shd_config.act_btf))


if policy_name != "none":
  policy = {"gateup": jax.checkpoint_policies.save_only_these_names("ffw_gate", "ffw_up"),
            "nothing": jax.checkpoint_policies.nothing_saveable}[policy_name]

  def checkpointed(mlp, x, lora_scale, matmul_dtype):
    graphdef, state = nnx.split(mlp)

    @functools.partial(jax.checkpoint, policy=policy)
    def inner(state, x):
      return named_feed_forward(nnx.merge(graphdef, state), x, lora_scale, matmul_dtype)
    return inner(state, x)

  gemma3_rl._feed_forward = checkpointed

mesh = mesh_lib.make_mesh(base.get_config().mesh)
actor = us.policy(mesh)
inputs = us.batch(157)
graphdef, lora_state, rest = nnx.split(actor, nnx.LoRAParam, ...)


def loss(lora_state, rest):
  model = nnx.merge(graphdef, lora_state, rest)
  logps, _ = losses.per_token_logps_and_entropy(
      model, inputs["prompts"], inputs["completions"], us.PAD, 1, 0.9, group_size=us.GENERATIONS)
  value, _ = losses.policy_loss(
      logps, inputs["advantages"], inputs["completions"] != us.PAD, ref_logps_BxT=inputs["ref_logps"],
      epsilon_low=0.2, epsilon_high=0.2, beta=0.08, sequence_ratio=False,
      aggregation="sequence-mean-token-mean")
  return value


with jax.set_mesh(mesh):
  compiled = jax.jit(jax.value_and_grad(loss)).lower(lora_state, rest).compile()
  out = jax.block_until_ready(compiled(lora_state, rest))
  times = []
  for _ in range(3):
    start = time.perf_counter()
    out = jax.block_until_ready(compiled(lora_state, rest))
    times.append(time.perf_counter() - start)
print(json.dumps({"gemma_grpo": gemma3_rl.__file__, "policy": policy_name,
                  "temporaries_mib": round(compiled.memory_analysis().temp_size_in_bytes / 2**20, 1),
                  "loss": float(out[0]), "median_s": round(statistics.median(times), 2)}))
