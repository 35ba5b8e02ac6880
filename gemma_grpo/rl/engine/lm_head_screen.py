"""The LM head's screen: the float32 top-k of the head's logits from a bfloat16 ranking.

The float32 LM head (the tied embedding, [V, D] with V = 262,144) is the
largest read of a decode step. With top-k sampling or greedy decoding only
the k largest logits matter, so where the screen is on (rollout.screen_lm_head;
"auto": on CPUs with bfloat16 matrix units, where it measured faster; off
on GPUs and TPUs, where it was not measured) a bfloat16 copy of the head ranks the vocabulary, the best
few hundred candidates are rescored from the float32 head, and an error
bound proves the float32 top-k is among them; where it cannot, that step
computes the whole float32 head. Tokens are drawn from the float32 logits
either way (`screened_top`).

Shapes: B rows, D model width, V vocabulary, W candidates, K = top-k.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gemma_grpo.rl.engine import decode_dots
from gemma_grpo.rl.engine import sampling as sampling_lib
from gemma_grpo.runtime import backend

# The CPUs on which the screen measured faster: x86 with AMX. Without AMX a
# bfloat16 head reads no faster than the float32 one, so the screen only adds
# work (BENCHMARKS.md, "The LM head's screen in decode").
_SCREEN_CPU_FLAGS = ("amx_bf16",)
SCREEN_MIN_WIDTH = 256  # candidates the screen keeps, at least; see screen_width


def screen_pays_off(cpuinfo: str = "/proc/cpuinfo") -> bool:
  """Whether "auto" screens the LM head: for a CPU whose /proc/cpuinfo lists
  a bfloat16 matrix unit (_SCREEN_CPU_FLAGS), where it measured faster; not
  for a GPU or TPU (runtime/backend.py's target), where it was not measured."""
  if not backend.on_cpu():
    return False
  try:
    with open(cpuinfo, encoding="utf-8") as f:
      flags = set(" ".join(line for line in f if line.startswith(("flags", "Features"))).split())
  except OSError:
    return False
  return any(flag in flags for flag in _SCREEN_CPU_FLAGS)


def screen_width(sampling: sampling_lib.Sampling, vocab_size: int) -> int:
  """Candidates the bfloat16 screen keeps for `sampling`; 0 where it cannot help.

  The exact top-k must lie among them and be provably so (`screened_top`).
  Too few candidates leave steps unproved, each of which then computes the
  whole head; SCREEN_MIN_WIDTH leaves almost none for k = 50
  (bench/studies/lm_head_screen.py counts them; docs/results/lm_head_screen).
  Sampling from the whole vocabulary (no top-k) needs every logit, so it
  gets no screen.
  """
  k = 1 if sampling.greedy else sampling.top_k
  if not k:
    return 0
  width = max(SCREEN_MIN_WIDTH, 4 * k)
  return width if 4 * width <= vocab_size else 0


def screen_error_bound(normed_BxD, head_norm_max):
  """Per row, the most any token's screen logit can differ from its float32 logit.

  The screen rounds both factors to bfloat16 (relative error u = 2^-8 each,
  so |h~e~ - he| <= (2u + u^2)|h||e| per term) and sums in float32; the
  candidates are rescored in float32, in another order than the full head.
  With D terms, float32 summation adds at most D·2^-24 of sum|h||e| each
  time; 4·D·2^-24 covers the screen, the rescoring and the full head they
  are compared with. Cauchy-Schwarz: sum|h||e| <= ||h|| max_v ||e_v||.
  """
  d = normed_BxD.shape[-1]
  factor = 2.0 ** -7 + 2.0 ** -16 + 4 * d * 2.0 ** -24
  return factor * jnp.linalg.norm(normed_BxD.astype(jnp.float32), axis=-1) * head_norm_max


def screen_candidates(screen_BxV, width: int):
  """Per row, the ids of the `width` largest screen logits (in no set
  order), and a bound that every other token's screen logit is at most.

  Blockwise (sampling.block_top_k): tokens outside the kept blocks are at
  most the width-th block maximum; the rest at most the least candidate.
  Their order does not matter (they are rescored), so the blocks are not
  put back in vocabulary order.
  """
  _, vocab = screen_BxV.shape
  if vocab % sampling_lib.BLOCK or vocab // sampling_lib.BLOCK < width:
    top_BxW, candidates_BxW = jax.lax.top_k(screen_BxV, width)
    # The min, not the last column: reading that makes XLA:CPU sort the
    # whole vocabulary instead.
    return jnp.min(top_BxW, axis=-1), candidates_BxW
  top_BxW, candidates_BxW, block_max_BxW = sampling_lib.block_top_k(screen_BxV, width,
                                                                    in_id_order=False)
  beyond_B = jnp.maximum(jnp.min(block_max_BxW, axis=-1), jnp.min(top_BxW, axis=-1))
  return beyond_B, candidates_BxW


def screened_top(normed_BxD, head_VxD, screen_VxD, head_norm_max, k: int, width: int,
                 temperature: float, live_B=None):
  """The k largest float32 head logits / temperature and their ids, sorted, as
  `jax.lax.top_k(project(normed, head) / temperature, k)` gives them up to
  float32 rounding; and whether the screen proved them.

  A bfloat16 copy of the head (half the bytes) ranks the vocabulary; the
  `width` best are rescored exactly from the float32 head's rows. If the
  k-th rescored logit exceeds every other token's screen logit by more
  than the screen's error bound, no token outside the candidates can be in
  the top k: the result is the float32 head's. Otherwise (a row whose
  logits are flat beyond the candidates) this step computes the whole
  float32 head, as without the screen. Rows not in `live_B` (ended ones,
  whose tokens are thrown away) need no proof: a rambling row that has
  already ended would otherwise make whole-head steps for nothing.
  """
  # Written [V, B] (head_logits), the faster form for the head's outputs.
  beyond_B, candidates_BxW = screen_candidates(
      decode_dots.head_logits(normed_BxD, screen_VxD), width)
  exact_BxW = jnp.einsum("bd,bwd->bw", normed_BxD, head_VxD[candidates_BxW])
  top_BxK, at_BxK = jax.lax.top_k(exact_BxW, k)
  margin_B = screen_error_bound(normed_BxD, head_norm_max)
  proved_B = top_BxK[:, -1] > beyond_B + margin_B
  proved = jnp.all(proved_B if live_B is None else proved_B | ~live_B)

  def from_candidates():
    return top_BxK / temperature, jnp.take_along_axis(candidates_BxW, at_BxK, axis=-1)

  def from_full_head():
    top_BxK, ids_BxK = jax.lax.top_k(decode_dots.head_logits(normed_BxD, head_VxD) / temperature,
                                     k)
    return top_BxK, ids_BxK

  top_BxK, ids_BxK = jax.lax.cond(proved, from_candidates, from_full_head)
  return top_BxK, ids_BxK, proved


def screened_token(normed_BxD, head_VxD, screen, key, sampling: sampling_lib.Sampling,
                   width: int, live_B=None):
  """(the token of each row, whether the screen proved this step), drawn from
  the float32 head's top-k that `screened_top` gives. `screen` is the head's
  bfloat16 copy and its largest row norm."""
  top_BxK, ids_BxK, proved = screened_top(
      normed_BxD, head_VxD, *screen, 1 if sampling.greedy else sampling.top_k, width,
      sampling.temperature, live_B)
  token_B = (ids_BxK[:, 0].astype(jnp.int32) if sampling.greedy
             else sampling_lib.draw_from_top(top_BxK, ids_BxK, key, sampling))
  return token_B, proved
