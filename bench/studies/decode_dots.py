"""Layouts of the decode step's projection dots on this CPU, timed in one process.

  python bench/studies/decode_dots.py [--repeats 41]

A decode step multiplies a few rows (8: the fixed workload's 4 prompts x 2)
by each layer's projections. This times the projections of Gemma-3-270M's
18 layers (queries [640 -> 1024], keys/values [640 -> 512], output
[1024 -> 640], gate/up [640 -> 4096], down [2048 -> 640]; distinct random
weights per layer, 401 MB in float32, so they stream from memory as in a
real step) in one jitted program, with the weights in three layouts:

  [in, out]        x @ W, the engine's layout before 2026-12-02
  [out, in] -> [B, out]   einsum("bi,oi->bo")
  [out, in] -> [out, B]^T einsum("bi,oi->ob"), an optimization barrier, then
                   the transpose (gemma_grpo.rl.engine.decode_dots.project's float32 path)

for float32 and bfloat16 weights (bfloat16 x bfloat16 accumulated in
float32), the layouts interleaved, median of --repeats, and prints ms per
call and the read rate it implies. Asserts nothing.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

LAYERS, ROWS, WIDTH, MLP_WIDTH = 18, 8, 640, 2048
SHAPES = {"query": (WIDTH, 1024), "key_value": (WIDTH, 512), "out": (1024, WIDTH),
          "gate_up": (WIDTH, 2 * MLP_WIDTH), "down": (MLP_WIDTH, WIDTH)}  # [in, out]


def in_out(x, w_IxO):
  return jnp.matmul(x.astype(w_IxO.dtype), w_IxO, preferred_element_type=jnp.float32)


def out_in_rows(x, w_OxI):
  return jnp.einsum("bi,oi->bo", x.astype(w_OxI.dtype), w_OxI, preferred_element_type=jnp.float32)


def out_in_transposed(x, w_OxI):
  y_OxB = jnp.einsum("bi,oi->ob", x.astype(w_OxI.dtype), w_OxI, preferred_element_type=jnp.float32)
  return jax.lax.optimization_barrier(y_OxB).T


def layers_program(project):
  """18 layers' projections, wired like a decode step (residual, gated MLP)."""

  @jax.jit
  def run(x_BxD, weights):
    for w in weights:
      query = project(x_BxD, w["query"])
      key_value = project(x_BxD, w["key_value"])
      out = project(query, w["out"])
      gate_up = project(x_BxD, w["gate_up"])
      down = project(jnp.tanh(gate_up[:, :MLP_WIDTH]) * gate_up[:, MLP_WIDTH:], w["down"])
      x_BxD = x_BxD + 0.01 * (out + down + key_value[:, :1])
    return x_BxD

  return run


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  p.add_argument("--repeats", type=int, default=41)
  args = p.parse_args()
  key = jax.random.PRNGKey(0)
  x_BxD = jax.random.normal(key, (ROWS, WIDTH), jnp.float32)
  print(f"{jax.device_count()} {jax.devices()[0].platform} device(s); {LAYERS} layers x {ROWS} rows")
  print("dtype | layout | ms per call | weights read | GB/s")
  for dtype in (jnp.float32, jnp.bfloat16):
    weights_IxO = [{name: (0.02 * jax.random.normal(jax.random.fold_in(key, 100 * i + layer), shape)
                           ).astype(dtype) for i, (name, shape) in enumerate(SHAPES.items())}
                   for layer in range(LAYERS)]
    weights_OxI = jax.tree.map(lambda w: jnp.asarray(w.T), weights_IxO)
    runs = {"[in, out]": (layers_program(in_out), weights_IxO),
            "[out, in] -> [B, out]": (layers_program(out_in_rows), weights_OxI),
            "[out, in] -> [out, B]^T": (layers_program(out_in_transposed), weights_OxI)}
    outputs = {name: np.asarray(run(x_BxD, w)) for name, (run, w) in runs.items()}  # compiles
    first = next(iter(outputs.values()))
    for name, y in outputs.items():  # the same numbers, whatever the layout
      assert np.allclose(y, first, atol=1e-4 if dtype == jnp.float32 else 5e-2), name
    times = {name: [] for name in runs}
    for _ in range(args.repeats):
      for name, (run, w) in runs.items():
        start = time.perf_counter()
        run(x_BxD, w).block_until_ready()
        times[name].append(time.perf_counter() - start)
    read = LAYERS * sum(np.prod(s) for s in SHAPES.values()) * jnp.dtype(dtype).itemsize
    for name, ts in times.items():
      ms = np.median(ts) * 1e3
      print(f"{jnp.dtype(dtype).name} | {name} | {ms:.2f} | {read / 1e6:.0f} MB | {read / ms / 1e6:.1f}")


if __name__ == "__main__":
  main()
