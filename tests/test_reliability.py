"""Bad input fails in one line; preemption, NaNs and damaged checkpoints are survived.

Cheap cases run `train.main` in-process (validation happens before any model
loads, which `no_model_loading` enforces); a few go through the CLI in a
subprocess to check the exit code and that stderr holds no traceback. The
expensive end-to-end runs (SIGTERM and resume, NaN, damaged checkpoint) share
module-scoped fixtures.
"""

import json
import math
import pathlib
import shutil
import signal
import socket
import time

import numpy as np
import pytest

from conftest import LEARNING, REPO, run_cli, run_python, start_cli
from gemma_grpo.runtime import checkpoints
from gemma_grpo.runtime import endings
from gemma_grpo import errors
from gemma_grpo.config import settings
from gemma_grpo.runtime import metrics
from gemma_grpo.commands import train
from gemma_grpo.runtime import workdir_lock

TINY = ["--config", "configs/tiny.py"]


# --- bad input: one line, exit code 2, before any model loads ------------------


def write(path: pathlib.Path, text: str) -> str:
  path.write_text(text)
  return str(path)


def write_bytes(path: pathlib.Path, data: bytes) -> str:
  path.write_bytes(data)
  return str(path)


def gsm8k_line(question="Tom has 3 apples and buys 4 more. How many?", answer="3 + 4 = 7\n#### 7"):
  return json.dumps({"question": question, "answer": answer})


def config_file(tmp_path, body: str) -> str:
  return write(tmp_path / "my_config.py", "from configs import tiny\n\n\ndef get_config():\n"
               "  c = tiny.get_config()\n" + body + "  return c\n")


def model_dir_without_weights(tmp_path) -> str:
  (tmp_path / "m").mkdir()
  write(tmp_path / "m" / "config.json", "{}")
  return str(tmp_path / "m")


def workdir_of(tiny_run, tmp_path, change=None) -> str:
  workdir = tmp_path / "run"
  shutil.copytree(tiny_run, workdir)
  if change:
    change(workdir)
  return str(workdir)


def garble_every_step(workdir):
  for step in checkpoints.saved_steps(workdir):
    (checkpoints.actor_dir(workdir) / str(step) / "model_params" / "_METADATA").write_text("{")


