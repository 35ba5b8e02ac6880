"""The policy and reference model as shapes and shardings, from a config, with no weights.

The models are built by the trainer's own code (gemma3_rl.Gemma3, lora.with_adapters,
mesh.shard_model) under `nnx.eval_shape`, so every parameter has the shape,
dtype and partition spec it has in training; each is then placed on the
planning mesh, whose devices may be a TPU or GPU slice that is not here.
"""

from __future__ import annotations

import os
import pathlib
import re

from flax import nnx
import jax

from gemma_grpo.config import settings
from gemma_grpo import config as config_lib
from gemma_grpo import errors
from gemma_grpo.model import gemma3_rl
from gemma_grpo.model import lora
from gemma_grpo.runtime import mesh as mesh_lib
from gemma_grpo.model import model_loading

# The text part of each public Gemma-3 checkpoint's config.json (the -it and
# -pt checkpoints of one size share it): what `model.source=hf:...` would
# download, so a plan needs neither the hub nor a token.
_GEMMA3 = {
    "270m": dict(vocab_size=262144, hidden_size=640, intermediate_size=2048,
                 num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1,
                 head_dim=256, sliding_window=512, query_pre_attn_scalar=256),
    "1b": dict(vocab_size=262144, hidden_size=1152, intermediate_size=6912,
               num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1,
               head_dim=256, sliding_window=512, query_pre_attn_scalar=256),
    "4b": dict(vocab_size=262208, hidden_size=2560, intermediate_size=10240,
               num_hidden_layers=34, num_attention_heads=8, num_key_value_heads=4,
               head_dim=256, sliding_window=1024, query_pre_attn_scalar=256,
               rope_parameters={"full_attention": {"rope_theta": 1_000_000, "factor": 8.0},
                                "sliding_attention": {"rope_theta": 10_000}}),
    "12b": dict(vocab_size=262208, hidden_size=3840, intermediate_size=15360,
                num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=8,
                head_dim=256, sliding_window=1024, query_pre_attn_scalar=256,
                rope_parameters={"full_attention": {"rope_theta": 1_000_000, "factor": 8.0},
                                 "sliding_attention": {"rope_theta": 10_000}}),
    "27b": dict(vocab_size=262208, hidden_size=5376, intermediate_size=21504,
                num_hidden_layers=62, num_attention_heads=32, num_key_value_heads=16,
                head_dim=128, sliding_window=1024, query_pre_attn_scalar=168,
                rope_parameters={"full_attention": {"rope_theta": 1_000_000, "factor": 8.0},
                                 "sliding_attention": {"rope_theta": 10_000}}),
}
_HUB_NAME = re.compile(r"hf:google/gemma-3-(270m|1b|4b|12b|27b)(-it|-pt)?")


def text_config(c: settings.ModelSettings) -> dict:
  """The HF text config that `c.source` (the `model` section) would load."""
  source = c.source
  if source == "random":
    return model_loading.random_hf_config(c.random)
  if source == config_lib.OFFLINE_MODEL:
    return _GEMMA3["270m"]
  known = _HUB_NAME.fullmatch(source)
  if known:
    return _GEMMA3[known.group(1)]
  path = pathlib.Path(os.path.expanduser(source))
  if path.is_dir() and (path / "config.json").is_file():
    return model_loading.text_config(path)
  raise errors.UserError(
      f"model.source={source!r}: plan knows the shapes of hf:google/gemma-3-"
      f"{{{','.join(_GEMMA3)}}}[-it|-pt], {config_lib.OFFLINE_MODEL} and random; for another"
      " model pass a local directory holding its config.json (no weights needed)")


def build(c: settings.Settings, mesh):
  """(reference, policy): the base model and its LoRA policy as abstract models on `mesh`.

  `c` is the whole config. Leaves are ShapeDtypeStructs sharded as in training.
  """
  model_config = model_loading.tunix_config(text_config(c.model), c.model.dtype)

  def models():
    base = mesh_lib.shard_model(gemma3_rl.Gemma3(model_config, rngs=nnx.Rngs(0)), mesh)
    base.matmul_dtype = None if c.model.matmul_dtype == "float32" else c.model.matmul_dtype
    return base, lora.with_adapters(base, c.lora, mesh)

  with jax.set_mesh(mesh):
    base, actor = nnx.eval_shape(models)
  return on_mesh(base, mesh), on_mesh(actor, mesh)


def on_mesh(tree, mesh):
  """`tree` (a module or pytree of ShapeDtypeStructs) with its shardings on `mesh`.

  eval_shape leaves shardings on an abstract mesh; compiling needs the
  devices themselves.
  """
  def place(x):
    if isinstance(x, jax.ShapeDtypeStruct):
      spec = x.sharding.spec if x.sharding is not None else jax.sharding.PartitionSpec()
      _check_divisible(x.shape, spec, mesh)
      return jax.ShapeDtypeStruct(x.shape, x.dtype,
                                  sharding=jax.sharding.NamedSharding(mesh, spec))
    return x

  if isinstance(tree, nnx.Module):
    graphdef, state = nnx.split(tree)
    return nnx.merge(graphdef, jax.tree.map(place, state))
  return jax.tree.map(place, tree)


def _check_divisible(shape, spec, mesh) -> None:
  """What placing real weights checks (mesh.shard_model), which shapes alone do not."""
  for size, axes in zip(shape, spec):
    names = axes if isinstance(axes, tuple) else (axes,)
    devices = 1
    for name in names:
      devices *= mesh.shape[name] if name is not None else 1
    if size % devices:
      raise errors.UserError(
          f"mesh: a parameter of shape {tuple(shape)} cannot be split over mesh"
          f" {dict(mesh.shape)} ({size} is not a multiple of {devices}: spec {spec});"
          " choose mesh.fsdp/mesh.tp that divide the model's dimensions")


def with_host_adapters(module):
  """`module` with zero adapters on the host and its other weights as unplaced shapes.

  What a trainer can be built on: its optimizer initialises its state from
  the adapters' values (the adapters' size; a compile-only device cannot
  hold them), and never reads the frozen weights.
  """
  graphdef, lora_state, rest = nnx.split(module, nnx.LoRAParam, ...)
  cpu = jax.devices("cpu")[0]
  lora_state = jax.tree.map(lambda x: jax.device_put(jax.numpy.zeros(x.shape, x.dtype), cpu),
                            lora_state)
  rest = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), rest)
  return nnx.merge(graphdef, lora_state, rest)


def describe(c: settings.Settings) -> str:
  """One line naming the model's size, e.g. for the report's header."""
  t = text_config(c.model)
  return (f"{c.model.source}: {t['num_hidden_layers']} layers, width {t['hidden_size']},"
          f" {t['num_attention_heads']} heads ({t['num_key_value_heads']} kv) of"
          f" {t.get('head_dim', 256)}, vocabulary {t['vocab_size']}; {c.model.dtype}")
