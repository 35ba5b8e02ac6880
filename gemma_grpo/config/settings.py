"""Typed settings: a validated config as small frozen dataclasses, one per concern.

The user writes a ConfigDict (configs/*.py, `--config.a.b=v`); the library
below the commands never reads one. A command (or `api`) validates the config
and calls `from_config(c)` once; each library function then takes the one
slice it depends on (`make_mesh(s.mesh)`, `build_splits(s.data, ...)`), so its
signature says what it reads and a test builds only that slice.

Each section of config/defaults.py is one class here, its fields the section's
keys with the same names, so `s.rollout.max_new_tokens` is
`c.rollout.max_new_tokens` and the configuration reference documents both
(tests/test_settings.py checks that every key lands in a field). Lists become
tuples; the open sections (a reasoning-gym task's options, reward weights)
stay mappings, read-only. The checks stay in config/validation.py: this only
converts.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Mapping

import ml_collections

from gemma_grpo.config.files import as_json
from gemma_grpo.config.files import frozen

_settings = dataclasses.dataclass(frozen=True, kw_only=True)


def _read_only(section: ml_collections.ConfigDict) -> Mapping[str, Any]:
  return types.MappingProxyType(frozen(section.to_dict()))


def _fields(cls, section: ml_collections.ConfigDict, **converted) -> dict[str, Any]:
  """The values of `cls`'s fields from the section's keys of the same names."""
  return {f.name: converted[f.name] if f.name in converted else frozen(section[f.name])
          for f in dataclasses.fields(cls)}


@_settings
class RandomModelSettings:
  """The shapes of a randomly initialised Gemma-3 (model.source=random; tests)."""

  num_layers: int
  embed_dim: int
  hidden_dim: int
  num_heads: int
  head_dim: int
  num_kv_heads: int
  sliding_window: int  # tokens
  vocab_size: int
  seed: int


@_settings
class ModelSettings:
  """Which Gemma-3 to load, in what precision, cached where (the `model` section)."""

  source: str  # gguf:gemma-3-270m | hf:<repo_id> | /local/hf/dir | random
  dtype: str  # parameter dtype: float32 | bfloat16
  matmul_dtype: str  # operands of the large products: float32 (no cast) | bfloat16
  cache_dir: str  # converted GGUF, hub snapshots, the XLA cache
  init_lora_from: str  # a finished run whose adapter is merged into the base; "" = none
  random: RandomModelSettings  # shapes when source=random

  @classmethod
  def from_config(cls, model: ml_collections.ConfigDict) -> ModelSettings:
    random = RandomModelSettings(**_fields(RandomModelSettings, model.random))
    return cls(**_fields(cls, model, random=random))


@_settings
class MeshSettings:
  """The (fsdp, tp) device mesh (the `mesh` section)."""

  fsdp: int  # devices on the fsdp axis; -1 fills what tp leaves
  tp: int  # devices on the tensor-parallel axis; -1 fills the rest
  rollout_devices: int = 0  # devices of the rollout's own group; 0 = one mesh for all


@_settings
class LoraSettings:
  """The adapters trained on the frozen base (the `lora` section)."""

  rank: int  # r
  alpha: float  # the update's scale is alpha / r
  targets: str  # regex over module paths
  seed: int  # initialises the A matrices

  @property
  def scale(self) -> float:
    """alpha / r, what an adapter's product A·B is multiplied by."""
    return self.alpha / self.rank


@_settings
class DataSettings:
  """Where the problems come from and how they are split (the `data` section)."""

  source: str  # gsm8k | /path/to.jsonl|.parquet | reasoning_gym:<task>
  split: str  # split of a hub dataset
  num_heldout: int  # problems held out of training
  heldout_unseen_by: str  # none | question | equation
  max_examples: int  # cap on training problems; 0 = all
  shuffle_seed: int
  reasoning_gym_size: int  # problems generated for reasoning_gym:*
  reasoning_gym_seed: int
  reasoning_gym_options: Mapping[str, Any]  # the task's own config fields (open section)
  few_shot: tuple[tuple[str, str, str], ...]  # (question, reasoning, answer) turns
  instruction: str  # atop the first user turn; "" = the default one

  @classmethod
  def from_config(cls, data: ml_collections.ConfigDict) -> DataSettings:
    return cls(**_fields(cls, data, reasoning_gym_options=_read_only(data.reasoning_gym_options)))


@_settings
class RewardSettings:
  """Which reward functions score a completion, and their weights (the `rewards` section)."""

  preset: str  # reference | guarded | math
  custom: str  # "module:function[,...]", weight 1
  weights: Mapping[str, float | None]  # per function; None = the preset's (open section)

  @classmethod
  def from_config(cls, rewards: ml_collections.ConfigDict) -> RewardSettings:
    return cls(**_fields(cls, rewards, weights=_read_only(rewards.weights)))


