"""Load a Python config file, apply `--config.a.b=value` overrides, validate.

Validation happens here, in one place, before anything heavy starts: every
problem is reported at once, one line each, naming the field, the value and
the fix.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import os
import pathlib
import re
import sys
import traceback

import ml_collections

from configs import base
from gemma_grpo import errors
from gemma_grpo.tasks import rewards
from gemma_grpo import storage

ALGORITHMS = ("grpo", "dapo", "dr_grpo", "gspo")
GEMMA_VOCAB_SIZE = 262144  # tokens of the Gemma-3 tokenizer
DTYPES = ("float32", "bfloat16")
MATMUL_DTYPES = ("float32", "bfloat16")  # gemma_grpo.model.gemma3_rl.Gemma3.matmul_dtype
ROLLOUT_ENGINES = ("grouped", "tunix")
DECODE_DTYPES = ("float32", "bfloat16")  # gemma_grpo.rl.rollout.DECODE_DTYPES
SCREEN_SETTINGS = ("auto", "on", "off")  # gemma_grpo.rl.rollout.SCREEN_SETTINGS
# Module names the LoRA targets regex is matched against (Gemma-3 in Tunix).
LORA_MODULES = (
    "q_einsum", "kv_einsum", "qkv_einsum", "attn_vec_einsum", "gate_proj",
    "up_proj", "down_proj",
)


def load(path: str) -> ml_collections.ConfigDict:
  """Runs `get_config()` of a config file given by path."""
  file = pathlib.Path(path)
  if not file.is_file():
    raise errors.UserError(
        f"--config: no such file {path!r}; pass e.g. configs/gemma3_270m.py"
    )
  # Config files import their base as `from configs import base`.
  root = str(file.resolve().parent.parent)
  if root not in sys.path:
    sys.path.insert(0, root)
  spec = importlib.util.spec_from_file_location(f"_config_{file.stem}", file)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
      raise errors.UserError(f"--config: {path} has no get_config() function")
    c = module.get_config()
  except errors.UserError:
    raise
  except Exception as e:  # pylint: disable=broad-exception-caught
    # A user's config file is input: say where it failed in one line.
    raise errors.UserError(f"--config {_where(e, file)}: {_first_line(e)}") from None
  if not isinstance(c, ml_collections.ConfigDict):
    raise errors.UserError(f"--config: get_config() of {path} returned a {type(c).__name__}, not a ConfigDict")
  missing = _missing_fields(c)
  if missing:
    shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
    raise errors.UserError(
        f"--config: {path} lacks {shown}, which configs/base.py has; start get_config()"
        f" from base.get_config() (as configs/gemma3_270m.py does) or add them")
  return c


def _missing_fields(c: ml_collections.ConfigDict) -> list[str]:
  """Fields of configs/base.py that `c` lacks (a config written for an older version)."""
  missing = []

  def walk(defaults, node, prefix):
    for key in defaults.keys():
      if key not in node:
        missing.append(prefix + key)
      elif isinstance(defaults[key], ml_collections.ConfigDict) and isinstance(node[key], ml_collections.ConfigDict):
        walk(defaults[key], node[key], f"{prefix}{key}.")

  walk(base.get_config(), c, "")
  return missing


def _where(e: BaseException, file: pathlib.Path) -> str:
  """`path:line` of the deepest frame of `e` inside the config file."""
  if isinstance(e, SyntaxError) and e.lineno:
    return f"{e.filename or file}:{e.lineno}"
  line = None
  for frame in traceback.extract_tb(e.__traceback__):
    if pathlib.Path(frame.filename).resolve() == file.resolve():
      line = frame.lineno
  return f"{file}:{line}" if line else str(file)


def _first_line(e: BaseException) -> str:
  text = str(e).strip().strip("'\"")
  hint = ""
  if "Did you mean" in text:  # ml_collections' suggestion for a mistyped key
    hint = "; " + text[text.index("Did you mean"):].splitlines()[0]
  text = text.split(". Other fields present")[0]
  if isinstance(e, SyntaxError):
    text = e.msg
  return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}{hint}"


def _parse_value(text: str, kind: type, key: str):
  if kind is bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
      return True
    if lowered in ("false", "0", "no"):
      return False
    raise errors.UserError(f"--config.{key}={text}: expected true or false")
  if kind is str:
    return text
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    raise errors.UserError(
        f"--config.{key}={text}: expected a {kind.__name__}"
    ) from None
  if kind is float and isinstance(value, int) and not isinstance(value, bool):
    value = float(value)
  if not isinstance(value, kind) or isinstance(value, bool):
    raise errors.UserError(f"--config.{key}={text}: expected a {kind.__name__}")
  return value


def override(c: ml_collections.ConfigDict, key: str, text: str) -> None:
  """Sets `c.<key>` from command-line text, converted to the field's type."""
  *parents, leaf = key.split(".")
  node = c
  for i, part in enumerate(parents):
    if part not in node or not isinstance(node[part], ml_collections.ConfigDict):
      where = ".".join(parents[:i]) or "config"
      valid = sorted(k for k, v in node.items() if isinstance(v, ml_collections.ConfigDict))
      raise errors.UserError(
          f"--config.{key}: {where} has no section {part!r}; sections: {', '.join(valid)}"
      )
    node = node[part]
  if leaf not in node:
    raise errors.UserError(
        f"--config.{key}: unknown key {leaf!r}; valid keys here: "
        f"{', '.join(sorted(node.keys()))}"
    )
  if isinstance(node[leaf], ml_collections.ConfigDict):
    raise errors.UserError(f"--config.{key} is a section; set one of its keys")
  kind = node.get_ref(leaf).get_type()
  with node.unlocked():
    node[leaf] = _parse_value(text, kind, key)


