import sys, time, os
exec(open("docs/results/step_anatomy/update_opts.py").read().split("OPTS = ")[0])
with jax.set_mesh(mesh):
    for i in range(2): jax.block_until_ready(f(lora_state, rest))
    for i in range(3):
        t0 = time.perf_counter(); c0 = os.times(); jax.block_until_ready(f(lora_state, rest)); c1 = os.times(); w = time.perf_counter()-t0
        cpu = c1.user - c0.user + c1.system - c0.system
        print(f"update wall {w:.2f} cpu {cpu:.2f} ratio {cpu/w:.2f}", flush=True)
