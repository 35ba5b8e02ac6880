"""Problem sources, prompt-length filtering, held-out split and batches."""

import json

import numpy as np
import pytest

from gemma_grpo.config import settings
from gemma_grpo.tasks import data
from gemma_grpo import errors
from gemma_grpo.tasks import prompts


class CharTokenizer:
  """One token per character plus <bos>: lengths are easy to reason about."""

  def encode(self, text):
    return [2] + [ord(ch) for ch in text]


def write_jsonl(path, records):
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  return path


@pytest.mark.parametrize("answer, reasoning, gold", [
    ("2 + 3 = <<2+3=5>>5 apples.\n#### 5", "2 + 3 = 5 apples.", "5"),
    ("Costs $<<1000+234=1234>>1234.\n#### 1,234", "Costs $1234.", "1234"),
    ("Loses 3.\n####  -3 ", "Loses 3.", "-3"),
    ("Half.\n#### 0.5", "Half.", "0.5"),
    ("a #### b\n#### 7", "a #### b", "7"),  # the final marker wins
])
def test_parse_gsm8k_answer(answer, reasoning, gold):
  assert data.parse_gsm8k_answer(answer) == (reasoning, gold)


@pytest.mark.parametrize("answer", ["no marker 5", "empty #### "])
def test_parse_gsm8k_answer_rejects(answer):
  with pytest.raises(ValueError):
    data.parse_gsm8k_answer(answer)


def test_read_jsonl(tmp_path):
  path = write_jsonl(tmp_path / "p.jsonl", [
      {"question": "Ann has 2 cats and gets 3 more. How many?", "answer": "2+3=<<2+3=5>>5\n#### 5"},
      {"question": "Bo has 10 pens and loses 4. How many?", "answer": "10-4=6\n#### 6"},
  ])
  problems = data.read_jsonl(path)
  assert [p.answer for p in problems] == ["5", "6"]
  assert problems[0].solution == "2+3=5"


@pytest.mark.parametrize("content, needle", [
    ('{"question": "q", "answer": "#### 1"}\n{not json}\n', "p.jsonl:2: malformed JSON"),
    ('{"question": "q"}\n', "p.jsonl:1: missing string field(s) ['answer']"),
    ('{"question": "q", "answer": "no marker"}\n', "p.jsonl:1: answer"),
    ('[1, 2]\n', "p.jsonl:1: expected a JSON object"),
])
def test_malformed_jsonl_names_the_line(tmp_path, content, needle):
  path = tmp_path / "p.jsonl"
  path.write_text(content)
  with pytest.raises(errors.UserError) as e:
    data.read_jsonl(path)
  assert needle in str(e.value)


def test_missing_and_empty_sources(tmp_path):
  with pytest.raises(errors.UserError, match="no such file"):
    data.load_problems(str(tmp_path / "nope.jsonl"))
  (tmp_path / "empty.jsonl").write_text("\n")
  with pytest.raises(errors.UserError, match="no problems found"):
    data.load_problems(str(tmp_path / "empty.jsonl"))


def test_parquet_source(tmp_path):
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

  table = pa.table({"question": ["Two plus two?"], "answer": ["2+2=4\n#### 4"]})
  pq.write_table(table, tmp_path / "p.parquet")
  assert data.load_problems(str(tmp_path / "p.parquet"))[0].answer == "4"


def test_reasoning_gym_source_is_offline_and_seeded():
  a = data.load_problems("reasoning_gym:gsm_symbolic", size=5, seed=7)
  b = data.load_problems("reasoning_gym:gsm_symbolic", size=5, seed=7)
  assert a == b and len(a) == 5
  assert all(p.answer.lstrip("-").replace(".", "").isdigit() for p in a)
  assert all(p.solution and "####" not in p.solution for p in a)


def test_reasoning_gym_options_set_the_difficulty():
  easy = data.load_problems("reasoning_gym:simple_equations", size=50, seed=3, options=dict(
      min_terms=2, max_terms=2, min_value=1, max_value=10,
      operators=("+", "-"), operators_weights=(0.5, 0.5)))
  assert all(1 <= int(p.answer) <= 10 for p in easy)
  assert not any("*" in p.question for p in easy)
  default = data.load_problems("reasoning_gym:simple_equations", size=50, seed=3)
  assert max(int(p.answer) for p in default) > 10