# (id, argv builder (tmp_path, tiny_run) -> args after `train`, expected first error line)
BAD_INPUTS = [
    # config values and cross-field rules
    ("one_generation", lambda t, r: ["--config.grpo.num_generations=1"],
     "error: grpo.num_generations=1: GRPO needs >= 2 completions per prompt"),
    ("micro_batch_not_dividing", lambda t, r: ["--config.train.micro_batch_size=3"],
     "error: train.micro_batch_size=3: must divide the update's 2 prompts"),
    ("kv_cache_too_small", lambda t, r: ["--config.rollout.kv_cache_size=100"],
     "error: rollout.kv_cache_size=100: must hold max_prompt_length + max_new_tokens = 208; set --config.rollout.kv_cache_size=208"),
    ("mesh_not_filling_devices", lambda t, r: ["--config.mesh.fsdp=3"],
     "error: mesh.fsdp=3 x mesh.tp=1 does not fill the 8 available devices"),
    ("lora_targets_match_nothing", lambda t, r: ["--config.lora.targets=embedder"],
     "error: lora.targets='embedder' matches no module"),
    ("warmup_not_before_max_steps", lambda t, r: ["--config.optim.warmup_fraction=1.0"],
     "error: optim.warmup_fraction=1.0: warmup must end before train.max_steps"),
    ("zero_steps", lambda t, r: ["--config.train.max_steps=0"], "error: train.max_steps=0: must be >= 1"),
    ("end_lr_above_peak", lambda t, r: ["--config.optim.end_lr=1.0"],
     "error: optim.end_lr=1.0: must be in [0, optim.peak_lr=0.001]"),
    ("vocab_smaller_than_tokenizer", lambda t, r: ["--config.model.random.vocab_size=1000"],
     "error: model.random.vocab_size=1000: must be >= 262144"),
    ("kv_heads_not_dividing_heads", lambda t, r: ["--config.model.random.num_kv_heads=3"],
     "error: model.random.num_kv_heads=3: must divide model.random.num_heads=4"),
    # overrides
    ("unknown_key", lambda t, r: ["--config.grpo.nope=1"], "error: --config.grpo.nope: unknown key 'nope'"),
    ("unknown_section", lambda t, r: ["--config.trian.max_steps=1"], "error: --config.trian.max_steps: config has no section 'trian'"),
    ("wrong_type", lambda t, r: ["--config.train.max_steps=ten"], "error: --config.train.max_steps=ten: expected a int"),
    ("missing_value", lambda t, r: ["--config.train.batch_size"], "error: --config.train.batch_size: missing value"),
    # config files
    ("missing_config_file", lambda t, r: ["--config", "configs/nope.py"], "error: --config: no such file 'configs/nope.py'"),
    ("config_typo", lambda t, r: ["--config", config_file(t, "  c.grpo.betta = 0.1\n")],
     'my_config.py:6: AttributeError: Key "betta" does not exist and cannot be added since the config is locked; Did you mean "beta"'),
    ("config_syntax_error", lambda t, r: ["--config", config_file(t, "  c.grpo.beta = = 1\n")],
     "my_config.py:6: SyntaxError: invalid syntax"),
    ("config_wrong_type", lambda t, r: ["--config", config_file(t, "  c.train.max_steps = 'many'\n")],
     "my_config.py:6: TypeError: Could not override field 'max_steps'"),
    ("config_nan", lambda t, r: ["--config", config_file(t, "  c.optim.peak_lr = float('nan')\n")],
     "error: optim.peak_lr=nan: must be a finite number"),
    ("config_bool_for_int", lambda t, r: ["--config", config_file(t, "  c.train.max_steps = True\n")],
     "error: train.max_steps=True: needs an int, not a bool"),
    # data
    ("missing_data_file", lambda t, r: ["--config.data.source=/no/such/file.jsonl"],
     "error: data.source='/no/such/file.jsonl': no such file"),
    ("data_is_a_directory", lambda t, r: [f"--config.data.source={t}"], "is a directory; pass a GSM8K-format"),
    ("malformed_jsonl_line", lambda t, r: [
        "--config.data.source=" + write(t / "d.jsonl", "\n".join([gsm8k_line(), gsm8k_line(), "{oops"]))],
     "d.jsonl:3: malformed JSON"),
    ("jsonl_missing_answer", lambda t, r: [
        "--config.data.source=" + write(t / "d.jsonl", gsm8k_line() + '\n{"question": "q"}\n')],
     "d.jsonl:2: missing string field(s) ['answer']"),
    ("jsonl_answer_without_marker", lambda t, r: [
        "--config.data.source=" + write(t / "d.jsonl", gsm8k_line(answer="it is 7"))],
     "d.jsonl:1: answer 'it is 7': no '####' before the final answer"),
    ("empty_data_file", lambda t, r: ["--config.data.source=" + write(t / "d.jsonl", "\n\n")],
     "error: data.source="),
    ("data_not_utf8", lambda t, r: ["--config.data.source=" + write_bytes(t / "d.jsonl", b"\xff\xfe{}\n")],
     "d.jsonl:1: not UTF-8 text"),
    ("parquet_not_parquet", lambda t, r: ["--config.data.source=" + write(t / "d.parquet", "not parquet")],
     "d.parquet: cannot read as GSM8K parquet"),
    # model sources
    ("unknown_offline_model", lambda t, r: ["--config.model.source=gguf:gemma-3-1b"],
     "error: model.source='gguf:gemma-3-1b': unknown offline model; the offline model is gguf:gemma-3-270m"),
    ("missing_model_dir", lambda t, r: ["--config.model.source=/no/such/model"],
     "error: model.source='/no/such/model': no such directory"),
    ("bad_hub_id", lambda t, r: ["--config.model.source=hf:gemma 3"], "error: model.source='hf:gemma 3': not a hub repo id"),
    ("model_dir_without_weights", lambda t, r: ["--config.model.source=" + model_dir_without_weights(t)],
     "needs config.json and *.safetensors"),
    # work directories and checkpoints
    ("workdir_is_a_file", lambda t, r: ["--workdir", write(t / "f", "")], "exists and is not a directory"),
    ("resume_with_other_lora_rank", lambda t, r: ["--workdir", workdir_of(r, t), "--config.lora.rank=8"],
     "holds checkpoints of a different run (lora.rank: 4 there, 8 here); use a new --workdir or resume with --config.lora.rank=4"),
    ("resume_with_other_algorithm", lambda t, r: ["--workdir", workdir_of(r, t), "--config.grpo.algorithm=dapo",
                                                  "--config.grpo.beta=0"],
     "grpo.algorithm: 'grpo' there, 'dapo' here"),
    ("resume_other_model_no_run_json", lambda t, r: [
        "--workdir", workdir_of(r, t, lambda w: (pathlib.Path(w) / "run.json").unlink()),
        "--config.model.random.num_layers=3"],
     "model.random.num_layers: 2 there, 3 here"),
    ("every_checkpoint_unreadable", lambda t, r: ["--workdir", workdir_of(r, t, garble_every_step)],
     "no checkpoint can be read (step 2: JSONDecodeError"),
    ("damaged_run_json", lambda t, r: [
        "--workdir", workdir_of(r, t, lambda w: (pathlib.Path(w) / "run.json").write_text("{"))],
     "run.json: not valid JSON"),
]


