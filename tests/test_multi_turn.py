"""Tool calls inside completions: the pause test, the host's turns, and the engine resuming."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tunix.generate import tokenizer_adapter

from conftest import device_mesh, run_cli, start_processes, wait_all
from configs import tiny
from gemma_grpo.config import settings
from gemma_grpo.runtime import metrics
from gemma_grpo.model import model_loading
from gemma_grpo.rl.engine import multi_turn
from gemma_grpo.tasks import prompts
from gemma_grpo.rl.engine import rollout
from gemma_grpo.tasks import tools
from gemma_grpo.seam import jax_mesh
import scripted_model
import test_rollout

CLOSE = "</tool_call>"


@pytest.fixture(scope="module")
def tiny_model():
  mesh = device_mesh()
  actor, tokenizer, _ = test_rollout.build(mesh)
  return mesh, actor, tokenizer


def paused_after(texts, previous, token):
  """The decode loop's pause test (multi_turn.force_results) for `token` after `previous`."""
  ends = multi_turn.CallEnds.from_texts(texts)
  no_results_1x2 = jnp.full((1, 2), -1, jnp.int32)
  turns = (no_results_1x2, *(jnp.asarray(x) for x in dataclasses.astuple(ends)))
  token_1, from_tool_1, paused_1 = multi_turn.force_results(
      turns, 1, jnp.asarray([token]), jnp.asarray([[previous, 0]]), jnp.asarray([False]))
  assert int(token_1[0]) == token and not bool(from_tool_1[0])
  return bool(paused_1[0])


# (text of the previous token, text of the new one, pauses)
PAUSES = [
    ("x", "</tool_call>", True),  # the whole tag in one token
    ("call", ">", True),  # Gemma's split: '</', 'tool', '_', 'call', '>'
    ("_cal", "l>", True),
    ("call", "><", True),  # a merged '><' still closes
    ("answer", ">", False),  # '</answer>' never pauses
    ("reason", "ing>", False),
    ("x", "a > b", False),
    ("x", "call", False),  # no '>' at all
    ("will", ">", True),  # necessary, not sufficient: the host reads the text
]


@pytest.mark.parametrize("previous, token, pauses", PAUSES)
def test_the_loop_pauses_where_a_call_may_have_closed(previous, token, pauses):
  texts = ["", previous, token]
  assert paused_after(texts, 1, 2) == pauses


def test_a_tool_result_is_forced_into_live_rows_and_never_pauses():
  # Row 0 takes the result's token 7; row 1 samples ">" after "call" and may
  # have closed a call; row 2 has stopped, so its forced token is ignored.
  ends = multi_turn.CallEnds.from_texts(["", "call", ">", "", "", "", "", ">"])
  forced_BxT = jnp.asarray([[-1, 7], [-1, -1], [-1, 7]], jnp.int32)
  turns = (forced_BxT, *(jnp.asarray(x) for x in dataclasses.astuple(ends)))
  tokens_BxT = jnp.asarray([[1, 0], [1, 0], [1, 0]], jnp.int32)
  token_B, from_tool_B, paused_B = multi_turn.force_results(
      turns, 1, jnp.asarray([2, 2, 2]), tokens_BxT, jnp.asarray([False, False, True]))
  assert token_B.tolist() == [7, 2, 2]
  assert from_tool_B.tolist() == [True, False, False]
  assert paused_B.tolist() == [False, True, False]


def test_every_way_gemmas_tokenizer_writes_a_closing_tag_pauses(tiny_model):
  """Whatever the text before it, the token that completes "</tool_call>" pauses."""
  tok = tiny_model[2]
  texts = [tok.decode([i]) for i in range(262144)]
  for before in ("", "x", " 42", "7)", "<tool_call>calculator: 2 * 3", "=> "):
    ids = tok.encode(before + CLOSE + "\n", add_bos=False)
    at = next(i for i in range(len(ids)) if CLOSE in tok.decode(ids[:i + 1]))
    assert at > 0 and paused_after(texts, ids[at - 1], ids[at]), [texts[i] for i in ids]


class CharTokenizer:
  """One token per character (id = code point); id 0 pads, 1 ends."""

  def decode(self, ids):
    return "".join(chr(i) for i in ids)

  def encode(self, text):
    return [2] + [ord(ch) for ch in text]  # a <bos> the turns must drop


def turns_with(runner=None, max_calls=2, width=160):
  runner = runner or tools.ToolRunner(tools.BUILTIN_TOOLS)
  tok = CharTokenizer()
  return multi_turn.ToolTurns(runner, tok.decode, tok.encode, max_calls=max_calls, rows=2,
                              width=width, banned_ids=[0, 1, 2])