def test_bad_reasoning_gym_options_name_the_field():
  with pytest.raises(errors.UserError, match="data.reasoning_gym_options=.*no_such_knob"):
    data.load_problems("reasoning_gym:simple_equations", size=2, options={"no_such_knob": 1})
  with pytest.raises(errors.UserError, match="data.reasoning_gym_options"):
    data.load_problems("reasoning_gym:simple_equations", size=2,
                       options={"operators": ("+", "-")})  # three weights for two operators


def test_few_shot_examples_are_earlier_turns_of_the_same_chat():
  examples = (("Solve for x: x + 1 = 3", "x = 3 - 1 = 2.", "2"),)
  problem = data.with_examples([data.Problem("Solve for y: y - 2 = 5", "7")],
                               _data_settings(few_shot=examples))[0]
  assert problem.prompt == (
      "<start_of_turn>user\n" + prompts.SYSTEM_INSTRUCTION + "\n\nSolve for x: x + 1 = 3<end_of_turn>\n"
      "<start_of_turn>model\n<reasoning>x = 3 - 1 = 2.</reasoning>\n<answer>2</answer><end_of_turn>\n"
      "<start_of_turn>user\nSolve for y: y - 2 = 5<end_of_turn>\n<start_of_turn>model\n")
  # Without examples the prompt is the single turn it always was.
  assert data.Problem("q", "1").prompt == prompts.render_prompt("q")
  # The example turns render exactly as SFT's targets do.
  assert prompts.render_answer("x = 3 - 1 = 2.", "2") + prompts.END_OF_TURN in problem.prompt


def test_data_instruction_replaces_the_default_one_atop_the_first_turn():
  c = _data_settings(instruction="Use the calculator.")
  problem = data.with_examples([data.Problem("What is 2 * 3?", "6")], c)[0]
  assert problem.prompt == ("<start_of_turn>user\nUse the calculator.\n\nWhat is 2 * 3?<end_of_turn>\n"
                            "<start_of_turn>model\n")
  assert prompts.SYSTEM_INSTRUCTION in data.with_examples([problem], _data_settings())[0].prompt


def test_split_prompts_carry_the_examples_and_count_toward_the_limit(tmp_path):
  path = write_jsonl(tmp_path / "p.jsonl", [
      {"question": f"What is {i} plus one?", "answer": f"#### {i + 1}"} for i in range(10)
  ])
  examples = (("What is 1 plus one?", "1 + 1 = 2.", "2"),)
  splits = data.build_splits(_data_settings(path, few_shot=examples), CharTokenizer(), 10_000)
  assert all(p.examples == examples for p in splits.train + splits.heldout)
  batch = data.to_batch(splits.train[:2])
  assert all(b.count("<start_of_turn>user") == 2 for b in batch["prompts"])
  one_turn = len(prompts.render_prompt("What is 1 plus one?")) + 1
  with pytest.raises(errors.UserError, match="max_prompt_length"):
    data.build_splits(_data_settings(path, few_shot=examples), CharTokenizer(), one_turn + 5)


def test_unknown_reasoning_gym_task():
  with pytest.raises(errors.UserError, match="reasoning_gym:no_such_task"):
    data.load_problems("reasoning_gym:no_such_task", size=2)


def test_gsm8k_hub_offline_gives_a_clear_error(monkeypatch):
  import huggingface_hub  # pylint: disable=g-import-not-at-top

  def offline(*args, **kwargs):
    raise huggingface_hub.errors.LocalEntryNotFoundError("offline")

  monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
  with pytest.raises(errors.UserError, match="pass a local GSM8K"):
    data.load_problems("gsm8k", split="test")


def test_long_prompts_are_dropped_not_truncated():
  short = data.Problem("x" * 10, "1")
  long = data.Problem("y" * 500, "2")
  limit = len(prompts.render_prompt(short.question)) + 1  # + <bos>
  assert data.fit_prompts([short, long], CharTokenizer(), limit) == [short]
  with pytest.raises(errors.UserError, match="rollout.max_prompt_length"):
    data.fit_prompts([long], CharTokenizer(), limit)


def _data_settings(source="unused.jsonl", **overrides) -> settings.DataSettings:
  """The data slice alone: no whole config is needed to split problems."""
  return settings.DataSettings(**{**dict(
      source=str(source), split="train", num_heldout=2, max_examples=0, heldout_unseen_by="none",
      shuffle_seed=42, reasoning_gym_size=10, reasoning_gym_seed=1,
      reasoning_gym_options={}, few_shot=(), instruction="",
  ), **overrides})


