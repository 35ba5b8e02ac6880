"""gemma-grpo export: the LoRA merge, HF and GGUF layouts, the CLI's guarantees.

The reference for every numerical check is the JAX policy itself (the
restored actor with its LoRA adapters), run by Tunix; the export is loaded by
an independent implementation (transformers' PyTorch Gemma-3, gguf-py).
"""

import hashlib
import json
import pathlib
import types

import numpy as np
import pytest

from conftest import device_mesh
from gemma_grpo import config as config_lib
from gemma_grpo import errors
from gemma_grpo.config import settings
from gemma_grpo.commands import export
from gemma_grpo.model import export_formats
from gemma_grpo.model import hf_export
from gemma_grpo.model import hf_layout
from gemma_grpo.model import gguf_io
from gemma_grpo.model import gguf_reader
from gemma_grpo.runtime import hub as hub_lib
from gemma_grpo.model import lora
from gemma_grpo.runtime import mesh as mesh_lib
from gemma_grpo.model import model_card
from gemma_grpo.model import policy as policy_lib
from gemma_grpo.tasks import prompts

from conftest import run_cli  # pylint: disable=g-bad-import-order
import fake_hub  # pylint: disable=g-bad-import-order

# 72 tokens with <bos>: longer than the tiny model's 64-token sliding window.
QUESTION = (
    "Mia packs 7 boxes with 12 pencils each and gives away 19 pencils."
    " How many pencils does she keep?"
)
FP32_BOUND = 1e-4  # max |logit diff| <= FP32_BOUND * max |logit|
# bf16 weights (rounded after merging) read back in float32, against the JAX
# policy running on the same rounded weights: what is left is the two
# implementations' float32 arithmetic. (Against the unrounded policy the
# difference depends on how sensitive the trained tiny model happens to be:
# 3% to 22% of its largest logit for two equally good 2-step runs.)
BF16_BOUND = FP32_BOUND
# The real 270M's bf16 export against its float32 policy measures 0.67% of
# the largest logit, well under its LoRA's effect (over 5%, checked below).
BF16_VS_FLOAT32_BOUND_270M = 0.02
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def tree_digest(root: pathlib.Path) -> dict[str, str]:
  """{relative path: sha256} of every file and directory under `root`."""
  digest = {}
  for path in sorted(root.rglob("*")):
    rel = str(path.relative_to(root))
    digest[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
  return digest


class JaxReference:
  """A JAX model copied onto one device, jitted once at a fixed padded length.

  Causal attention makes the logits at position t independent of the padding
  after it. One device, because a model sharded over 8 simulated CPU devices
  runs a forward ~10x slower.
  """

  def __init__(self, model, length: int):
    from flax import nnx  # pylint: disable=g-import-not-at-top
    import jax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

    graphdef, state = nnx.split(model)
    self._state = jax.device_put(state, jax.devices()[0])
    self.length = length
    positions = jnp.arange(length)[None]
    mask = jnp.tril(jnp.ones((length, length), bool))[None]

    def logits(state, tokens_1xL):
      return nnx.merge(graphdef, state)(tokens_1xL, positions, None, mask)[0][0]

    self._logits = jax.jit(logits)
    self._next = jax.jit(lambda state, tokens_1xL, t: jnp.argmax(logits(state, tokens_1xL)[t - 1]))

  def _padded(self, ids: list[int]):
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

    return jnp.asarray([list(ids) + [0] * (self.length - len(ids))])

  def logits(self, ids: list[int]) -> np.ndarray:
    """[len(ids), V] float32."""
    return np.asarray(self._logits(self._state, self._padded(ids)), np.float32)[:len(ids)]

  def greedy(self, ids: list[int], new_tokens: int) -> list[int]:
    seq = list(ids)
    for _ in range(new_tokens):
      seq.append(int(self._next(self._state, self._padded(seq), len(seq))))
    return seq[len(ids):]


def randomize_lora_b(actor, path_part: str, seed: int, std: float = 0.2) -> None:
  """Sets every LoRA B under a module path containing `path_part` to N(0, std²)."""
  import jax  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top

  key = jax.random.key(seed)
  for path, _ in nnx.to_flat_state(nnx.state(actor, nnx.LoRAParam)):
    if str(path[-1]).endswith("lora_b") and path_part in map(str, path):
      module = actor
      for part in path[:-1]:
        module = module[part] if isinstance(part, int) else getattr(module, part)
      variable = getattr(module, path[-1])
      key, sub = jax.random.split(key)
      value = variable.get_value()
      noise = std * jax.random.normal(sub, value.shape, value.dtype)
      variable.set_value(jax.device_put(noise, value.sharding))


def hf_logits(out_dir: pathlib.Path, ids: list[int]) -> np.ndarray:
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import AutoModelForCausalLM  # pylint: disable=g-import-not-at-top

  model = AutoModelForCausalLM.from_pretrained(str(out_dir), dtype=torch.float32)
  with torch.no_grad():
    return model(torch.tensor([ids])).logits[0].numpy()


@pytest.fixture(scope="module")
def exported(tiny_run, tmp_path_factory):
  """The tiny run restored once and exported as HF fp32, HF bf16 and GGUF.

  A random model's rewards are all equal (it never writes the tags), so its
  advantages and gradients are zero and training leaves B at zero: every
  adapter gets a random B, so that a layout mistake in any merged weight
  shows up in the logits. The work directory is hashed before the restore
  and after the exports.
  """
  before = tree_digest(tiny_run)
  policy = policy_lib.restore(tiny_run, mesh_lib.make_mesh(settings.from_config(config_lib.defaults()).mesh))
  randomize_lora_b(policy.actor, "layers", seed=0)
  root = tmp_path_factory.mktemp("exports")
  dirs = {}
  for name, kwargs in {
      "fp32": dict(dtype="float32"),
      "bf16": dict(dtype="bfloat16"),
      "gguf": dict(dtype="float32", fmt="gguf"),
      "gguf_q4_0": dict(dtype="float32", fmt="gguf", quant="q4_0"),
  }.items():
    dirs[name] = hf_export.export_policy(policy, tiny_run, root / name, **kwargs)
  dirs["gguf_file"] = hf_export.export_policy(policy, tiny_run, root / "named" / "policy.gguf",
                                           dtype="float32", fmt="gguf")
  after = tree_digest(tiny_run)
  ids = policy.loaded.tokenizer.encode(prompts.render_prompt(QUESTION))
  actor = JaxReference(policy.actor, len(ids) + 32)
  logits = actor.logits(ids)
  return types.SimpleNamespace(
      policy=policy, dirs=dirs, before=before, after=after, ids=ids, actor=actor,
      logits=logits, merged=hf_layout.merged_tensors(policy),
  )


# --- The merge ------------------------------------------------------------------


def test_fused_qkv_splits_into_hf_projections():
  """Sizes with as many KV heads as query heads fuse q, k, v: [3, N, D, H]."""
  n, d, h = 2, 6, 4
  qkv = np.arange(3 * n * d * h, dtype=np.float32).reshape(3, n, d, h)
  hf = hf_layout.to_hf({"layers.0.attn.qkv_einsum.w": qkv})
  for i, proj in enumerate("qkv"):
    # HF row n*H + h, column d holds W[n, d, h].
    expected = np.array([[qkv[i, head, col, j] for col in range(d)] for head in range(n) for j in range(h)])
    np.testing.assert_array_equal(hf[f"model.layers.0.self_attn.{proj}_proj.weight"], expected)


def test_merge_matches_an_independent_numpy_merge_of_layer_0(exported):
  """W + (alpha/r)·A·B per weight kind, written out by hand, HF-arranged by hand."""
  from flax import nnx  # pylint: disable=g-import-not-at-top

  p = exported.policy
  scale = p.settings.lora.alpha / p.settings.lora.rank
  layer = p.actor.layers[0]
  get = lambda v: np.asarray(v.get_value(), dtype=np.float64)
  attn, mlp = layer.attn, layer.mlp
  q = get(attn.q_einsum.w) + scale * np.einsum("dr,rnh->ndh", get(attn.q_einsum.w_lora_a), get(attn.q_einsum.w_lora_b))
  kv = get(attn.kv_einsum.w) + scale * np.einsum("dr,rckh->ckdh", get(attn.kv_einsum.w_lora_a), get(attn.kv_einsum.w_lora_b))
  o = get(attn.attn_vec_einsum.w) + scale * np.einsum(
      "nhr,rd->nhd", get(attn.attn_vec_einsum.w_lora_a), get(attn.attn_vec_einsum.w_lora_b))
  rows = lambda w_ndh: np.concatenate([w_ndh[i].T for i in range(w_ndh.shape[0])])  # [N*H, D]
  expected = {
      "self_attn.q_proj": rows(q),
      "self_attn.k_proj": rows(kv[0]),
      "self_attn.v_proj": rows(kv[1]),
      "self_attn.o_proj": np.concatenate([o[i] for i in range(o.shape[0])]).T,
  }
  for proj in ("gate_proj", "up_proj", "down_proj"):
    m = getattr(mlp, proj)
    expected[f"mlp.{proj}"] = (get(m.kernel) + scale * get(m.kernel_lora_a) @ get(m.kernel_lora_b)).T
  for name, want in expected.items():
    got = exported.merged[f"model.layers.0.{name}.weight"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)
  assert nnx.state(p.actor, nnx.LoRAParam)  # the adapters were there to merge


def test_lora_really_changed_the_targeted_weights_and_nothing_else(exported):
  base_tensors = hf_layout.to_hf(lora.merged_params(exported.policy.loaded.model, 0.0))
  assert base_tensors.keys() == exported.merged.keys()
  changed = set()
  for name, merged in exported.merged.items():
    change = np.abs(merged - base_tensors[name]).max()
    if any(f".{t}." in name for t in LORA_TARGETS):
      if change > 1e-3 * max(np.abs(base_tensors[name]).max(), 1e-3):
        changed.add(name.split(".")[-2])
    else:
      assert change == 0, name
  assert changed == {t for t in LORA_TARGETS}, changed


def test_merged_tensors_are_the_text_model_in_hf_layout(exported):
  p = exported.policy.settings.model.random
  shapes = {k: v.shape for k, v in exported.merged.items()}
  assert shapes["model.embed_tokens.weight"] == (p.vocab_size, p.embed_dim)
  assert shapes["model.layers.1.self_attn.q_proj.weight"] == (p.num_heads * p.head_dim, p.embed_dim)
  assert shapes["model.layers.1.self_attn.k_proj.weight"] == (p.num_kv_heads * p.head_dim, p.embed_dim)
  assert shapes["model.layers.1.self_attn.o_proj.weight"] == (p.embed_dim, p.num_heads * p.head_dim)
  assert shapes["model.layers.1.mlp.down_proj.weight"] == (p.embed_dim, p.hidden_dim)
  assert shapes["model.layers.1.self_attn.q_norm.weight"] == (p.head_dim,)
  assert len(shapes) == 2 + p.num_layers * 13
  assert all(v.dtype == np.float32 for v in exported.merged.values())


# --- HF directory ---------------------------------------------------------------


@pytest.mark.torch
def test_hf_fp32_export_reproduces_the_jax_policy_logits(exported):
  ref = exported.logits
  got = hf_logits(exported.dirs["fp32"], exported.ids)
  diff = np.abs(got - ref).max()
  assert diff <= FP32_BOUND * np.abs(ref).max(), diff
  # The bound is far below the LoRA's own effect, so an unmerged export fails.
  unmerged = JaxReference(exported.policy.loaded.model, len(exported.ids)).logits(exported.ids)
  assert np.abs(unmerged - ref).max() > 100 * FP32_BOUND * np.abs(ref).max()


@pytest.mark.torch
def test_hf_bf16_export_is_within_the_bf16_bound(exported):
  import safetensors  # pylint: disable=g-import-not-at-top

  out = exported.dirs["bf16"]
  with safetensors.safe_open(str(out / "model.safetensors"), "np") as f:
    assert f.get_slice("model.embed_tokens.weight").get_dtype() == "BF16"
  assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
  ref = bf16_rounded_policy_logits(exported.policy, exported.ids)
  diff = np.abs(hf_logits(out, exported.ids) - ref).max()
  assert diff <= BF16_BOUND * np.abs(ref).max(), diff
  # Rounding did happen: the rounded policy differs from the float32 one.
  assert np.abs(ref - exported.logits).max() > 10 * BF16_BOUND * np.abs(ref).max()


def bf16_rounded_policy_logits(policy, ids: list[int]) -> np.ndarray:
  """Logits of the plain model holding the merged weights rounded to bf16."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  c = policy.settings.lora
  merged = lora.merged_params(policy.actor, c.alpha / c.rank)
  plain = nnx.clone(policy.loaded.model)  # new variables, so the policy is untouched
  nnx.update(plain, nnx.State.from_flat_path({
      tuple(int(k) if k.isdigit() else k for k in name.split(".")):
          jnp.asarray(value).astype(jnp.bfloat16).astype(jnp.float32)
      for name, value in merged.items()
  }))
  return JaxReference(plain, len(ids) + 32).logits(ids)


@pytest.mark.torch
def test_greedy_generation_matches_the_jax_policy(exported):
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import AutoModelForCausalLM  # pylint: disable=g-import-not-at-top

  model = AutoModelForCausalLM.from_pretrained(str(exported.dirs["fp32"]), dtype=torch.float32)
  out = model.generate(torch.tensor([exported.ids]), do_sample=False, max_new_tokens=32)
  hf_tokens = out[0, len(exported.ids):].tolist()
  assert len(hf_tokens) == 32
  assert hf_tokens == exported.actor.greedy(exported.ids, 32)


def test_hf_directory_is_a_complete_text_only_checkpoint(exported):
  out = exported.dirs["fp32"]
  assert {p.name for p in out.iterdir()} == {
      "model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
      "tokenizer_config.json", "README.md",
  }
  config = json.loads((out / "config.json").read_text())
  assert config["architectures"] == ["Gemma3ForCausalLM"]
  assert config["model_type"] == "gemma3_text" and config["dtype"] == "float32"
  r = exported.policy.settings.model.random
  assert (config["num_hidden_layers"], config["hidden_size"], config["num_key_value_heads"]) == (
      r.num_layers, r.embed_dim, r.num_kv_heads)
  assert config["sliding_window"] == r.sliding_window and config["tie_word_embeddings"]
  assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == [1, 106]
  import safetensors.numpy  # pylint: disable=g-import-not-at-top

  saved = safetensors.numpy.load_file(str(out / "model.safetensors"))
  assert saved.keys() == exported.merged.keys()
  assert all(np.array_equal(saved[k], v) for k, v in exported.merged.items())


def test_exported_tokenizer_renders_the_training_prompt(exported):
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top

  tok = AutoTokenizer.from_pretrained(str(exported.dirs["fp32"]))
  messages = [
      {"role": "system", "content": prompts.SYSTEM_INSTRUCTION},
      {"role": "user", "content": QUESTION},
  ]
  text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
  assert text == "<bos>" + prompts.render_prompt(QUESTION)
  ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
  assert list(ids["input_ids"]) == exported.ids


def test_model_card_names_the_run_and_its_evaluation(exported, tmp_path):
  (tmp_path / "eval_step2").mkdir()
  (tmp_path / "eval_step2" / "eval.json").write_text(
      json.dumps({"metrics": {"accuracy": 0.375, "format_accuracy": 0.5}, "samples": [1, 2]}))
  card = model_card.write(exported.policy, tmp_path, "hf", "float32")
  c = exported.policy.settings
  for needle in ("license: gemma", model_card.LICENSE_URL, "step 2", "`random`", c.data.source,
                 f"{c.lora.rank} / {c.lora.alpha}", "| accuracy | 0.375 |", "AutoModelForCausalLM",
                 c.grpo.algorithm):
    assert needle in card, needle
  assert (exported.dirs["fp32"] / "README.md").read_text().startswith("---\nlicense: gemma")


def test_model_card_shows_the_few_shot_prompt_the_stop_text_and_the_runs_own_evals(exported, tmp_path):
  import dataclasses  # pylint: disable=g-import-not-at-top

  c = exported.policy.settings
  c = dataclasses.replace(
      c, data=dataclasses.replace(c.data, few_shot=(("Solve for x: x + 7 = 15", "x = 15 - 7 = 8.", "8"),)),
      rollout=dataclasses.replace(c.rollout, stop_text="</answer>"))
  policy = dataclasses.replace(exported.policy, settings=c)
  for step, accuracy in ((0, 0.25), (14, 0.5)):
    (tmp_path / "eval" / f"step_{step:06d}").mkdir(parents=True)
    (tmp_path / "eval" / f"step_{step:06d}" / "eval.json").write_text(
        json.dumps({"metrics": {"accuracy": accuracy}}))
  card = model_card.write(policy, tmp_path, "hf", "float32")
  assert "Solve for x: x + 7 = 15" in card and "1 solved example as" in card
  assert "`</answer>`: use it as a stop string" in card
  assert card.index("`eval/step_000000/eval.json`") < card.index("`eval/step_000014/eval.json`")
  assert "| accuracy | 0.5 |" in card


@pytest.mark.torch
def test_sharded_export_has_an_index_and_loads_the_same(exported, tmp_path):
  import safetensors.numpy  # pylint: disable=g-import-not-at-top

  files = hf_export.export_hf(exported.policy, tmp_path, tmp_path, max_shard_size="20MB")
  shards = sorted(tmp_path.glob("model-*-of-*.safetensors"))
  # The 67 MB embedding is larger than a shard: it gets one of its own.
  assert [p.name for p in shards] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
  assert hf_export.INDEX_FILE in files and not (tmp_path / hf_export.SINGLE_FILE).exists()
  index = json.loads((tmp_path / hf_export.INDEX_FILE).read_text())
  assert index["weight_map"]["model.embed_tokens.weight"] == shards[0].name
  assert index["metadata"]["total_size"] == sum(v.nbytes for v in exported.merged.values())
  loaded = {}
  for shard in shards:
    loaded.update(safetensors.numpy.load_file(str(shard)))
  assert loaded.keys() == exported.merged.keys() == index["weight_map"].keys()
  np.testing.assert_array_equal(hf_logits(tmp_path, exported.ids), hf_logits(exported.dirs["fp32"], exported.ids))


@pytest.mark.parametrize("text, expected", [
    ("2GB", 2 * 10**9), ("500MB", 500 * 10**6), ("1.5GiB", 3 * 2**29), ("4096", 4096), ("20 mb", 20 * 10**6),
])
def test_shard_sizes_parse(text, expected):
  assert hf_export.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "0GB", "2XB", "-1MB", "big"])
def test_bad_shard_sizes_are_user_errors(text):
  with pytest.raises(errors.UserError, match="--max-shard-size"):
    hf_export.parse_size(text)


# --- GGUF -------------------------------------------------------------------------


def test_gguf_export_reads_back_as_the_merged_weights(exported):
  path = exported.dirs["gguf"] / export_formats.GGUF_FILE
  assert {p.name for p in exported.dirs["gguf"].iterdir()} == {export_formats.GGUF_FILE, "README.md"}
  contents = gguf_reader.read(path)
  back = gguf_io.read_tensors(contents)
  assert back.keys() == exported.merged.keys()
  for name, merged in exported.merged.items():
    # Norms are stored as 1 + w (llama.cpp's Gemma convention) in float32.
    expected = (np.float32(1) + merged) - np.float32(1) if gguf_io.is_norm(name) else merged
    np.testing.assert_array_equal(back[name], expected, err_msg=name)
  types_by_name = {t.name: t.tensor_type.name for t in contents.tensors}
  assert set(types_by_name.values()) == {"F32"}
  r = exported.policy.settings.model.random
  config = gguf_io.hf_config_kwargs(contents)
  assert {k: config[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                 "num_attention_heads", "num_key_value_heads", "head_dim", "sliding_window")} == {
      "vocab_size": r.vocab_size, "hidden_size": r.embed_dim, "intermediate_size": r.hidden_dim,
      "num_hidden_layers": r.num_layers, "num_attention_heads": r.num_heads,
      "num_key_value_heads": r.num_kv_heads, "head_dim": r.head_dim, "sliding_window": r.sliding_window}
  assert config["rope_parameters"]["full_attention"]["rope_theta"] == 1_000_000.0
  assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (2, 1, 0)
  pieces, _, token_types = gguf_io.vocabulary(contents)
  assert len(pieces) == exported.policy.loaded.tokenizer.vocab_size()
  assert pieces[106] == "<end_of_turn>" and token_types[106] == 3
  assert contents.metadata["tokenizer.chat_template"] == prompts.CHAT_TEMPLATE
  # What chat front ends stop on: <eos>, and <end_of_turn> as the end of a turn.
  assert contents.metadata["tokenizer.ggml.eot_token_id"] == 106


def test_quantized_gguf_export_keeps_norms_f32_and_the_tied_embedding_q8_0(exported):
  contents = gguf_reader.read(exported.dirs["gguf_q4_0"] / export_formats.GGUF_FILE)
  types_by_name = {t.name: t.tensor_type.name for t in contents.tensors}
  assert types_by_name.pop("token_embd.weight") == "Q8_0"
  assert {n for n, t in types_by_name.items() if t == "F32"} == {n for n in types_by_name if n.endswith("norm.weight")}
  assert {t for n, t in types_by_name.items() if not n.endswith("norm.weight")} == {"Q4_0"}
  assert contents.metadata["general.file_type"] == 2  # llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_0
  back = gguf_io.read_tensors(contents)
  for name, merged in exported.merged.items():
    if gguf_io.is_norm(name):
      np.testing.assert_array_equal(back[name], (np.float32(1) + merged) - np.float32(1), err_msg=name)
    else:  # 4 bits a weight: within the block quantization's bound, and not the same
      assert 0 < np.abs(back[name] - merged).max() <= np.abs(merged).max() / 7, name
  assert "saved as Q4_0" in (exported.dirs["gguf_q4_0"] / "README.md").read_text()


@pytest.mark.torch
@pytest.mark.slow
def test_transformers_reads_the_gguf_export_with_the_hf_exports_logits(exported):
  """transformers' own GGUF loader (gguf_file=, a reader we did not write)
  loads our GGUF export to the logits of our HF export of the same policy."""
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import AutoModelForCausalLM  # pylint: disable=g-import-not-at-top

  # transformers' GGUF config mapping has no query_pre_attn_scalar and falls
  # back to 256: right for Gemma-3 270M to 12B (head_dim 256), not for this
  # tiny model's head_dim, so the test passes it as a user would.
  head_dim = exported.policy.settings.model.random.head_dim
  model = AutoModelForCausalLM.from_pretrained(
      str(exported.dirs["gguf"]), gguf_file=export_formats.GGUF_FILE, dtype=torch.float32,
      query_pre_attn_scalar=head_dim)
  assert type(model).__name__ == "Gemma3ForCausalLM"
  with torch.no_grad():
    theirs = model(torch.tensor([exported.ids])).logits[0].numpy()
  reference = hf_logits(exported.dirs["fp32"], exported.ids)
  np.testing.assert_allclose(theirs, reference, atol=1e-5 * np.abs(reference).max(), rtol=0)


def _tiny_hf_tensors(rng) -> dict[str, np.ndarray]:
  shapes = {
      "model.embed_tokens.weight": (8, 32), "model.norm.weight": (32,),
      "model.layers.0.self_attn.q_proj.weight": (64, 32), "model.layers.0.self_attn.k_proj.weight": (32, 32),
      "model.layers.0.self_attn.v_proj.weight": (32, 32), "model.layers.0.self_attn.o_proj.weight": (32, 64),
      "model.layers.0.self_attn.q_norm.weight": (32,), "model.layers.0.self_attn.k_norm.weight": (32,),
      "model.layers.0.mlp.gate_proj.weight": (64, 32), "model.layers.0.mlp.up_proj.weight": (64, 32),
      "model.layers.0.mlp.down_proj.weight": (32, 64), "model.layers.0.input_layernorm.weight": (32,),
      "model.layers.0.post_attention_layernorm.weight": (32,),
      "model.layers.0.pre_feedforward_layernorm.weight": (32,),
      "model.layers.0.post_feedforward_layernorm.weight": (32,),
  }
  return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def test_out_ending_in_gguf_is_the_file_itself(exported):
  path = exported.dirs["gguf_file"]
  assert path.is_file() and path.name == "policy.gguf"
  assert [p.name for p in path.parent.iterdir()] == ["policy.gguf"]  # no temporary left
  assert path.read_bytes() == (exported.dirs["gguf"] / export_formats.GGUF_FILE).read_bytes()


def blockwise_bound(x: np.ndarray, tensor_type: str) -> np.ndarray:
  """Largest error a block quantization may make on each element of `x` ([..., n], n % 32 == 0).

  By hand from llama.cpp's reference quantizers: Q8_0 scales each block of 32 by
  d = max|x| / 127 and rounds x / d to an integer (error <= d / 2); Q4_0 by
  d = x_maxabs / -8 to 16 levels, clipped at 15 (error <= |d|). d is stored in
  float16, whose rounding (2^-11 relative) scales every level: up to 2^-11 of
  |x| + |d| more.
  """
  blocks = x.reshape(-1, 32)
  amax = np.abs(blocks).max(axis=1, keepdims=True)
  d = amax / 127 if tensor_type == "Q8_0" else amax / 8
  step = d / 2 if tensor_type == "Q8_0" else d
  return (step + (np.abs(blocks) + d) * 2.0**-10).reshape(x.shape)


def test_the_command_writes_a_q8_0_gguf(exported, tmp_path, monkeypatch):
  monkeypatch.setattr(policy_lib, "restore", lambda workdir, mesh, step=None: exported.policy)
  (tmp_path / "run").mkdir()
  out = tmp_path / "g-q8_0.gguf"
  assert export.main(["--workdir", str(tmp_path / "run"), "--out", str(out), "--format", "gguf",
                      "--quant", "q8_0"]) == 0
  contents = gguf_reader.read(out)
  assert contents.metadata["general.file_type"] == 7  # llama.cpp's LLAMA_FTYPE_MOSTLY_Q8_0
  assert {t.tensor_type.name for t in contents.tensors if not t.name.endswith("norm.weight")} == {"Q8_0"}


@pytest.mark.parametrize("tensor_type", ["F32", "F16", "BF16", "Q8_0", "Q4_0"])
def test_write_gguf_round_trips_through_read_tensors(tmp_path, tensor_type):
  import ml_dtypes  # pylint: disable=g-import-not-at-top

  tensors = _tiny_hf_tensors(np.random.default_rng(0))
  config = dict(vocab_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                max_position_embeddings=1024, rms_norm_eps=1e-6, sliding_window=512,
                rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
                bos_token_id=2, eos_token_id=1, pad_token_id=0)
  vocab = (["<pad>", "<eos>", "<bos>", "<unk>", "a", "b", "ab", "<0x41>"],
           [0.0, 0.0, 0.0, 0.0, -1.0, -2.0, -3.0, 0.0], [3, 3, 3, 3, 1, 1, 1, 6])
  path = tmp_path / "m.gguf"
  gguf_io.write_gguf(path, tensors, config, vocab, tensor_type=tensor_type, name="t")
  contents = gguf_reader.read(path)
  back = gguf_io.read_tensors(contents)
  stored = {t.name: t.tensor_type.name for t in contents.tensors}
  for name, x in tensors.items():
    if gguf_io.is_norm(name):
      assert stored[gguf_io.gguf_name(name)] == "F32"
      np.testing.assert_array_equal(back[name], (np.float32(1) + x) - np.float32(1), err_msg=name)
    elif tensor_type.startswith("Q"):
      kind = "Q8_0" if name == "model.embed_tokens.weight" else tensor_type
      assert stored[gguf_io.gguf_name(name)] == kind, name
      assert np.all(np.abs(back[name] - x) <= blockwise_bound(x, kind)), name
    else:
      cast = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}[tensor_type]
      np.testing.assert_array_equal(back[name], x.astype(cast).astype(np.float32), err_msg=name)
  read_config = gguf_io.hf_config_kwargs(contents)
  assert read_config.pop("query_pre_attn_scalar") == config["head_dim"]
  assert read_config == dict(config, rms_norm_eps=float(np.float32(1e-6)))  # GGUF keeps a float32
  assert gguf_io.vocabulary(contents) == vocab
  assert contents.metadata["tokenizer.ggml.unknown_token_id"] == 3


def test_a_row_of_partial_blocks_falls_back_to_f16_as_llama_cpps_converter_does():
  tensors = {"model.layers.0.mlp.down_proj.weight": np.zeros((8, 48), np.float32),
             "model.layers.0.mlp.up_proj.weight": np.zeros((48, 64), np.float32),
             "model.norm.weight": np.zeros((64,), np.float32)}
  assert gguf_io.tensor_types(tensors, "Q8_0") == {
      "model.layers.0.mlp.down_proj.weight": "F16", "model.layers.0.mlp.up_proj.weight": "Q8_0",
      "model.norm.weight": "F32"}


def test_tokenizer_json_vocabulary_scores_follow_the_merge_order(tmp_path):
  spec = {
      "model": {
          "type": "BPE", "vocab": {"<pad>": 0, "<eos>": 1, "<0x41>": 2, "a": 3, "b": 4, "ab": 5, "abb": 6, "ba": 7},
          "merges": [["a", "b"], ["ab", "b"], ["b", "a"]],
      },
      "added_tokens": [{"id": 0, "content": "<pad>", "special": True},
                       {"id": 1, "content": "<eos>", "special": True},
                       {"id": 8, "content": "<start_of_turn>", "special": True},
                       {"id": 9, "content": "\n\n", "special": False}],
  }
  (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
  pieces, scores, token_types = gguf_io.tokenizer_json_vocabulary(tmp_path / "tokenizer.json")
  assert pieces == ["<pad>", "<eos>", "<0x41>", "a", "b", "ab", "abb", "ba", "<start_of_turn>", "\n\n"]
  assert token_types == [3, 3, 6, 1, 1, 1, 1, 1, 3, 4]
  # Pieces made by a merge score minus its rank; single letters rank last.
  assert scores == [0.0, 0.0, 0.0, -3.0, -3.0, -0.0, -1.0, -2.0, 0.0, 0.0]


# --- The command and its guarantees -------------------------------------------------


def test_export_leaves_the_work_directory_untouched(exported):
  assert exported.after == exported.before


def test_non_empty_out_is_refused_in_one_line(tiny_run, tmp_path):
  out = tmp_path / "out"
  out.mkdir()
  (out / "keep.txt").write_text("mine")
  proc = run_cli(["export", "--workdir", str(tiny_run), "--out", str(out)], check=False, timeout=120)
  assert proc.returncode == 2, proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: --out") and "--overwrite" in lines[0], proc.stderr
  assert (out / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("args, needle", [
    (["--workdir", "{tmp}/missing"], "no such directory"),
    (["--workdir", "{tmp}/empty"], "config.json"),
    (["--workdir", "{run}", "--step", "7"], "step 7"),
    (["--workdir", "{run}", "--max-shard-size", "lots"], "--max-shard-size"),
    (["--workdir", "{run}", "--out", "{run}/hf"], "outside the work directory"),
    (["--workdir", "{run}", "--format", "gguf", "--quant", "q4_k_m"], "llama-quantize"),
    (["--workdir", "{run}", "--format", "gguf", "--quant", "Q8"], "--quant='Q8': use one of q8_0, q4_0"),
    (["--workdir", "{run}", "--quant", "q8_0"], "add --format gguf"),
    (["--workdir", "{run}", "--format", "gguf", "--quant", "q8_0", "--dtype", "bfloat16"],
     "drop --dtype bfloat16"),
])
def test_bad_arguments_exit_2_with_one_line(tiny_run, tmp_path, capsys, args, needle):
  (tmp_path / "empty").mkdir()
  args = [a.format(tmp=tmp_path, run=tiny_run) for a in args]
  if "--out" not in args:
    args += ["--out", str(tmp_path / "out")]
  with pytest.raises(SystemExit) as exit_info:
    export.main(args)
  assert exit_info.value.code == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], lines
  assert not (tmp_path / "out").exists()


def test_overwrite_replaces_the_old_export(exported, tmp_path):
  out = tmp_path / "out"
  out.mkdir()
  (out / "stale.bin").write_text("old")
  with pytest.raises(errors.UserError, match="not empty"):
    hf_export.export_policy(exported.policy, tmp_path / "run", out, fmt="gguf")
  hf_export.export_policy(exported.policy, tmp_path / "run", out, overwrite=True)
  assert not (out / "stale.bin").exists() and (out / "model.safetensors").exists()
  assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary directories left


def test_a_failed_export_leaves_nothing_behind(exported, tmp_path, monkeypatch):
  def crash(*args, **kwargs):
    raise RuntimeError("disk full")

  monkeypatch.setattr(hf_export, "save_tokenizer", crash)
  with pytest.raises(RuntimeError, match="disk full"):
    hf_export.export_policy(exported.policy, tmp_path / "run", tmp_path / "out")
  assert list(tmp_path.iterdir()) == []


# --- Pushing to the hub ------------------------------------------------------------

HUB_TOKEN = "hf_fake_token_only_the_local_hub_accepts"


@pytest.fixture
def hub(monkeypatch):
  """tests/fake_hub.py on localhost, where huggingface_hub sends its requests.

  HfApi() reads constants.ENDPOINT when it is made (HF_ENDPOINT is read once,
  at import). hf_xet is installed, so upload_folder would send the weights by
  Xet, whose storage service the fake does not emulate: HF_HUB_DISABLE_XET
  (also read at import; the constant is looked up on every upload) sends them
  by LFS, through preupload, the LFS batch and a PUT to the storage URL.
  """
  # A submodule import: huggingface_hub loads its attributes lazily.
  from huggingface_hub import constants  # pylint: disable=g-import-not-at-top

  with fake_hub.FakeHub(token=HUB_TOKEN) as server:
    monkeypatch.setattr(constants, "ENDPOINT", server.url)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    yield server


def test_push_to_hub_uploads_the_export_byte_for_byte_to_a_private_repo(
    exported, hub, tmp_path, monkeypatch, capsys, caplog):
  monkeypatch.setattr(policy_lib, "restore", lambda workdir, mesh, step=None: exported.policy)
  (tmp_path / "run").mkdir()
  out = tmp_path / "out"
  code = export.main(["--workdir", str(tmp_path / "run"), "--out", str(out),
                      "--push-to-hub", "me/gemma-grpo-tiny"])
  assert code == 0
  assert hub.unexpected == [], hub.log
  assert hub.created == [{"organization": "me", "name": "gemma-grpo-tiny", "visibility": "private", "type": "model"}]
  local = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
  pushed = hub.repos["me/gemma-grpo-tiny"]
  assert sorted(pushed) == sorted(local)
  for path, data in local.items():
    assert pushed[path] == data, path  # compared one by one: a 67 MB diff would drown the name
  # The weights went by LFS, the path a multi-GB export must take; small files in the commit.
  stored = {path.removeprefix("/lfs/") for method, path, _ in hub.log if method == "PUT"}
  assert hashlib.sha256(local[hf_export.SINGLE_FILE]).hexdigest() in stored
  assert hashlib.sha256(local["config.json"]).hexdigest() not in stored
  # The token goes to the Hub's API and nowhere else: not to the storage URL
  # (presigned on the real Hub), not to telemetry, not to the output or the logs.
  for method, path, auth in hub.log:
    public = path.startswith("/lfs/") or path == "/api/agent-harnesses"
    assert auth == (None if public else f"Bearer {HUB_TOKEN}"), (method, path)
  captured = capsys.readouterr()
  assert HUB_TOKEN not in captured.out + captured.err + caplog.text


def test_a_rejected_hub_token_is_a_one_line_user_error(hub, tmp_path, monkeypatch):
  monkeypatch.setenv("HF_TOKEN", "hf_revoked_token")
  with pytest.raises(errors.UserError) as error:
    hub_lib.push_folder(tmp_path, "me/x")
  message = str(error.value)
  # huggingface_hub's own words, first line only: "Client error '401 Unauthorized' for url ...".
  assert message.startswith("--push-to-hub me/x: upload failed (HfHubHTTPError: Client error '401"), message
  assert "check HF_TOKEN" in message and "\n" not in message and "hf_revoked_token" not in message, message
  assert "the Hub says: " in message, message  # the server's reason, from a later line
  assert hub.repos == {} and hub.unexpected == [], hub.log


# --- The real Gemma-3-270M ----------------------------------------------------------


@pytest.mark.torch
@pytest.mark.slow
def test_offline_270m_with_random_lora_exports_faithfully(tmp_path):
  """Non-zero random B on every adapter of the real 270M; fp32 and bf16 exports."""
  from gemma_grpo.model import model_loading  # pylint: disable=g-import-not-at-top

  c = config_lib.defaults()  # gguf:gemma-3-270m, float32
  c.lora.rank, c.lora.alpha = 8, 16.0
  c = settings.from_config(c)
  mesh = device_mesh()  # sharded exports are the tiny model's tests; this one is about the numbers
  loaded = model_loading.build(c.model, mesh)
  actor = lora.apply(loaded.model, c.lora, mesh)
  randomize_lora_b(actor, "layers", seed=0, std=0.02)
  policy = policy_lib.Policy(c, loaded, actor, step=0)
  ids = loaded.tokenizer.encode("The capital of France is Paris, and the capital of Italy is")
  ref = JaxReference(actor, len(ids)).logits(ids)
  unmerged = JaxReference(loaded.model, len(ids)).logits(ids)
  assert np.abs(unmerged - ref).max() > 0.05 * np.abs(ref).max()  # the LoRA matters
  for dtype, bound in (("float32", FP32_BOUND), ("bfloat16", BF16_VS_FLOAT32_BOUND_270M)):
    out = hf_export.export_policy(policy, tmp_path / "run", tmp_path / dtype, dtype=dtype)
    diff = np.abs(hf_logits(out, ids) - ref).max()
    print(f"270M {dtype}: max|diff| {diff:.3g} = {diff / np.abs(ref).max():.3g} x max|logit|")
    assert diff <= bound * np.abs(ref).max(), (dtype, diff)

