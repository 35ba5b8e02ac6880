"""Math word problems -> grain datasets of {prompts, answer} batches.

Sources (`data.source`):
  gsm8k                    openai/gsm8k from the hub (cached by huggingface_hub)
  /path/file.jsonl|.parquet GSM8K's own format: question, answer "...#### 72"
  reasoning_gym:<task>     offline procedural problems (e.g. gsm_symbolic)

GSM-Symbolic's templates come from GSM8K *test* questions: a model trained on
it must not be scored on GSM8K test as if that test were unseen.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import random
import re

from absl import logging
import grain
import numpy as np

from gemma_grpo import errors
from gemma_grpo.config import settings
from gemma_grpo.runtime import hub
from gemma_grpo.tasks import prompts

GSM8K_HUB_ID = "openai/gsm8k"
_CALCULATOR = re.compile(r"<<[^<>]*>>")


@dataclasses.dataclass(frozen=True)
class Problem:
  question: str
  answer: str  # gold final answer, e.g. "72"
  solution: str = ""  # worked reasoning, when the source has one (for SFT)
  # Solved (question, reasoning, answer) turns shown before the question.
  examples: tuple[tuple[str, str, str], ...] = ()
  instruction: str = prompts.SYSTEM_INSTRUCTION  # atop the first user turn

  @property
  def prompt(self) -> str:
    """The exact text the policy is given (before <bos>), in training and eval."""
    return prompts.render_prompt(self.question, system=self.instruction, examples=self.examples)


def with_examples(problems: list[Problem], data: settings.DataSettings) -> list[Problem]:
  """The problems with the data settings' instruction and few-shot turns in their prompt."""
  examples = tuple(tuple(str(x) for x in e) for e in data.few_shot)
  return [dataclasses.replace(p, examples=examples, instruction=instruction(data))
          for p in problems]


def instruction(data: settings.DataSettings) -> str:
  """`data.instruction`, or the default one when it is empty."""
  return data.instruction or prompts.SYSTEM_INSTRUCTION


def parse_gsm8k_answer(text: str) -> tuple[str, str]:
  """(reasoning without calculator annotations, gold number) of a GSM8K answer."""
  reasoning, sep, final = text.rpartition("####")
  if not sep:
    raise ValueError("no '####' before the final answer")
  gold = final.strip().replace(",", "")
  if not gold:
    raise ValueError("empty final answer after '####'")
  return _CALCULATOR.sub("", reasoning).strip(), gold


def _problem(record: dict, where: str) -> Problem:
  if not isinstance(record, dict):
    raise errors.UserError(f"{where}: expected a JSON object with 'question' and 'answer'")
  missing = [k for k in ("question", "answer") if not isinstance(record.get(k), str)]
  if missing:
    raise errors.UserError(f"{where}: missing string field(s) {missing} (GSM8K format: question, answer '...#### 72')")
  try:
    solution, gold = parse_gsm8k_answer(record["answer"])
  except ValueError as e:
    raise errors.UserError(f"{where}: answer {record['answer'][-40:]!r}: {e}") from None
  return Problem(record["question"], gold, solution)


def read_jsonl(path: pathlib.Path) -> list[Problem]:
  problems = []
  with open(path, "rb") as f:
    for number, raw in enumerate(f, start=1):
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError:
        raise errors.UserError(f"{path}:{number}: not UTF-8 text; is this a JSONL file?") from None
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise errors.UserError(f"{path}:{number}: malformed JSON ({e.msg}); fix or remove that line") from None
      problems.append(_problem(record, f"{path}:{number}"))
  return problems


def read_parquet(path: pathlib.Path) -> list[Problem]:
  # Deferred: only .parquet sources need pyarrow.
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

  try:
    rows = pq.read_table(path, columns=["question", "answer"]).to_pylist()
  except Exception as e:  # pylint: disable=broad-exception-caught
    raise errors.UserError(f"{path}: cannot read as GSM8K parquet ({e})") from None
  return [_problem(r, f"{path}: row {i}") for i, r in enumerate(rows)]


