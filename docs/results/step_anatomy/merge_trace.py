import sys, time
sys.path.insert(0, "bench"); sys.path.insert(0, ".")
exec(open("docs/results/step_anatomy/prefill_parts.py").read().split("def t(name")[0])
with mesh:
    g, s = nnx.split(actor)
    for i in range(3):
        jax.block_until_ready(merge_only(g, s))
    t0=time.perf_counter(); jax.block_until_ready(merge_only(g, s)); print("merge", time.perf_counter()-t0)
    jax.profiler.start_trace("/tmp/adhoc/tr_merge", create_perfetto_trace=True)
    for i in range(3):
        jax.block_until_ready(merge_only(g, s))
    jax.profiler.stop_trace()
