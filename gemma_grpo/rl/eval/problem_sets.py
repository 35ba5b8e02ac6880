"""The problems `gemma-grpo eval` scores, and whether a run has already seen them.

reasoning_gym:<task> problems are drawn from seeds past the training range
(data.reasoning_gym_seed + data.reasoning_gym_size), so none is a training
problem. A run trained on reasoning_gym:gsm_symbolic (templates taken from
GSM8K test) and scored on GSM8K test is flagged as contaminated.
"""

from __future__ import annotations

import pathlib
from typing import Any

from huggingface_hub.utils import logging as hub_logging

from gemma_grpo import config as config_lib
from gemma_grpo import errors
from gemma_grpo.config import settings
from gemma_grpo.tasks import data as data_lib


def is_gsm8k_test(source: str, split: str | None) -> bool:
  """GSM8K's test split: the hub's, or a file whose path says gsm8k and test."""
  kind = config_lib.data_source_kind(source)
  if kind == "hub":
    return split == "test"
  if kind == "reasoning_gym":
    return False
  path = str(pathlib.Path(source).expanduser().resolve()).lower()
  return "gsm8k" in path and "test" in path


def contamination(trained_on: tuple[str, str] | None, data_source: str,
                  split: str | None) -> str | None:
  """Why scores on this data overstate the generalisation of a run trained on
  `trained_on` (its data.source, data.split), or None.

  GSM-Symbolic's templates are GSM8K test questions with new numbers.
  """
  if trained_on is None or not is_gsm8k_test(data_source, split):
    return None
  source, train_split = trained_on
  if source == "reasoning_gym:gsm_symbolic":
    return ("this run trained on reasoning_gym:gsm_symbolic, whose templates"
            " derive from GSM8K test questions")
  if is_gsm8k_test(source, train_split):
    return f"this run trained on {source} (GSM8K test itself)"
  return None


def default_data(data: settings.DataSettings) -> str:
  """--data when none is given: the config's own source, never its training problems."""
  if config_lib.data_source_kind(data.source) != "file":
    return data.source
  raise errors.UserError(
      f"--data: required, because data.source={data.source!r} is a file of training"
      " problems; pass the matching test file (or gsm8k, reasoning_gym:<task>)")


def load_problems(source: str, data: settings.DataSettings, *, split: str | None = None,
                  num_test: int | None = None) -> tuple[list[data_lib.Problem], dict[str, Any]]:
  """The first `num_test` problems of `source` (all if None), and how they were chosen.

  `data` is the run's data settings: the reasoning-gym range and options,
  the few-shot examples.
  """
  info: dict[str, Any] = {"source": source, "num_test": num_test}
  kind = config_lib.data_source_kind(source)
  if kind == "hub":
    split = split or "test"
    info["split"] = split
    problems = _load_gsm8k_hub(split)
  elif kind == "reasoning_gym":
    # Item i of a reasoning-gym dataset is drawn with Random(seed + i): starting
    # past the training range keeps every eval problem out of training's.
    seed = data.reasoning_gym_seed + data.reasoning_gym_size
    size = num_test or data.reasoning_gym_size
    info.update(seed=seed, size=size)
    # The run's difficulty knobs belong to its own task only.
    options = dict(data.reasoning_gym_options) if source == data.source else {}
    info["options"] = options
    problems = data_lib.load_problems(source, size=size, seed=seed, options=options)
  else:
    path = pathlib.Path(source).expanduser()
    if not path.is_file():
      raise errors.UserError(
          f"--data {source}: no such file; pass a GSM8K-format .jsonl/.parquet,"
          " gsm8k or reasoning_gym:<task>")
    info["path"] = str(path.resolve())
    problems = data_lib.load_problems(str(path))
  info["num_loaded"] = len(problems)
  info["few_shot"] = len(data.few_shot)
  problems = data_lib.with_examples(problems, data)
  return problems[:num_test] if num_test else problems, info


def _load_gsm8k_hub(split: str) -> list[data_lib.Problem]:
  verbosity = hub_logging.get_verbosity()
  hub_logging.set_verbosity_error()  # no retry chatter
  try:
    return data_lib.load_gsm8k_hub(split)
  except errors.UserError:
    raise errors.UserError(
        f"--data gsm8k: cannot download {data_lib.GSM8K_HUB_ID} split {split!r}"
        " (offline?); pass a local GSM8K-format file instead, e.g. --data"
        " /path/to/gsm8k/test.jsonl") from None
  finally:
    hub_logging.set_verbosity(verbosity)
