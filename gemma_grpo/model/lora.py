"""Qwix LoRA on Gemma-3's attention einsums and MLP projections: apply, merge.

Merge, for every LoRA-targeted weight, in float32 before any cast:
  W' = W + (alpha / r) * A·B
where A·B contracts the rank axis and lays the result out in W's axes. This is
Qwix's update (`qwix/_src/providers/lora.py`): an einsum `lhs,W->out` gains
`(alpha/r) * einsum('lhs,A,B->out')` with A holding W's axes shared with the
input (contracting or batch) plus r, and B holding r plus W's other axes; a
dot_general (nnx.Linear, kernel [in, out]) gains `(alpha/r) * x·A·B` with A
[in, r] and B [r, out].
"""

from __future__ import annotations

import threading

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import qwix

from gemma_grpo import errors
from gemma_grpo.config import settings
from gemma_grpo.runtime import mesh as mesh_lib
from gemma_grpo.seam import qwix_lora


def _probe_inputs(mesh) -> dict:
  """A one-token batch for Qwix's tracing pass, divisible by the fsdp axis."""

  batch = max(2, mesh.shape["fsdp"])
  return {
      "last_tokens": jnp.ones((batch, 1), jnp.int32),
      "positions": jnp.zeros((batch, 1), jnp.int32),
      "cache": None,
      "attention_mask": jnp.ones((batch, 1, 1), jnp.bool_),
  }


def _eager_pass_can_deadlock(mesh) -> bool:
  """Whether Qwix's eager pass must be compiled instead.

  Eager, the pass is hundreds of small programs. On a multi-device CPU mesh
  they carry collectives, and XLA:CPU (jaxlib 0.10.2) deadlocks once more
  than 32 such programs are in flight on a device. Compiled, the pass is one
  program; on one CPU device eager stays, as it is faster there (compiling
  means compiling the model's whole forward).
  """
  return mesh.size > 1 and mesh.devices.flat[0].platform == "cpu"


def _add_adapters(base, provider, rngs, mesh):
  """A clone of `base` with Qwix's adapters, which Qwix creates in a forward pass."""

  inputs = _probe_inputs(mesh)
  if not _eager_pass_can_deadlock(mesh):
    return qwix.apply_lora_to_model(base, provider, rngs=rngs, **inputs)

  @nnx.jit
  def forward_pass(model):
    model(**inputs)

  return qwix_lora.apply_lora_initialised_by(base, provider, rngs, forward_pass)


_holders: dict[type, threading.Thread] = {}
_holders_lock = threading.Lock()


def keep_interception_installed(provider_type: type) -> None:
  """Keeps Qwix's patches of JAX functions installed for the rest of the process.

  A Qwix model's call patches jnp.asarray, jnp.einsum, lax.dot_general and
  others process-wide and unpatches them when the last such call in any
  thread returns. A thread that entered a patched function just before then
  looks its original up after it is gone: KeyError from inside jnp.asarray.
  Tunix traces the policy (train step, log-probs) in one thread while another
  runs rollouts, and our train step compiles beside the first rollout, so
  the two overlap. An idle thread holding an interception of the same names
  open means they are never unpatched; threads outside a Qwix call still get
  the original functions (one lock and lookup more per call). Seam touch 9.
  """
  with _holders_lock:
    if provider_type in _holders:
      return
    holder_provider = provider_type(rules=[])  # intercepts the same names, rewrites nothing
    entered = threading.Event()

    def hold_open():
      entered.set()
      threading.Event().wait()  # until the process exits (daemon thread)

    held = qwix_lora.intercepted(hold_open, holder_provider)
    thread = threading.Thread(target=held, name=f"qwix-{provider_type.__name__}-held", daemon=True)
    thread.start()
    entered.wait()
    _holders[provider_type] = thread


def num_lora_params(model) -> int:

  return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam)))


def apply(base, s: settings.LoraSettings, mesh):
  """The LoRA policy for `base`, sharded on `mesh`.

  Qwix returns a clone of the base model with adapters. The frozen base weights
  are then pointed back into `base`, so the reference policy (`base`) and the
  actor share one copy of them instead of two.
  """

  with jax.set_mesh(mesh):
    return with_adapters(base, s, mesh)


