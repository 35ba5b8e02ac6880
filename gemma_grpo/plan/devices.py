"""Devices to compile for: a TPU or NVIDIA slice described to its compiler, or this machine.

No accelerator is needed: JAX describes a TPU slice through libtpu and an
NVIDIA one through the CUDA plugin's compiler, each given the slice's shape.
"""

from __future__ import annotations

import os


from gemma_grpo.config import settings
from gemma_grpo import config as config_lib
from gemma_grpo import errors
from gemma_grpo.runtime import mesh as mesh_lib
from gemma_grpo.plan import chips

INSTALL = "pip install 'gemma-grpo[plan]'  (or pip install -e '.[plan]' in a checkout)"


def for_topology(t: chips.Topology) -> list:
  """The devices of slice `t`, as its compiler sees them."""
  # Deferred: `plan --help` and a config check need no JAX, which takes seconds.
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

  try:
    if t.platform == "tpu":
      # Describing a slice opens no TPU, but libtpu's lockfile refuses a second
      # process that loads it (two plans, or two test workers) unless allowed.
      os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
      return list(topologies.get_topology_desc(
          platform="tpu", topology_name=t.topology, chip_config_name=t.chip_config,
          chips_per_host_bounds=t.chips_per_host, num_slices=1, wrap=(False, False, False)).devices)
    return list(topologies.get_topology_desc(
        platform="cuda", topology=t.topology, target_config=chips.nvidia_target_config(t.chip)).devices)
  except (RuntimeError, ValueError, KeyError, NotImplementedError) as e:
    cause = str(e).splitlines()[0][:160]
    what = "libtpu" if t.platform == "tpu" else "the CUDA plugin (jax-cuda12-plugin)"
    missing = any(sign in cause for sign in ("Unknown backend", "No module", "not found",
                                             "Unable to initialize backend"))
    fix = f"install {what} with {INSTALL}" if missing else f"the compiler is {what}"
    raise errors.UserError(
        f"--topology {t.name}: JAX could not describe this slice ({cause}); {fix}") from None


def mesh_for(c: settings.MeshSettings, devices: list):
  """The config's (fsdp, tp) mesh over `devices`, with Auto axes as in training."""
  return mesh_lib.mesh_over(config_lib.mesh_shape(c, len(devices)), devices)
