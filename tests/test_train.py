"""End to end on configs/tiny.py: train, log, checkpoint, resume."""

import json
import os
import re
import resource
import shutil
import struct
import subprocess
import sys

import pytest

from conftest import REPO
from conftest import run_cli
from conftest import run_python
from gemma_grpo.runtime import checkpoints
from gemma_grpo.commands import command
from gemma_grpo.runtime import metrics

REWARD_FUNCTIONS = ("format_exact", "format_approx", "answer_correct", "number_match")


def test_two_steps_write_events_metrics_config_and_checkpoints(tiny_run):
  assert checkpoints.saved_steps(tiny_run) == [1, 2]
  events = list((tiny_run / "tensorboard").glob("events.out.tfevents.*"))
  assert events
  rows = metrics.read_jsonl(tiny_run / "tensorboard" / "metrics.jsonl")
  assert [r["step"] for r in rows] == [1, 2]
  for row in rows:
    for name in REWARD_FUNCTIONS:
      assert f"rewards/train/{name}" in row
    for key in ("actor/train/loss", "actor/train/kl", "actor/train/grad_norm",
                "actor/train/learning_rate", "completions/train/mean_length",
                "perf/train/step_seconds"):
      assert key in row, key
  saved = json.loads((tiny_run / "config.json").read_text())
  assert saved["model"]["source"] == "random" and saved["train"]["max_steps"] == 2


def read_scalars(event_file) -> dict[str, list[int]]:
  """Steps per scalar tag of a TensorBoard event file (TFRecord of Events)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top

  steps = {}
  raw = event_file.read_bytes()
  offset = 0
  while offset < len(raw):
    length = struct.unpack("<Q", raw[offset:offset + 8])[0]
    record = raw[offset + 12:offset + 12 + length]  # skip length and its crc
    offset += 12 + length + 4  # and the data crc
    event = event_pb2.Event.FromString(record)
    for value in event.summary.value:
      steps.setdefault(value.tag, []).append(event.step)
  return steps


def test_tensorboard_events_hold_per_reward_scalars(tiny_run):
  (event_file,) = (tiny_run / "tensorboard").glob("events.out.tfevents.*")
  steps = read_scalars(event_file)
  assert {f"rewards/train/{n}" for n in REWARD_FUNCTIONS} <= set(steps)
  assert steps["rewards/train/sum"] == [1, 2]
  assert steps["actor/train/loss"] == [1, 2]


def test_tensorboard_itself_reads_every_scalar(tiny_run):
  """The viewer README points to (installed with the package) reads the run."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top

  events = event_accumulator.EventAccumulator(str(tiny_run / "tensorboard"))
  events.Reload()
  tags = set(events.Tags()["scalars"])
  rows = metrics.read_jsonl(tiny_run / "tensorboard" / "metrics.jsonl")
  assert {k for row in rows for k in row if k != "step"} <= tags
  assert [e.step for e in events.Scalars("rewards/train/sum")] == [1, 2]
  assert [e.value for e in events.Scalars("actor/train/loss")] == pytest.approx(
      [row["actor/train/loss"] for row in rows], rel=1e-6)


def test_start_up_phases_print_one_line_each_with_seconds(tiny_run):
  stderr = (tiny_run.parent / "stderr.txt").read_text()
  phases = ["model: random loaded", "LoRA: ", "data: ", "RL cluster: ",
            "step 1: the first step, compilation included"]
  lines = [next((line for line in stderr.splitlines() if p in line), "") for p in phases]
  for phase, line in zip(phases, lines):
    assert re.search(r"\(\d+\.\d s; \d+ s since start\)$", line), (phase, line)
  assert [stderr.index(line) for line in lines] == sorted(stderr.index(line) for line in lines)
  # Piped output: no progress bar (tqdm draws with carriage returns).
  stdout = (tiny_run.parent / "stdout.txt").read_text()
  assert "\r" not in stderr and "\r" not in stdout
  assert "step 2/2 |" in stdout
  assert stderr.count("the first step, compilation included") == 1


