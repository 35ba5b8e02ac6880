"""Where gemma-grpo reaches past Tunix's and Qwix's public APIs, and a canary per touch.

Supported: google-tunix 0.1.7 and qwix 0.1.8 (pyproject.toml pins them).
Every module that touches their internals calls `check_versions()` as it is
imported, so another version stops there with one line (`UnsupportedVersion`).

Each touch, why, and what upstream change would remove it:

1. cluster.SharedWeightsCluster sets RLCluster._anchor_policy_state = None.
   The anchor is a full copy of the actor's weights (1.07 GB for the 270M)
   kept for Tunix's own old-log-prob path, which our learner never reads.
   Removed by: an RLCluster option not to keep the anchor.
2. cluster.SharedWeightsCluster swaps actor_trainer.__class__ for
   trainers.RLTrainer. RLCluster builds its trainer itself.
   Removed by: a trainer class (or factory) argument to RLCluster.
3. trainers re-implements PeftTrainer.jit_train_and_eval_step (reading
   _jitted_train_step_fn, _jitted_eval_step_fn, _shard_optimizer and
   jax.interpreters.pxla.thread_resources) to donate the model to the jitted
   step, so the frozen base is not written out twice every step; and compiles
   that step ahead of its first call for an example prepared as
   PeftTrainer.train prepares each one (_prepare_inputs, then shard_input over
   config.data_sharding_axis), so the first update does not wait for it.
   Removed by: PeftTrainer donating the model (an option or the default) and
   offering to compile its step for given input shapes.
4. learner.Learner overrides GRPOLearner._generate_and_compute_advantage and
   reads _rollout_micro_batch_size / _compute_logps_micro_batch_size: dynamic
   sampling, the stop text, grouped rollouts and per-step diagnostics need
   the step between rollout and advantage. Removed by: public hooks around
   rollout and advantage computation in RLLearner.
5. gemma3_rl.Gemma3 calls Gemma3._encode_and_get_inputs (the embedding of
   last-token decoding) and is swapped in by graphdef (nnx.merge of Tunix's
   state into our subclass). Removed by: Tunix exposing a forward over
   hidden states / a decode step with a cache of our shape.
6. rollout and export read Attention._query_norm / _key_norm (the q/k RMS
   norms) and the state paths that carry those names. Removed by: public
   names for the norms (the state paths are the checkpoint format, so these
   only change with a checkpoint-format change).
7. lora passes skip_nnx_init=True to qwix.apply_lora_to_model and sets the
   qwix_rngs attribute, so the adapter-creating forward can run compiled
   (eager, it deadlocks XLA:CPU on 8 simulated devices). Removed by: Qwix
   creating adapters without a forward pass, or jitting it itself.
8. cluster.SharedWeightsCluster rewrites the cluster's training config after
   RLCluster built the actor trainer from a deep copy of it: the trainer
   updates every train.mini_batch_size prompts (its copy), while
   RLLearner.train, reading the cluster's config, takes the whole batch as
   one mini-batch and so rolls it out once (verl's mini-batches; Tunix rolls
   out each mini-batch before its update). Removed by: an RLTrainingConfig
   field for updates per rollout.
9. lora.keep_interception_installed holds a Qwix interception open in an
   idle thread (qwix._src.interception.wrap_func_intercepted around a
   provider's get_interceptors()), so Qwix never unpatches jnp.asarray and
   the other functions it intercepts. Unpatching races with other threads:
   one that entered a patched function just before looks up an original
   that is gone (KeyError in jnp.asarray during a rollout, seen in CI).
   Removed by: Qwix keeping the original function reachable from its patch
   (or never removing patches once installed).
10. gemma3_rl re-implements Tunix's DecoderLayer.block and FeedForward.block
   for a LoRA policy and applies the feed-forward's adapters itself
   (lora_dot: Qwix's `res + delta * alpha / rank` with the adapters Qwix
   names kernel_lora_a/kernel_lora_b), so that their backward pass is
   written out: autodiff of Qwix's form leaves XLA:CPU writing the [tokens,
   F] gradients transposed (most of the 270M update's 2.4 thread-seconds
   of copies).
   The canary fingerprints the two Tunix methods. Removed by: XLA:CPU laying
   that contraction out in place, or Qwix taking a custom LoRA dot.

`canaries()` checks each touch against the installed packages; tests/test_seam.py
runs them, and a failure names the version and the touch in one line.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
from typing import Callable

from gemma_grpo import errors

SUPPORTED = {"google-tunix": "0.1.7", "qwix": "0.1.8"}


class UnsupportedVersion(errors.UserError, ImportError):
  """An installed Tunix or Qwix other than the one the touches were made for."""


def check_versions(installed: dict[str, str] | None = None) -> None:
  """Raises UnsupportedVersion, one line, unless every SUPPORTED version is installed."""
  for package, wanted in SUPPORTED.items():
    found = (installed or {}).get(package) if installed is not None else _version(package)
    if found != wanted:
      raise UnsupportedVersion(
          f"gemma-grpo needs {package}=={wanted} (it reaches into its internals,"
          f" gemma_grpo/seam.py), found {found or 'none'}; run `pip install -e .` in the checkout")


def _version(package: str) -> str | None:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None



class TouchChanged(AssertionError):
  """An internal that gemma-grpo relies on has changed shape."""


def _expect(ok: bool, touch: str, what: str) -> None:
  if not ok:
    versions = ", ".join(f"{p} {_version(p)}" for p in SUPPORTED)
    raise TouchChanged(f"{versions}: touch {touch} changed: {what} (see gemma_grpo/seam.py)")


def _params(fn) -> list[str]:
  return list(inspect.signature(fn).parameters)


def _anchor_policy_state() -> None:
  from tunix.rl import rl_cluster  # pylint: disable=g-import-not-at-top

  _expect("self._anchor_policy_state" in inspect.getsource(rl_cluster.RLCluster),
          "1", "RLCluster no longer keeps self._anchor_policy_state")


def _trainer_class_swap() -> None:
  from tunix.rl import rl_cluster  # pylint: disable=g-import-not-at-top
  from tunix.rl import trainer as rl_trainer  # pylint: disable=g-import-not-at-top
  from tunix.sft import peft_trainer  # pylint: disable=g-import-not-at-top

  _expect(isinstance(inspect.getattr_static(rl_cluster.RLCluster, "actor_trainer"), property)
          and "self._actor_trainer = rl_trainer.Trainer(" in inspect.getsource(rl_cluster.RLCluster),
          "2", "RLCluster no longer builds its actor trainer as rl_trainer.Trainer")
  _expect(issubclass(rl_trainer.Trainer, peft_trainer.PeftTrainer),
          "2", "rl_trainer.Trainer is no longer a PeftTrainer")


def _jitted_step() -> None:
  from jax.interpreters import pxla  # pylint: disable=g-import-not-at-top
  from tunix.sft import peft_trainer  # pylint: disable=g-import-not-at-top

  trainer = peft_trainer.PeftTrainer
  _expect(_params(trainer.jit_train_and_eval_step) == ["self", "skip_jit", "cache_nnx_graph"],
          "3", f"PeftTrainer.jit_train_and_eval_step{inspect.signature(trainer.jit_train_and_eval_step)}")
  source = inspect.getsource(trainer)
  for name in ("self._jitted_train_step_fn", "self._jitted_eval_step_fn", "def _shard_optimizer",
               "def create_train_step_fn", "def create_eval_step_fn"):
    _expect(name in source, "3", f"PeftTrainer has no {name}")
  _expect(hasattr(pxla, "thread_resources"), "3", "jax.interpreters.pxla.thread_resources is gone")
  # The example compiled ahead must be prepared as train() prepares each one.
  train = inspect.getsource(trainer.train)
  for text in ("self._prepare_inputs(", "sharding_utils.shard_input(",
               "self.config.data_sharding_axis"):
    _expect(text in train, "3", f"PeftTrainer.train no longer calls {text.rstrip('(')}")


def _learner_step() -> None:
  from tunix.rl.grpo import grpo_learner  # pylint: disable=g-import-not-at-top

  method = grpo_learner.GRPOLearner._generate_and_compute_advantage  # pylint: disable=protected-access
  _expect(_params(method) == ["self", "training_input", "mode"],
          "4", f"GRPOLearner._generate_and_compute_advantage{inspect.signature(method)}")
  source = inspect.getsource(grpo_learner)
  for name in ("self._rollout_micro_batch_size", "self._compute_logps_micro_batch_size"):
    _expect(name in source, "4", f"GRPOLearner no longer sets {name}")


def _encode_and_get_inputs() -> None:
  from tunix.models.gemma3 import model as gemma3  # pylint: disable=g-import-not-at-top

  method = getattr(gemma3.Gemma3, "_encode_and_get_inputs", None)
  _expect(method is not None and "tokens" in _params(method),
          "5", "Gemma3._encode_and_get_inputs(*, tokens) is gone")


def _qk_norm_names() -> None:
  from tunix.models.gemma3 import model as gemma3  # pylint: disable=g-import-not-at-top

  source = inspect.getsource(gemma3.Attention.__init__)
  _expect("self._query_norm" in source and "self._key_norm" in source,
          "6", "Attention no longer names its q/k norms _query_norm/_key_norm")


def _qwix_lora_init() -> None:
  import qwix  # pylint: disable=g-import-not-at-top
  from qwix._src import model as qwix_model  # pylint: disable=g-import-not-at-top

  source = inspect.getsource(qwix_model)
  _expect('"skip_nnx_init"' in source and "qwix_rngs" in source,
          "7", "qwix.apply_lora_to_model no longer takes skip_nnx_init / reads qwix_rngs")
  _expect(callable(getattr(qwix, "apply_lora_to_model", None)), "7", "qwix.apply_lora_to_model is gone")


def _one_rollout_per_batch() -> None:
  from tunix.rl import rl_cluster  # pylint: disable=g-import-not-at-top
  from tunix.rl import rl_learner  # pylint: disable=g-import-not-at-top

  _expect("actor_config = copy.deepcopy(self.cluster_config.training_config)"
          in inspect.getsource(rl_cluster.RLCluster),
          "8", "RLCluster no longer builds its actor trainer from a copy of the training config")
  train = inspect.getsource(rl_learner.RLLearner.train)
  for name in ("self._training_config.mini_batch_size", '"gradient_accumulation_steps"'):
    _expect(name in train, "8", f"RLLearner.train no longer reads {name}")


def _qwix_interception() -> None:
  import qwix  # pylint: disable=g-import-not-at-top
  from qwix._src import interception  # pylint: disable=g-import-not-at-top

  wrap = getattr(interception, "wrap_func_intercepted", None)
  _expect(wrap is not None and _params(wrap)[:2] == ["func", "get_interceptor"]
          and "disable_jit" in _params(wrap),
          "9", "qwix._src.interception.wrap_func_intercepted(func, get_interceptor, *, disable_jit) is gone")
  provider = qwix.LoraProvider(rules=[])
  _expect(callable(getattr(provider, "get_interceptors", None))
          and isinstance(getattr(provider, "disable_jit", None), bool),
          "9", "LoraProvider(rules=[]) has no get_interceptors() / disable_jit")
  # The race is in the unpatch: the original is popped while a patch may run.
  source = inspect.getsource(interception)
  _expect("self._original_fns.pop(name)" in source,
          "9", "Qwix no longer pops the original when it unpatches; the hold may be unneeded")


# Whitespace- and comment-free source of the methods gemma3_rl re-implements,
# as of google-tunix 0.1.7.
_BLOCK_FINGERPRINTS = {"DecoderLayer.block": "66abd2f267646069",
                       "FeedForward.block": "1762f16d586e1852"}


def fingerprint(source: str) -> str:
  """A hash of `source` that ignores indentation, blank lines and comment lines."""
  lines = (line.strip() for line in source.splitlines())
  text = "\n".join(line for line in lines if line and not line.startswith("#"))
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def _own_feed_forward() -> None:
  from qwix._src.providers import lora as qwix_lora  # pylint: disable=g-import-not-at-top
  from tunix.models.gemma3 import model as gemma3  # pylint: disable=g-import-not-at-top

  for name, expected in _BLOCK_FINGERPRINTS.items():
    cls, method = name.split(".")
    _expect(fingerprint(inspect.getsource(getattr(getattr(gemma3, cls), method))) == expected,
            "10", f"Tunix's {name} changed; gemma3_rl._decoder_layer/_feed_forward copy it")
  _expect("return res + delta * (rule.alpha / rule.rank)" in inspect.getsource(qwix_lora),
          "10", "Qwix's LoRA dot_general no longer returns res + delta * alpha / rank")


def canaries() -> dict[str, Callable[[], None]]:
  """{touch: check}; a check raises TouchChanged when the internal changed shape."""
  return {
      "1 RLCluster._anchor_policy_state": _anchor_policy_state,
      "2 RLCluster.actor_trainer class": _trainer_class_swap,
      "3 PeftTrainer.jit_train_and_eval_step": _jitted_step,
      "4 GRPOLearner._generate_and_compute_advantage": _learner_step,
      "5 Gemma3._encode_and_get_inputs": _encode_and_get_inputs,
      "6 Attention._query_norm/_key_norm": _qk_norm_names,
      "7 qwix skip_nnx_init/qwix_rngs": _qwix_lora_init,
      "8 RLCluster's actor config copy": _one_rollout_per_batch,
      "9 Qwix interception held open": _qwix_interception,
      "10 the LoRA feed-forward run by gemma3_rl": _own_feed_forward,
  }