@pytest.fixture
def no_model_loading(monkeypatch):
  """Fails a test that gets as far as loading a model: checks must come first."""
  from gemma_grpo.model import model_loading  # pylint: disable=g-import-not-at-top

  def refuse(*args, **kwargs):
    raise AssertionError("input was not rejected before loading the model")
  monkeypatch.setattr(model_loading, "build", refuse)


@pytest.mark.parametrize("name, build, expected", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_one_line_and_exit_2(request, tmp_path, capsys, no_model_loading, name, build, expected):
  del no_model_loading
  tiny_run = request.getfixturevalue("tiny_run") if name.startswith(("resume", "every", "damaged")) else None
  args = build(tmp_path, tiny_run)
  argv = ([] if args[0] == "--config" else TINY) + args
  if "--workdir" not in args:
    argv += ["--workdir", str(tmp_path / "w")]
  with pytest.raises(SystemExit) as exit_info:
    train.main(argv)
  err = capsys.readouterr().err
  assert exit_info.value.code == errors.EXIT_BAD_INPUT, err
  lines = [line for line in err.splitlines() if line.startswith("error: ")]
  assert lines, err
  assert any(expected in line for line in lines), err


@pytest.mark.parametrize("args, expected", [
    (["--config.grpo.num_generations=1", "--config.rollout.kv_cache_size=100"], 2),
])
def test_every_problem_is_reported_at_once(tmp_path, capsys, args, expected):
  with pytest.raises(SystemExit):
    train.main(TINY + ["--workdir", str(tmp_path / "w")] + args)
  assert len([line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]) == expected


@pytest.mark.parametrize("args, expected", [
    (["--config.model.source=gguf:gemma-3-1b"], "error: model.source='gguf:gemma-3-1b': unknown offline model"),
    (["--config.train.micro_batch_size=3"], "error: train.micro_batch_size=3"),
])
def test_cli_bad_input_exits_2_fast_without_traceback(tmp_path, args, expected):
  proc = run_cli(["train", *TINY, "--workdir", str(tmp_path / "w"), *args], check=False, timeout=120)
  assert proc.returncode == 2, proc.stderr
  assert proc.stderr.splitlines()[0].startswith(expected), proc.stderr
  assert "Traceback" not in proc.stderr
  assert not (tmp_path / "w").exists()  # nothing was started


def test_cli_malformed_data_names_the_line(tmp_path):
  data = write(tmp_path / "d.jsonl", "\n".join([gsm8k_line(), "[1, 2", gsm8k_line()]))
  proc = run_cli(["train", *TINY, "--workdir", str(tmp_path / "w"), f"--config.data.source={data}"],
                 check=False, timeout=120)
  assert proc.returncode == 2, proc.stderr
  # The first error line; with the plan extra installed, the CUDA plugin's absl
  # start-up notice may come before it.
  errors_ = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert errors_ and errors_[0].startswith(f"error: {data}:2: malformed JSON"), proc.stderr
  assert "Traceback" not in proc.stderr


def test_cli_resume_with_another_rank_is_refused(tiny_run, tmp_path):
  workdir = workdir_of(tiny_run, tmp_path)
  before = (pathlib.Path(workdir) / "config.json").read_text()
  proc = run_cli(["train", *TINY, "--workdir", workdir, "--config.lora.rank=8"], check=False, timeout=120)
  assert proc.returncode == 2, proc.stderr
  assert "use a new --workdir or resume with --config.lora.rank=4" in proc.stderr
  assert "Traceback" not in proc.stderr
  assert (pathlib.Path(workdir) / "config.json").read_text() == before  # not overwritten


# --- model sources that fail on the hub (in-process, no network needed) ----------


def hub_error(kind):
  import httpx  # pylint: disable=g-import-not-at-top
  from huggingface_hub import errors as hub_errors  # pylint: disable=g-import-not-at-top

  response = httpx.Response(403 if kind == "gated" else 404,
                            request=httpx.Request("GET", "https://huggingface.co/x"))
  if kind == "gated":
    return hub_errors.GatedRepoError("gated", response=response)
  if kind == "missing":
    return hub_errors.RepositoryNotFoundError("missing", response=response)
  return hub_errors.LocalEntryNotFoundError("offline")


@pytest.mark.parametrize("kind, token, expected", [
    ("gated", None, "google/gemma-3-1b-it is gated; accept its licence at"
     " https://huggingface.co/google/gemma-3-1b-it and set HF_TOKEN (or run `hf auth login`)"),
    ("gated", "hf_sentinel_token", "with the account of the token in HF_TOKEN, which has no access yet"),
    ("missing", None, "hub repo 'google/gemma-3-1b-it' not found"),
    ("offline", None, "cannot download google/gemma-3-1b-it from the Hugging Face hub (LocalEntryNotFoundError)"),
])
def test_hub_failures_are_user_errors(monkeypatch, tmp_path, kind, token, expected):
  import huggingface_hub  # pylint: disable=g-import-not-at-top
  from configs import base  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import model_loading  # pylint: disable=g-import-not-at-top

  from gemma_grpo.runtime import hub  # pylint: disable=g-import-not-at-top

  def fail(*args, **kwargs):
    raise hub_error(kind)
  monkeypatch.setattr(huggingface_hub, "snapshot_download", fail)
  # The hub answers (with these errors) whether or not this machine has a
  # network; the unreachable case is tests/test_hub.py's.
  monkeypatch.setattr(hub, "reachable", lambda *args, **kwargs: True)
  if token:
    monkeypatch.setenv("HF_TOKEN", token)
  else:
    monkeypatch.delenv("HF_TOKEN", raising=False)
  c = base.get_config()
  c.model.source, c.model.cache_dir = "hf:google/gemma-3-1b-it", str(tmp_path)
  with pytest.raises(errors.UserError) as e:
    model_loading.resolve_dir(settings.from_config(c).model)
  assert expected in str(e.value) and "\n" not in str(e.value)
  if token:
    assert token not in str(e.value)


@pytest.mark.parametrize("max_prompt_length, num_heldout, expected", [
    (8, 0, "rollout.max_prompt_length=8: every prompt is longer"),
    (192, 64, "data: no training problems left after holding out 64"),
])
def test_nothing_left_to_train_on_is_a_user_error(max_prompt_length, num_heldout, expected):
  from gemma_grpo import config as config_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo.tasks import data as data_lib  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import model_loading  # pylint: disable=g-import-not-at-top
  from gemma_grpo.model import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top

  c = config_lib.load("configs/tiny.py")
  c.data.num_heldout = num_heldout
  c = settings.from_config(c)
  tokenizer = tokenizer_lib.load(model_loading.offline_270m_dir(c.model))
  with pytest.raises(errors.UserError, match=expected):
    data_lib.build_splits(c.data, tokenizer, max_prompt_length)


# --- end to end: preemption and exact resume (and no secret on disk) ------------


SENTINEL = "hf_SENTINELtoken0123456789"
RUN_ARGS = [*TINY, *LEARNING, "--config.train.max_steps=4", "--config.ckpt.every_steps=100"]
# What each step computes (LEARNING makes the adapters really move, so the
# losses, KL and gradient norms differ from step to step). Not compared: perf/
# timings; the optimizer state is checked through the final parameters.
COMPARED_PREFIXES = ("rewards/", "completions/", "diagnostics/", "actor/train/loss",
                     "actor/train/kl", "actor/train/grad_norm", "actor/train/entropy",
                     "actor/train/learning_rate")


def start(args, workdir: pathlib.Path, env=None):
  """`gemma-grpo train ARGS --workdir WORKDIR` in the background (conftest.start_cli)."""
  workdir.parent.mkdir(parents=True, exist_ok=True)
  return start_cli(["train", *args, "--workdir", str(workdir)], env=env,
                   out_path=workdir.parent / f"{workdir.name}.out",
                   err_path=workdir.parent / f"{workdir.name}.err")


def outputs(workdir: pathlib.Path) -> tuple[str, str]:
  return ((workdir.parent / f"{workdir.name}.out").read_text(),
          (workdir.parent / f"{workdir.name}.err").read_text())


def logged_steps(workdir: pathlib.Path) -> list[int]:
  path = workdir / "tensorboard" / "metrics.jsonl"
  return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def preempted(tmp_path_factory):
  """A 4-step run, and the same run stopped by SIGTERM after step 2 then resumed.

  Both start together (2 CPU cores: the compile phases overlap).
  """
  root = tmp_path_factory.mktemp("preempted")
  reference, resumed = root / "reference", root / "resumed"
  ref_proc = start(RUN_ARGS, reference, env={"HF_TOKEN": SENTINEL})
  proc = start(RUN_ARGS, resumed)
  # A second trainer on the same directory while the first one loads.
  lock = resumed / workdir_lock.LOCK_NAME
  deadline = time.time() + 120
  while not lock.exists() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.1)
  intruder = run_cli(["train", *RUN_ARGS, "--workdir", str(resumed)], check=False, timeout=300)
  # Step k's row is written at the end of step k + 1: once row 1 is there, step
  # 2 is done and step 3 may have started. The stop lands after step 2 or 3.
  deadline = time.time() + 600
  while 1 not in logged_steps(resumed) and proc.poll() is None and time.time() < deadline:
    time.sleep(0.2)
  proc.send_signal(signal.SIGTERM)
  stop_code = proc.wait(timeout=300)
  stop_out, stop_err = outputs(resumed)
  stopped_steps = checkpoints.saved_steps(resumed)
  stopped_rows = logged_steps(resumed)
  resume = run_cli(["train", *RUN_ARGS, "--workdir", str(resumed)], check=False, timeout=600)
  ref_code = ref_proc.wait(timeout=600)
  ref_out, ref_err = outputs(reference)
  return dict(
      reference=reference, resumed=resumed, ref_code=ref_code, ref_out=ref_out, ref_err=ref_err,
      stop_code=stop_code, stop_out=stop_out, stop_err=stop_err, stopped_steps=stopped_steps,
      stopped_rows=stopped_rows, resume=resume, intruder=intruder, first_pid=proc.pid,
      lock_after_stop=lock.exists(),
  )


