"""Our Gemma3 subclass: same numbers as Tunix's, last-token decoding, hidden states."""

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from gemma_grpo.model import lora
from gemma_grpo.runtime import mesh as mesh_lib
from gemma_grpo.model import model_loading
from gemma_grpo.model import gemma3_rl
from gemma_grpo.config import settings


@pytest.fixture(scope="module")
def tiny():
  c = base.get_config()
  c.model.source = "random"
  c.mesh.fsdp = 8
  c = settings.from_config(c)
  mesh = mesh_lib.make_mesh(c.mesh)
  loaded = model_loading.build(c.model, mesh)
  return c, mesh, loaded


def _inputs():
  tokens = jnp.array([[0, 0, 2, 10, 11, 12], [2, 20, 21, 22, 23, 24]] * 4)
  valid = tokens != 0
  positions = jnp.maximum(jnp.cumsum(valid, -1) - 1, 0)
  mask = jnp.tril(jnp.ones((6, 6), bool))[None] & valid[:, None, :]
  return tokens, positions, mask


# Model code runs compiled in these tests: eager, one forward over the 8
# simulated devices queues hundreds of programs with collectives, which can
# deadlock XLA:CPU.
@functools.partial(nnx.jit, static_argnames="last_only")
def _logits(model, tokens, positions, mask, last_only=False):
  return model(tokens, positions, None, mask, decode_only_last_token=last_only)[0]


@nnx.jit
def _hidden(model, tokens, positions, mask):
  return model.hidden_states(tokens, positions, mask)


@nnx.jit
def _decode(model, hidden):
  return model.embedder.decode(hidden)


def test_loaded_models_are_converted_without_copying(tiny):
  _, _, loaded = tiny
  assert isinstance(loaded.model, gemma3_rl.Gemma3)
  again = gemma3_rl.convert(loaded.model)
  assert again is loaded.model


def test_last_token_logits_equal_the_full_forward(tiny):
  _, mesh, loaded = tiny
  tokens, positions, mask = _inputs()
  with jax.set_mesh(mesh):
    full = _logits(loaded.model, tokens, positions, mask)
    last = _logits(loaded.model, tokens, positions, mask, last_only=True)
  assert last.shape == (8, 1, full.shape[-1])
  np.testing.assert_allclose(last[:, 0], full[:, -1], atol=1e-5)


def test_hidden_states_decode_to_the_logits(tiny):
  _, mesh, loaded = tiny
  tokens, positions, mask = _inputs()
  with jax.set_mesh(mesh):
    full = _logits(loaded.model, tokens, positions, mask)
    hidden = _hidden(loaded.model, tokens, positions, mask)
    decoded = _decode(loaded.model, hidden)
  np.testing.assert_allclose(decoded, full, atol=1e-5)


def test_tunix_sampler_uses_last_token_prefill_on_the_lora_policy(tiny):
  from tunix.generate import sampler  # pylint: disable=g-import-not-at-top

  c, mesh, loaded = tiny
  actor = lora.apply(loaded.model, c.lora, mesh)
  s = sampler.Sampler(actor, loaded.tokenizer, sampler.CacheConfig(
      cache_size=64, num_layers=2, num_kv_heads=1, head_dim=32))
  assert s._supports_decode_only_last_token  # pylint: disable=protected-access


def test_hidden_states_of_the_lora_policy_include_the_adapters(tiny):
  """Qwix applies LoRA inside __call__ only; hidden_states must go through it."""
  c, mesh, loaded = tiny
  actor = lora.apply(loaded.model, c.lora, mesh)
  state = nnx.state(actor, nnx.LoRAParam)
  nnx.update(actor, jax.tree.map(lambda x: x + 0.1, state))  # make B non-zero
  tokens, positions, mask = _inputs()
  with jax.set_mesh(mesh):
    base = _hidden(loaded.model, tokens, positions, mask)
    adapted = _hidden(actor, tokens, positions, mask)
    logits = _logits(actor, tokens, positions, mask)
    decoded = _decode(actor, adapted)
  assert float(jnp.abs(adapted - base).max()) > 1e-3
  np.testing.assert_allclose(decoded, logits, atol=1e-4)

  def loss(model):
    return model.hidden_states(tokens, positions, mask).sum()

  with jax.set_mesh(mesh):
    grads = nnx.jit(nnx.grad(loss, argnums=nnx.DiffState(0, nnx.LoRAParam)))(actor)
  assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads))


