"""The decode loop's LM head on XLA:CPU: which output layout reads the head at streaming rate?

  flock /tmp/gemma_grpo_heavy.lock python bench/studies/lm_head.py
About 1 min on a quiet 2-core CPU.

At each decoded token the rollout engine multiplies B rows [B, D] by the tied
embedding [V, D] (Gemma-3-270M: V = 262144, D = 640; 671 MB in float32), so
the head is read once per token and the dot should cost about what reading
the head costs. In one process, for B = 8 and 16 rows and a float32 and a
bfloat16 head (bfloat16 dot accumulated in float32, as decode_dtype=bfloat16
runs it), this times (jitted, median of --repeats after a warm-up):

  read        a jitted sum over the head: what streaming it costs here
  [B, V]      einsum "bd,vd->bv": the logits written row-major, as the
              engine computed them before
  [V, B]^T    einsum "bd,vd->vb", an optimization barrier, then the
              transpose to [B, V]
  [B, V] + top-k 50 and [V, B]^T + top-k 50: the same followed by the
              sampler's top-k, as the decode step uses the logits
  engine      gemma_grpo.rl.engine.decode_dots.project (the LM head and every decode
              dot), which takes [V, B]^T for a float32 head and [B, V]
              otherwise, with the top-k

and the ratios [B, V] / [V, B]^T. Asserts nothing.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np


def median_ms(fn, args, repeats: int) -> float:
  jitted = jax.jit(fn)
  jax.block_until_ready(jitted(*args))
  seconds = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(jitted(*args))
    seconds.append(time.perf_counter() - start)
  return 1e3 * statistics.median(seconds)


def row_major(x_BxD, head_VxD):
  return jnp.einsum("bd,vd->bv", x_BxD.astype(head_VxD.dtype), head_VxD,
                    preferred_element_type=jnp.float32)


def column_major(x_BxD, head_VxD):
  logits_VxB = jnp.einsum("bd,vd->vb", x_BxD.astype(head_VxD.dtype), head_VxD,
                          preferred_element_type=jnp.float32)
  return jax.lax.optimization_barrier(logits_VxB).T


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=15)
  parser.add_argument("--vocab", type=int, default=262144)
  parser.add_argument("--width", type=int, default=640)
  args = parser.parse_args()
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
  from gemma_grpo.rl.engine import decode_dots  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(0)
  head32_VxD = rng.standard_normal((args.vocab, args.width), dtype=np.float32)
  top_k = lambda logits_BxV: jax.lax.top_k(logits_BxV, 50)
  print(f"LM head [{args.vocab}, {args.width}], median of {args.repeats}, ms")
  print("head | rows | read | [B, V] | [V, B]^T | [B, V] + top-k | [V, B]^T + top-k"
        " | engine + top-k | [B, V] / [V, B]^T | with top-k")
  for dtype in (jnp.float32, jnp.bfloat16):
    head_VxD = jnp.asarray(head32_VxD, dtype)
    read = median_ms(lambda h: jnp.sum(h, dtype=jnp.float32), (head_VxD,), args.repeats)
    for rows in (8, 16):
      x_BxD = jnp.asarray(rng.standard_normal((rows, args.width), dtype=np.float32))
      timed = {name: median_ms(fn, (x_BxD, head_VxD), args.repeats) for name, fn in (
          ("old", row_major), ("new", column_major),
          ("old_k", lambda x, h: top_k(row_major(x, h))),
          ("new_k", lambda x, h: top_k(column_major(x, h))),
          ("engine_k", lambda x, h: top_k(decode_dots.project(x, h))))}
      print(f"{jnp.dtype(dtype).name} | {rows} | {read:.1f} | {timed['old']:.1f}"
            f" | {timed['new']:.1f} | {timed['old_k']:.1f} | {timed['new_k']:.1f}"
            f" | {timed['engine_k']:.1f} | {timed['old'] / timed['new']:.2f}"
            f" | {timed['old_k'] / timed['new_k']:.2f}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
