"""Touch 11: JAX's coordination service client, which runtime/distributed.py's watchdog uses.

The watchdog (a background thread in every process) needs the key-value
store of jax.distributed's coordination service, because a collective
cannot run on a background thread; jax 0.10 has no public API for it, and
Orbax's multi-host code reads the same attribute. Removed by: a public
accessor for the coordination client (or key-value store) in JAX.
"""

from __future__ import annotations

from gemma_grpo.seam import versions

# pylint: disable=g-import-not-at-top,wrong-import-position
from jax._src import distributed as jax_distributed
from jax._src.lib import _jax
# pylint: enable=g-import-not-at-top,wrong-import-position


def coordination_client():
  """The key-value client of jax.distributed's coordination service; None before initialize()."""
  return jax_distributed.global_state.client


def _coordination_client() -> None:
  state = getattr(jax_distributed, "global_state", None)
  versions.expect(state is not None and hasattr(state, "client"), "11",
                  "jax._src.distributed.global_state.client is gone")
  client_type = getattr(_jax, "DistributedRuntimeClient", None)
  for method in ("key_value_set", "key_value_dir_get"):  # what the watchdog calls
    versions.expect(hasattr(client_type, method), "11",
                    f"the coordination client (DistributedRuntimeClient) has no {method}")


CANARIES = {"11 jax._src.distributed.global_state.client": _coordination_client}