def written(text, width=160):
  """[2, width] tokens: row 0 holds `text`, row 1 a plain sentence."""
  tokens = np.zeros((2, width), np.int64)
  tokens[0, :len(text)] = [ord(ch) for ch in text]
  tokens[1, :5] = [ord(ch) for ch in "hello"]
  return tokens


def test_a_complete_call_is_run_and_its_result_fills_the_next_slots():
  turns = turns_with()
  text = "<tool_call>calculator: 4821 * 367</tool_call>"
  turns.resume(written(text), len(text), np.array([True, True]))
  result = "<tool_result>1769307</tool_result>"
  want = [ord(ch) for ch in result]  # <bos> dropped
  np.testing.assert_array_equal(turns.forced_BxT[0, len(text):len(text) + len(result)], want)
  assert (turns.forced_BxT[0, :len(text)] == -1).all()
  assert (turns.forced_BxT[0, len(text) + len(result):] == -1).all()
  assert (turns.forced_BxT[1] == -1).all()  # paused, but wrote no call
  rows = turns.rows([len(text) + len(result) + 3, 5])
  assert rows[0].calls == (tools.ToolCall("calculator", "4821 * 367", "1769307", True),)
  np.testing.assert_array_equal(
      rows[0].tool_mask, [False] * len(text) + [True] * len(result) + [False] * 3)
  assert rows[1].calls == () and not rows[1].tool_mask.any()


def test_a_pause_without_a_complete_call_changes_nothing():
  turns = turns_with()
  for text in ("I will>", "<tool_call>calculator: 2 * 3", "</answer>"):
    turns.resume(written(text), len(text), np.array([True, False]))
  assert (turns.forced_BxT == -1).all()
  assert turns.rows([10, 5])[0].calls == ()


def test_a_later_call_reads_only_the_text_after_the_last_result():
  turns = turns_with()
  first = "<tool_call>calculator: 2 * 3</tool_call>"
  turns.resume(written(first), len(first), np.array([True, False]))
  result = "<tool_result>6</tool_result>"
  # The first call's text must not be found again at the next pause.
  text = first + result + " so>"
  turns.resume(written(text), len(text), np.array([True, False]))
  assert len(turns.rows([len(text), 5])[0].calls) == 1
  text += "<tool_call>calculator: 6 + 1</tool_call>"
  turns.resume(written(text), len(text), np.array([True, False]))
  calls = turns.rows([len(text), 5])[0].calls
  assert [c.result for c in calls] == ["6", "7"]


def test_calls_beyond_the_limit_get_an_error_result_and_are_not_run():
  ran = []

  def echo(arguments):
    ran.append(arguments)
    return arguments

  turns = turns_with(tools.ToolRunner({"echo": echo}), max_calls=1, width=200)
  text = ""
  for word in ("a", "b"):
    text += f"<tool_call>echo: {word}</tool_call>"
    turns.resume(written(text, 200), len(text), np.array([True, False]))
    text += "".join(chr(i) for i in turns.forced_BxT[0, len(text):] if i >= 0)
  calls = turns.rows([len(text), 5])[0].calls
  assert ran == ["a"]
  assert [c.ok for c in calls] == [True, False]
  assert calls[1].result.startswith("error: no tool calls left")
  assert turns.rows([len(text), 5])[0].failed_calls == 1


def test_a_result_is_cut_at_the_completion_budget():
  turns = turns_with(width=50)
  text = "<tool_call>calculator: 4821 * 367</tool_call>"
  turns.resume(written(text, 50), len(text), np.array([True, False]))
  assert (turns.forced_BxT[0, len(text):] >= 0).all()  # filled to the last slot


# --- The engine: pausing, resuming and reading results, on a tiny random Gemma-3 ---

MAX_NEW = 24
DISTINCT = [prompts.render_prompt(q) for q in test_rollout.QUESTIONS]


class ScriptedTokenizer(tokenizer_adapter.TokenizerAdapter):
  """Gemma's tokenizer, except that one exact row prefix reads as a calculator call."""

  def __init__(self, tokenizer, prefix):
    super().__init__(tokenizer)
    self.prefix = list(prefix)

  def decode(self, ids, **kwargs):
    if list(ids) == self.prefix:
      return "<tool_call>calculator: 6 * 7</tool_call>"
    return super().decode(ids, **kwargs)


def always_pause(cls, texts):
  vocab = len(texts)
  return cls(np.ones(vocab, bool), np.full(vocab, -1, np.int32), np.full(vocab, -1, np.int32))