@pytest.mark.parametrize("argnums", [(0, 1, 2, 3), (2, 3), (0,), (1,)])
def test_lora_dot_gradients_equal_autodiff_of_qwix_form(argnums):
  keys = jax.random.split(jax.random.key(0), 5)
  x = jax.random.normal(keys[0], (2, 5, 8))
  w = jax.random.normal(keys[1], (8, 6))
  a = jax.random.normal(keys[2], (8, 3))
  b = jax.random.normal(keys[3], (3, 6))
  cotangent = jax.random.normal(keys[4], (2, 5, 6))

  def qwix_form(x, w, a, b):
    return jnp.einsum("bti,io->bto", x, w) + jnp.einsum("bti,ir,ro->bto", x, a, b) * 0.7

  expected = jax.grad(lambda *args: jnp.sum(qwix_form(*args) * cotangent), argnums)(x, w, a, b)
  got = jax.jit(jax.grad(lambda *args: jnp.sum(gemma3_rl.lora_dot(*args, 0.7) * cotangent),
                         argnums))(x, w, a, b)
  np.testing.assert_allclose(gemma3_rl.lora_dot(x, w, a, b, 0.7), qwix_form(x, w, a, b), atol=1e-5)
  for e, g in zip(expected, got):
    np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def test_lora_dot_keeps_the_dtypes_of_a_bfloat16_model():
  keys = jax.random.split(jax.random.key(1), 4)
  x, w, a, b = (jax.random.normal(k, s, jnp.bfloat16)
                for k, s in zip(keys, [(2, 5, 8), (8, 6), (8, 3), (3, 6)]))
  qwix_form = jnp.einsum("bti,io->bto", x, w) + jnp.einsum("bti,ir,ro->bto", x, a, b) * 0.7
  y = gemma3_rl.lora_dot(x, w, a, b, 0.7)
  assert y.dtype == qwix_form.dtype == jnp.bfloat16
  grads = jax.grad(lambda *args: gemma3_rl.lora_dot(*args, 0.7).astype(jnp.float32).sum(),
                   (0, 2, 3))(x, w, a, b)
  assert [g.dtype for g in grads] == [jnp.bfloat16] * 3
  np.testing.assert_allclose(y.astype(np.float32), qwix_form.astype(np.float32), rtol=0.05, atol=0.1)


def test_own_feed_forward_matches_qwix_in_values_and_lora_gradients(tiny):
  c, mesh, loaded = tiny
  actor = lora.apply(loaded.model, c.lora, mesh)
  state = nnx.state(actor, nnx.LoRAParam)
  nnx.update(actor, jax.tree.map(lambda x: x + 0.05, state))
  through_qwix = nnx.clone(actor)
  through_qwix.lora_scale = None
  tokens, positions, mask = _inputs()
  weights = jax.random.normal(jax.random.key(1), (*tokens.shape, c.model.random.embed_dim))

  def loss(model):
    return (model.hidden_states(tokens, positions, mask) * weights).sum()

  value_and_grad = nnx.jit(nnx.value_and_grad(loss, argnums=nnx.DiffState(0, nnx.LoRAParam)))
  with jax.set_mesh(mesh):
    own_program = str(jax.make_jaxpr(lambda m: loss(m))(actor))
    assert "custom_vjp" in own_program  # the feed-forward really runs here
    assert "custom_vjp" not in str(jax.make_jaxpr(lambda m: loss(m))(through_qwix))
    value, grads = value_and_grad(actor)
    expected_value, expected_grads = value_and_grad(through_qwix)
  np.testing.assert_allclose(value, expected_value, rtol=1e-5)
  for path, grad in nnx.to_flat_state(grads):
    expected = dict(nnx.to_flat_state(expected_grads))[path]
    scale = float(jnp.abs(expected.get_value()).max())
    # Both programs sum the same float32 terms in orders of XLA's choosing:
    # a cold CI rehearsal measured 2.4e-4 of the largest entry on an adapter Qwix
    # computes in both (the kv projection's A). A wrong gradient is off by
    # its own size.
    np.testing.assert_allclose(grad.get_value(), expected.get_value(), atol=1e-3 * scale, err_msg=str(path))
  mlp_paths = [p for p, _ in nnx.to_flat_state(grads) if "mlp" in p]
  assert len(mlp_paths) == 6 * c.model.random.num_layers  # gate, up, down x (A, B)


def _feed_forward_weights(key, width: int, hidden: int, rank: int):
  shapes = [(width, hidden), (width, rank), (rank, hidden)] * 2 + [
      (hidden, width), (hidden, rank), (rank, width)]
  return tuple(jax.random.normal(k, s) / np.sqrt(s[0])
               for k, s in zip(jax.random.split(key, len(shapes)), shapes))


