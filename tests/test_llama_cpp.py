"""llama.cpp runs what we export: README's GGUF of the trained 270M, token for token.

The journey (tests/journey.py) trains the offline Gemma-3-270M with README's
first command, shortened, and exports it with README's export commands (a
float32 and a Q8_0 GGUF); here llama.cpp (node-llama-cpp's prebuilt CPU build,
tests/llama_cpp_runtime.py) loads them, tokenizes held-out prompts of the run
and completes them greedily. The reference is our own greedy decoding of the
same prompts: the engine `gemma-grpo eval` decodes with, on the run's restored
policy, in a process of its own that also writes the Q4_0 GGUF of the same
checkpoint. One llama.cpp process loads each file once. The BF16 file and 32
prompts are bench/llama_cpp.py's (docs/export.md): too slow for the suite.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from conftest import run_python
from gemma_grpo.model import gguf_reader
from gemma_grpo.tasks import answers
from gemma_grpo.tasks import prompts
import llama_cpp_runtime

# Held-out prompts, each completed to "</answer>" (about 40 tokens) or 64 tokens,
# by our engine and by llama.cpp on the F32 and Q8_0 files; the Q4_0 file
# completes the first PROMPTS_Q4_0. llama.cpp's decoding on 2 cores is the slow
# part (docs/results/llama_cpp has its speed).
NUM_PROMPTS = 3
PROMPTS_Q4_0 = 2
# README's exports (the journey's) and OURS's, side by side.
FILES = {"F32": "g270m.gguf", "Q8_0": "g270m-q8_0.gguf", "Q4_0": "g270m-q4_0.gguf"}
F32, Q8_0 = 0, 8  # GGML type ids, as llama.cpp reports a tensor's type
# One llama.cpp thread: the suite's other worker keeps the second core busy, and
# llama.cpp's threads wait for each other by spinning. On the 2-core Xeon under
# load, these completions took 27-40 s with 1 thread against 36-280 s with 2.
LLAMA_THREADS = 1

OURS = """
import json, pathlib
from gemma_grpo import api
from gemma_grpo.model import hf_export
from gemma_grpo.rl.eval import generation as eval_generation
from gemma_grpo.runtime import mesh as mesh_lib
from gemma_grpo.tasks import prompts

run = api.Run(pathlib.Path({workdir!r}))
policy = run.policy()
c = policy.settings
problems = api.heldout(policy, {num_prompts})
generator = eval_generation.Generator.from_settings(
    policy.actor, policy.loaded.tokenizer, mesh_lib.make_mesh(c.mesh), c.rollout, c.lora,
    max_new_tokens=c.eval.max_new_tokens)
out = generator.generate([p.prompt for p in problems],
                         eval_generation.Decoding(max_new_tokens=c.eval.max_new_tokens),
                         batch_size=c.eval.batch_size)
exported = pathlib.Path({exported!r})
hf_export.export_policy(policy, run.workdir, exported / {q4_0!r}, fmt="gguf", quant="q4_0")
# The first prompt as the chat messages it renders: instruction, solved turns, question.
first = problems[0]
messages = [{{"role": "system", "content": first.instruction}}]
for question, reasoning, answer in first.examples:
  messages += [{{"role": "user", "content": question}},
               {{"role": "assistant", "content": prompts.render_answer(reasoning, answer)}}]
messages.append({{"role": "user", "content": first.question}})
print(json.dumps({{
    "prompts": [p.prompt for p in problems],
    "prompt_ids": [policy.loaded.tokenizer.encode(p.prompt) for p in problems],
    "ids": out.token_ids, "texts": out.texts, "messages": messages,
    "max_new_tokens": c.eval.max_new_tokens, "stop_text": c.rollout.stop_text,
}}))
"""


def answers_of(completions: list[dict]) -> list[str | None]:
  return [answers.extract_answer(c["text"]) for c in completions]


def llama_cpp_or_fail(request: dict, **kwargs) -> dict:
  """llama.cpp's response, or the test fails on one line saying why (never a skip)."""
  try:
    return llama_cpp_runtime.run(request, **kwargs)
  except llama_cpp_runtime.Unavailable as e:
    pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="module")
def ours(journey) -> dict:
  """Our greedy completions of NUM_PROMPTS held-out prompts, and the Q4_0 GGUF."""
  code = OURS.format(
      workdir=str(journey.root / "runs" / "gemma3_270m"), num_prompts=NUM_PROMPTS,
      exported=str(journey.root / "exported"), q4_0=FILES["Q4_0"])
  proc = run_python(code, cwd=journey.root, timeout=900)
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def llama(journey, ours) -> dict[str, dict]:
  """llama.cpp's results per file ("F32", "Q8_0", "Q4_0"); the chat on F32's."""
  exported = journey.root / "exported"
  response = llama_cpp_or_fail({
      "models": [{"path": str(exported / name),
                  "prompts": PROMPTS_Q4_0 if kind == "Q4_0" else NUM_PROMPTS}
                 for kind, name in FILES.items()],
      "prompts": ours["prompts"], "maxTokens": ours["max_new_tokens"],
      "stopText": ours["stop_text"], "threads": LLAMA_THREADS, "chat": ours["messages"],
  })
  return dict(zip(FILES, response["models"]))