def read_file(path: pathlib.Path) -> list[Problem]:
  if path.is_dir():
    raise errors.UserError(f"data.source: {path} is a directory; pass a GSM8K-format .jsonl or .parquet file")
  if not path.is_file():
    raise errors.UserError(f"data.source: no such file {path}; pass a GSM8K-format .jsonl or .parquet file, gsm8k or reasoning_gym:<task>")
  if not os.access(path, os.R_OK):
    raise errors.UserError(f"data.source: {path} is not readable; check its permissions")
  try:
    if path.suffix == ".parquet":
      return read_parquet(path)
    return read_jsonl(path)
  except OSError as e:
    raise errors.UserError(f"data.source: cannot read {path} ({e.strerror or e})") from None


def check_source(source: str) -> None:
  """Reads a local data file (data.source) once, so a bad one fails before the model loads.

  Hub and procedural sources are checked when loaded; they need no user file.
  """
  if source == "gsm8k" or source.startswith("reasoning_gym:"):
    return
  path = pathlib.Path(os.path.expanduser(source))
  if not read_file(path):
    raise errors.UserError(f"data.source={source!r}: no problems in the file")


def load_gsm8k_hub(split: str) -> list[Problem]:
  try:
    path = hub.download_file(GSM8K_HUB_ID, f"main/{split}-00000-of-00001.parquet", repo_type="dataset")
  except Exception as e:  # pylint: disable=broad-exception-caught
    why = str(e) if isinstance(e, hub.Unreachable) else type(e).__name__
    raise errors.UserError(
        f"data.source=gsm8k: cannot download {GSM8K_HUB_ID} split {split!r}"
        f" ({why}); pass a local GSM8K .jsonl/.parquet path or"
        " reasoning_gym:gsm_symbolic"
    ) from None
  return read_parquet(pathlib.Path(path))


def load_reasoning_gym(task: str, size: int, seed: int, options: dict | None = None) -> list[Problem]:
  """`size` problems of a reasoning-gym task; `options` are its config's fields."""
  # Deferred: reasoning_gym takes a second to import; only reasoning_gym: sources need it.
  import reasoning_gym  # pylint: disable=g-import-not-at-top

  options = dict(options or {})
  try:
    items = reasoning_gym.create_dataset(task, size=size, seed=seed, **options)
    items = list(items)
  except (ValueError, TypeError, AssertionError) as e:
    raise errors.UserError(
        f"data.source=reasoning_gym:{task} with data.reasoning_gym_options={options}:"
        f" {e or type(e).__name__}; fix the options (they are the task config's fields)") from None
  problems = []
  for item in items:
    cot = item.get("metadata", {}).get("answer_cot", "")
    solution = parse_gsm8k_answer(cot)[0] if "####" in cot else cot
    problems.append(Problem(item["question"], str(item["answer"]).strip(), solution))
  return problems


def load_problems(source: str, *, split: str = "train", size: int = 2000, seed: int = 1234,
                  options: dict | None = None) -> list[Problem]:
  """Every problem of a source, in the source's order."""
  if source == "gsm8k":
    problems = load_gsm8k_hub(split)
  elif source.startswith("reasoning_gym:"):
    problems = load_reasoning_gym(source.split(":", 1)[1], size, seed, options)
  else:
    problems = read_file(pathlib.Path(os.path.expanduser(source)))
  if not problems:
    raise errors.UserError(f"data.source={source!r}: no problems found")
  return problems


def fit_prompts(problems: list[Problem], tokenizer, max_prompt_length: int) -> list[Problem]:
  """Drops (and counts) problems whose prompt exceeds the limit, never truncates."""
  kept = [p for p in problems if len(tokenizer.encode(p.prompt)) <= max_prompt_length]
  dropped = len(problems) - len(kept)
  if dropped:
    logging.warning("Dropped %d of %d problems longer than rollout.max_prompt_length=%d tokens", dropped, len(problems), max_prompt_length)
  if not kept:
    raise errors.UserError(
        f"rollout.max_prompt_length={max_prompt_length}: every prompt is longer;"
        " raise it (and rollout.kv_cache_size)"
    )
  return kept


