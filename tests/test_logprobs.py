"""Chunked completion-only log-probs against full-vocabulary references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gemma_grpo.rl.learner import logprobs
from gemma_grpo.config import settings


def _reference(hidden, embed, targets, temperature):
  logits = np.einsum("bcd,vd->bcv", hidden, embed) / temperature
  logits = logits - logits.max(-1, keepdims=True)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  picked = np.take_along_axis(logp, targets[..., None], -1)[..., 0]
  entropy = -(np.exp(logp) * logp).sum(-1)
  return picked, entropy


@pytest.mark.parametrize("vocab, chunk, temperature", [(50, 50, 1.0), (50, 16, 1.0), (64, 16, 0.7), (7, 3, 1.3)])
def test_matches_full_softmax(vocab, chunk, temperature):
  rng = np.random.default_rng(0)
  hidden = rng.normal(size=(2, 3, 8)).astype(np.float32)
  embed = rng.normal(size=(vocab, 8)).astype(np.float32)
  targets = rng.integers(0, vocab, size=(2, 3))
  logps, entropy = logprobs.logps_and_entropy_from_hidden(
      jnp.array(hidden), jnp.array(embed), jnp.array(targets), temperature, chunk)
  want_logps, want_entropy = _reference(hidden.astype(np.float64), embed.astype(np.float64), targets, temperature)
  np.testing.assert_allclose(logps, want_logps, atol=1e-5)
  np.testing.assert_allclose(entropy, want_entropy, atol=1e-5)


def test_gradient_matches_full_softmax():
  rng = np.random.default_rng(1)
  hidden = jnp.array(rng.normal(size=(2, 3, 8)), jnp.float32)
  embed = jnp.array(rng.normal(size=(40, 8)), jnp.float32)
  targets = jnp.array(rng.integers(0, 40, size=(2, 3)))

  def chunked(h, e):
    logps, entropy = logprobs.logps_and_entropy_from_hidden(h, e, targets, 0.9, chunk=16)
    return logps.sum() + 0.1 * entropy.sum()

  def full(h, e):
    logp = jax.nn.log_softmax(jnp.einsum("bcd,vd->bcv", h, e) / 0.9, axis=-1)
    picked = jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
    entropy = -(jnp.exp(logp) * logp).sum(-1)
    return picked.sum() + 0.1 * entropy.sum()

  for got, want in zip(jax.grad(chunked, argnums=(0, 1))(hidden, embed), jax.grad(full, argnums=(0, 1))(hidden, embed)):
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_model_logps_match_tunix_full_logits():
  """On the tiny model, against Tunix's own compute_per_token_logps."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from tunix.rl import common  # pylint: disable=g-import-not-at-top
  from configs import base  # pylint: disable=g-import-not-at-top
  from gemma_grpo.runtime import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import model_loading  # pylint: disable=g-import-not-at-top

  c = base.get_config()
  c.model.source = "random"
  c.mesh.fsdp = 8
  c = settings.from_config(c)
  mesh = mesh_lib.make_mesh(c.mesh)
  model = model_loading.build(c.model, mesh).model
  prompts = jnp.array([[0, 0, 2, 10, 11, 12], [2, 20, 21, 22, 23, 24]] * 4)
  completions = jnp.array([[30, 31, 32, 0], [40, 41, 42, 43]] * 4)
  with jax.set_mesh(mesh):
    ours, _ = nnx.jit(lambda m, p, cpl: logprobs.per_token_logps(m, p, cpl, pad_id=0, temperature=0.9, chunk=4096))(
        model, prompts, completions)
    graphdef, state = nnx.split(model)
    theirs = common.compute_per_token_logps(
        graphdef, state, prompts, completions, pad_id=0, eos_id=1, temperature=0.9)
  valid = np.asarray(completions != 0)
  np.testing.assert_allclose(np.asarray(ours)[valid], np.asarray(theirs)[valid], atol=2e-5)


