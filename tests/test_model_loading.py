"""Model sources, the Tunix config mapping, and the offline 270M end to end."""

import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
from flax import nnx
import numpy as np
import pytest

from configs import base
from gemma_grpo import config as config_lib
from gemma_grpo import errors
from gemma_grpo.config import settings
from gemma_grpo.model import model_loading

# google/gemma-3-270m and google/gemma-3-1b-it config.json, the fields that matter.
HF_270M = dict(
    vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
    num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
    query_pre_attn_scalar=256, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
)
HF_1B = dict(
    vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
    num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
    query_pre_attn_scalar=256, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
)
PARAGRAPH = (
    "The library opens at nine in the morning and closes at six in the evening."
    " On weekends it stays open until noon. Children can borrow up to five books"
    " at a time, and adults may borrow ten. Late returns cost a small fee for"
    " each day that a book is overdue."
)


@pytest.mark.parametrize("hf, factory", [(HF_270M, "gemma3_270m"), (HF_1B, "gemma3_1b_it")])
def test_tunix_config_matches_tunix_presets(hf, factory):
  from tunix.models.gemma3 import model as gemma3  # pylint: disable=g-import-not-at-top

  ours = model_loading.tunix_config(hf, "float32")
  theirs = getattr(gemma3.ModelConfig, factory)()
  for field in ("num_layers", "num_embed", "embed_dim", "hidden_dim", "num_heads",
                "head_dim", "num_kv_heads", "sliding_window_size",
                "local_base_frequency", "global_base_frequency", "query_pre_attn_norm"):
    assert getattr(ours, field) == getattr(theirs, field), field
  assert ours.param_dtype == jnp.float32


# google/gemma-3-4b-it's text_config as the hub serves it (saved by transformers 4.50).
HF_4B = dict(
    vocab_size=262208, hidden_size=2560, intermediate_size=10240, num_hidden_layers=34,
    num_attention_heads=8, num_key_value_heads=4, head_dim=256, sliding_window=1024,
    query_pre_attn_scalar=256, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
    rope_scaling={"factor": 8.0, "rope_type": "linear"},
)


def test_tunix_config_reads_the_global_rope_scaling_of_older_checkpoints():
  from tunix.models.gemma3 import model as gemma3  # pylint: disable=g-import-not-at-top

  ours = model_loading.tunix_config(HF_4B, "float32")
  theirs = gemma3.ModelConfig.gemma3_4b_it()
  for field in ("num_layers", "embed_dim", "hidden_dim", "num_heads", "head_dim", "num_kv_heads",
                "sliding_window_size", "local_base_frequency", "global_base_frequency",
                "global_scale_factor", "query_pre_attn_norm"):
    assert getattr(ours, field) == getattr(theirs, field), field
  assert ours.global_scale_factor == 8.0
  # Checkpoints of the 1B and 270M give no scaling: 1, as Tunix's presets.
  assert model_loading.tunix_config(HF_1B, "float32").global_scale_factor == 1.0


def test_tunix_config_reads_the_multimodal_text_config(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({"text_config": HF_1B, "vision_config": {}}))
  assert model_loading.text_config(tmp_path)["hidden_size"] == 1152


def test_non_gemma3_layer_pattern_is_rejected():
  hf = dict(HF_270M, layer_types=["full_attention"] * 18)
  with pytest.raises(errors.UserError, match="layer_types"):
    model_loading.tunix_config(hf, "float32")


DEFAULT_MODEL = settings.from_config(base.get_config()).model
ONE_AXIS = settings.MeshSettings(fsdp=-1, tp=1)


def _model_config(source, cache_dir):
  return dataclasses.replace(DEFAULT_MODEL, source=source, cache_dir=str(cache_dir))


@pytest.mark.parametrize("source, needle", [
    ("gguf:llama-7b", "unknown offline model"),
    ("no/such/dir", "neither a directory"),
])
def test_unknown_sources_are_user_errors(tmp_path, source, needle):
  with pytest.raises(errors.UserError, match=needle):
    model_loading.resolve_dir(_model_config(source, tmp_path))


def test_directory_without_weights_is_rejected(tmp_path):
  (tmp_path / "config.json").write_text("{}")
  with pytest.raises(errors.UserError, match="needs config.json and"):
    model_loading.resolve_dir(_model_config(str(tmp_path), tmp_path))


