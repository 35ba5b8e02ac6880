# Evidence, committed with its output in 44cdf16: it imports the module paths and signatures of then
# (they have moved since). To rerun it: git worktree add /tmp/at-44cdf16 44cdf16
import sys, time, statistics, os
sys.path.insert(0, "bench"); sys.path.insert(0, ".")
import jax, jax.numpy as jnp
from flax import nnx
import update_step as us
from configs import base
from gemma_grpo import mesh as mesh_lib, losses
c = base.get_config()
mesh = mesh_lib.make_mesh(c.mesh)
actor = us.policy(mesh)
inputs = us.batch(157)
g, lora_state, rest = nnx.split(actor, nnx.LoRAParam, ...)
def loss_fn(lora_state, rest):
    model = nnx.merge(g, lora_state, rest)
    logps, _ = losses.per_token_logps_and_entropy(model, inputs["prompts"], inputs["completions"], 0, 1, 0.9, group_size=2)
    v, _ = losses.policy_loss(logps, inputs["advantages"], inputs["completions"] != 0, ref_logps_BxT=inputs["ref_logps"],
        epsilon_low=0.2, epsilon_high=0.2, beta=0.08, sequence_ratio=False, aggregation="sequence-mean-token-mean")
    return v
f = jax.jit(jax.value_and_grad(loss_fn))
OPTS = {"default": {}}
for a in sys.argv[1:]:
    k, v = a.split("=")
    OPTS[a] = {k: {"false": False, "true": True}.get(v, v)}
with jax.set_mesh(mesh):
    lowered = f.lower(lora_state, rest)
    comp = {}
    for name, o in OPTS.items():
        t0 = time.perf_counter()
        comp[name] = lowered.compile(compiler_options=o)
        print(name, "compile", round(time.perf_counter()-t0,1), flush=True)
    times = {n: [] for n in OPTS}
    for r in range(5):
        for n, cf in comp.items():
            t0 = time.perf_counter(); out = jax.block_until_ready(cf(lora_state, rest)); times[n].append(time.perf_counter()-t0)
            if r == 0: print(n, "loss", float(out[0]))
    for n, ts in times.items():
        print(f"{n:60s} min {min(ts):.3f} med {statistics.median(ts):.3f}", [round(t,2) for t in ts])