def tool_engine(actor, prefix, stop_text=""):
  gemma_tokenizer = model_loading.build(settings.from_config(tiny.get_config()).model, device_mesh()).tokenizer
  return rollout.GroupedRollout(
      actor, ScriptedTokenizer(gemma_tokenizer, prefix), None, lora_scale=1.0,
      tool_runner=tools.ToolRunner(tools.BUILTIN_TOOLS), max_tool_calls=2, stop_text=stop_text)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_resumed_decoding_reads_the_result_as_a_single_forward_pass_would(
    tiny_model, monkeypatch, sampled):
  """Pausing at every step changes no row; the calling row gets the result at the
  next slots, masked; and the sampler's log-probs of every token the model wrote,
  those after the result included, are the trainer's over the whole sequence."""
  mesh, actor, tokenizer = tiny_model
  monkeypatch.setattr(multi_turn.CallEnds, "from_texts", classmethod(always_pause))
  settings = dict(max_tokens_to_generate=MAX_NEW, kv_cache_size=test_rollout.MAX_PROMPT + MAX_NEW)
  if sampled:
    settings.update(temperature=0.7, top_p=1.0, top_k=50, seed=jax.random.PRNGKey(3),
                    return_logprobs=True)
  plain = rollout.GroupedRollout(actor, tokenizer, None, lora_scale=1.0)
  with jax_mesh.tunix_mesh(mesh):
    before = plain.generate(DISTINCT, test_rollout.config(**settings))
  call_at = 3  # row 0's first three tokens read as a call
  engine = tool_engine(actor, before.tokens[0][:call_at])
  with jax_mesh.tunix_mesh(mesh):
    out = engine.generate(DISTINCT, test_rollout.config(**settings))
  turns = engine.take_tool_turns()
  assert engine.take_tool_turns() == []  # taken once

  result = [i for i in tokenizer.encode("<tool_result>42</tool_result>")
            if i != tokenizer.bos_id()]
  row = np.asarray(out.tokens[0])
  np.testing.assert_array_equal(row[:call_at], before.tokens[0][:call_at])
  np.testing.assert_array_equal(row[call_at:call_at + len(result)], result)
  assert len(row) == MAX_NEW
  want_mask = np.zeros(MAX_NEW, bool)
  want_mask[call_at:call_at + len(result)] = True
  np.testing.assert_array_equal(turns[0].tool_mask, want_mask)
  assert [c.result for c in turns[0].calls] == ["42"]
  for other in (1, 2):  # no call: as if never paused
    np.testing.assert_array_equal(out.tokens[other], before.tokens[other])
    assert turns[other].calls == () and not turns[other].tool_mask.any()
  assert "<tool_result>42</tool_result>" in out.text[0]

  if sampled:
    want_BxT = test_rollout.trainer_logps(actor, out, temperature=0.7)
    for r in range(3):
      written_by_model = ~turns[r].tool_mask
      np.testing.assert_allclose(np.asarray(out.logprobs[r])[written_by_model],
                                 want_BxT[r][written_by_model], atol=2e-4)
    # Tokens after the result, the ones that read it through the cache.
    assert written_by_model[call_at + len(result):].sum() > 0


def test_a_stop_text_in_a_tool_result_ends_the_row_where_the_learner_cuts_it(tiny_model,
                                                                           monkeypatch):
  # The learner cuts at the stop text wherever it is, a tool's result
  # included; the loop must end the row there too, and no other row.
  mesh, actor, tokenizer = tiny_model
  monkeypatch.setattr(multi_turn.CallEnds, "from_texts", classmethod(always_pause))
  settings = dict(max_tokens_to_generate=MAX_NEW, kv_cache_size=test_rollout.MAX_PROMPT + MAX_NEW)
  plain = rollout.GroupedRollout(actor, tokenizer, None, lora_scale=1.0)
  with jax_mesh.tunix_mesh(mesh):
    prefix = plain.generate(DISTINCT, test_rollout.config(**settings)).tokens[0][:3]
    free = tool_engine(actor, prefix).generate(DISTINCT, test_rollout.config(**settings))
    stopping = tool_engine(actor, prefix, stop_text="</tool_result>")
    out = stopping.generate(DISTINCT, test_rollout.config(**settings))
  want = [test_rollout.learner_cut(tokenizer, t.tolist(), "</tool_result>") for t in free.tokens]
  assert [t.tolist() for t in out.tokens] == want
  assert out.text[0].endswith("<tool_result>42</tool_result>") and len(want[0]) < MAX_NEW
  assert [len(w) for w in want[1:]] == [MAX_NEW, MAX_NEW]
  turns = stopping.take_tool_turns()
  assert [c.result for c in turns[0].calls] == ["42"] and turns[0].tool_mask[3:].all()


def test_an_engine_without_tools_takes_no_turns(tiny_model):
  mesh, actor, tokenizer = tiny_model
  engine = rollout.GroupedRollout(actor, tokenizer, None, lora_scale=1.0)
  with jax_mesh.tunix_mesh(mesh):
    engine.generate(DISTINCT, test_rollout.config())
  assert not engine.uses_tools and engine.take_tool_turns() == []


