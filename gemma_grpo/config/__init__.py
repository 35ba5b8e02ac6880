"""Configs: the defaults, loading a config file, `--config.a.b=v` overrides, validation, settings.

Data only: nothing here imports the trainer (tests/test_architecture.py), so
a bad flag fails before JAX starts. The modules, one job each:

  defaults       every key with its default, unit and meaning
  offline_270m   the first command's settings (configs/gemma3_270m.py)
  choices        the values a key may take (ALGORITHMS, DECODE_DTYPES, ...)
  files          load a config file; save and reload a run's config.json
  overrides      --config.a.b=value
  validation     every problem at once, one line each
  derived        quantities a config implies (updates per batch, mesh shape)
  settings       a validated config as frozen per-concern dataclasses, for the library
"""

from gemma_grpo.config.choices import ALGORITHMS
from gemma_grpo.config.choices import data_source_kind
from gemma_grpo.config.choices import DECODE_DTYPES
from gemma_grpo.config.choices import DTYPES
from gemma_grpo.config.choices import GEMMA_VOCAB_SIZE
from gemma_grpo.config.choices import HELDOUT_UNSEEN_BY
from gemma_grpo.config.choices import HUB_DATASET
from gemma_grpo.config.choices import LORA_MODULES
from gemma_grpo.config.choices import MATMUL_DTYPES
from gemma_grpo.config.choices import OFFLINE_MODEL
from gemma_grpo.config.choices import REASONING_GYM_PREFIX
from gemma_grpo.config.choices import REWARD_FUNCTIONS
from gemma_grpo.config.choices import ROLLOUT_ENGINES
from gemma_grpo.config.choices import SCREEN_SETTINGS
from gemma_grpo.config.defaults import defaults
from gemma_grpo.config.derived import completions_per_train_step
from gemma_grpo.config.derived import mesh_shape
from gemma_grpo.config.derived import split_problems
from gemma_grpo.config.derived import updates_per_batch
from gemma_grpo.config.files import load
from gemma_grpo.config.files import load_saved
from gemma_grpo.config.files import save
from gemma_grpo.config.offline_270m import offline_270m
from gemma_grpo.config.overrides import apply_overrides
from gemma_grpo.config.overrides import override
from gemma_grpo.config.validation import validate