@pytest.mark.parametrize("group", [2, 4])
def test_shared_prompt_pass_matches_the_full_pass(group):
  """Each prompt run once and its cache shared: same log-probs, same gradients."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from configs import base  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import lora  # pylint: disable=g-import-not-at-top
  from gemma_grpo.runtime import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import model_loading  # pylint: disable=g-import-not-at-top

  c = base.get_config()
  c.model.source = "random"
  c.mesh.fsdp = 8
  c = settings.from_config(c)
  mesh = mesh_lib.make_mesh(c.mesh)
  loaded = model_loading.build(c.model, mesh)
  actor = lora.apply(loaded.model, c.lora, mesh)
  state = nnx.state(actor, nnx.LoRAParam)  # non-zero adapters: gradients reach A too
  nnx.update(actor, jax.tree.map(lambda x: x + 0.05, state))
  rng = np.random.default_rng(group)
  prompts = rng.integers(3, 5000, size=(8 // group, 7))
  prompts[0, :3] = 0  # left padding
  prompts = jnp.array(np.repeat(prompts, group, axis=0))
  completions = rng.integers(3, 5000, size=(8, 5))
  completions[1, 3:] = 0  # right padding
  completions = jnp.array(completions)
  valid = np.asarray(completions != 0)

  def loss(model, shared):
    logps, entropy = logprobs.per_token_logps(
        model, prompts, completions, 0, 0.9, chunk=4096, group_size=group if shared else 1)
    return (logps * valid).sum() + 0.1 * (entropy * valid).sum(), (logps, entropy)

  grad = nnx.value_and_grad(loss, argnums=nnx.DiffState(0, nnx.LoRAParam), has_aux=True)
  with jax.set_mesh(mesh):
    (_, (full_logps, full_entropy)), full_grads = nnx.jit(grad, static_argnums=1)(actor, False)
    (_, (shared_logps, shared_entropy)), shared_grads = nnx.jit(grad, static_argnums=1)(actor, True)
  # float32 sums in another order: ~2e-6 relative on |log p| ~ 12.
  np.testing.assert_allclose(np.asarray(shared_logps)[valid], np.asarray(full_logps)[valid], rtol=1e-5)
  np.testing.assert_allclose(np.asarray(shared_entropy)[valid], np.asarray(full_entropy)[valid], rtol=1e-5)
  # In float64 the two agree to 1e-12 (measured); float32 rounding differs
  # per path by up to ~3e-4 of the largest gradient entry.
  scale = max(float(np.abs(b).max()) for b in jax.tree.leaves(full_grads))
  for a, b in zip(jax.tree.leaves(shared_grads), jax.tree.leaves(full_grads)):
    assert np.abs(np.asarray(a) - np.asarray(b)).max() <= 2e-3 * scale


def test_policy_gradient_takes_the_expected_embedding_path_and_matches_autodiff():
  """The training case: d(logps)/d(hidden) only, the entropy stopped, the embedding frozen."""
  rng = np.random.default_rng(2)
  hidden = jnp.array(rng.normal(size=(2, 3, 8)), jnp.float32)
  embed = jnp.array(rng.normal(size=(40, 8)), jnp.float32)
  targets = jnp.array(rng.integers(0, 40, size=(2, 3)))
  weights = jnp.array(rng.normal(size=(2, 3)), jnp.float32)

  def chunked(h):
    logps, entropy = logprobs.logps_and_entropy_from_hidden(h, embed, targets, 0.7, chunk=16)
    return (logps * weights).sum() + 0.0 * jax.lax.stop_gradient(entropy).sum()

  def full(h):
    logp = jax.nn.log_softmax(jnp.einsum("bcd,vd->bcv", h, embed) / 0.7, axis=-1)
    return (jnp.take_along_axis(logp, targets[..., None], -1)[..., 0] * weights).sum()

  program = str(jax.make_jaxpr(jax.grad(chunked))(hidden))
  # One scan (the forward); autodiff's path would add a second, backward one.
  assert program.count("scan[") == 1
  np.testing.assert_allclose(jax.jit(jax.grad(chunked))(hidden), jax.grad(full)(hidden), atol=1e-5)


def test_gradient_into_the_embedding_alone_matches_full_softmax():
  rng = np.random.default_rng(3)
  hidden = jnp.array(rng.normal(size=(2, 3, 8)), jnp.float32)
  embed = jnp.array(rng.normal(size=(40, 8)), jnp.float32)
  targets = jnp.array(rng.integers(0, 40, size=(2, 3)))

  def chunked(e):
    return logprobs.logps_and_entropy_from_hidden(hidden, e, targets, 1.1, chunk=16)[0].sum()

  def full(e):
    logp = jax.nn.log_softmax(jnp.einsum("bcd,vd->bcv", hidden, e) / 1.1, axis=-1)
    return jnp.take_along_axis(logp, targets[..., None], -1)[..., 0].sum()

  np.testing.assert_allclose(jax.grad(chunked)(embed), jax.grad(full)(embed), atol=1e-4)


def test_bfloat16_products_round_the_logits_like_bfloat16_operands():
  rng = np.random.default_rng(3)
  hidden = jnp.array(rng.normal(size=(2, 3, 64)), jnp.float32)
  embed = jnp.array(rng.normal(size=(40, 64)) * 0.2, jnp.float32)
  targets = jnp.array(rng.integers(0, 40, size=(2, 3)))
  got, _ = logprobs.logps_and_entropy_from_hidden(hidden, embed, targets, 0.9, 16, "bfloat16")
  exact, _ = logprobs.logps_and_entropy_from_hidden(hidden, embed, targets, 0.9, 16)
  rounded = lambda x: np.asarray(x.astype(jnp.bfloat16).astype(jnp.float32), np.float64)
  want, _ = _reference(rounded(hidden), rounded(embed), np.asarray(targets), 0.9)
  np.testing.assert_allclose(got, want, atol=1e-4)
  assert float(jnp.abs(got - exact).max()) > 1e-4  # the operands really were rounded

  def policy_gradient(h, matmul_dtype):
    return jax.grad(lambda h: logprobs.logps_and_entropy_from_hidden(
        h, embed, targets, 0.9, 16, matmul_dtype)[0].sum())(h)

  np.testing.assert_allclose(policy_gradient(hidden, "bfloat16"), policy_gradient(hidden, None),
                             atol=2e-2)