# --- From the command line, with a tiny model that calls the calculator -----------

# tests/scripted_model.py: the tiny model plus a planted script, so that each
# completion calls the calculator, well or not (sampled), then malformed calls.
TOOL_RUN = ["train", "--config", "configs/tiny.py", "--config.rollout.tools=calculator",
            "--config.rewards.weights.tool_errors=1.0", "--config.train.max_steps=1",
            "--config.train.batch_size=4", "--config.grpo.num_generations=4",
            # Rewards that tell the two calls' texts apart, so that groups have advantages.
            "--config.rewards.custom=tests.toy_rewards:vowel_share",
            "--config.rollout.max_new_tokens=48",
            "--config.rollout.kv_cache_size=240", "--config.eval.every_steps=1",
            "--config.eval.max_new_tokens=48", "--config.mesh.fsdp=2", "--config.mesh.tp=1"]


def _rows(workdir):
  return {row["step"]: row for row in metrics.read_jsonl(workdir / "tensorboard" / "metrics.jsonl")}


@pytest.fixture(scope="module")
def calling_model(tmp_path_factory):
  tokenizer_dir = model_loading.offline_270m_dir(settings.from_config(tiny.get_config()).model)
  return scripted_model.write(tmp_path_factory.mktemp("scripted") / "model", tokenizer_dir)


@pytest.fixture(scope="module")
def one_process_tool_run(calling_model, tmp_path_factory):
  """One step and its eval, one process with two devices (fsdp=2)."""
  workdir = tmp_path_factory.mktemp("one") / "run"
  run_cli([*TOOL_RUN, f"--config.model.source={calling_model}", "--workdir", str(workdir)],
          devices=2)
  return workdir


@pytest.mark.slow
def test_a_run_with_tools_trains_evaluates_and_reports_them(one_process_tool_run, tmp_path):
  row = _rows(one_process_tool_run)[1]
  assert row["tools/train/calls_per_completion"] > 1  # every row calls, most twice
  assert 0 < row["tools/train/failed_frac"] < 1  # good calls and failed ones
  assert row["diagnostics/train/zero_std_frac"] < 1  # some group has advantages
  assert row["rewards/train/tool_errors"] < 0
  assert row["eval/tool_use_rate"] > 0  # the in-training eval used the tool too
  run_cli(["eval", "--workdir", str(one_process_tool_run), "--num-test", "2",
           "--out", str(tmp_path / "eval")], devices=2)
  report = json.loads((tmp_path / "eval" / "eval.json").read_text())
  assert report["settings"]["decoding"]["tools"] == "calculator"  # evaluated as trained
  assert report["metrics"]["tool_calls_per_completion"] > 0
  samples = (tmp_path / "eval" / "samples.jsonl").read_text()
  assert "<tool_result>42</tool_result>" in samples or "<tool_result>error:" in samples


def test_a_tool_that_cannot_be_loaded_stops_train_in_one_line(tmp_path):
  proc = run_cli(["train", "--config", "configs/tiny.py", "--workdir", str(tmp_path / "run"),
                  "--config.rollout.tools=calculator,no_such_module_xyz:f"], check=False)
  assert proc.returncode == 2
  errors_ = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert len(errors_) == 1 and errors_[0].startswith("error: rollout.tools: "), proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  assert not (tmp_path / "run" / "checkpoints").exists()


# --- On a mesh of two processes -----------------------------------------------------


@pytest.mark.slow
def test_two_processes_call_the_tools_as_one_process_does(one_process_tool_run, calling_model,
                                                         tmp_path):
  """Each process runs the tool loop over its own rows; the step and its eval
  equal one process's with two devices: rewards, calls, lengths, the loss and
  its gradient's norm."""
  procs = start_processes([*TOOL_RUN, f"--config.model.source={calling_model}",
                           "--workdir", str(tmp_path / "two")], devices=1,
                          logdir=tmp_path / "logs")
  codes = wait_all(procs, timeout=900)
  assert codes == [0, 0], [(tmp_path / "logs" / f"p{r}.err").read_text()[-3000:] for r in (0, 1)]
  single, double = _rows(one_process_tool_run)[1], _rows(tmp_path / "two")[1]
  assert single["tools/train/calls_per_completion"] > 1
  assert single["diagnostics/train/zero_std_frac"] < 1
  for key in ("rewards/train/sum", "tools/train/calls_per_completion",
              "tools/train/failed_per_completion", "tools/train/turns_mean",
              "completions/train/mean_length", "eval/tool_use_rate"):
    assert double[key] == single[key], key
  assert single["actor/train/grad_norm"] > 0  # the advantages reached the weights
  for key in ("actor/train/loss", "actor/train/kl", "actor/train/grad_norm"):
    assert double[key] == pytest.approx(single[key], rel=1e-4, abs=1e-7), key
