"""Touch 12: JAX's legacy mesh context (`with mesh:`), the one Tunix reads.

Tunix 0.1.7's sharding helpers (tunix.sft.sharding_utils.shard_input,
tunix.utils.sharding_utils.shard) and its RLCluster's rollout and update
find the mesh through jax.interpreters.pxla.thread_resources, which only
`with mesh:` sets; jax.set_mesh, its replacement, sets another context.
JAX deprecates both `with mesh:` and the public name of thread_resources,
so the trainer enters the context here, and only here, without the
warning, and reads it from where JAX keeps it (jax._src.mesh). JAX also keys compiled programs on the mesh contexts
around a call: an eval run outside training shares the update's programs
only under the same context. Removed by: Tunix reading jax.set_mesh's
context (jax.sharding.get_abstract_mesh); the canary then fails.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings

from gemma_grpo.seam import versions

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
from jax._src import mesh as jax_mesh_internals
from tunix.sft import sharding_utils as sft_sharding
from tunix.utils import sharding_utils
# pylint: enable=g-import-not-at-top,wrong-import-position

_DEPRECATED = r"`with mesh:` context manager has been deprecated"


@contextlib.contextmanager
def tunix_mesh(mesh: jax.sharding.Mesh):
  """`with mesh:`, the context Tunix's code reads its mesh from."""
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=_DEPRECATED, category=DeprecationWarning)
    mesh.__enter__()
  try:
    yield mesh
  finally:
    mesh.__exit__(None, None, None)


def current_mesh() -> jax.sharding.Mesh:
  """The mesh of the innermost tunix_mesh (or Tunix's own `with mesh:`) in this thread."""
  return jax_mesh_internals.thread_resources.env.physical_mesh


def _tunix_reads_the_legacy_context() -> None:
  for fn in (sharding_utils.shard, sft_sharding.shard_input):
    versions.expect("thread_resources" in inspect.getsource(fn), "12",
                    f"{fn.__module__}.{fn.__name__} no longer reads pxla.thread_resources;"
                    " enter jax.set_mesh instead and drop jax_mesh.tunix_mesh")
  versions.expect(hasattr(getattr(jax_mesh_internals, "thread_resources", None), "env"), "12",
                  "jax._src.mesh.thread_resources.env is gone")


CANARIES = {"12 jax.interpreters.pxla.thread_resources (the mesh Tunix reads)":
            _tunix_reads_the_legacy_context}