def test_heldout_split_is_deterministic_and_disjoint(tmp_path):
  path = write_jsonl(tmp_path / "p.jsonl", [
      {"question": f"What is {i} plus one?", "answer": f"#### {i + 1}"} for i in range(10)
  ])
  a = data.build_splits(_data_settings(path), CharTokenizer(), 10_000)
  b = data.build_splits(_data_settings(path), CharTokenizer(), 10_000)
  assert a.train == b.train and a.heldout == b.heldout
  assert len(a.heldout) == 2 and len(a.train) == 8
  assert not set(p.question for p in a.heldout) & set(p.question for p in a.train)
  capped = data.build_splits(_data_settings(path, max_examples=3), CharTokenizer(), 10_000)
  assert len(capped.train) == 3
  with pytest.raises(errors.UserError, match="data.num_heldout"):
    data.build_splits(_data_settings(path, num_heldout=10), CharTokenizer(), 10_000)


def test_batches_are_numpy_and_reshuffled_each_epoch():
  problems = [data.Problem(f"q{i}", str(i)) for i in range(4)]
  batches = iter(data.train_batches(problems, batch_size=2, seed=0))
  epoch1 = [next(batches) for _ in range(2)]
  epoch2 = [next(batches) for _ in range(2)]
  for batch in epoch1 + epoch2:
    assert isinstance(batch["prompts"], np.ndarray) and isinstance(batch["answer"], np.ndarray)
    assert batch["prompts"][0] == prompts.render_prompt(f"q{batch['answer'][0]}")
  seen1 = sorted(a for b in epoch1 for a in b["answer"])
  seen2 = sorted(a for b in epoch2 for a in b["answer"])
  assert seen1 == seen2 == ["0", "1", "2", "3"]  # every problem once per epoch
  order1 = [a for b in epoch1 for a in b["answer"]]
  again = iter(data.train_batches(problems, batch_size=2, seed=0))
  assert [a for _ in range(2) for a in next(again)["answer"]] == order1


def test_each_epoch_has_its_own_order():
  problems = [data.Problem(f"q{i}", str(i)) for i in range(20)]
  batches = iter(data.train_batches(problems, batch_size=20, seed=0))
  first, second = next(batches)["answer"].tolist(), next(batches)["answer"].tolist()
  assert sorted(first) == sorted(second) and first != second


def test_batch_larger_than_data_is_rejected():
  with pytest.raises(errors.UserError, match="train.batch_size=4"):
    data.train_batches([data.Problem("q", "1")], batch_size=4, seed=0)


def test_problem_key_reads_one_equation_under_any_letter_or_wording():
  a = data.Problem("Solve for h: h + 6 = 7", "1")
  b = data.Problem("Find the value of x in the equation: x + 6 = 7", "1")
  c = data.Problem("Solve for h: 6 + h = 7", "1")
  assert data.problem_key(a, "equation") == data.problem_key(b, "equation") == "x + 6 = 7"
  assert data.problem_key(a, "equation") != data.problem_key(c, "equation")
  assert data.problem_key(a, "question") != data.problem_key(b, "question")


def test_unseen_heldout_problems_are_distinct_and_never_trained_on(tmp_path):
  # 30 rows over 6 equations, each under several letters and wordings.
  rows = [{"question": f"{wording} {letter}: {letter} + {i % 6} = {i % 6 + 3}", "answer": "#### 3"}
          for i, (wording, letter) in enumerate(
              (w, l) for w in ("Solve for", "Find") for l in "xyzkm" for _ in range(3))]
  path = write_jsonl(tmp_path / "p.jsonl", rows)
  plain = data.build_splits(_data_settings(path, num_heldout=4), CharTokenizer(), 10_000)
  key = lambda p: data.problem_key(p, "equation")
  assert {key(p) for p in plain.heldout} & {key(p) for p in plain.train}  # the leak it closes
  unseen = data.build_splits(_data_settings(path, num_heldout=4, heldout_unseen_by="equation"),
                             CharTokenizer(), 10_000)
  heldout_keys = [key(p) for p in unseen.heldout]
  assert len(heldout_keys) == len(set(heldout_keys)) == 4
  assert not set(heldout_keys) & {key(p) for p in unseen.train}
  assert len(unseen.train) == 10  # the 2 other equations, 5 rows each
  with pytest.raises(errors.UserError, match="only 6 distinct problems.*data.num_heldout"):
    data.build_splits(_data_settings(path, num_heldout=7, heldout_unseen_by="equation"),
                      CharTokenizer(), 10_000)