def with_adapters(base, s: settings.LoraSettings, mesh):
  """`apply`'s work inside a mesh context the caller holds.

  Traceable: `gemma-grpo plan` runs it under `nnx.eval_shape` to build the
  policy's shapes and shardings without any weights.
  """

  provider = qwix.LoraProvider(
      module_path=f".*({s.targets})", rank=s.rank, alpha=s.alpha
  )
  keep_interception_installed(type(provider))
  actor = _add_adapters(base, provider, nnx.Rngs(s.seed), mesh)
  actor = mesh_lib.shard_model(actor, mesh)
  if num_lora_params(actor) == 0:
    raise errors.UserError(
        f"lora.targets={s.targets!r} matched no module of this model"
    )
  share_frozen_weights(source=actor, target=base)
  # Qwix's update scale, for the feed-forward that gemma3_rl runs itself.
  actor.lora_scale = s.scale
  return actor


def share_frozen_weights(*, source, target) -> None:
  """Points `target`'s non-LoRA weights at `source`'s arrays (one copy, not two).

  The two are the base model and its LoRA policy, whose frozen weights hold
  the same values.
  """

  nnx.update(target, nnx.state(source, nnx.Not(nnx.LoRAParam)))


def lora_dim_char(used: set[str]) -> str:
  """The letter Qwix names the rank axis: 'r' unless the einsum uses it."""
  if "r" not in used:
    return "r"
  return sorted(set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") - used)[0]


def einsum_lora_strs(einsum_str: str) -> tuple[str, str, str]:
  """(A axes, B axes, W axes) of Qwix LoRA on the weight of `lhs,W->out`.

  >>> einsum_lora_strs("BSD,CKDH->CBSKH")
  ('Dr', 'rCKH', 'CKDH')
  """
  inputs, _ = einsum_str.replace(" ", "").split("->")
  lhs, rhs = inputs.split(",")
  r = lora_dim_char(set(lhs) | set(rhs))
  shared = "".join(c for c in rhs if c in lhs)
  rest = "".join(c for c in rhs if c not in lhs)
  return shared + r, r + rest, rhs


def lora_delta(module, weight_name: str, a, b):
  """A·B of one adapter, in the axes of `module.<weight_name>` (unscaled).

  NumPy arrays in, NumPy out (export); JAX arrays or tracers in, JAX out
  (the rollout engine merges inside jit).
  """
  einsum_str = getattr(module, "einsum_str", None)
  if einsum_str is not None:  # Tunix Einsum: Qwix's einsum interception.
    a_str, b_str, w_str = einsum_lora_strs(einsum_str)
    recorded = getattr(module, f"{weight_name}_lora_einsum_str", None)
    if recorded is not None and recorded.split("->")[0].split(",")[1:] != [a_str, b_str]:
      raise AssertionError(f"Qwix used {recorded!r}; expected A={a_str}, B={b_str}")
    if isinstance(a, np.ndarray):
      return np.einsum(f"{a_str},{b_str}->{w_str}", a, b, optimize=True)

    return jnp.einsum(f"{a_str},{b_str}->{w_str}", a, b)
  if a.ndim == 2 and b.ndim == 2:  # nnx.Linear kernel [in, out]: dot_general.
    return a @ b
  raise NotImplementedError(
      f"LoRA merge for {type(module).__name__}.{weight_name} with A {a.shape}, B {b.shape}"
  )


def _as_float32(variable) -> np.ndarray:

  return np.asarray(jax.device_get(variable.get_value()), dtype=np.float32)


def _module_at(root, path: tuple):
  node = root
  for key in path:
    node = node[key] if isinstance(key, int) else getattr(node, key)
  return node


def merged_params(actor, scale: float) -> dict[str, np.ndarray]:
  """Every frozen parameter of `actor` as float32, with `scale`·A·B added.

  Keys are Tunix paths (`layers.0.attn.q_einsum.w`); LoRA params are consumed.
  """

  flat = dict(nnx.to_flat_state(nnx.state(actor)))
  params, adapters = {}, {}
  for path, variable in flat.items():
    last = str(path[-1])
    if isinstance(variable, nnx.LoRAParam):
      if last.endswith("_lora_a"):
        adapters[path[:-1] + (last[: -len("_lora_a")],)] = path
      continue
    params[path] = _as_float32(variable)
  for weight_path, a_path in adapters.items():
    if weight_path not in params:
      raise AssertionError(f"LoRA {a_path} has no base weight {weight_path}")
    b_path = a_path[:-1] + (str(a_path[-1])[: -len("a")] + "b",)
    a, b = _as_float32(flat[a_path]), _as_float32(flat[b_path])
    module = _module_at(actor, weight_path[:-1])
    delta = lora_delta(module, str(weight_path[-1]), a, b)
    params[weight_path] = params[weight_path] + np.float32(scale) * delta.astype(np.float32)
  return {".".join(map(str, path)): value for path, value in params.items()}
