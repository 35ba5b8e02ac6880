"""Is XLA:CPU's 8-row LM-head dot limited by memory or by arithmetic? Ad hoc; asserts nothing.

Times, in one process, the float32 decode head as the engine writes it
(W [V, D] times 8 rows, the result [V, B]) against a jitted sum that reads the
same 671 MB, and the process's CPU time over wall time for each. Run it on
both cores and on one (taskset -c 0): a memory-bound kernel barely slows on
one core, an arithmetic-bound one takes twice as long. With --forms, other
ways of writing the same product, for comparison: the logits as [B, V], a
multiply-and-sum that XLA fuses instead of a dot, and numpy's (OpenBLAS).
"""

import sys

import time

import jax
import jax.numpy as jnp
import numpy as np

VOCAB, WIDTH, ROWS, ROUNDS = 262144, 640, 8, 20


def timed(fn):
  fn()
  walls, cpu0, wall0 = [], time.process_time(), time.perf_counter()
  for _ in range(ROUNDS):
    start = time.perf_counter()
    fn()
    walls.append(time.perf_counter() - start)
  busy = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
  return 1e3 * min(walls), 1e3 * float(np.median(walls)), busy


def main():
  rng = np.random.default_rng(0)
  head_VxD = jnp.asarray(rng.standard_normal((VOCAB, WIDTH), dtype=np.float32))
  rows_BxD = jnp.asarray(rng.standard_normal((ROWS, WIDTH), dtype=np.float32))
  dot = jax.jit(lambda x, w: w @ x.T)
  read = jax.jit(jnp.sum)
  gigabytes = head_VxD.nbytes / 1e9
  gflop = 2 * VOCAB * WIDTH * ROWS / 1e9
  forms = [
      ("head dot [V,D]x[D,B]", lambda: dot(rows_BxD, head_VxD).block_until_ready(), gflop),
      ("sum of the same bytes", lambda: read(head_VxD).block_until_ready(), None)]
  if "--forms" in sys.argv:
    rows_major = jax.jit(lambda x, w: x @ w.T)
    fused = jax.jit(lambda x, w: jnp.sum(w[:, None, :] * x[None], axis=-1))
    head_np, rows_np = np.asarray(head_VxD), np.asarray(rows_BxD)
    forms += [
        ("head dot as [B,V]", lambda: rows_major(rows_BxD, head_VxD).block_until_ready(), gflop),
        ("multiply-and-sum [V,B]", lambda: fused(rows_BxD, head_VxD).block_until_ready(), gflop),
        ("numpy W @ x.T", lambda: head_np @ rows_np.T, gflop)]
  for name, fn, flop in forms:
    fastest, median, busy = timed(fn)
    rate = f"{flop / fastest * 1e3:5.1f} GFLOP/s" if flop else " " * 13
    print(f"{name:24s} fastest {fastest:6.1f} ms  median {median:6.1f} ms  "
          f"{gigabytes / fastest * 1e3:5.1f} GB/s  {rate}  cores busy {busy:.2f}")


if __name__ == "__main__":
  main()
