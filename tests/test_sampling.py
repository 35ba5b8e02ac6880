"""Choosing tokens from logits (gemma_grpo.rl.engine.sampling): the nucleus and the one top-k."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gemma_grpo.rl.engine import sampling as sampling_lib


@pytest.mark.parametrize("top_k, top_p, allowed", [
    (None, 1.0, {0, 1, 2, 3}),
    (2, 1.0, {0, 1}),
    (None, 0.5, {0}),  # token 0 alone holds 0.6 > 0.5 of the mass
    (None, 0.7, {0, 1}),
    (3, 0.95, {0, 1, 2}),
])
def test_sample_tokens_keeps_exactly_the_top_k_and_nucleus(top_k, top_p, allowed):
  probs = np.array([0.6, 0.25, 0.1, 0.05])
  logits = jnp.asarray(np.tile(np.log(probs), (4096, 1)), jnp.float32)
  sampling = sampling_lib.Sampling(greedy=False, temperature=1.0, top_k=top_k, top_p=top_p)
  drawn = np.asarray(sampling_lib.sample_tokens(logits, jax.random.PRNGKey(0), sampling))
  assert set(drawn.tolist()) == allowed
  if top_k is None and top_p == 1.0:  # plain softmax sampling: frequencies follow probs
    np.testing.assert_allclose(np.bincount(drawn, minlength=4) / len(drawn), probs, atol=0.03)



@pytest.mark.parametrize("values, k", [
    ("distinct", 50), ("ties", 50), ("ties", 7), ("best-in-one-block", 40), ("distinct", 1),
    ("no whole blocks", 50), ("tie across blocks", 2)])
def test_top_k_is_lax_top_k_with_its_ties_and_order(values, k):
  rng = np.random.default_rng(3)
  vocab = 8000 if values == "no whole blocks" else 262144
  x_BxV = rng.normal(size=(4, vocab)).astype(np.float32)
  if values == "ties":  # a few hundred distinct values: ties everywhere, at the k-th too
    x_BxV = np.round(x_BxV * 60) / 60
  if values == "best-in-one-block":
    x_BxV[0, 640:680] = 10 + rng.random(40)
  if values == "tie across blocks":
    # Row 0's best is 9 in block 5; its second, 3, sits in block 5 and in
    # block 2: top_k takes the lower id, block 2's, though block 5 ranks first.
    x_BxV[0] = np.minimum(x_BxV[0], 2.0)
    x_BxV[0, 5 * 64 + 7], x_BxV[0, 5 * 64 + 1], x_BxV[0, 2 * 64 + 30] = 9.0, 3.0, 3.0
  got_values, got_ids = sampling_lib.top_k(jnp.asarray(x_BxV), k)
  want_values, want_ids = jax.lax.top_k(jnp.asarray(x_BxV), k)
  np.testing.assert_array_equal(got_values, want_values)
  np.testing.assert_array_equal(got_ids, want_ids)