@pytest.mark.parametrize("exception, needle", [
    ("GatedRepoError", "is gated; accept its licence"),
    ("RepositoryNotFoundError", "not found"),
    ("LocalEntryNotFoundError", "cannot download"),
])
def test_hub_failures_are_explained(monkeypatch, tmp_path, exception, needle):
  import huggingface_hub  # pylint: disable=g-import-not-at-top

  class FakeResponse:
    status_code, headers, url, request = 401, {}, "https://huggingface.co", None

  def fail(*args, **kwargs):
    cls = getattr(huggingface_hub.errors, exception)
    try:
      raise cls("nope", response=FakeResponse())
    except TypeError:
      raise cls("nope") from None

  monkeypatch.setattr(huggingface_hub, "snapshot_download", fail)
  with pytest.raises(errors.UserError, match=needle):
    model_loading.resolve_dir(_model_config("hf:google/gemma-3-1b-it", tmp_path))


@pytest.fixture(scope="module")
def offline_270m_dir():
  c = _model_config(config_lib.OFFLINE_MODEL, "~/.cache/gemma_grpo")
  return model_loading.offline_270m_dir(c)


def test_offline_directory_is_a_complete_hf_checkpoint(offline_270m_dir):
  names = {p.name for p in pathlib.Path(offline_270m_dir).iterdir()}
  assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= names
  config = json.loads((offline_270m_dir / "config.json").read_text())
  assert config["model_type"] == "gemma3_text" and config["num_hidden_layers"] == 18
  generation = json.loads((offline_270m_dir / "generation_config.json").read_text())
  assert generation["eos_token_id"] == [1, 106]


@pytest.fixture(scope="module")
def offline_270m(offline_270m_dir):
  from gemma_grpo.runtime import mesh as mesh_lib  # pylint: disable=g-import-not-at-top

  mesh = mesh_lib.make_mesh(ONE_AXIS)
  c = _model_config(config_lib.OFFLINE_MODEL, "~/.cache/gemma_grpo")
  return model_loading.build(c, mesh), mesh


@nnx.jit
def _forward(model, tokens, positions, mask):
  # Compiled, not eager: an eager forward over the 8 simulated devices queues
  # hundreds of programs with collectives, which can deadlock XLA:CPU.
  return model(tokens, positions, None, mask)[0]


def _logits(model, mesh, ids):
  n = len(ids)
  with jax.set_mesh(mesh):
    logits = _forward(model, jnp.array([ids]), jnp.arange(n)[None], jnp.tril(jnp.ones((1, n, n), bool)))
  return np.asarray(logits[0], np.float64)


@pytest.mark.slow
def test_offline_270m_has_low_perplexity(offline_270m):
  loaded, mesh = offline_270m
  ids = loaded.tokenizer.encode(PARAGRAPH)
  logits = _logits(loaded.model, mesh, ids)
  logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
  nll = -np.mean([logp[i, ids[i + 1]] for i in range(len(ids) - 1)])
  # A wrong key mapping or a missed norm offset gives perplexities in the thousands.
  assert np.exp(nll) < 40, np.exp(nll)


@pytest.mark.torch
@pytest.mark.slow
def test_offline_270m_matches_transformers(offline_270m):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  loaded, mesh = offline_270m
  ids = loaded.tokenizer.encode(PARAGRAPH)
  ours = _logits(loaded.model, mesh, ids)
  hf = transformers.AutoModelForCausalLM.from_pretrained(str(loaded.model_dir), dtype=torch.float32)
  with torch.no_grad():
    theirs = hf(torch.tensor([ids])).logits[0].double().numpy()
  assert np.abs(ours - theirs).max() <= 1e-4 * np.abs(theirs).max()
  assert (ours.argmax(-1) == theirs.argmax(-1)).all()


