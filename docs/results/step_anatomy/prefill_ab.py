import sys, time
exec(open("docs/results/step_anatomy/prefill_parts.py").read().split("def t(name")[0])
import functools
orig = rollout.decode_weights
def run(screened, merge):
    rollout.decode_weights = orig if merge else (lambda m, s, d=None: [])
    f = rollout._prefill.__wrapped__ if hasattr(rollout._prefill, "__wrapped__") else None
    return jax.jit(functools.partial(f, lora_scale=1.0, rows_per_prompt=G, new_tokens=64, pad_id=pad, sampling=sampling, decode_dtype="float32", screened=screened))
with mesh:
    g, s = nnx.split(actor)
    variants = {}
    for name, sc, mg in (("full", True, True), ("no screen", False, True), ("no merge", True, False), ("neither", False, False)):
        fn = run(sc, mg)
        jax.block_until_ready(fn(g, s, ids, jax.random.PRNGKey(0)))
        variants[name] = fn
    ts = {n: [] for n in variants}
    for r in range(6):
        for n, fn in variants.items():
            t0 = time.perf_counter(); jax.block_until_ready(fn(g, s, ids, jax.random.PRNGKey(0))); ts[n].append(time.perf_counter()-t0)
    import statistics
    for n, t in ts.items(): print(f"{n:10s} min {min(t):.3f} med {statistics.median(t):.3f}")
