import jax, jax.numpy as jnp, time, numpy as np
shapes = [(2048,2048,2048),(512,640,16384),(512,16384,640),(512,2048,640),(628,640,2048),(628,2048,640)]
for m,k,n in shapes:
    a = jax.random.normal(jax.random.PRNGKey(0),(m,k)); b = jax.random.normal(jax.random.PRNGKey(1),(k,n))
    f = jax.jit(lambda a,b: a@b)
    f(a,b).block_until_ready()
    ts=[]
    for _ in range(7):
        t0=time.perf_counter(); f(a,b).block_until_ready(); ts.append(time.perf_counter()-t0)
    t=min(ts); print(f"{m}x{k}x{n}: {t*1e3:.1f} ms {2*m*k*n/t/1e9:.0f} GFLOP/s")
