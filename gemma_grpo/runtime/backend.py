"""The platform a program being traced will run on: the devices of its mesh, or this process's.

Layouts and shortcuts measured faster on XLA:CPU (decode_dots' transposed
products, the LM head's screen) are chosen only for programs that run on a
CPU; a GPU or TPU program is built the plain way until a measurement on that
backend says otherwise (BENCHMARKS.md, "GPU"). `gemma-grpo plan` traces GPU
and TPU programs on a CPU host under the slice's mesh, so the mesh's devices
decide, and JAX keys its traces on the mesh context, so a CPU program and a
TPU program of the same function never share one.
"""

from __future__ import annotations

import jax

from gemma_grpo.seam import jax_mesh

_NAMES = {"cuda": "gpu", "rocm": "gpu"}  # plugin names, as jax.default_backend() says them


def target_platform() -> str:
  """"cpu", "gpu" or "tpu": where the program traced now will run."""
  mesh = jax_mesh.current_mesh()
  platform = jax.default_backend() if mesh.empty else mesh.devices.flat[0].platform
  return _NAMES.get(platform, platform)


def on_cpu() -> bool:
  return target_platform() == "cpu"
