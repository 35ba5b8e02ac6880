"""Touches 7 and 9: Qwix's LoRA, as model/lora.py applies it.

7. `apply_lora_initialised_by` passes skip_nnx_init=True to
   qwix.apply_lora_to_model and sets the qwix_rngs attribute, so that the
   forward pass that creates the adapters can run compiled (eager, it
   deadlocks XLA:CPU on 8 simulated devices). Removed by: Qwix creating
   adapters without a forward pass, or jitting it itself.
9. `intercepted` wraps a function in a provider's interceptions
   (qwix._src.interception.wrap_func_intercepted), which model/lora.py uses
   to hold an interception open in an idle thread, so Qwix never unpatches
   jnp.asarray and the other functions it intercepts. Unpatching races with
   other threads: one that entered a patched function just before looks up
   an original that is gone (KeyError in jnp.asarray during a rollout, seen
   in CI). Removed by: Qwix keeping the original function reachable from its
   patch (or never removing patches once installed).
"""

from __future__ import annotations

import inspect
from typing import Callable

from gemma_grpo.seam import versions

versions.check_versions()

# pylint: disable=g-import-not-at-top,wrong-import-position
import qwix
from qwix._src import interception
from qwix._src import model as qwix_model
# pylint: enable=g-import-not-at-top,wrong-import-position


def apply_lora_initialised_by(base, provider, rngs, init_pass: Callable[[object], None]):
  """qwix.apply_lora_to_model(base, provider), its adapters created by `init_pass(model)`.

  Qwix creates adapters inside the model's first forward; `init_pass` is that
  forward, which the caller may compile.
  """
  model = qwix.apply_lora_to_model(base, provider, rngs=rngs, skip_nnx_init=True)
  model.set_attributes(qwix_rngs=rngs)  # what Qwix's own pass initialises from
  init_pass(model)
  model.set_attributes(qwix_rngs=None)
  return model


def intercepted(fn: Callable[[], None], provider) -> Callable[[], None]:
  """`fn` run inside every interception of `provider`, as Qwix runs a model's call."""
  for get_interceptor in provider.get_interceptors():
    fn = interception.wrap_func_intercepted(fn, get_interceptor, disable_jit=provider.disable_jit)
  return fn


def _qwix_lora_init() -> None:
  source = inspect.getsource(qwix_model)
  versions.expect('"skip_nnx_init"' in source and "qwix_rngs" in source,
                  "7", "qwix.apply_lora_to_model no longer takes skip_nnx_init / reads qwix_rngs")
  versions.expect(callable(getattr(qwix, "apply_lora_to_model", None)), "7",
                  "qwix.apply_lora_to_model is gone")


def _qwix_interception() -> None:
  wrap = getattr(interception, "wrap_func_intercepted", None)
  versions.expect(wrap is not None and versions.params(wrap)[:2] == ["func", "get_interceptor"]
                  and "disable_jit" in versions.params(wrap),
                  "9", "qwix._src.interception.wrap_func_intercepted(func, get_interceptor, *,"
                  " disable_jit) is gone")
  provider = qwix.LoraProvider(rules=[])
  versions.expect(callable(getattr(provider, "get_interceptors", None))
                  and isinstance(getattr(provider, "disable_jit", None), bool),
                  "9", "LoraProvider(rules=[]) has no get_interceptors() / disable_jit")
  # The race is in the unpatch: the original is popped while a patch may run.
  versions.expect("self._original_fns.pop(name)" in inspect.getsource(interception),
                  "9", "Qwix no longer pops the original when it unpatches; the hold may be unneeded")


CANARIES = {
    "7 qwix skip_nnx_init/qwix_rngs": _qwix_lora_init,
    "9 Qwix interception held open": _qwix_interception,
}