@pytest.mark.slow
def test_sigterm_checkpoints_and_exits_143(preempted):
  assert preempted["stop_code"] == 128 + signal.SIGTERM, preempted["stop_err"][-3000:]
  (step,) = preempted["stopped_steps"]  # ckpt.every_steps=100: only the stop saved one
  assert 2 <= step < 4
  assert f"SIGTERM: stopped after step {step}; checkpoint step {step} saved in" in preempted["stop_err"]
  assert "Traceback" not in preempted["stop_err"]
  assert preempted["stopped_rows"] == list(range(1, step + 1))  # every finished step logged
  assert checkpoints.problem(preempted["resumed"], step) is None  # whole, not mid-write
  assert not list(checkpoints.actor_dir(preempted["resumed"]).glob("*tmp*"))


@pytest.mark.slow
def test_a_second_trainer_on_a_live_workdir_is_refused_in_one_line(preempted):
  intruder = preempted["intruder"]
  assert intruder.returncode == 2, intruder.stderr[-3000:]
  [line] = [line for line in intruder.stderr.splitlines() if line.startswith("error:")]
  assert (f"error: --workdir {preempted['resumed']} is in use by another trainer:"
          f" pid {preempted['first_pid']} on host {socket.gethostname()}, since ") in line
  assert "Traceback" not in intruder.stderr
  # The first trainer was not disturbed, and released the lease when it stopped.
  assert preempted["stop_code"] == 128 + signal.SIGTERM
  assert not preempted["lock_after_stop"]


