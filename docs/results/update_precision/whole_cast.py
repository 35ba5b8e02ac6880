# Evidence, committed with its output in abd1839: it imports the module paths and signatures of then
# (they have moved since). To rerun it: git worktree add /tmp/at-abd1839 abd1839
# As run at commit 171852a, whose flat module names (gemma_grpo.mesh, gemma_grpo.losses) it
# imports; today's are gemma_grpo.runtime.mesh and the RL learner's losses. Rerun from that checkout.
import sys, time, statistics
sys.path.insert(0, "/work/main/bench"); sys.path.insert(0, "/work/main")
import update_step as u
from flax import nnx
import jax, jax.numpy as jnp
from configs import base
from gemma_grpo import mesh as mesh_lib, losses

def cast_model(model, dtype):
  graphdef, state = nnx.split(model)
  state = jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, state)
  return nnx.merge(graphdef, state)

def program(inputs, dtype):
  def loss(model):
    m = cast_model(model, dtype) if dtype is not None else model
    logps_BxT, _ = losses.per_token_logps_and_entropy(
        m, inputs["prompts"], inputs["completions"], u.PAD, 1, 0.9, group_size=u.GENERATIONS)
    logps_BxT = logps_BxT.astype(jnp.float32)
    value, _ = losses.policy_loss(
        logps_BxT, inputs["advantages"], inputs["completions"] != u.PAD,
        ref_logps_BxT=inputs["ref_logps"], epsilon_low=0.2, epsilon_high=0.2, beta=0.08,
        sequence_ratio=False, aggregation="sequence-mean-token-mean")
    return value, logps_BxT
  return nnx.jit(nnx.value_and_grad(loss, argnums=nnx.DiffState(0, nnx.LoRAParam), has_aux=True))

c = base.get_config(); mesh = mesh_lib.make_mesh(c.mesh)
actor = u.policy(mesh); inputs = u.batch(157)
progs = {"f32": program(inputs, None), "bf16": program(inputs, jnp.bfloat16)}
out = {}
with jax.set_mesh(mesh):
  for k, p in progs.items():
    t=time.perf_counter(); out[k] = jax.block_until_ready(p(actor)); print(k, "first", time.perf_counter()-t, flush=True)
  ts = {k: [] for k in progs}
  for _ in range(3):
    for k, p in progs.items():
      t=time.perf_counter(); jax.block_until_ready(p(actor)); ts[k].append(time.perf_counter()-t)
  print({k: [round(x,2) for x in v] for k,v in ts.items()})
(lf,af),gf = out["f32"]; (lb,ab),gb = out["bf16"]
print("loss", lf, lb, "logp maxdiff", float(jnp.max(jnp.abs(af-ab))), "mean", float(jnp.mean(jnp.abs(af-ab))))
fa = jnp.concatenate([x.ravel() for x in jax.tree.leaves(gf)]); fb = jnp.concatenate([x.astype(jnp.float32).ravel() for x in jax.tree.leaves(gb)])
print("grad cos", float(fa@fb/jnp.linalg.norm(fa)/jnp.linalg.norm(fb)), "norm", float(jnp.linalg.norm(fa)), float(jnp.linalg.norm(fb)))