def test_rerun_resumes_and_continues_to_a_higher_max_steps(tiny_run, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(tiny_run, workdir)
  before = metrics.read_jsonl(workdir / "tensorboard" / "metrics.jsonl")
  proc = run_cli(["train", "--config", "configs/tiny.py", "--workdir", str(workdir),
                  "--config.optim.peak_lr=0.05", "--config.train.max_steps=3"])
  assert "Resuming from step 2" in proc.stderr
  assert checkpoints.saved_steps(workdir) == [1, 2, 3]
  rows = metrics.read_jsonl(workdir / "tensorboard" / "metrics.jsonl")
  assert [r["step"] for r in rows] == [1, 2, 3]
  assert rows[:2] == before  # the resumed run did not redo or relabel steps 1-2


def test_rerun_of_a_finished_run_does_nothing(tiny_run, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(tiny_run, workdir)
  proc = run_cli(["train", "--config", "configs/tiny.py", "--workdir", str(workdir)])
  assert "nothing to do" in proc.stderr
  assert "model: random loaded" not in proc.stderr  # known before the model loads
  assert checkpoints.saved_steps(workdir) == [1, 2]


def test_start_up_validates_reads_the_identity_and_the_checkpoint_once(tiny_run, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(tiny_run, workdir)
  # The whole start-up of a resume (up to "nothing to do"), counting calls.
  proc = run_python(f"""
import collections, json
from gemma_grpo.runtime import checkpoints
from gemma_grpo import config
from gemma_grpo.commands import train
calls = collections.Counter()
def counted(module, name):
  original = getattr(module, name)
  def wrapper(*args, **kwargs):
    calls[name] += 1
    return original(*args, **kwargs)
  setattr(module, name, wrapper)
counted(config, "validate")
counted(checkpoints, "saved_identity")
counted(checkpoints, "_manager")  # every Orbax read of ours opens one
code = train.main(["--config", "configs/tiny.py", "--workdir", {str(workdir)!r}])
print(json.dumps({{"code": code, **calls}}))
""", cwd=REPO)
  counts = json.loads(proc.stdout.strip().splitlines()[-1])
  assert counts == {"code": 0, "validate": 1, "saved_identity": 1, "_manager": 1}
  assert "nothing to do" in proc.stderr


def train_watching_compiles(workdir, overrides) -> dict:
  """Trains configs/tiny.py with `overrides` in a process of its own: its exit
  code, the steps it made, and what JAX compiled after the first update.

  Every program JAX lowers once the first update is done, by name: a step
  program recompiled (a shape, dtype or sharding that drifts between steps)
  or a host-side op compiled mid-run would appear there. And the train step
  is traced and compiled once, by the thread that compiles it ahead
  (trainers.precompile_train_step): an example of the wrong shape, dtype or
  sharding would make the first update trace and compile it again.
  """
  proc = run_python(f"""
import json, logging, threading
import jax
from gemma_grpo.rl.run import step_hooks
from gemma_grpo.commands import train
jax.config.update("jax_log_compiles", True)
state = {{"steps_done": 0, "late": [], "train_step": []}}
original = step_hooks.RunHooks.on_train_step_end
def on_train_step_end(self, *args, **kwargs):
  state["steps_done"] += 1
  return original(self, *args, **kwargs)
step_hooks.RunHooks.on_train_step_end = on_train_step_end
class Late(logging.Handler):
  def emit(self, record):
    message = record.getMessage()
    if state["steps_done"] and message.startswith("Compiling "):
      state["late"].append(message.split(" with ")[0])
    if message.startswith(("Finished tracing _train_step ", "Compiling jit(_train_step) ")):
      state["train_step"].append([threading.current_thread().name, message.split(" ")[0]])
logging.getLogger("jax").addHandler(Late())
code = train.main(["--config", "configs/tiny.py", "--workdir", {str(workdir)!r},
                   "--config.ckpt.every_steps=100", *{list(overrides)!r}])
print(json.dumps({{"code": code, "steps": state["steps_done"], "late": state["late"],
                  "train_step": state["train_step"]}}))
""", cwd=REPO)
  return json.loads(proc.stdout.strip().splitlines()[-1])


def compiled_once(steps: int) -> dict:
  """train_watching_compiles's answer for a run of `steps` that compiled nothing late."""
  return {"code": 0, "steps": steps, "late": [], "train_step": [
      ["precompile-train-step", "Finished"], ["precompile-train-step", "Compiling"]]}


@pytest.mark.parametrize("overrides", [
    # No reference log-probs; the sampling policy's for each batch's second update.
    ["--config.train.max_steps=4", "--config.grpo.beta=0", "--config.grpo.num_iterations=2"],
    # The default's programs, and held-out evals before step 1 and after steps
    # 2 and 3: one set of eval programs.
    ["--config.train.max_steps=3", "--config.eval.every_steps=2"],
    # Continuous batching: 3 slots for tiny's 4 completions a step, so slots
    # refill; the held-out eval's greedy rollout uses the slots too.
    ["--config.train.max_steps=3", "--config.eval.every_steps=2", "--config.rollout.slots=3"],
])
def test_nothing_compiles_after_the_first_step(tmp_path, overrides):
  result = train_watching_compiles(tmp_path / "run", overrides)
  assert result == compiled_once(int(overrides[0].split("=")[1]))
  # tiny's completions all run to the limit, so every step's rollout decodes
  # alike; the held-out evals' decoding (before step 1, after step 2) is not its.
  rows = metrics.read_jsonl(tmp_path / "run" / "tensorboard" / "metrics.jsonl")
  assert len({r["rollout/train/decode_steps"] for r in rows if "rollout/train/decode_steps" in r}) == 1


def test_default_workdir_is_named_after_the_config():
  assert command.default_workdir("configs/gemma3_270m.py") == "runs/gemma3_270m"


@pytest.mark.parametrize("args, needle", [
    (["--config.grpo.num_generations=1"], "error: grpo.num_generations=1"),
    (["--config.grpo.nope=1"], "error: --config.grpo.nope: unknown key 'nope'"),
    (["--config.mesh.fsdp=3"], "error: mesh.fsdp=3"),
    # A range is checked with its feature off too (tiny.py calls no tools).
    (["--config.rollout.max_tool_calls=-2"], "error: rollout.max_tool_calls=-2: must be >= 1"),
])
def test_bad_config_exits_2_with_one_line(tmp_path, args, needle):
  proc = run_cli(["train", "--config", "configs/tiny.py", "--workdir", str(tmp_path / "w"), *args],
                 check=False, timeout=120)
  assert proc.returncode == 2, proc.stderr
  assert needle in proc.stderr
  assert [line.startswith("error:") for line in proc.stderr.splitlines()].count(True) == 1, proc.stderr
  assert "Traceback" not in proc.stderr


# What `--help` and a bad config must answer without: the seconds JAX, Tunix,
# transformers and matplotlib take to import.
_HEAVY = ("jax", "flax", "tunix", "qwix", "orbax", "optax", "transformers", "matplotlib",
          "tensorboardX", "sympy")


@pytest.mark.parametrize("argv, code", [
    (["-m", "gemma_grpo.train", "--help"], 0),
    (["-m", "gemma_grpo.commands.cli", "train", "--help"], 0),
    (["-m", "gemma_grpo.commands.cli", "sft", "--help"], 0),
    (["-m", "gemma_grpo.commands.cli", "export", "--help"], 0),
    (["-m", "gemma_grpo.commands.cli", "train", "--config", "configs/tiny.py",
      "--config.grpo.num_generations=1"], 2),
])
def test_help_and_a_bad_config_answer_in_under_half_a_second(argv, code):
  # The modules a run left loaded, printed at exit: none of the heavy ones.
  probe = ("import atexit, sys; atexit.register(lambda: print(sorted({m.split('.')[0] for m in"
           f" sys.modules}} & set({_HEAVY!r})), file=sys.stderr)); sys.argv = [''] + {argv[2:]!r};"
           f" import runpy; runpy.run_module({argv[1]!r}, run_name='__main__')")
  env = {**os.environ, "PYTHONPATH": str(REPO)}
  seconds = []
  for _ in range(3):  # the best of three
    # The child's own CPU seconds: its wall time is that on an idle machine, and
    # the suite's other worker, which slows the wall clock, does not add to it.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
  assert proc.returncode == code, proc.stderr
  assert "Traceback" not in proc.stderr
  loaded = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
  assert loaded.stderr.strip().splitlines()[-1] == "[]", loaded.stderr
  assert min(seconds) < 0.5, seconds