@pytest.mark.slow
def test_rerun_resumes_to_the_end(preempted):
  resume = preempted["resume"]
  assert resume.returncode == 0, resume.stderr[-3000:]
  assert f"Resuming from step {preempted['stopped_steps'][0]}" in resume.stderr
  assert checkpoints.saved_steps(preempted["resumed"])[-1] == 4
  assert preempted["ref_code"] == 0, preempted["ref_err"][-3000:]


@pytest.mark.slow
def test_resumed_run_matches_the_uninterrupted_one_step_for_step(preempted):
  # Same program, same device count, same inputs, keys and restored state:
  # CPU XLA is deterministic, and the numbers agree to the last bit (measured).
  # rel=1e-6 only leaves room for a different XLA build or thread count
  # reassociating a reduction; a real fault (wrong data offset, sampling key
  # or optimizer state) changes completions, KL and parameters far beyond it.
  reference = metrics.read_jsonl(preempted["reference"] / "tensorboard" / "metrics.jsonl")
  resumed = metrics.read_jsonl(preempted["resumed"] / "tensorboard" / "metrics.jsonl")
  assert [r["step"] for r in reference] == [r["step"] for r in resumed] == [1, 2, 3, 4]
  for ref_row, row in zip(reference, resumed):
    keys = sorted(k for k in ref_row if k.startswith(COMPARED_PREFIXES))
    assert keys and keys == sorted(k for k in row if k.startswith(COMPARED_PREFIXES))
    for key in keys:
      assert row[key] == pytest.approx(ref_row[key], rel=1e-6, abs=1e-9), (row["step"], key)
  final_ref = checkpoints.read(preempted["reference"], 4).params
  final = checkpoints.read(preempted["resumed"], 4).params
  for name in final_ref:
    np.testing.assert_allclose(final[name], final_ref[name], rtol=1e-6, atol=1e-9, err_msg=name)


