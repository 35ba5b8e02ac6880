import sys, time
exec(open("docs/results/step_anatomy/update_opts.py").read().split("OPTS = ")[0])
with jax.set_mesh(mesh):
    for i in range(3): jax.block_until_ready(f(lora_state, rest))
    t0 = time.perf_counter(); jax.block_until_ready(f(lora_state, rest)); print("update", time.perf_counter()-t0)
    jax.profiler.start_trace("/tmp/adhoc/tr_upd", create_perfetto_trace=True)
    t0 = time.perf_counter(); jax.block_until_ready(f(lora_state, rest)); print("traced", time.perf_counter()-t0)
    jax.profiler.stop_trace()
