"""The lockstep decode loop: every row of a call decodes until the last one stops.

Rows are grouped by prompt: row b continues prompt b // R, whose keys and
values the prefill keeps once (decode_layers.decode_layer). Each step embeds
every row's last token, runs the layers, and draws every row's next token
with one key, fold_in(rng, t), as Tunix's sampler does (sampling.py). A row
stops at a stop token or right after its stop text (stop_text.py); ended
rows take stop_ids[0] until the loop ends. With tools the same loop pauses
for the host (multi_turn.py).

Shapes: B rows, U distinct prompts of R rows each, P prompt width, T new
tokens, L layers, K key/value heads, H head width, D model width, V vocabulary.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from gemma_grpo.rl.engine import decode_dots
from gemma_grpo.rl.engine import decode_layers
from gemma_grpo.rl.engine import lm_head_screen
from gemma_grpo.rl.engine import multi_turn
from gemma_grpo.rl.engine import sampling as sampling_lib
from gemma_grpo.rl.engine import stop_text as stop_text_lib


def start(first_B, first_logp_B, prompt_cache, stop_ids, next_state_SxV, *, new_tokens,
          with_logps):
  """The decode loop's carry before its first step: the prefill's token in slot 0."""
  keys_LxBxKxHxT, values_LxBxKxTxH = decode_layers.completion_cache(
      prompt_cache, first_B.shape[0], new_tokens)
  tokens_BxT, logps_BxT = decode_layers.first_tokens(first_B, first_logp_B, new_tokens=new_tokens,
                                                     with_logps=with_logps)
  done_B = jnp.isin(first_B, stop_ids)
  text_state_B = None
  if next_state_SxV is not None:
    text_state_B, done_B = stop_text_lib.step(next_state_SxV, jnp.zeros_like(first_B), first_B,
                                              done_B)
  return (1, tokens_BxT, logps_BxT, done_B, keys_LxBxKxHxT, values_LxBxKxTxH, jnp.int32(0),
          text_state_B)


def loop(carry, weights, embed_VxD, head_VxD, screen, final_norm_D, prompt_cache,
         next_position_B, valid_UxP, stop_ids, next_state_SxV, rng, turns, *, shapes,
         new_tokens, sampling, with_logps, screen_width):
  """Runs decode steps from `carry` until every row stops or slot new_tokens is reached.

  `next_state_SxV` (stop_text.py) ends a row right after its stop text; None
  ends rows at stop tokens only.

  `turns` is None for one-turn decoding. For tool calls (multi_turn.py) it is
  (forced_BxT, ends_call_V, needs_char_V, last_char_V) and the carry ends
  with paused_B: a row takes forced_BxT[b, t] at slot t where that is >= 0
  (a tool's result, read like a prompt and never sampled), and the loop
  also stops after a step in which a row may have closed a tool call, for
  the host to run it.
  """
  def step(carry):
    (t, tokens_BxT, logps_BxT, done_B, keys_LxBxKxHxT, values_LxBxKxTxH, full_heads,
     text_state_B) = carry[:8]
    x_BxD = embed_VxD[tokens_BxT[:, t - 1]] * jnp.sqrt(embed_VxD.shape[-1]).astype(embed_VxD.dtype)
    position_B = next_position_B + t - 1
    for layer, (w, shape) in enumerate(zip(weights, shapes)):
      x_BxD, keys_LxBxKxHxT, values_LxBxKxTxH = decode_layers.decode_layer(
          w, shape, layer, x_BxD, position_B, t - 1, prompt_cache, valid_UxP, keys_LxBxKxHxT,
          values_LxBxKxTxH)
    normed_BxD = decode_layers.rms_norm(x_BxD, final_norm_D)
    key = jax.random.fold_in(rng, t)

    def settle(token_B):
      """(the token each row takes at slot t, from_tool_B, paused_B; None, None without tools)."""
      token_B = jnp.where(done_B, stop_ids[0], token_B)
      if turns is None:
        return token_B, None, None
      return multi_turn.force_results(turns, t, token_B, tokens_BxT, done_B)

    # Log-probs need every logit, so a screened head never returns them
    # (GroupedRollout.settings); each branch reads only what it computes.
    if screen_width:
      token_B, proved = lm_head_screen.screened_token(normed_BxD, head_VxD, screen, key, sampling,
                                                      screen_width, ~done_B)
      full_heads += 1 - proved.astype(jnp.int32)
      token_B, from_tool_B, paused_B = settle(token_B)
    else:
      logits_BxV = decode_dots.head_logits(normed_BxD, head_VxD)
      token_B, from_tool_B, paused_B = settle(
          sampling_lib.sample_tokens(logits_BxV, key, sampling))
      if with_logps:
        logps_BxT = logps_BxT.at[:, t].set(sampling_lib.token_logps(logits_BxV, token_B, sampling))
    stops_B = jnp.isin(token_B, stop_ids)
    if turns is not None:
      stops_B &= ~from_tool_B
    done_B = done_B | stops_B
    if next_state_SxV is not None:  # a tool's result may hold the stop text too, as the learner reads it
      text_state_B, done_B = stop_text_lib.step(next_state_SxV, text_state_B, token_B, done_B)
    out = (t + 1, tokens_BxT.at[:, t].set(token_B), logps_BxT, done_B, keys_LxBxKxHxT,
           values_LxBxKxTxH, full_heads, text_state_B)
    return out if turns is None else (*out, paused_B)

  def more(carry):
    t, _, _, done_B, *_ = carry
    going = (t < new_tokens) & ~jnp.all(done_B)
    return going if turns is None else going & ~jnp.any(carry[8])

  return jax.lax.while_loop(more, step, carry)


@functools.partial(jax.jit, static_argnames=("shapes", "new_tokens", "sampling", "with_logps",
                                             "screen_width"))
def decode(weights, embed_VxD, head_VxD, screen, final_norm_D, first_B, first_logp_B,
           prompt_cache, next_position_B, valid_UxP, stop_ids, next_state_SxV, rng, *,
           shapes, new_tokens, sampling, with_logps, screen_width):
  """Tokens 2..new_tokens of every row, and with_logps their log-probs; stops
  early once every row has stopped. Also returns how many steps computed the
  whole float32 LM head although a screen was given (its proof failed).

  Rows are grouped by prompt: row b continues prompt b // R, whose keys and
  values `prompt_cache` holds (decode_layers.decode_layer). Token t (0-based)
  of a row sits at completion slot t and RoPE position next_position_B + t; it is
  drawn with fold_in(rng, t). `embed_VxD` embeds the input tokens;
  `head_VxD` (the embedding, maybe rounded) gives the logits, through
  `screen` (its bfloat16 copy, max row norm) when screen_width > 0.
  """
  carry = start(first_B, first_logp_B, prompt_cache, stop_ids, next_state_SxV,
                new_tokens=new_tokens, with_logps=with_logps)
  _, tokens_BxT, logps_BxT, _, _, _, full_heads, _ = loop(
      carry, weights, embed_VxD, head_VxD, screen, final_norm_D, prompt_cache, next_position_B,
      valid_UxP, stop_ids, next_state_SxV, rng, None, shapes=shapes, new_tokens=new_tokens,
      sampling=sampling, with_logps=with_logps, screen_width=screen_width)
  return tokens_BxT, logps_BxT, full_heads


# Multi-turn decoding (tool calls): the same loop, resumed by the host after
# each pause with the carry donated, so the caches are updated in place.
turn_start = jax.jit(start, static_argnames=("new_tokens", "with_logps"))
turn = jax.jit(loop, donate_argnums=(0,), static_argnames=(
    "shapes", "new_tokens", "sampling", "with_logps", "screen_width"))
