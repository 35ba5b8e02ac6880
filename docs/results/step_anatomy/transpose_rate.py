import jax, jax.numpy as jnp, numpy as np, time
ws = [jax.random.normal(jax.random.PRNGKey(i), (640, 4096)) for i in range(18)]
f = jax.jit(lambda ws: [w.T for w in ws])
g = jax.jit(lambda ws: [w.reshape(80, 8, 512, 8).transpose(2, 3, 0, 1).reshape(4096, 640) for w in ws])
def h(ws): return [np.ascontiguousarray(np.asarray(w).T) for w in ws]
for fn in (f, g): jax.block_until_ready(fn(ws))
for _ in range(3):
  for name, fn in (("xla .T", f), ("xla tiled", g), ("numpy", h)):
    t0 = time.perf_counter(); jax.block_until_ready(fn(ws)); dt = time.perf_counter() - t0
    print(f"{name:10s} {dt*1e3:.0f} ms {18*640*4096*4/dt/1e9:.2f} GB/s")