def apply_overrides(c: ml_collections.ConfigDict, args: list[str]) -> list[str]:
  """Applies `--config.a.b=v` / `--config.a.b v` args; returns the rest."""
  rest, i = [], 0
  while i < len(args):
    arg = args[i]
    if arg.startswith("--config."):
      if "=" in arg:
        key, text = arg[len("--config."):].split("=", 1)
      elif i + 1 < len(args):
        key, text = arg[len("--config."):], args[i + 1]
        i += 1
      else:
        raise errors.UserError(f"{arg}: missing value (use {arg}=VALUE)")
      override(c, key, text)
    else:
      rest.append(arg)
    i += 1
  return rest


def _check(problems: list[str], ok: bool, message: str) -> None:
  if not ok:
    problems.append(message)


def _type_problems(node: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
  """Wrong types that ml_collections lets through: None, bools as ints, NaN/Inf."""
  defaults = base.get_config()
  problems = []

  def default(key: str):
    value = defaults
    for part in key.split("."):
      if part not in value:
        return None
      value = value[part]
    return value

  def walk(n, pre):
    for key in n.keys():
      value, name = n[key], f"{pre}{key}"
      if isinstance(value, ml_collections.ConfigDict):
        walk(value, f"{name}.")
        continue
      # The declared type is base's: ml_collections lets a bool replace an int.
      kind = type(default(name)) if default(name) is not None else n.get_ref(key).get_type()
      if value is None:
        if default(name) is not None:
          problems.append(f"{name}=None: needs a {kind.__name__} (default {default(name)!r})")
      elif kind is int and isinstance(value, bool):
        problems.append(f"{name}={value}: needs an int, not a bool")
      elif isinstance(value, float) and not math.isfinite(value):
        problems.append(f"{name}={value}: must be a finite number")
      elif kind is str and not value.strip() and default(name):
        problems.append(f"{name} is empty; the default is {default(name)!r}")

  walk(node, prefix)
  return problems


def _model_source_problems(m: ml_collections.ConfigDict) -> list[str]:
  source, offline = m.source, "gguf:gemma-3-270m"
  forms = f"use {offline}, hf:<org>/<repo>, a local Hugging Face directory, or random"
  if source in ("random", offline):
    return []
  if source.startswith("gguf:"):
    return [f"model.source={source!r}: unknown offline model; the offline model is {offline}"]
  if source.startswith("hf:"):
    repo = source[3:]
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
      return [f"model.source={source!r}: not a hub repo id; {forms}"]
    return []
  path = pathlib.Path(os.path.expanduser(source))
  if not path.is_dir():
    return [f"model.source={source!r}: no such directory; {forms}"]
  if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
    return [f"model.source={source!r}: needs config.json and *.safetensors (a Hugging Face checkpoint directory)"]
  return []


def _data_source_problems(d: ml_collections.ConfigDict) -> list[str]:
  source = d.source
  if source == "gsm8k":
    return [] if d.split in ("train", "test") else [f"data.split={d.split!r}: GSM8K has 'train' and 'test'"]
  if source.startswith("reasoning_gym:"):
    return [] if source.split(":", 1)[1] else ["data.source='reasoning_gym:': name a task, e.g. reasoning_gym:gsm_symbolic"]
  path = pathlib.Path(os.path.expanduser(source))
  if path.is_dir():
    return [f"data.source={source!r}: is a directory; pass a GSM8K-format .jsonl or .parquet file"]
  if not path.is_file():
    return [f"data.source={source!r}: no such file; use gsm8k, reasoning_gym:<task> or a GSM8K-format .jsonl/.parquet file"]
  return []


def validate(c: ml_collections.ConfigDict, num_devices: int | None = None) -> None:
  """Raises UserError listing every problem in `c`, one per line.

  With `num_devices` the mesh is checked too; without it, everything that
  needs no device is (so a bad flag fails before JAX starts).
  """
  p: list[str] = _type_problems(c)
  if p:  # range checks on wrongly typed values would only add noise
    raise errors.UserError("\n".join(p))
  m, g, r, t = c.model, c.grpo, c.rollout, c.train
  _check(p, m.dtype in DTYPES, f"model.dtype={m.dtype!r}: use one of {DTYPES}")
  _check(p, m.matmul_dtype in MATMUL_DTYPES,
         f"model.matmul_dtype={m.matmul_dtype!r}: use one of {', '.join(MATMUL_DTYPES)}")
  p.extend(_model_source_problems(m))
  if m.source == "random":
    rnd = m.random
    for key in ("num_layers", "embed_dim", "hidden_dim", "num_heads", "head_dim", "num_kv_heads", "sliding_window"):
      _check(p, rnd[key] >= 1, f"model.random.{key}={rnd[key]}: must be >= 1")
    _check(p, rnd.num_kv_heads < 1 or rnd.num_heads % rnd.num_kv_heads == 0,
           f"model.random.num_kv_heads={rnd.num_kv_heads}: must divide model.random.num_heads={rnd.num_heads}")
    # Token ids beyond the embedding table would be clamped silently by JAX.
    _check(p, rnd.vocab_size >= GEMMA_VOCAB_SIZE,
           f"model.random.vocab_size={rnd.vocab_size}: must be >= {GEMMA_VOCAB_SIZE}, the Gemma tokenizer's vocabulary")
  p.extend(_data_source_problems(c.data))
  _check(p, c.lora.rank >= 1, f"lora.rank={c.lora.rank}: must be >= 1 (32 is typical)")
  _check(p, c.lora.alpha > 0, f"lora.alpha={c.lora.alpha}: must be > 0 (usually equal to lora.rank)")
  try:
    pattern = re.compile(c.lora.targets)
    matched = [n for n in LORA_MODULES if pattern.search(f"layers.0.attn.{n}") or pattern.search(f"layers.0.mlp.{n}")]
    _check(p, bool(matched), f"lora.targets={c.lora.targets!r} matches no module; choose from {'|'.join(LORA_MODULES)}")
  except re.error as e:
    p.append(f"lora.targets={c.lora.targets!r} is not a regex ({e})")

  _check(p, g.algorithm in ALGORITHMS, f"grpo.algorithm={g.algorithm!r}: use one of {ALGORITHMS}")
  _check(p, g.num_generations >= 2, f"grpo.num_generations={g.num_generations}: GRPO needs >= 2 completions per prompt to compare")
  _check(p, g.num_iterations >= 1, f"grpo.num_iterations={g.num_iterations}: must be >= 1")
  t = c.train
  mini = t.mini_batch_size or t.batch_size
  _check(p, t.mini_batch_size >= 0 and t.batch_size >= 1 and t.batch_size % mini == 0,
         f"train.mini_batch_size={t.mini_batch_size}: must divide train.batch_size={t.batch_size} (0 = the whole batch)")
  updates = updates_per_batch(c) if mini >= 1 and t.batch_size % mini == 0 else 1
  if updates > 1:
    # Steps count updates; a checkpoint inside a batch could not be resumed exactly.
    why = " x ".join(part for part in (
        f"grpo.num_iterations={g.num_iterations}" if g.num_iterations > 1 else "",
        f"train.batch_size / train.mini_batch_size = {t.batch_size // mini}" if mini < t.batch_size else "",
    ) if part)
    for key, value in (("train.max_steps", t.max_steps), ("ckpt.every_steps", c.ckpt.every_steps),
                       ("eval.every_steps", c.eval.every_steps)):
      _check(p, value % updates == 0,
             f"{key}={value}: must be a multiple of {updates} ({why}: updates per batch; steps count updates)")
  _check(p, g.beta >= 0, f"grpo.beta={g.beta}: must be >= 0 (0 disables the KL term)")
  _check(p, 0 < g.epsilon < 1, f"grpo.epsilon={g.epsilon}: must be in (0, 1); 0.2 is typical")
  _check(p, g.epsilon_high >= g.epsilon, f"grpo.epsilon_high={g.epsilon_high}: must be >= grpo.epsilon={g.epsilon}")
  _check(p, g.algorithm != "dapo" or g.beta == 0, f"grpo.beta={g.beta}: DAPO has no KL term; set --config.grpo.beta=0")
  _check(p, 0 <= g.overlong_buffer < r.max_new_tokens, f"grpo.overlong_buffer={g.overlong_buffer}: must be in [0, rollout.max_new_tokens={r.max_new_tokens})")
  _check(p, g.max_resample_rounds >= 0, f"grpo.max_resample_rounds={g.max_resample_rounds}: must be >= 0")
  _check(p, not g.dynamic_sampling or g.max_resample_rounds >= 1, f"grpo.max_resample_rounds={g.max_resample_rounds}: dynamic sampling needs >= 1 extra round to refill the batch")
  _check(p, g.overlong_penalty >= 0, f"grpo.overlong_penalty={g.overlong_penalty}: must be >= 0")
  _check(p, 0 < g.gspo_epsilon < 1, f"grpo.gspo_epsilon={g.gspo_epsilon}: must be in (0, 1); the GSPO paper uses 3e-4")
  _check(p, g.gspo_epsilon_high >= g.gspo_epsilon, f"grpo.gspo_epsilon_high={g.gspo_epsilon_high}: must be >= grpo.gspo_epsilon={g.gspo_epsilon}")
  # A cap below 1 would shrink even the tokens where sampler and trainer agree.
  _check(p, g.tis_cap == 0 or g.tis_cap >= 1, f"grpo.tis_cap={g.tis_cap}: must be 0 (off) or >= 1; 2.0 is typical")

  _check(p, r.temperature > 0, f"rollout.temperature={r.temperature}: must be > 0; greedy rollouts make every completion of a group identical (zero advantage)")
  _check(p, 0 < r.top_p <= 1, f"rollout.top_p={r.top_p}: must be in (0, 1]")
  _check(p, r.engine in ROLLOUT_ENGINES, f"rollout.engine={r.engine!r}: must be one of {', '.join(ROLLOUT_ENGINES)}")
  _check(p, r.decode_dtype in DECODE_DTYPES, f"rollout.decode_dtype={r.decode_dtype!r}: must be one of {', '.join(DECODE_DTYPES)}")
  _check(p, r.decode_dtype == "float32" or r.engine == "grouped", f"rollout.decode_dtype={r.decode_dtype!r} needs rollout.engine='grouped' (Tunix's sampler decodes in the model's dtype)")
  _check(p, r.screen_lm_head in SCREEN_SETTINGS, f"rollout.screen_lm_head={r.screen_lm_head!r}: must be one of {', '.join(SCREEN_SETTINGS)}")
  _check(p, r.top_k >= 0, f"rollout.top_k={r.top_k}: must be >= 0 (0 = no top-k)")
  _check(p, r.max_prompt_length >= 8, f"rollout.max_prompt_length={r.max_prompt_length}: too small for the instruction; use >= 128")
  _check(p, r.max_new_tokens >= 1, f"rollout.max_new_tokens={r.max_new_tokens}: must be >= 1")
  _check(p, c.eval.max_new_tokens >= 1, f"eval.max_new_tokens={c.eval.max_new_tokens}: must be >= 1")
  if r.tools:
    _check(p, r.engine == "grouped", f"rollout.tools={r.tools!r} needs rollout.engine='grouped' (Tunix's sampler cannot pause for a tool)")
    _check(p, r.max_tool_calls >= 1, f"rollout.max_tool_calls={r.max_tool_calls}: must be >= 1 with rollout.tools set")
    _check(p, r.tool_time_limit > 0, f"rollout.tool_time_limit={r.tool_time_limit}: must be > 0 seconds")
  need = r.max_prompt_length + max(r.max_new_tokens, c.eval.max_new_tokens)
  _check(p, r.kv_cache_size >= need, f"rollout.kv_cache_size={r.kv_cache_size}: must hold max_prompt_length + max_new_tokens = {need}; set --config.rollout.kv_cache_size={need}")

  _check(p, c.optim.peak_lr > 0, f"optim.peak_lr={c.optim.peak_lr}: must be > 0")
  _check(p, 0 <= c.optim.warmup_fraction < 1, f"optim.warmup_fraction={c.optim.warmup_fraction}: warmup must end before train.max_steps; use a value in [0, 1)")
  _check(p, 0 <= c.optim.end_lr <= c.optim.peak_lr, f"optim.end_lr={c.optim.end_lr}: must be in [0, optim.peak_lr={c.optim.peak_lr}]")
  _check(p, c.optim.max_grad_norm > 0, f"optim.max_grad_norm={c.optim.max_grad_norm}: must be > 0")
  _check(p, 0 <= c.optim.b1 < 1 and 0 <= c.optim.b2 < 1, f"optim.b1={c.optim.b1}, optim.b2={c.optim.b2}: must be in [0, 1)")
  _check(p, c.optim.weight_decay >= 0, f"optim.weight_decay={c.optim.weight_decay}: must be >= 0")

  _check(p, t.max_steps >= 1, f"train.max_steps={t.max_steps}: must be >= 1")
  _check(p, t.batch_size >= 1, f"train.batch_size={t.batch_size}: must be >= 1 prompt")
  # Micro-batches count prompts. Tunix repeats each prompt G times inside its
  # micro-batch (rl_learner._prepare_data), and rollout and log-prob
  # micro-batches default to the same size, so every micro-batch holds whole
  # groups: the all-zero metrics of tunix#816 (a micro-batch of completions
  # smaller than G) cannot arise. Tunix does require that it divide the batch.
  mini = t.mini_batch_size or t.batch_size
  micro = t.micro_batch_size or mini
  _check(p, t.micro_batch_size >= 0 and mini >= 1 and mini % micro == 0,
         f"train.micro_batch_size={t.micro_batch_size}: must divide the update's {mini} prompts"
         " (train.mini_batch_size, or train.batch_size when that is 0)")

  _check(p, c.eval.every_steps >= 0, f"eval.every_steps={c.eval.every_steps}: must be >= 0 (0 = never)")
  _check(p, c.eval.num_examples >= 0, f"eval.num_examples={c.eval.num_examples}: must be >= 0")
  _check(p, c.eval.num_examples <= c.data.num_heldout, f"eval.num_examples={c.eval.num_examples}: exceeds data.num_heldout={c.data.num_heldout}")
  _check(p, c.eval.batch_size >= 1, f"eval.batch_size={c.eval.batch_size}: must be >= 1")
  _check(p, c.data.heldout_unseen_by in ("none", "question", "equation"),
         f"data.heldout_unseen_by={c.data.heldout_unseen_by!r}: must be none, question or equation")
  _check(p, c.data.num_heldout >= 0, f"data.num_heldout={c.data.num_heldout}: must be >= 0")
  _check(p, c.data.reasoning_gym_size >= 1, f"data.reasoning_gym_size={c.data.reasoning_gym_size}: must be >= 1")
  _check(p, c.data.max_examples >= 0, f"data.max_examples={c.data.max_examples}: must be >= 0 (0 = all)")
  _check(p, all(isinstance(e, (tuple, list)) and len(e) == 3 and all(isinstance(x, str) for x in e)
                for e in c.data.few_shot),
         "data.few_shot: each example must be three strings (question, reasoning, answer)")
  _check(p, c.ckpt.every_steps >= 1, f"ckpt.every_steps={c.ckpt.every_steps}: must be >= 1")
  sft = c.sft
  _check(p, sft.max_steps >= 1, f"sft.max_steps={sft.max_steps}: must be >= 1")
  _check(p, sft.batch_size >= 1, f"sft.batch_size={sft.batch_size}: must be >= 1")
  _check(p, sft.peak_lr > 0, f"sft.peak_lr={sft.peak_lr}: must be > 0 (2e-4 is typical for LoRA)")
  _check(p, sft.max_length > r.max_prompt_length, f"sft.max_length={sft.max_length}: must exceed rollout.max_prompt_length={r.max_prompt_length} to leave room for the solution")
  _check(p, c.ckpt.keep >= 1, f"ckpt.keep={c.ckpt.keep}: must keep >= 1 checkpoint")
  _check(p, c.log.flush_every_steps >= 1, f"log.flush_every_steps={c.log.flush_every_steps}: must be >= 1")

  if num_devices is not None:
    try:
      mesh_shape(c.mesh, num_devices)
    except errors.UserError as e:
      p.append(str(e))
  p.extend(_reward_problems(c.rewards))
  if p:
    raise errors.UserError("\n".join(p))


def _reward_problems(c: ml_collections.ConfigDict) -> list[str]:
  try:
    rewards.from_config(c)
  except ValueError as e:
    return [str(e)]
  return []


def completions_per_train_step(c: ml_collections.ConfigDict) -> int:
  """Rows of one call of the compiled train step: a micro-batch's completions."""
  t = c.train
  return (t.micro_batch_size or t.mini_batch_size or t.batch_size) * c.grpo.num_generations


def updates_per_batch(c: ml_collections.ConfigDict) -> int:
  """Optimizer updates per rollout batch: grpo.num_iterations x its mini-batches."""
  return c.grpo.num_iterations * (c.train.batch_size // (c.train.mini_batch_size or c.train.batch_size))


def mesh_shape(c: ml_collections.ConfigDict, num_devices: int) -> tuple[int, int]:
  """(fsdp, tp) with -1 resolved; raises UserError if it cannot fill the devices."""
  fsdp, tp = c.fsdp, c.tp
  if fsdp == -1 and tp == -1:
    raise errors.UserError("mesh.fsdp and mesh.tp are both -1; fix one of them")
  for name, v in (("fsdp", fsdp), ("tp", tp)):
    if v == 0 or v < -1:
      raise errors.UserError(f"mesh.{name}={v}: use a positive size or -1")
  if fsdp == -1:
    fsdp, rem = divmod(num_devices, tp)
  elif tp == -1:
    tp, rem = divmod(num_devices, fsdp)
  else:
    rem = 0
  if rem or fsdp * tp != num_devices:
    raise errors.UserError(
        f"mesh.fsdp={c.fsdp} x mesh.tp={c.tp} does not fill the {num_devices}"
        f" available devices; make the product {num_devices} (or use -1 for one"
        " of them)"
    )
  return fsdp, tp


def save(c: ml_collections.ConfigDict, path: str | os.PathLike) -> None:
  """Writes the resolved config beside the run (no secrets live in configs)."""
  storage.write_text(storage.path(path), c.to_json_best_effort(indent=2) + "\n")


def _assign(node: ml_collections.ConfigDict, values: dict, prefix: str) -> None:
  for key, value in values.items():
    if key not in node:
      raise errors.UserError(f"{prefix}{key}: not a config key of this version")
    if isinstance(node[key], ml_collections.ConfigDict):
      _assign(node[key], value, f"{prefix}{key}.")
    else:
      with node.unlocked():
        node[key] = tuple(value) if isinstance(node[key], tuple) else value


def load_saved(path: str | os.PathLike) -> ml_collections.ConfigDict:
  """The config a run saved as JSON, rebuilt on top of base (types kept)."""
  file = storage.path(path)
  if not file.is_file():
    raise errors.UserError(f"{file}: missing; is this a gemma-grpo work directory?")
  try:
    values = json.loads(file.read_text())
  except json.JSONDecodeError as e:
    raise errors.UserError(f"{file}: not valid JSON ({e.msg})") from None
  c = base.get_config()
  _assign(c, values, "")
  return c