@pytest.mark.slow
def test_bfloat16_products_keep_the_270m_log_probs_close(offline_270m):
  """model.matmul_dtype=bfloat16 on the real weights: the log-probs the loss reads move little."""
  from gemma_grpo.rl.learner import logprobs  # pylint: disable=g-import-not-at-top

  loaded, mesh = offline_270m
  mixed = nnx.merge(*nnx.split(loaded.model))
  mixed.matmul_dtype = "bfloat16"
  ids = jnp.array([loaded.tokenizer.encode(PARAGRAPH)])
  logps = nnx.jit(lambda m: logprobs.per_token_logps(m, ids[:, :8], ids[:, 8:], pad_id=0)[0])
  with jax.set_mesh(mesh):
    exact, rounded = (np.asarray(logps(m), np.float64) for m in (loaded.model, mixed))
  change = np.abs(rounded - exact)
  # Measured 2026-12-03: mean 0.0076, max 0.028 nats over this paragraph.
  assert 0 < change.mean() < 0.015 and change.max() < 0.1, (change.mean(), change.max())


def test_matmul_dtype_is_set_on_the_built_model():
  from gemma_grpo.runtime import mesh as mesh_lib  # pylint: disable=g-import-not-at-top

  mesh = mesh_lib.make_mesh(ONE_AXIS)
  for name, attribute in (("float32", None), ("bfloat16", "bfloat16")):
    c = dataclasses.replace(DEFAULT_MODEL, source="random", matmul_dtype=name)
    assert model_loading.build(c, mesh).model.matmul_dtype == attribute


