"""Validate a config before anything heavy starts: every problem at once, one line each.

Each line names the field, the value and the fix. One function per config
section returns that section's problems; `validate` joins them. Every key's
type and range are checked whether or not the feature it belongs to is on
(tools, a random model, dynamic sampling), so a bad value fails the command
that has it, not a later one that turns the feature on. The rewards
section is checked by gemma_grpo.tasks.rewards.check, which knows the
reward functions (this package imports nothing of the trainer).
"""

from __future__ import annotations

import math
import os
import pathlib
import re

import ml_collections

from gemma_grpo import errors
import gemma_grpo.config.choices as choices  # the module, not the package: no cycle
from gemma_grpo.config.defaults import defaults
import gemma_grpo.config.derived as derived


def _check(problems: list[str], ok: bool, message: str) -> None:
  if not ok:
    problems.append(message)


def _type_problems(node: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
  """Wrong types that ml_collections lets through: None, bools as ints, NaN/Inf."""
  every = defaults()
  problems = []

  def default(key: str):
    value = every
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
      # The declared type is the defaults': ml_collections lets a bool replace an int.
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
  source, offline = m.source, choices.OFFLINE_MODEL
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


def _model_problems(m: ml_collections.ConfigDict) -> list[str]:
  p: list[str] = []
  _check(p, m.dtype in choices.DTYPES, f"model.dtype={m.dtype!r}: use one of {choices.DTYPES}")
  _check(p, m.matmul_dtype in choices.MATMUL_DTYPES,
         f"model.matmul_dtype={m.matmul_dtype!r}: use one of {', '.join(choices.MATMUL_DTYPES)}")
  p.extend(_model_source_problems(m))
  rnd = m.random
  for key in ("num_layers", "embed_dim", "hidden_dim", "num_heads", "head_dim", "num_kv_heads", "sliding_window"):
    _check(p, rnd[key] >= 1, f"model.random.{key}={rnd[key]}: must be >= 1")
  _check(p, rnd.num_kv_heads < 1 or rnd.num_heads % rnd.num_kv_heads == 0,
         f"model.random.num_kv_heads={rnd.num_kv_heads}: must divide model.random.num_heads={rnd.num_heads}")
  # Token ids beyond the embedding table would be clamped silently by JAX.
  _check(p, rnd.vocab_size >= choices.GEMMA_VOCAB_SIZE,
         f"model.random.vocab_size={rnd.vocab_size}: must be >= {choices.GEMMA_VOCAB_SIZE}, the Gemma tokenizer's vocabulary")
  return p


def _data_source_problems(d: ml_collections.ConfigDict) -> list[str]:
  source, kind = d.source, choices.data_source_kind(d.source)
  if kind == "hub":
    return [] if d.split in ("train", "test") else [f"data.split={d.split!r}: GSM8K has 'train' and 'test'"]
  if kind == "reasoning_gym":
    task = source[len(choices.REASONING_GYM_PREFIX):]
    return [] if task else ["data.source='reasoning_gym:': name a task, e.g. reasoning_gym:gsm_symbolic"]
  path = pathlib.Path(os.path.expanduser(source))
  if path.is_dir():
    return [f"data.source={source!r}: is a directory; pass a GSM8K-format .jsonl or .parquet file"]
  if not path.is_file():
    return [f"data.source={source!r}: no such file; use gsm8k, reasoning_gym:<task> or a GSM8K-format .jsonl/.parquet file"]
  return []


def _data_problems(d: ml_collections.ConfigDict) -> list[str]:
  p = _data_source_problems(d)
  _check(p, d.heldout_unseen_by in choices.HELDOUT_UNSEEN_BY,
         f"data.heldout_unseen_by={d.heldout_unseen_by!r}: must be one of {', '.join(choices.HELDOUT_UNSEEN_BY)}")
  _check(p, d.num_heldout >= 0, f"data.num_heldout={d.num_heldout}: must be >= 0")
  _check(p, d.reasoning_gym_size >= 1, f"data.reasoning_gym_size={d.reasoning_gym_size}: must be >= 1")
  _check(p, d.max_examples >= 0, f"data.max_examples={d.max_examples}: must be >= 0 (0 = all)")
  _check(p, all(isinstance(e, (tuple, list)) and len(e) == 3 and all(isinstance(x, str) for x in e)
                for e in d.few_shot),
         "data.few_shot: each example must be three strings (question, reasoning, answer)")
  return p


def _lora_problems(lora: ml_collections.ConfigDict) -> list[str]:
  p: list[str] = []
  _check(p, lora.rank >= 1, f"lora.rank={lora.rank}: must be >= 1 (32 is typical)")
  _check(p, lora.alpha > 0, f"lora.alpha={lora.alpha}: must be > 0 (usually equal to lora.rank)")
  try:
    pattern = re.compile(lora.targets)
  except re.error as e:
    p.append(f"lora.targets={lora.targets!r} is not a regex ({e})")
    return p
  matched = [n for n in choices.LORA_MODULES
             if pattern.search(f"layers.0.attn.{n}") or pattern.search(f"layers.0.mlp.{n}")]
  _check(p, bool(matched), f"lora.targets={lora.targets!r} matches no module; choose from {'|'.join(choices.LORA_MODULES)}")
  return p


def _grpo_problems(g: ml_collections.ConfigDict, max_new_tokens: int) -> list[str]:
  """grpo.*; `max_new_tokens` (rollout's) bounds the overlong buffer."""
  p: list[str] = []
  _check(p, g.algorithm in choices.ALGORITHMS, f"grpo.algorithm={g.algorithm!r}: use one of {choices.ALGORITHMS}")
  _check(p, g.num_generations >= 2, f"grpo.num_generations={g.num_generations}: GRPO needs >= 2 completions per prompt to compare")
  _check(p, g.num_iterations >= 1, f"grpo.num_iterations={g.num_iterations}: must be >= 1")
  _check(p, g.beta >= 0, f"grpo.beta={g.beta}: must be >= 0 (0 disables the KL term)")
  _check(p, 0 < g.epsilon < 1, f"grpo.epsilon={g.epsilon}: must be in (0, 1); 0.2 is typical")
  _check(p, g.epsilon_high >= g.epsilon, f"grpo.epsilon_high={g.epsilon_high}: must be >= grpo.epsilon={g.epsilon}")
  _check(p, g.algorithm != "dapo" or g.beta == 0, f"grpo.beta={g.beta}: DAPO has no KL term; set --config.grpo.beta=0")
  _check(p, 0 <= g.overlong_buffer < max_new_tokens, f"grpo.overlong_buffer={g.overlong_buffer}: must be in [0, rollout.max_new_tokens={max_new_tokens})")
  _check(p, g.max_resample_rounds >= 0, f"grpo.max_resample_rounds={g.max_resample_rounds}: must be >= 0")
  _check(p, not g.dynamic_sampling or g.max_resample_rounds >= 1, f"grpo.max_resample_rounds={g.max_resample_rounds}: dynamic sampling needs >= 1 extra round to refill the batch")
  _check(p, g.overlong_penalty >= 0, f"grpo.overlong_penalty={g.overlong_penalty}: must be >= 0")
  _check(p, 0 < g.gspo_epsilon < 1, f"grpo.gspo_epsilon={g.gspo_epsilon}: must be in (0, 1); the GSPO paper uses 3e-4")
  _check(p, g.gspo_epsilon_high >= g.gspo_epsilon, f"grpo.gspo_epsilon_high={g.gspo_epsilon_high}: must be >= grpo.gspo_epsilon={g.gspo_epsilon}")
  # A cap below 1 would shrink even the tokens where sampler and trainer agree.
  _check(p, g.tis_cap == 0 or g.tis_cap >= 1, f"grpo.tis_cap={g.tis_cap}: must be 0 (off) or >= 1; 2.0 is typical")
  return p


def _batching_problems(c: ml_collections.ConfigDict) -> list[str]:
  """How a rollout batch splits into updates, and the periods that must fall between batches."""
  p: list[str] = []
  g, t = c.grpo, c.train
  mini = t.mini_batch_size or t.batch_size
  _check(p, t.mini_batch_size >= 0 and t.batch_size >= 1 and t.batch_size % mini == 0,
         f"train.mini_batch_size={t.mini_batch_size}: must divide train.batch_size={t.batch_size} (0 = the whole batch)")
  updates = derived.updates_per_batch(c.train, c.grpo.num_iterations) if mini >= 1 and t.batch_size % mini == 0 else 1
  completions = t.batch_size * g.num_generations
  _check(p, c.rollout.slots <= completions,
         f"rollout.slots={c.rollout.slots}: must be <= the step's completions, train.batch_size x grpo.num_generations = {completions}; set --config.rollout.slots={completions} or lower")
  if c.rollout.max_staleness:
    _check(p, updates == 1, f"rollout.max_staleness={c.rollout.max_staleness} needs one update per batch (grpo.num_iterations=1, train.mini_batch_size=0); set --config.rollout.max_staleness=0")
    _check(p, not g.dynamic_sampling, f"rollout.max_staleness={c.rollout.max_staleness} cannot refill groups (grpo.dynamic_sampling); set --config.grpo.dynamic_sampling=False")
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
  return p


def _rollout_problems(r: ml_collections.ConfigDict, eval_max_new_tokens: int) -> list[str]:
  """rollout.*; the KV cache must also hold eval's `eval_max_new_tokens`."""
  p: list[str] = []
  _check(p, r.temperature > 0, f"rollout.temperature={r.temperature}: must be > 0; greedy rollouts make every completion of a group identical (zero advantage)")
  _check(p, 0 < r.top_p <= 1, f"rollout.top_p={r.top_p}: must be in (0, 1]")
  _check(p, r.engine in choices.ROLLOUT_ENGINES, f"rollout.engine={r.engine!r}: must be one of {', '.join(choices.ROLLOUT_ENGINES)}")
  _check(p, r.decode_dtype in choices.DECODE_DTYPES, f"rollout.decode_dtype={r.decode_dtype!r}: must be one of {', '.join(choices.DECODE_DTYPES)}")
  _check(p, r.decode_dtype == "float32" or r.engine == "grouped", f"rollout.decode_dtype={r.decode_dtype!r} needs rollout.engine='grouped' (Tunix's sampler decodes in the model's dtype)")
  _check(p, r.screen_lm_head in choices.SCREEN_SETTINGS, f"rollout.screen_lm_head={r.screen_lm_head!r}: must be one of {', '.join(choices.SCREEN_SETTINGS)}")
  _check(p, r.top_k >= 0, f"rollout.top_k={r.top_k}: must be >= 0 (0 = no top-k)")
  _check(p, r.max_prompt_length >= 8, f"rollout.max_prompt_length={r.max_prompt_length}: too small for the instruction; use >= 128")
  _check(p, r.max_new_tokens >= 1, f"rollout.max_new_tokens={r.max_new_tokens}: must be >= 1")
  _check(p, not r.tools or r.engine == "grouped", f"rollout.tools={r.tools!r} needs rollout.engine='grouped' (Tunix's sampler cannot pause for a tool)")
  _check(p, r.max_tool_calls >= 1, f"rollout.max_tool_calls={r.max_tool_calls}: must be >= 1")
  _check(p, r.tool_time_limit > 0, f"rollout.tool_time_limit={r.tool_time_limit}: must be > 0 seconds")
  _check(p, r.slots >= 0, f"rollout.slots={r.slots}: must be >= 0 (0 = lockstep decoding)")
  _check(p, not r.slots or r.engine == "grouped", f"rollout.slots={r.slots} needs rollout.engine='grouped' (continuous batching is our engine's)")
  _check(p, not r.slots or not r.tools, f"rollout.slots={r.slots} cannot run rollout.tools={r.tools!r} yet; set --config.rollout.slots=0 for tool calls")
  _check(p, r.max_staleness >= 0, f"rollout.max_staleness={r.max_staleness}: must be >= 0 (0 = lockstep)")
  _check(p, not r.max_staleness or r.slots > 0, f"rollout.max_staleness={r.max_staleness} runs ahead in carried slots: set --config.rollout.slots (8 is a start)")
  need = r.max_prompt_length + max(r.max_new_tokens, eval_max_new_tokens)
  _check(p, r.kv_cache_size >= need, f"rollout.kv_cache_size={r.kv_cache_size}: must hold max_prompt_length + max_new_tokens = {need}; set --config.rollout.kv_cache_size={need}")
  return p


def _optim_problems(o: ml_collections.ConfigDict) -> list[str]:
  p: list[str] = []
  _check(p, o.peak_lr > 0, f"optim.peak_lr={o.peak_lr}: must be > 0")
  _check(p, 0 <= o.warmup_fraction < 1, f"optim.warmup_fraction={o.warmup_fraction}: warmup must end before train.max_steps; use a value in [0, 1)")
  _check(p, 0 <= o.end_lr <= o.peak_lr, f"optim.end_lr={o.end_lr}: must be in [0, optim.peak_lr={o.peak_lr}]")
  _check(p, o.max_grad_norm > 0, f"optim.max_grad_norm={o.max_grad_norm}: must be > 0")
  for key in ("b1", "b2"):
    _check(p, 0 <= o[key] < 1, f"optim.{key}={o[key]}: must be in [0, 1)")
  _check(p, o.weight_decay >= 0, f"optim.weight_decay={o.weight_decay}: must be >= 0")
  return p


def _train_problems(t: ml_collections.ConfigDict) -> list[str]:
  p: list[str] = []
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
  return p


def _eval_problems(e: ml_collections.ConfigDict, num_heldout: int) -> list[str]:
  """eval.*; it draws from data's `num_heldout` held-out problems."""
  p: list[str] = []
  _check(p, e.max_new_tokens >= 1, f"eval.max_new_tokens={e.max_new_tokens}: must be >= 1")
  _check(p, e.every_steps >= 0, f"eval.every_steps={e.every_steps}: must be >= 0 (0 = never)")
  _check(p, e.num_examples >= 0, f"eval.num_examples={e.num_examples}: must be >= 0")
  _check(p, e.num_examples <= num_heldout, f"eval.num_examples={e.num_examples}: exceeds data.num_heldout={num_heldout}")
  _check(p, e.batch_size >= 1, f"eval.batch_size={e.batch_size}: must be >= 1")
  return p


def _ckpt_problems(k: ml_collections.ConfigDict) -> list[str]:
  p: list[str] = []
  _check(p, k.every_steps >= 1, f"ckpt.every_steps={k.every_steps}: must be >= 1")
  _check(p, k.keep >= 1, f"ckpt.keep={k.keep}: must keep >= 1 checkpoint")
  return p


def _sft_problems(sft: ml_collections.ConfigDict, max_prompt_length: int) -> list[str]:
  """sft.*; a solution needs room beyond rollout's `max_prompt_length`."""
  p: list[str] = []
  _check(p, sft.max_steps >= 1, f"sft.max_steps={sft.max_steps}: must be >= 1")
  _check(p, sft.batch_size >= 1, f"sft.batch_size={sft.batch_size}: must be >= 1")
  _check(p, sft.peak_lr > 0, f"sft.peak_lr={sft.peak_lr}: must be > 0 (2e-4 is typical for LoRA)")
  _check(p, sft.max_length > max_prompt_length, f"sft.max_length={sft.max_length}: must exceed rollout.max_prompt_length={max_prompt_length} to leave room for the solution")
  return p


def _log_problems(log: ml_collections.ConfigDict) -> list[str]:
  p: list[str] = []
  _check(p, log.flush_every_steps >= 1, f"log.flush_every_steps={log.flush_every_steps}: must be >= 1")
  return p


def _seed_problems(c: ml_collections.ConfigDict) -> list[str]:
  """Every *.seed and *_seed key: numpy's generators take only seeds >= 0."""
  p: list[str] = []
  for section in c.keys():
    for key, value in _leaves(c[section], f"{section}."):
      if key.endswith(("seed", "_seed")) and isinstance(value, int):
        _check(p, value >= 0, f"{key}={value}: must be >= 0")
  return p


def _leaves(node: ml_collections.ConfigDict, prefix: str):
  for key in node.keys():
    if isinstance(node[key], ml_collections.ConfigDict):
      yield from _leaves(node[key], f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", node[key]


def _mesh_problems(mesh: ml_collections.ConfigDict, max_staleness: int,
                   num_devices: int | None) -> list[str]:
  """The axis sizes always; with `num_devices`, whether they fill the devices."""
  p = derived.mesh_size_problems(mesh)
  n = mesh.rollout_devices
  _check(p, n >= 0, f"mesh.rollout_devices={n}: must be >= 0 (0 = one mesh for every program)")
  if n > 0:
    _check(p, max_staleness >= 1, f"mesh.rollout_devices={n} decodes the next batch while the update runs, which needs rollout.max_staleness >= 1; set --config.rollout.max_staleness=1")
    _check(p, mesh.fsdp == -1, f"mesh.rollout_devices={n}: each group fills fsdp with its own devices; set --config.mesh.fsdp=-1")
  if p or num_devices is None:
    return p
  try:
    _, tp = derived.mesh_shape(mesh, num_devices)
    if n > 0:
      p += derived.split_problems(n, num_devices, tp, "mesh.rollout_devices=",
                                  unsplit=": set --config.mesh.rollout_devices=0")
  except errors.UserError as e:
    return [str(e)]
  return p


def validate(c: ml_collections.ConfigDict, num_devices: int | None = None) -> None:
  """Raises UserError listing every problem in `c`, one per line.

  With `num_devices` the mesh is checked against them too; without it,
  everything that needs no device is (so a bad flag fails before JAX starts). The rewards
  section is gemma_grpo.tasks.rewards.check's to check.
  """
  p: list[str] = _type_problems(c)
  if p:  # range checks on wrongly typed values would only add noise
    raise errors.UserError("\n".join(p))
  p += _model_problems(c.model)
  p += _data_problems(c.data)
  p += _lora_problems(c.lora)
  p += _grpo_problems(c.grpo, c.rollout.max_new_tokens)
  p += _batching_problems(c)
  p += _rollout_problems(c.rollout, c.eval.max_new_tokens)
  p += _optim_problems(c.optim)
  p += _train_problems(c.train)
  p += _eval_problems(c.eval, c.data.num_heldout)
  p += _ckpt_problems(c.ckpt)
  p += _sft_problems(c.sft, c.rollout.max_prompt_length)
  p += _log_problems(c.log)
  p += _seed_problems(c)
  p += _mesh_problems(c.mesh, c.rollout.max_staleness, num_devices)
  if p:
    raise errors.UserError("\n".join(p))