@_settings
class AlgorithmSettings:
  """The GRPO-family algorithm (the `grpo` section; rl/learner/algorithms.py builds
  Tunix's AlgoConfig from it)."""

  algorithm: str  # grpo | dapo | dr_grpo | gspo
  num_generations: int  # G: completions per prompt
  num_iterations: int  # mu: optimisation passes per batch
  beta: float  # β: KL (k3) weight to the reference
  log_kl: bool  # log the KL even when beta=0
  epsilon: float  # ε: clip ratio >= 1 - ε
  epsilon_high: float  # dapo: clip ratio <= 1 + ε_high
  gspo_epsilon: float
  gspo_epsilon_high: float
  overlong_buffer: int  # tokens; 0 = off
  overlong_penalty: float  # reward units at the length limit
  dynamic_sampling: bool
  max_resample_rounds: int
  tis_cap: float  # C of truncated importance sampling; 0 = off


@_settings
class RolloutSettings:
  """How completions are sampled, stopped and given tools (the `rollout` section)."""

  temperature: float
  top_p: float
  top_k: int
  max_prompt_length: int  # tokens; longer prompts are dropped
  max_new_tokens: int  # tokens generated per completion
  kv_cache_size: int  # tokens
  seed: int  # sampling key for step s is fold_in(seed, s)
  ignore_eos: bool
  stop_text: str  # "" = off
  engine: str  # grouped | tunix
  decode_dtype: str  # float32 | bfloat16
  screen_lm_head: str  # auto | on | off
  slots: int  # rows decoded at once, refilled as samples end; 0 = lockstep
  max_staleness: int  # rollouts run this many updates ahead in carried slots; 0 = lockstep
  tools: str  # built-in names or module:function, comma-separated; "" = none
  max_tool_calls: int  # per completion
  tool_time_limit: float  # seconds


@_settings
class OptimizerSettings:
  """Warmup-cosine AdamW with global-norm clipping (the `optim` section)."""

  peak_lr: float
  warmup_fraction: float  # of the steps, linear from 0
  end_lr: float
  weight_decay: float
  b1: float
  b2: float
  max_grad_norm: float  # global-norm clip


@_settings
class TrainSettings:
  """Steps and batch sizes of a GRPO run (the `train` section)."""

  max_steps: int  # optimizer updates
  batch_size: int  # prompts per rollout
  mini_batch_size: int  # prompts per update; 0 = batch_size
  micro_batch_size: int  # prompts per forward/backward; 0 = mini_batch_size


@_settings
class EvalSettings:
  """The held-out eval during training, and `gemma-grpo eval`'s defaults (the `eval` section)."""

  every_steps: int  # 0 = never
  num_examples: int  # held-out problems per in-training eval
  batch_size: int  # prompts per generation batch
  max_new_tokens: int


@_settings
class LogSettings:
  """The `log` section."""

  flush_every_steps: int  # TensorBoard flush period


@_settings
class CheckpointSettings:
  """When checkpoints are written and how many are kept (the `ckpt` section)."""

  every_steps: int
  keep: int


@_settings
class SftSettings:
  """`gemma-grpo sft`, the supervised warm start (the `sft` section)."""

  max_steps: int
  batch_size: int  # examples per update
  peak_lr: float
  max_length: int  # tokens of prompt + solution


@_settings
class Settings:
  """Every slice of one validated config: what a run's orchestrator
  (rl/run/training_run.py, sft/sft.py, rl/eval/evaluation.py) hands out."""

  model: ModelSettings
  mesh: MeshSettings
  lora: LoraSettings
  data: DataSettings
  rewards: RewardSettings
  grpo: AlgorithmSettings
  rollout: RolloutSettings
  optim: OptimizerSettings
  train: TrainSettings
  eval: EvalSettings
  log: LogSettings
  ckpt: CheckpointSettings
  sft: SftSettings
  # The config as a run's config.json holds it (config.files.save): written
  # beside checkpoints and into eval.json as the user wrote it, open sections
  # included, and read back with config.load_saved.
  config_json: str


def _plain(cls: type, section: ml_collections.ConfigDict):
  return cls(**_fields(cls, section))


def from_config(c: ml_collections.ConfigDict) -> Settings:
  """The settings of a config that config.validate passed (it checks nothing itself)."""
  return Settings(
      model=ModelSettings.from_config(c.model),
      mesh=_plain(MeshSettings, c.mesh),
      lora=_plain(LoraSettings, c.lora),
      data=DataSettings.from_config(c.data),
      rewards=RewardSettings.from_config(c.rewards),
      grpo=_plain(AlgorithmSettings, c.grpo),
      rollout=_plain(RolloutSettings, c.rollout),
      optim=_plain(OptimizerSettings, c.optim),
      train=_plain(TrainSettings, c.train),
      eval=_plain(EvalSettings, c.eval),
      log=_plain(LogSettings, c.log),
      ckpt=_plain(CheckpointSettings, c.ckpt),
      sft=_plain(SftSettings, c.sft),
      config_json=as_json(c),
  )