def test_gemma3_1b_builds_up_to_the_weights():
  """configs/gemma3_1b.py end to end without downloading: abstract 1B + LoRA."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from tunix.models.gemma3 import model as gemma3  # pylint: disable=g-import-not-at-top
  from gemma_grpo.rl.run import cluster as cluster_lib  # pylint: disable=g-import-not-at-top

  c = config_lib.load("configs/gemma3_1b.py")
  config_lib.validate(c, num_devices=8)
  tunix_config = model_loading.tunix_config(HF_1B, c.model.dtype)
  abstract = nnx.eval_shape(lambda: gemma3.Gemma3(tunix_config, rngs=nnx.Rngs(0)))
  sizes = sum(x.size for x in jax.tree.leaves(nnx.state(abstract)))
  assert 0.99e9 < sizes < 1.01e9  # Gemma-3-1B
  cluster = cluster_lib.cluster_config(settings.from_config(c), mesh=None, workdir="/tmp/g1b", writer=None, stop_token_ids=[1, 106])
  assert cluster.training_config.max_steps == 100
  rollout = cluster.rollout_config[next(iter(cluster.rollout_config))]
  assert rollout.kv_cache_size >= rollout.max_prompt_length + rollout.max_tokens_to_generate


# --- Every checkpoint layout a user brings, against transformers' own forward --

# A tiny Gemma-3 text model: 6 layers (5 sliding + 1 global), an 8-token
# window that a 20-token input crosses.
TINY_TEXT = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
    num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=8,
    query_pre_attn_scalar=32, max_position_embeddings=128, initializer_range=0.2,
)
LAYOUTS = ("causal_lm_fp32", "causal_lm_sharded_bf16", "conditional_generation_sharded_bf16")


def _randomize_norms(hf_model, seed: int) -> None:
  """Gives every norm weight a random value: HF initialises them to 0 (scale 1),
  and a loader that dropped or swapped a norm would still match at 0."""
  import torch  # pylint: disable=g-import-not-at-top

  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, param in hf_model.named_parameters():
      if "norm" in name and "vision" not in name:
        param.copy_(0.5 * torch.randn(param.shape, generator=generator))


def _write_layout(layout: str, out: pathlib.Path, tokenizer_dir: pathlib.Path) -> None:
  """Writes a random checkpoint the way transformers saves that layout."""
  import shutil  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  torch.manual_seed(0)
  text = transformers.Gemma3TextConfig(**TINY_TEXT)
  if layout == "conditional_generation_sharded_bf16":
    vision = transformers.SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        image_size=28, patch_size=14)
    config = transformers.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4,
        boi_token_index=500, eoi_token_index=501, image_token_index=502)
    hf_model = transformers.Gemma3ForConditionalGeneration(config)
  else:
    hf_model = transformers.Gemma3ForCausalLM(text)
  _randomize_norms(hf_model, seed=1)
  if layout == "causal_lm_fp32":
    hf_model.save_pretrained(out)
  else:
    hf_model.to(torch.bfloat16).save_pretrained(out, max_shard_size="300KB")
  for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(tokenizer_dir / name, out / name)


@pytest.fixture(scope="module")
def hf_layouts(tmp_path_factory, offline_270m_dir):
  root = tmp_path_factory.mktemp("hf_layouts")
  for layout in LAYOUTS:
    _write_layout(layout, root / layout, offline_270m_dir)
  return root


@pytest.mark.torch
def test_the_layouts_are_written_as_the_hub_ships_them(hf_layouts):
  """The fixture really holds what each layout means (else the tests below test less)."""
  import safetensors  # pylint: disable=g-import-not-at-top

  def keys(layout):
    names = []
    for path in (hf_layouts / layout).glob("*.safetensors"):
      with safetensors.safe_open(path, "np") as f:
        names += list(f.keys())
    return names

  assert not (hf_layouts / "causal_lm_fp32" / "model.safetensors.index.json").exists()
  for layout in LAYOUTS[1:]:
    assert len(list((hf_layouts / layout).glob("*.safetensors"))) > 1
    assert (hf_layouts / layout / "model.safetensors.index.json").exists()
  multimodal = keys("conditional_generation_sharded_bf16")
  assert any(k.startswith("vision_tower.") for k in multimodal)
  assert all(k.startswith(("language_model.model.", "vision_tower.", "multi_modal_projector."))
             for k in multimodal), multimodal
  config = json.loads((hf_layouts / "conditional_generation_sharded_bf16" / "config.json").read_text())
  assert config["architectures"] == ["Gemma3ForConditionalGeneration"]


def _transformers_logits(layout: str, model_dir: pathlib.Path, ids: list[int]) -> np.ndarray:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  cls = (transformers.Gemma3ForConditionalGeneration if layout.startswith("conditional")
         else transformers.Gemma3ForCausalLM)
  hf_model = cls.from_pretrained(str(model_dir), dtype=torch.float32)
  with torch.no_grad():
    return hf_model(torch.tensor([ids])).logits[0].double().numpy()


@pytest.mark.torch
@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_layout_loads_to_transformers_logits(hf_layouts, layout):
  """Our JAX forward of the loaded checkpoint equals transformers' forward of
  the same files: a mapping mistake made symmetrically in loader and exporter
  passes a round trip, but not this."""
  from gemma_grpo.runtime import mesh as mesh_lib  # pylint: disable=g-import-not-at-top

  mesh = mesh_lib.make_mesh(ONE_AXIS)
  # bf16 files are upcast, as transformers' float32 load does
  c = dataclasses.replace(_model_config(str(hf_layouts / layout), hf_layouts), dtype="float32")
  loaded = model_loading.build(c, mesh)
  ids = [int(i) for i in np.random.RandomState(0).randint(0, 500, size=20)]
  ours = _logits(loaded.model, mesh, ids)
  theirs = _transformers_logits(layout, hf_layouts / layout, ids)
  assert np.abs(theirs).max() > 1.0  # random weights large enough to show a mistake
  np.testing.assert_allclose(ours, theirs, atol=2e-5 * np.abs(theirs).max(), rtol=0)


@pytest.mark.torch
def test_multimodal_checkpoint_exports_its_text_model_unchanged(hf_layouts):
  """The export of a model loaded from a multimodal checkpoint holds exactly
  its language_model tensors under Gemma3ForCausalLM names, the vision tower
  dropped."""
  import safetensors.numpy  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import hf_layout  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import lora  # pylint: disable=g-import-not-at-top
  from gemma_grpo.runtime import mesh as mesh_lib  # pylint: disable=g-import-not-at-top

  layout = hf_layouts / "conditional_generation_sharded_bf16"
  mesh = mesh_lib.make_mesh(ONE_AXIS)
  c = dataclasses.replace(_model_config(str(layout), hf_layouts), dtype="float32")
  exported = hf_layout.to_hf(lora.merged_params(model_loading.build(c, mesh).model, 1.0))
  original = {}
  for path in layout.glob("*.safetensors"):
    original.update(safetensors.numpy.load_file(path))
  text = {k.removeprefix("language_model."): v for k, v in original.items()
          if k.startswith("language_model.")}
  assert sorted(exported) == sorted(text)
  for name, value in text.items():
    np.testing.assert_array_equal(exported[name], value.astype(np.float32), err_msg=name)