@pytest.mark.slow
def test_the_hub_token_is_nowhere_in_the_workdir_or_output(preempted):
  assert preempted["ref_code"] == 0
  for text in (preempted["ref_out"], preempted["ref_err"]):
    assert SENTINEL not in text
  files = [p for p in preempted["reference"].rglob("*") if p.is_file()]
  assert any(p.name == "config.json" for p in files) and any(p.name == "run.json" for p in files)
  for path in files:
    assert SENTINEL.encode() not in path.read_bytes(), path


# --- end to end: a damaged latest checkpoint, then a NaN reward ------------------

NAN_RUNNER = """
import math, sys
from gemma_grpo.tasks import rewards
from gemma_grpo.commands import train

build = rewards.build_reward_fns
calls = []

def nan_on_second_call(prompts, completions, **kwargs):
  calls.append(1)
  return [math.nan if len(calls) == 2 else 0.0] * len(completions)

rewards.build_reward_fns = lambda *a, **k: build(*a, **k) + [nan_on_second_call]
sys.exit(train.main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def damaged_then_nan(tiny_run, tmp_path_factory):
  """tiny_run with step 2 truncated, resumed to step 4 with a reward that
  returns NaN on its second call: step 2 is redone from step 1, step 3 stops."""
  workdir = tmp_path_factory.mktemp("damaged") / "run"
  shutil.copytree(tiny_run, workdir)
  step2 = checkpoints.actor_dir(workdir) / "2"
  chunks = [p for p in (step2 / "model_params").rglob("*") if p.is_file() and p.parent.name == "d"]
  biggest = max(chunks, key=lambda p: p.stat().st_size)
  biggest.write_bytes(biggest.read_bytes()[:100])
  files = sorted(str(p.relative_to(step2)) for p in step2.rglob("*"))
  args = [*TINY, "--workdir", str(workdir), "--config.train.max_steps=4",
          "--config.optim.peak_lr=0.05"]
  proc = run_python(f"import sys\nsys.argv[1:] = {args!r}\n{NAN_RUNNER}", cwd=REPO, check=False)
  return dict(workdir=workdir, proc=proc, damaged_files=files)


@pytest.mark.slow
def test_damaged_latest_checkpoint_is_set_aside_and_the_previous_used(damaged_then_nan):
  proc, workdir = damaged_then_nan["proc"], damaged_then_nan["workdir"]
  actor = checkpoints.actor_dir(workdir)
  assert "Checkpoint step 2 is unreadable (ValueError: OUT_OF_RANGE" in proc.stderr, proc.stderr[-3000:]
  assert f"moved it to {actor / '2.corrupt'} and resuming from step 1" in proc.stderr
  assert "Resuming from step 1" in proc.stderr
  kept = sorted(str(p.relative_to(actor / "2.corrupt")) for p in (actor / "2.corrupt").rglob("*"))
  assert kept == damaged_then_nan["damaged_files"]  # user data kept as it was


@pytest.mark.slow
def test_nan_reward_stops_naming_the_step_and_keeps_the_last_good_checkpoint(damaged_then_nan):
  proc, workdir = damaged_then_nan["proc"], damaged_then_nan["workdir"]
  assert proc.returncode == endings.EXIT_NONFINITE, proc.stderr[-3000:]
  error_lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
  assert error_lines == [
      "error: step 3: reward function nan_on_second_call returned nan for completion 0 (4 of 4"
      " non-finite); rewards must be finite floats; training stopped; the last good checkpoint,"
      f" step 2, is kept in {checkpoints.actor_dir(workdir)}"
  ]
  assert "Traceback" not in proc.stderr
  assert checkpoints.saved_steps(workdir) == [1, 2]  # step 3 never written
  assert checkpoints.problem(workdir, 2) is None
  good = checkpoints.read(workdir, 2)
  assert good.custom_metadata["global_step"] == 2
  step1 = checkpoints.read(workdir, 1).params
  assert any(not np.array_equal(good.params[k], step1[k]) for k in step1)  # step 2 really trained
  assert all(math.isfinite(float(np.abs(v).max())) for v in good.params.values())