@pytest.mark.parametrize("matmul_dtype", [None, "bfloat16"])
def test_feed_forward_backward_recomputes_instead_of_saving_intermediates(matmul_dtype):
  statics = gemma3_rl._FeedForwardStatics((True, True, True), 0.5, matmul_dtype, (None,) * 3)
  layers = [_feed_forward_weights(k, 16, 256, 4) for k in jax.random.split(jax.random.key(3), 6)]
  x = jax.random.normal(jax.random.key(4), (2, 128, 16))
  frozen = (0, 3, 6)

  def loss(feed_forward, adapters):
    h = x
    for weights, layer_adapters in zip(layers, adapters):
      merged = [w if i in frozen else layer_adapters.pop(0) for i, w in enumerate(weights)]
      h = h + feed_forward(statics, jnp.tanh(h), tuple(merged))
    return jnp.sum(h * h)

  adapters = [[w for i, w in enumerate(weights) if i not in frozen] for weights in layers]
  programs = {}
  for name, feed_forward in (("recomputed", gemma3_rl._recomputed_feed_forward),
                             ("saved", gemma3_rl._feed_forward_math)):
    grad = jax.jit(jax.value_and_grad(lambda a, f=feed_forward: loss(f, [list(l) for l in a])))
    compiled = grad.lower(adapters).compile()
    programs[name] = (compiled.memory_analysis().temp_size_in_bytes, compiled(adapters))
  (recomputed_bytes, (value, grads)), (saved_bytes, (want_value, want_grads)) = (
      programs["recomputed"], programs["saved"])
  np.testing.assert_allclose(value, want_value, rtol=1e-5)
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(jnp.abs(want).max()))
  # Autodiff keeps each layer's [2, 128, 256] gate, up and activations (256 KiB
  # apiece) for the backward pass; the recomputed program keeps each input
  # (16 KiB). If XLA merged the recomputation into the forward, the two
  # programs' temporaries would be alike.
  assert recomputed_bytes < 0.5 * saved_bytes, (recomputed_bytes, saved_bytes)


def test_lora_dot_in_bfloat16_rounds_only_the_frozen_products():
  keys = jax.random.split(jax.random.key(2), 5)
  x = jax.random.normal(keys[0], (2, 5, 64))
  w = jax.random.normal(keys[1], (64, 48))
  a = jax.random.normal(keys[2], (64, 3))
  b = jax.random.normal(keys[3], (3, 48))
  cotangent = jax.random.normal(keys[4], (2, 5, 48))
  bf16 = functools.partial(jnp.einsum, preferred_element_type=jnp.float32)

  def mixed_form(x, w, a, b):  # x·W from bfloat16 operands, the adapter term in float32
    return (bf16("bti,io->bto", x.astype(jnp.bfloat16), w.astype(jnp.bfloat16))
            + jnp.einsum("bti,ir,ro->bto", x, a, b) * 0.7)

  y = gemma3_rl.lora_dot(x, w, a, b, 0.7, "bfloat16")
  y32 = gemma3_rl.lora_dot(x, w, a, b, 0.7)
  assert y.dtype == jnp.float32
  np.testing.assert_allclose(y, mixed_form(x, w, a, b), rtol=1e-5, atol=1e-5)
  assert float(jnp.abs(y - y32).max()) > 1e-3  # the cast happened
  np.testing.assert_allclose(y, y32, rtol=0.05, atol=0.2)

  dx, da, db = jax.grad(lambda *args: jnp.sum(gemma3_rl.lora_dot(*args, 0.7, "bfloat16") * cotangent),
                        (0, 2, 3))(x, w, a, b)
  dx32, da32, db32 = jax.grad(lambda *args: jnp.sum(gemma3_rl.lora_dot(*args, 0.7) * cotangent),
                              (0, 2, 3))(x, w, a, b)
  want_dx = (bf16("bto,io->bti", cotangent.astype(jnp.bfloat16), w.astype(jnp.bfloat16))
             + jnp.einsum("bto,ro,ir->bti", cotangent, b, a) * 0.7)
  np.testing.assert_allclose(dx, want_dx, rtol=1e-5, atol=1e-4)
  assert float(jnp.abs(dx - dx32).max()) > 1e-3
  # The adapters' gradients never meet W: the same numbers as in float32.
  np.testing.assert_allclose(da, da32, rtol=1e-6)
  np.testing.assert_allclose(db, db32, rtol=1e-6)


def test_matmul_dtype_reaches_the_reference_and_the_lora_policy(tiny):
  c, mesh, loaded = tiny
  tokens, positions, mask = _inputs()
  actor = lora.apply(nnx.clone(loaded.model), c.lora, mesh)
  nnx.update(actor, jax.tree.map(lambda x: x + 0.05, nnx.state(actor, nnx.LoRAParam)))
  for model in (nnx.clone(loaded.model), actor):  # the reference, then the LoRA policy
    mixed = nnx.clone(model)
    mixed.matmul_dtype = "bfloat16"
    with jax.set_mesh(mesh):
      program = str(jax.make_jaxpr(lambda m: m.hidden_states(tokens, positions, mask))(mixed))
      want = _hidden(model, tokens, positions, mask)
      got = _hidden(mixed, tokens, positions, mask)
    # gate, up and down read bfloat16 operands in every layer
    assert program.count("bf16[64,128]") + program.count("bf16[128,64]") >= 3 * c.model.random.num_layers
    assert got.dtype == jnp.float32
    assert 0 < float(jnp.abs(got - want).max()) < 0.05 * float(jnp.abs(want).max())


def test_positions_and_mask_skip_left_padding():
  tokens = jnp.array([[0, 0, 5, 6, 7, 0], [3, 4, 5, 6, 7, 8]])
  positions, mask = gemma3_rl.positions_and_mask(tokens, pad_id=0)
  assert positions.tolist() == [[0, 0, 0, 1, 2, 2], [0, 1, 2, 3, 4, 5]]
  assert mask[0, 4].tolist() == [False, False, True, True, True, False]
  assert mask[1, 2].tolist() == [True, True, True, False, False, False]
