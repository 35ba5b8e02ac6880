"""Qwix LoRA: targets, sharing of frozen weights, sharding, and the merge math."""

import sys
import threading
import time
import types

import jax
from flax import nnx
import numpy as np
import pytest
import qwix

from conftest import device_mesh
from configs import base
from gemma_grpo import errors
from gemma_grpo.model import lora
from gemma_grpo.runtime import mesh as mesh_lib
from gemma_grpo.model import model_loading
from gemma_grpo.config import settings


def _tiny(fsdp=8, tp=1, **lora_overrides):
  c = base.get_config()
  c.model.source = "random"
  c.model.random.num_heads, c.model.random.head_dim = 4, 16
  c.mesh.fsdp, c.mesh.tp = fsdp, tp
  c.lora.rank, c.lora.alpha = 4, 8.0
  c.lora.update(lora_overrides)
  c = settings.from_config(c)
  mesh = mesh_lib.make_mesh(c.mesh)
  return c, mesh, model_loading.build(c.model, mesh)


def test_lora_targets_every_projection_with_rank_r():
  c, mesh, loaded = _tiny()
  actor = lora.apply(loaded.model, c.lora, mesh)
  names = {".".join(map(str, path[2:])) for path, _ in nnx.state(actor, nnx.LoRAParam).flat_state()}
  assert names == {
      f"{module}.{w}_lora_{ab}"
      for module, w in [("attn.q_einsum", "w"), ("attn.kv_einsum", "w"), ("attn.attn_vec_einsum", "w"),
                        ("mlp.gate_proj", "kernel"), ("mlp.up_proj", "kernel"), ("mlp.down_proj", "kernel")]
      for ab in "ab"
  }
  r = c.model.random
  # A: [in, r] (einsums keep their input axes), B: [r, out...]; r = 4 everywhere.
  expected_per_layer = (
      (r.embed_dim * 4 + 4 * r.num_heads * r.head_dim)  # q
      + (r.embed_dim * 4 + 4 * 2 * r.num_kv_heads * r.head_dim)  # k and v fused
      + (r.num_heads * r.head_dim * 4 + 4 * r.embed_dim)  # attention output
      + 2 * (r.embed_dim * 4 + 4 * r.hidden_dim)  # gate, up
      + (r.hidden_dim * 4 + 4 * r.embed_dim)  # down
  )
  assert lora.num_lora_params(actor) == r.num_layers * expected_per_layer


def test_lora_b_starts_at_zero_so_the_policy_equals_the_base():
  c, mesh, loaded = _tiny()
  actor = lora.apply(loaded.model, c.lora, mesh)
  for path, value in nnx.state(actor, nnx.LoRAParam).flat_state():
    if str(path[-1]).endswith("lora_b"):
      assert not jax.numpy.any(value.get_value()), path


def test_reference_shares_the_actors_frozen_arrays():
  c, mesh, loaded = _tiny()
  actor = lora.apply(loaded.model, c.lora, mesh)
  frozen = jax.tree.leaves(nnx.state(actor, nnx.Not(nnx.LoRAParam)))
  reference = jax.tree.leaves(nnx.state(loaded.model))
  assert len(frozen) == len(reference)
  assert all(a is b for a, b in zip(frozen, reference))


