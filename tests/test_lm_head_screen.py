"""The LM head's screen (gemma_grpo.rl.engine.lm_head_screen) on random heads, against lax.top_k."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gemma_grpo.rl.engine import decode_dots
from gemma_grpo.rl.engine import lm_head_screen
from gemma_grpo.rl.engine import sampling as sampling_lib


@pytest.mark.parametrize("flags, pays", [
    ("fpu sse avx512f avx512_bf16 avx512_vnni", False),  # the AMD EPYC where it measured slower
    ("fpu sse avx512f avx512_bf16 amx_bf16 amx_tile", True),  # an Intel Xeon with AMX
    ("fp asimd bf16", False),  # Arm's bfloat16 dot, not measured
])
def test_auto_screens_only_on_cpus_with_bfloat16_matrix_units(tmp_path, flags, pays):
  cpuinfo = tmp_path / "cpuinfo"
  cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
  assert lm_head_screen.screen_pays_off(str(cpuinfo)) is pays
  assert lm_head_screen.screen_pays_off(str(tmp_path / "missing")) is False


def screened_top(normed_BxD, head_VxD, k, width, temperature=1.0, live_B=None):
  screen = (head_VxD.astype(jnp.bfloat16), jnp.max(jnp.linalg.norm(head_VxD, axis=-1)))
  return jax.jit(lm_head_screen.screened_top, static_argnums=(4, 5, 6))(
      normed_BxD, head_VxD, *screen, k, width, temperature, live_B)


def full_top(normed_BxD, head_VxD, k, temperature=1.0):
  return jax.lax.top_k(decode_dots.project(normed_BxD, head_VxD) / temperature, k)


def test_screened_top_k_is_the_float32_top_k_when_proved():
  rng = np.random.default_rng(0)
  head_VxD = jnp.asarray(rng.normal(size=(8192, 32)), jnp.float32)
  normed_BxD = jnp.asarray(3 * rng.normal(size=(4, 32)), jnp.float32)
  top_BxK, ids_BxK, proved = screened_top(normed_BxD, head_VxD, k=5, width=64, temperature=0.7)
  want_top_BxK, want_ids_BxK = full_top(normed_BxD, head_VxD, k=5, temperature=0.7)
  assert bool(proved)
  np.testing.assert_array_equal(ids_BxK, want_ids_BxK)
  np.testing.assert_allclose(top_BxK, want_top_BxK, rtol=1e-6)


def test_a_flat_tail_defeats_the_proof_and_the_full_head_answers():
  rng = np.random.default_rng(1)
  # 300 near-equal logits around the 5th: no 16 candidates can prove a top 5.
  normed_BxD = jnp.asarray(np.eye(2, 32), jnp.float32)
  head_VxD = np.asarray(0.01 * rng.normal(size=(4096, 32)), np.float32)
  head_VxD[:300, :2] = 1.0 + 1e-4 * rng.normal(size=(300, 2))
  head_VxD = jnp.asarray(head_VxD)
  top_BxK, ids_BxK, proved = screened_top(normed_BxD, head_VxD, k=5, width=16)
  want_top_BxK, want_ids_BxK = full_top(normed_BxD, head_VxD, k=5)
  assert not bool(proved)
  np.testing.assert_array_equal(ids_BxK, want_ids_BxK)
  np.testing.assert_array_equal(top_BxK, want_top_BxK)


def test_an_ended_rows_flat_tail_does_not_make_the_live_rows_read_the_full_head():
  rng = np.random.default_rng(1)
  # Row 1 meets the flat tail above; row 0 reads a head it can prove.
  head_VxD = np.asarray(0.01 * rng.normal(size=(4096, 32)), np.float32)
  head_VxD[:300, 1] = 1.0 + 1e-4 * rng.normal(size=300)
  head_VxD[4000:4005, 0] = [5.0, 4.5, 4.0, 3.5, 3.0]  # a clear top 5
  head_VxD = jnp.asarray(head_VxD)
  normed_BxD = jnp.asarray(np.eye(2, 32), jnp.float32)
  _, _, proved = screened_top(normed_BxD, head_VxD, k=5, width=16)
  assert not bool(proved)
  top_BxK, ids_BxK, proved = screened_top(normed_BxD, head_VxD, k=5, width=16,
                                          live_B=jnp.array([True, False]))
  want_top_BxK, want_ids_BxK = full_top(normed_BxD, head_VxD, k=5)
  assert bool(proved)
  np.testing.assert_array_equal(ids_BxK[0], want_ids_BxK[0])
  np.testing.assert_allclose(top_BxK[0], want_top_BxK[0], rtol=1e-6)
  _, _, proved = screened_top(normed_BxD, head_VxD, k=5, width=16,
                              live_B=jnp.array([False, True]))
  assert not bool(proved)  # a live row's flat tail still needs the full head


def test_the_screen_error_bound_holds_where_rounding_is_worst():
  # Every coordinate 1 + 0.75 * 2^-8 rounds down to 1 in bfloat16, in both
  # factors and with one sign: the error adds up to about 3/4 of the bound.
  d = 640
  value = 1 + 0.75 * 2.0 ** -8
  normed_1xD = jnp.full((1, d), value, jnp.float32)
  head_2xD = jnp.stack([jnp.full((d,), value, jnp.float32), jnp.full((d,), -value, jnp.float32)])
  screen_1x2 = jnp.einsum("bi,vi->bv", normed_1xD.astype(jnp.bfloat16), head_2xD.astype(jnp.bfloat16),
                          preferred_element_type=jnp.float32)
  error = float(jnp.max(jnp.abs(screen_1x2 - normed_1xD @ head_2xD.T)))
  bound = float(lm_head_screen.screen_error_bound(normed_1xD, jnp.max(jnp.linalg.norm(head_2xD, axis=-1)))[0])
  assert 0.6 * bound < error <= bound


@pytest.mark.parametrize("sampling, vocab, width", [
    (sampling_lib.Sampling(greedy=True, temperature=1.0, top_k=None, top_p=1.0), 262144, 256),
    (sampling_lib.Sampling(greedy=False, temperature=0.9, top_k=50, top_p=1.0), 262144, 256),
    (sampling_lib.Sampling(greedy=False, temperature=0.9, top_k=100, top_p=1.0), 262144, 400),
    (sampling_lib.Sampling(greedy=False, temperature=0.9, top_k=None, top_p=0.9), 262144, 0),
    (sampling_lib.Sampling(greedy=False, temperature=0.9, top_k=50, top_p=1.0), 512, 0),
])
def test_screen_width(sampling, vocab, width):
  assert lm_head_screen.screen_width(sampling, vocab) == width


@pytest.mark.parametrize("vocab, crowded", [(8192, False), (8192, True), (8000, False)],
                         ids=["blocks", "best-tokens-in-one-block", "top_k (no whole blocks)"])
def test_screen_candidates_are_the_best_tokens_and_bound_the_rest(vocab, crowded):
  rng = np.random.default_rng(2)
  screen_BxV = rng.normal(size=(3, vocab)).astype(np.float32)
  if crowded:  # the 40 best tokens of row 0 share one block
    screen_BxV[0, 128:168] = 10 + rng.random(40)
  beyond_B, candidates_BxW = lm_head_screen.screen_candidates(jnp.asarray(screen_BxV), 48)
  want_BxW = np.argsort(-screen_BxV, axis=-1)[:, :48]
  np.testing.assert_array_equal(np.sort(candidates_BxW, axis=-1), np.sort(want_BxW, axis=-1))
  others_BxV = screen_BxV.copy()
  np.put_along_axis(others_BxV, want_BxW, -np.inf, axis=-1)
  assert np.all(others_BxV.max(axis=-1) <= beyond_B)
  np.testing.assert_array_equal(beyond_B, np.take_along_axis(screen_BxV, want_BxW, -1).min(-1))