@pytest.mark.slow
def test_llama_cpp_tokenizes_the_held_out_prompts_as_we_do(llama, ours):
  for kind, model in llama.items():
    n = len(model["completions"])
    assert [c["promptTokens"] for c in model["completions"]] == ours["prompt_ids"][:n], kind


@pytest.mark.slow
def test_llama_cpp_completes_the_f32_export_token_for_token(llama, ours):
  completions = llama["F32"]["completions"]
  assert [c["ids"] for c in completions] == ours["ids"]
  # And it reads them back as the text `gemma-grpo eval` scores.
  assert [c["text"] for c in completions] == ours["texts"]
  assert all(c["stop"] == "stopText" for c in completions), [c["stop"] for c in completions]


# Q8_0 must keep most answers; Q4_0 (of a 270M model) is only reported. Answers
# are compared rather than tokens: a slip in one digit of an equation is a
# different answer, and the 32-prompt figures are in docs/export.md.
@pytest.mark.parametrize("kind, at_least", [("Q8_0", NUM_PROMPTS - 1), ("Q4_0", 0)])
def test_llama_cpp_runs_the_quantized_exports(llama, kind, at_least):
  model = llama[kind]
  assert model["fileType"] == {"Q8_0": 7, "Q4_0": 2}[kind]  # llama.cpp's LLAMA_FTYPE_MOSTLY_*
  types = model["tensorTypes"]
  assert types["token_embd.weight"] == Q8_0  # the tied output head, kept at 8 bits
  assert all(t == F32 for name, t in types.items() if name.endswith("norm.weight"))
  completions = model["completions"]
  n = len(completions)
  assert n and all(c["ids"] for c in completions)
  reference = answers_of(llama["F32"]["completions"])
  agree = sum(a == b for a, b in zip(answers_of(completions), reference))
  same = sum(c["ids"] == f["ids"] for c, f in zip(completions, llama["F32"]["completions"]))
  print(f"{kind} GGUF in llama.cpp: {agree}/{n} answers as the float32 GGUF's,"
        f" {same}/{n} completions token for token")
  assert agree >= at_least


@pytest.mark.slow
def test_the_gguf_carries_the_chat_template_and_stops_at_end_of_turn(journey, llama, ours):
  metadata = gguf_reader.read(journey.root / "exported" / FILES["F32"]).metadata
  assert metadata["tokenizer.chat_template"] == prompts.CHAT_TEMPLATE
  assert (metadata["tokenizer.ggml.eos_token_id"], metadata["tokenizer.ggml.eot_token_id"]) == (1, 106)
  assert metadata["tokenizer.ggml.tokens"][106] == "<end_of_turn>"
  model = llama["F32"]
  assert model["chatTemplate"] == prompts.CHAT_TEMPLATE
  # llama.cpp ends generation at <eos> and <end_of_turn>, never at <start_of_turn>.
  assert model["tokens"]["eot"] == 106 and model["eog"] == {"1": True, "105": False, "106": True}
  # The file's template renders the chat as the training prompt, token for token,
  # and ends the model's turn at <end_of_turn>.
  chat = model["chat"]
  assert chat["contextTokens"] == ours["prompt_ids"][0]
  assert [106, 107] in chat["stopTriggers"], chat["stopTriggers"]


def test_a_missing_llama_cpp_runtime_fails_in_one_line(tmp_path):
  with pytest.raises(pytest.fail.Exception) as failed:
    llama_cpp_or_fail({"models": []}, node_dir=tmp_path)
  message = str(failed.value)
  assert "\n" not in message and "npm ci --prefix tests/llama_cpp" in message, message


def test_a_llama_cpp_that_does_not_load_fails_in_one_line(tmp_path):
  package = tmp_path / "node_modules" / "node-llama-cpp"
  package.mkdir(parents=True)
  (package / "package.json").write_text(json.dumps({"name": "node-llama-cpp", "version": "0.0.0"}))
  (tmp_path / "llama_cpp.mjs").write_text(
      pathlib.Path(llama_cpp_runtime.SCRIPT).read_text())
  with pytest.raises(pytest.fail.Exception) as failed:
    llama_cpp_or_fail({"models": []}, node_dir=tmp_path)
  message = str(failed.value)
  assert "\n" not in message and message.startswith("llama.cpp: node llama_cpp.mjs exited 1"), message