@dataclasses.dataclass
class Splits:
  train: list[Problem]
  heldout: list[Problem]
  dropped: int


# One-letter names, as in "Solve for h: h + 6 = 7".
_VARIABLE = re.compile(r"\b[a-z]\b")


def problem_key(problem: Problem, by: str) -> str:
  """What makes two problems the same one, for `data.heldout_unseen_by`.

  "question": the same text. "equation": the same text after the last colon
  with every one-letter name read as x, so reasoning-gym's "Solve for h:
  h + 6 = 7" and "Find the value of x in the equation: x + 6 = 7" are one
  problem (simple_equations has only ~300 distinct equations in 2000 draws).
  """
  if by == "question":
    return problem.question.strip()
  if by == "equation":
    return _VARIABLE.sub("x", problem.question.rsplit(":", 1)[-1].strip())
  raise ValueError(f"unknown problem key {by!r}")


def _split_unseen(problems: list[Problem], num_heldout: int, by: str) -> tuple[list[Problem], list[Problem]]:
  """`num_heldout` distinct problems, and the rest minus every repeat of one of them."""
  heldout, keys = [], set()
  for problem in problems:
    if len(heldout) == num_heldout:
      break
    key = problem_key(problem, by)
    if key not in keys:
      keys.add(key)
      heldout.append(problem)
  if len(heldout) < num_heldout:
    raise errors.UserError(
        f"data.num_heldout={num_heldout}: the source has only {len(heldout)} distinct problems"
        f" by data.heldout_unseen_by={by!r}; lower data.num_heldout or raise data.reasoning_gym_size")
  return heldout, [p for p in problems if problem_key(p, by) not in keys]


def build_splits(data: settings.DataSettings, tokenizer, max_prompt_length: int) -> Splits:
  """Shuffled (seeded) problems, the first `num_heldout` kept out of training.

  With `heldout_unseen_by` set, the held-out problems are distinct and no
  training problem repeats one of them, so a held-out score is measured on
  problems the policy never trained on.
  """
  problems = load_problems(data.source, split=data.split, size=data.reasoning_gym_size,
                           seed=data.reasoning_gym_seed, options=dict(data.reasoning_gym_options))
  fitted = fit_prompts(with_examples(problems, data), tokenizer, max_prompt_length)
  random.Random(data.shuffle_seed).shuffle(fitted)
  if data.heldout_unseen_by == "none":
    heldout, train = fitted[:data.num_heldout], fitted[data.num_heldout:]
  else:
    heldout, train = _split_unseen(fitted, data.num_heldout, data.heldout_unseen_by)
  if data.max_examples:
    train = train[:data.max_examples]
  if not train:
    raise errors.UserError(
        f"data: no training problems left after holding out {data.num_heldout};"
        " lower data.num_heldout or use a larger source"
    )
  return Splits(train, heldout, len(problems) - len(fitted))


def to_batch(problems: list[Problem]) -> dict[str, np.ndarray]:
  """Tunix's learner wants numpy columns; lists break inside it."""
  return {
      "prompts": np.array([p.prompt for p in problems]),
      "answer": np.array([p.answer for p in problems]),
  }


def train_batches(problems: list[Problem], batch_size: int, seed: int):
  """An endless grain dataset of batches; epoch e is shuffled with (seed, e).

  Deterministic, so a resumed run that skips k batches sees exactly the
  batches the uninterrupted run saw after step k.
  """

  if len(problems) < batch_size:
    raise errors.UserError(
        f"train.batch_size={batch_size}: only {len(problems)} training problems;"
        " lower the batch size or add data"
    )
  ds = grain.MapDataset.source(problems).shuffle(seed=seed).repeat(None)
  return ds.batch(batch_size, drop_remainder=True, batch_fn=to_batch)
