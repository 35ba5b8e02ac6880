"""The accelerators `gemma-grpo plan` targets: each chip's public figures, each slice's shape.

Per chip (one JAX device; v4 and v5p chips run their two TensorCores as one
"megacore" device): HBM capacity, peak dense bfloat16 FLOP/s, HBM bandwidth.
Sources, the vendors' product pages:
  TPU v4   cloud.google.com/tpu/docs/v4    32 GiB, 275 TFLOP/s, 1,228 GB/s
  TPU v5e  cloud.google.com/tpu/docs/v5e   16 GiB, 197 TFLOP/s,   819 GB/s
  TPU v5p  cloud.google.com/tpu/docs/v5p   95 GB,  459 TFLOP/s, 2,765 GB/s
  TPU v6e  cloud.google.com/tpu/docs/v6e   32 GB,  918 TFLOP/s, 1,640 GB/s
  H100 SXM nvidia.com/en-us/data-center/h100  80 GB, 989 TFLOP/s (dense), 3.35 TB/s
  H200 SXM nvidia.com/en-us/data-center/h200 141 GB, 989 TFLOP/s (dense), 4.8 TB/s
A slice's name follows Cloud TPU's accelerator types, whose number counts
TensorCores: v4-8 and v5p-8 are 4 chips, v5e-8 and v6e-8 are 8.
"""

from __future__ import annotations

import dataclasses

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One device's public figures."""

  name: str
  hbm_bytes: int
  peak_flops: float  # dense bfloat16 (float32 on a CPU) per second
  hbm_bandwidth: float  # bytes per second


@dataclasses.dataclass(frozen=True)
class Topology:
  """A slice: its chip, and how JAX describes it for compiling without one.

  Attributes:
    name: the accelerator type as users write it (v5e-8).
    chip: the chip's figures.
    platform: "tpu", "cuda" or "cpu".
    topology: get_topology_desc's topology name (v5e:2x4) or, for NVIDIA,
      its "slices x hosts x devices per host" string.
    chip_config: TPU chip config ("default" | "megacore").
    chips_per_host: TPU chips per host as (x, y, z) bounds.
  """

  name: str
  chip: Chip
  platform: str
  topology: str
  chip_config: str = "default"
  chips_per_host: tuple[int, int, int] = (1, 1, 1)


V4 = Chip("TPU v4", 32 * GIB, 275e12, 1228e9)
V5E = Chip("TPU v5e", 16 * GIB, 197e12, 819e9)
V5P = Chip("TPU v5p", 95 * 10**9, 459e12, 2765e9)
V6E = Chip("TPU v6e", 32 * 10**9, 918e12, 1640e9)
H100 = Chip("NVIDIA H100 SXM", 80 * 10**9, 989e12, 3.35e12)
H200 = Chip("NVIDIA H200 SXM", 141 * 10**9, 989e12, 4.8e12)

TOPOLOGIES = {t.name: t for t in (
    Topology("v4-8", V4, "tpu", "v4:2x2x1", "megacore", (2, 2, 1)),
    Topology("v5e-1", V5E, "tpu", "v5e:1x1", "default", (1, 1, 1)),
    Topology("v5e-4", V5E, "tpu", "v5e:2x2", "default", (2, 2, 1)),
    Topology("v5e-8", V5E, "tpu", "v5e:2x4", "default", (2, 4, 1)),
    Topology("v5e-16", V5E, "tpu", "v5e:4x4", "default", (2, 4, 1)),
    Topology("v5p-8", V5P, "tpu", "v5p:2x2x1", "megacore", (2, 2, 1)),
    Topology("v6e-1", V6E, "tpu", "v6e:1x1", "default", (1, 1, 1)),
    Topology("v6e-8", V6E, "tpu", "v6e:2x4", "default", (2, 4, 1)),
    Topology("h100-1", H100, "cuda", "1x1x1"),
    Topology("h100-8", H100, "cuda", "1x1x8"),
    Topology("h200-1", H200, "cuda", "1x1x1"),
    Topology("h200-8", H200, "cuda", "1x1x8"),
)}
ALIASES = {"v5litepod-1": "v5e-1", "v5litepod-4": "v5e-4", "v5litepod-8": "v5e-8",
           "v5litepod-16": "v5e-16"}
CPU = "cpu"  # this machine's own devices, with figures measured by bench/roofline.py


def topology(name: str) -> Topology:
  """The slice called `name` (aliases accepted); KeyError if unknown."""
  return TOPOLOGIES[ALIASES.get(name, name)]


def names() -> list[str]:
  return [*TOPOLOGIES, *ALIASES, CPU]


# The NVIDIA compiler's description of each GPU: XLA's GpuTargetConfig text
# proto (the form jax issue #28376 passes to get_topology_desc), with each
# chip's public figures. Only the compiler reads it; no GPU is needed.
_NVIDIA_TEMPLATE = """gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth}
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: {memory}
  shared_memory_per_block_optin: 232448
  cuda_compute_capability {{
    major: 9
  }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{
  major: 9
  minor: 7
}}
runtime_version {{
  major: 12
  minor: 8
}}
device_description_str: "{name}"
"""


def nvidia_target_config(chip: Chip) -> str:
  """The GpuTargetConfig text proto for a Hopper chip (132 SMs, compute 9.0)."""
  return _NVIDIA_TEMPLATE.format(bandwidth=int(chip.hbm_bandwidth), memory=chip.hbm_bytes,
                                 name=chip.name)
