"""The decode step's matrix products, in the layouts XLA:CPU reads fastest.

A decode step multiplies a few rows by large weights, so its cost is
reading them: on a CPU, the layouts here are the ones measured fastest
(BENCHMARKS.md, "The LM head in decode, and attention";
bench/studies/decode_dots.py). Programs for a GPU or TPU take the plain
product (runtime/backend.py): no layout was measured there.

Shapes: B rows, I inputs, O outputs, D model width, V vocabulary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gemma_grpo.runtime import backend


def project(x_BxI, w_OxI):
  """x @ w.T for decode's few rows, accumulated in float32, in x's dtype.

  Weights are laid out [out, in]. XLA:CPU's float32 dot writing [B, O]
  reads them well below the streaming rate, writing [O, B] near it; the
  barrier keeps XLA from folding the transpose back into the dot. A
  bfloat16 weight is fastest writing [B, O] directly. Both beat the
  [in, out] layout. The LM head has its own `head_logits`.
  """
  x_BxI, dtype = x_BxI.astype(w_OxI.dtype), x_BxI.dtype
  if w_OxI.dtype != jnp.float32 or not backend.on_cpu():
    return jnp.einsum("bi,oi->bo", x_BxI, w_OxI, preferred_element_type=jnp.float32).astype(dtype)
  y_OxB = jnp.einsum("bi,oi->ob", x_BxI, w_OxI)
  return jax.lax.optimization_barrier(y_OxB).T.astype(dtype)


def head_logits(normed_BxD, head_VxD):
  """float32 logits of the LM head [V, D], written [V, B] behind a barrier in any dtype.

  In float32 this is `project`'s form. Unlike the layers' bfloat16
  projections, the head's 262,144 outputs are faster written
  vocabulary-major in bfloat16 too (BENCHMARKS.md, "Decode in bfloat16").
  The screen (lm_head_screen.py) and the float32 head both go through here.
  """
  normed_BxD = normed_BxD.astype(head_VxD.dtype)
  if not backend.on_cpu():
    return jnp.einsum("bi,vi->bv", normed_BxD, head_VxD, preferred_element_type=jnp.float32)
  logits_VxB = jnp.einsum("bi,vi->vb", normed_BxD, head_VxD, preferred_element_type=jnp.float32)
  return jax.lax.optimization_barrier(logits_VxB).T
