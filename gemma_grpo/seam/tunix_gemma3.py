"""Touches 5, 6 and 10: Tunix's Gemma-3, as model/gemma3_rl.py extends it.

5. gemma3_rl.Gemma3 embeds tokens with Gemma3._encode_and_get_inputs
   (`embed_tokens`, for last-token decoding) and is swapped in by graphdef (nnx.merge of Tunix's
   state into our subclass). Removed by: Tunix exposing a forward over
   hidden states / a decode step with a cache of our shape.
6. The rollout reads Attention._query_norm / _key_norm (the q/k RMS norms:
   `query_norm_scale`, `key_norm_scale`) and the export maps the state paths
   that carry those names (QUERY_NORM, KEY_NORM). Removed by:
   public names for the norms (the state paths are the checkpoint format,
   so these only change with a checkpoint-format change).
10. gemma3_rl re-implements Tunix's DecoderLayer.block and FeedForward.block
   for a LoRA policy and applies the feed-forward's adapters itself
   (lora_dot: Qwix's `res + delta * alpha / rank` with the adapters Qwix
   names kernel_lora_a/kernel_lora_b), so that their backward pass is
   written out: autodiff of Qwix's form leaves XLA:CPU writing the [tokens,
   F] gradients transposed, the update's largest copies (BENCHMARKS.md,
   "The update's gradient program"). The canary fingerprints the two Tunix methods. Removed by:
   XLA:CPU laying that contraction out in place, or Qwix taking a custom
   LoRA dot.
"""

from __future__ import annotations

import inspect

from gemma_grpo.seam import versions

versions.check_versions()

# pylint: disable=g-import-not-at-top,wrong-import-position
from qwix._src.providers import lora as qwix_lora
from tunix.models.gemma3 import model as gemma3
# pylint: enable=g-import-not-at-top,wrong-import-position

# Attention's attribute names for its q/k RMS norms, also their state paths.
QUERY_NORM = "_query_norm"
KEY_NORM = "_key_norm"


def embed_tokens(model: gemma3.Gemma3, tokens):
  """The model's input embedding of `tokens` (Gemma3.__call__'s first step)."""
  return model._encode_and_get_inputs(tokens=tokens)  # pylint: disable=protected-access


def query_norm_scale(attention: gemma3.Attention):
  """The scale of the attention's RMS norm on queries."""
  return getattr(attention, QUERY_NORM).scale.get_value()


def key_norm_scale(attention: gemma3.Attention):
  """The scale of the attention's RMS norm on keys."""
  return getattr(attention, KEY_NORM).scale.get_value()


# Whitespace- and comment-free source of the methods gemma3_rl re-implements,
# as of google-tunix 0.1.7.
_BLOCK_FINGERPRINTS = {"DecoderLayer.block": "66abd2f267646069",
                       "FeedForward.block": "1762f16d586e1852"}


def _encode_and_get_inputs() -> None:
  method = getattr(gemma3.Gemma3, "_encode_and_get_inputs", None)
  versions.expect(method is not None and "tokens" in versions.params(method),
                  "5", "Gemma3._encode_and_get_inputs(*, tokens) is gone")


def _qk_norm_names() -> None:
  source = inspect.getsource(gemma3.Attention.__init__)
  versions.expect(f"self.{QUERY_NORM}" in source and f"self.{KEY_NORM}" in source,
                  "6", "Attention no longer names its q/k norms _query_norm/_key_norm")


def _own_feed_forward() -> None:
  for name, expected in _BLOCK_FINGERPRINTS.items():
    cls, method = name.split(".")
    versions.expect(
        versions.fingerprint(inspect.getsource(getattr(getattr(gemma3, cls), method))) == expected,
        "10", f"Tunix's {name} changed; gemma3_rl._decoder_layer/_feed_forward copy it")
  versions.expect("return res + delta * (rule.alpha / rule.rank)" in inspect.getsource(qwix_lora),
                  "10", "Qwix's LoRA dot_general no longer returns res + delta * alpha / rank")


CANARIES = {
    "5 Gemma3._encode_and_get_inputs": _encode_and_get_inputs,
    "6 Attention._query_norm/_key_norm": _qk_norm_names,
    "10 the LoRA feed-forward run by gemma3_rl": _own_feed_forward,
}