@pytest.mark.parametrize("fsdp, tp", [(8, 1), (4, 2), (2, 4)])
def test_parameters_are_sharded_over_the_mesh(fsdp, tp):
  c, mesh, loaded = _tiny(fsdp, tp)
  actor = lora.apply(loaded.model, c.lora, mesh)
  state = nnx.state(actor)
  embedding = state["embedder"]["input_embedding"].get_value()
  assert embedding.sharding.spec == jax.sharding.PartitionSpec("tp", "fsdp")
  assert not embedding.sharding.is_fully_replicated
  shard = embedding.addressable_shards[0].data.shape
  assert shard == (embedding.shape[0] // tp, embedding.shape[1] // fsdp)
  lora_a = state["layers"][0]["mlp"]["gate_proj"]["kernel_lora_a"].get_value()
  assert not lora_a.sharding.is_fully_replicated or fsdp == 1


def test_compiled_adapter_pass_makes_the_adapters_of_the_eager_one():
  """Qwix's forward pass runs compiled on 8 CPU devices, eagerly on one."""
  c, mesh, loaded = _tiny()
  assert lora._eager_pass_can_deadlock(mesh)  # pylint: disable=protected-access
  actor = lora.apply(loaded.model, c.lora, mesh)
  compiled = nnx.state(actor, nnx.LoRAParam).flat_state()
  one_device = device_mesh()
  assert not lora._eager_pass_can_deadlock(one_device)  # pylint: disable=protected-access
  eager = lora.apply(model_loading.build(c.model, one_device).model, c.lora, one_device)
  eager = dict(nnx.state(eager, nnx.LoRAParam).flat_state())
  assert [path for path, _ in compiled] == list(eager)
  for path, variable in compiled:
    np.testing.assert_array_equal(np.asarray(variable.get_value()), np.asarray(eager[path].get_value()), str(path))
  assert any(np.any(np.asarray(v.get_value())) for p, v in compiled if str(p[-1]).endswith("_lora_a"))
  # Qwix records each einsum's LoRA form during the pass; the merge checks it.
  assert actor.layers[0].attn.q_einsum.w_lora_einsum_str == "BTD,Dr,rNH->BTNH"


def test_targets_matching_nothing_are_rejected():
  c, mesh, loaded = _tiny(targets="no_such_module")
  with pytest.raises(errors.UserError, match="matched no module"):
    lora.apply(loaded.model, c.lora, mesh)


# --- The merge (Qwix's update folded into the weight) --------------------------


@pytest.mark.parametrize("einsum_str, expected", [
    ("BTD,NDH->BTNH", ("Dr", "rNH", "NDH")),  # q_einsum
    ("BSD,CKDH->CBSKH", ("Dr", "rCKH", "CKDH")),  # kv_einsum
    ("BTD,SNDH->SBTNH", ("Dr", "rSNH", "SNDH")),  # qkv_einsum
    ("BTNH,NHD->BTD", ("NHr", "rD", "NHD")),  # attn_vec_einsum
    ("BTr,rH->BTH", ("rA", "AH", "rH")),  # 'r' taken: Qwix's sorted(ascii_letters) -> 'A'
])
def test_einsum_lora_axes_follow_qwix(einsum_str, expected):
  assert lora.einsum_lora_strs(einsum_str) == expected


# (Tunix einsum, Qwix's runtime LoRA einsum `lhs,A,B->out`, lhs shape, W shape)
QWIX_EINSUMS = [
    ("BTD,NDH->BTNH", "BTD,Dr,rNH->BTNH", (2, 3, 8), (4, 8, 5)),
    ("BSD,CKDH->CBSKH", "BSD,Dr,rCKH->CBSKH", (2, 3, 8), (2, 1, 8, 5)),
    ("BTD,SNDH->SBTNH", "BTD,Dr,rSNH->SBTNH", (2, 3, 8), (3, 4, 8, 5)),
    ("BTNH,NHD->BTD", "BTNH,NHr,rD->BTD", (2, 3, 4, 5), (4, 5, 8)),
]


@pytest.mark.parametrize("einsum_str, qwix_str, lhs_shape, w_shape", QWIX_EINSUMS)
def test_merged_weight_reproduces_qwix_runtime_update(einsum_str, qwix_str, lhs_shape, w_shape):
  """x·(W + s·A·B) == x·W + s·einsum(x, A, B), Qwix's forward (lora.py, einsum)."""
  rng = np.random.default_rng(0)
  _, a_str, b_str = qwix_str.split("->")[0].split(",")
  sizes = dict(zip(einsum_str.split("->")[0].split(",")[1], w_shape), r=3)
  a = rng.standard_normal([sizes[c] for c in a_str])
  b = rng.standard_normal([sizes[c] for c in b_str])
  x, w, scale = rng.standard_normal(lhs_shape), rng.standard_normal(w_shape), 0.5
  module = types.SimpleNamespace(einsum_str=einsum_str, w_lora_einsum_str=qwix_str)
  merged = w + scale * lora.lora_delta(module, "w", a, b)
  np.testing.assert_allclose(
      np.einsum(einsum_str, x, merged),
      np.einsum(einsum_str, x, w) + scale * np.einsum(qwix_str, x, a, b), rtol=1e-10)


def test_linear_kernels_merge_as_a_matrix_product():
  """nnx.Linear goes through Qwix's dot_general: x·W + s·(x·A)·B, A [in, r], B [r, out]."""
  rng = np.random.default_rng(1)
  x, w, a, b = (rng.standard_normal(s) for s in [(2, 6), (6, 4), (6, 3), (3, 4)])
  merged = w + 0.5 * lora.lora_delta(types.SimpleNamespace(), "kernel", a, b)
  np.testing.assert_allclose(x @ merged, x @ w + 0.5 * (x @ a) @ b, rtol=1e-10)


class _Identity(nnx.Module):
  def __init__(self):
    self.w = nnx.Param(np.ones((4, 4), np.float32))

  def __call__(self, x):
    return x


def test_qwix_calls_in_one_thread_never_break_jax_in_another():
  # Qwix patches jnp.asarray (and more) during a Qwix model's call, and used to
  # unpatch it while another thread was inside it: KeyError in a rollout.
  c, mesh, loaded = _tiny()
  lora.apply(loaded.model, c.lora, mesh)  # what keeps the patches installed
  x = jax.numpy.ones((2, 4))
  churning = qwix.apply_lora_to_model(_Identity(), qwix.LoraProvider(module_path=".*", rank=2, alpha=2.0), x)
  stop, calls, failures = threading.Event(), [0], []

  def churn():  # enters and leaves Qwix's interception as fast as it can
    while not stop.is_set():
      churning(x)
      calls[0] += 1

  switch_interval = sys.getswitchinterval()
  sys.setswitchinterval(1e-6)  # thread switches anywhere: without the fix, thousands of KeyErrors/s
  thread = threading.Thread(target=churn, daemon=True)
  thread.start()
  try:
    deadline = time.monotonic() + 30.0  # a bound for a stalled machine; normally ~1 s
    while calls[0] < 2000 and time.monotonic() < deadline:
      try:
        jax.numpy.asarray(x)
      except KeyError as e:
        failures.append(e)
  finally:
    stop.set()
    thread.join()
    sys.setswitchinterval(switch_interval)
  assert calls[0] >= 200, calls  # the other thread really churned
  assert not failures, f"{len(failures)} KeyErrors, e.g. {failures[0]!r}"
