# Evidence, committed with its output in 44cdf16: it imports the module paths and signatures of then
# (they have moved since). To rerun it: git worktree add /tmp/at-44cdf16 44cdf16
"""The update program with the attention output's LoRA through lora_dot (this checkout) and
through Qwix (gemma3_rl._attention_runs_here forced False while tracing), alternated in one process."""
import sys, time, statistics
sys.path.insert(0, "bench"); sys.path.insert(0, ".")
import jax, jax.numpy as jnp
from flax import nnx
import update_step as us
from configs import base
from gemma_grpo import mesh as mesh_lib, losses, gemma3_rl
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
own = gemma3_rl._attention_runs_here
programs = {}
with jax.set_mesh(mesh):
    for name, runs_here in (("qwix output", lambda attn: False), ("lora_dot output", own)):
        gemma3_rl._attention_runs_here = runs_here
        programs[name] = jax.jit(jax.value_and_grad(loss_fn)).lower(lora_state, rest).compile()
    gemma3_rl._attention_runs_here = own
    times = {n: [] for n in programs}
    values = {}
    for r in range(int(sys.argv[1]) + 1):
        for n, p in programs.items():
            t0 = time.perf_counter(); v, grads = jax.block_until_ready(p(lora_state, rest)); dt = time.perf_counter() - t0
            if r: times[n].append(dt)
            values[n] = (float(v), grads)
        print("round", r, {n: round(t[-1], 2) for n, t in times.items() if t}, flush=True)
print({n: v[0] for n, v in values.items()})
gq, go = values["qwix output"][1], values["lora_dot output"][1]
rel = max(float(jnp.abs(a - b).max() / (jnp.abs(a).max() + 1e-30)) for a, b in zip(jax.tree.leaves(gq), jax.tree.leaves(go)))
print("largest gradient difference relative to its leaf's largest entry:", f"{rel:.2e}")
for n, t in times.items():
    print(f"{n:18s} fastest {min(t):.3f} s, median {statistics.median(t):.3f} s; rounds {[round(x, 2) for x in t]}")
