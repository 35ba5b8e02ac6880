"""Shared test setup: a simulated 8-device CPU, runs of the CLI, xdist scheduling.

XLA_FLAGS must be set before JAX is imported anywhere, which is why it lives
here. CLI runs are processes of their own (forked from a server that has
done the imports: tests/forked_cli.py) with a single device unless a test asks.
"""

import dataclasses
import os
import pathlib
import subprocess
import sys

# The suite compiles far more programs than it runs steps of, and at LLVM's -O0
# XLA's CPU compiler takes about half the time while the tiny models' steps,
# whose time is in library matmuls, run as fast (docs/results/suite_time.txt,
# 2026-12-06 stop 55). Every process a test starts gets the same flags, so runs compared
# bit for bit are compiled alike; GEMMA_GRPO_TEST_XLA_OPT=default compiles as
# users do.
XLA_OPT = ("" if os.environ.get("GEMMA_GRPO_TEST_XLA_OPT") == "default"
           else " --xla_backend_optimization_level=0")


def xla_flags(devices: int) -> str:
  """XLA_FLAGS for a test process with `devices` simulated CPU devices."""
  return f"--xla_force_host_platform_device_count={devices}{XLA_OPT}"


os.environ.setdefault("XLA_FLAGS", xla_flags(8))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Compiled programs are shared by every test and CLI subprocess of a session.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.expanduser("~/.cache/gemma_grpo/xla"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

REPO = pathlib.Path(__file__).resolve().parent.parent
_CONVERTER = pytest.StashKey[subprocess.Popen]()
GSM8K_DIR = REPO.parent / "shared" / "data" / "gsm8k"


# Overrides under which configs/tiny.py really updates its adapters: a reward
# that random text varies on, and a rate that moves a random model.
LEARNING = ("--config.rewards.custom=tests.toy_rewards:vowel_share", "--config.optim.peak_lr=0.05")


def device_mesh(fsdp: int = 1, tp: int = 1):
  """A mesh of the first fsdp*tp simulated devices, with the axis types of mesh.make_mesh."""
  import jax  # pylint: disable=g-import-not-at-top

  return jax.make_mesh((fsdp, tp), ("fsdp", "tp"), devices=jax.devices()[:fsdp * tp],
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)


# CLI runs fork from a server that has done the imports (tests/forked_cli.py);
# GEMMA_GRPO_TEST_FORK=0 starts each as a fresh interpreter instead.
FORK = os.environ.get("GEMMA_GRPO_TEST_FORK", "1") == "1"


def _forked(args=None, *, code=None, cwd, env, timeout) -> subprocess.CompletedProcess:
  import shutil  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top

  import forked_cli  # pylint: disable=g-import-not-at-top

  output_dir = tempfile.mkdtemp(prefix="gemma-grpo-cli-")
  try:
    return forked_cli.run(args, code=code, cwd=str(cwd), env=env, timeout=timeout,
                          output_dir=output_dir)
  finally:
    shutil.rmtree(output_dir, ignore_errors=True)


def cli_env(devices: int = 1) -> dict[str, str]:
  env = dict(os.environ)
  env["XLA_FLAGS"] = xla_flags(devices)
  env["PYTHONUNBUFFERED"] = "1"
  return env


# What a forked run's environment may add to the suite's: PYTHONPATH (the fork
# server puts it on sys.path) and variables the libraries read when called, not
# when imported (gcsfs, google-cloud-storage and TensorStore find the GCS server
# through these).
FORKABLE_ENV = frozenset({"PYTHONPATH", "STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL",
                          "GOOGLE_CLOUD_PROJECT"})


def _forks(env: dict[str, str] | None) -> bool:
  """Whether a CLI run whose environment adds `env` forks from the import server."""
  return FORK and set(env or {}) <= FORKABLE_ENV


def start_cli(argv: list[str], *, out_path: pathlib.Path, err_path: pathlib.Path,
              devices: int = 1, env: dict[str, str] | None = None):
  """Starts `gemma-grpo ARGV` in the background, stdout and stderr to files.

  Forked from the import server unless `env` adds more than FORKABLE_ENV (as
  run_cli's runs); returns an object with Popen's pid, poll, wait, kill and
  send_signal.
  """
  full_env = {**cli_env(devices), **(env or {})}
  if _forks(env):
    import forked_cli  # pylint: disable=g-import-not-at-top

    return forked_cli.start(argv, cwd=str(REPO), env=full_env, out_path=str(out_path),
                            err_path=str(err_path))
  return subprocess.Popen([sys.executable, "-m", "gemma_grpo.commands.cli", *argv], cwd=REPO,
                          env=full_env, stdout=open(out_path, "w"), stderr=open(err_path, "w"),
                          text=True)


def run_cli(args: list[str], *, devices: int = 1, timeout: int = 600,
            check: bool = True, env: dict[str, str] | None = None, cwd: pathlib.Path = REPO,
            **kwargs) -> subprocess.CompletedProcess:
  """Runs `python -m gemma_grpo.commands.cli ARGS` in `cwd`, capturing output.

  The process is forked from a server that has imported the CLI's modules
  (tests/forked_cli.py) unless `env` sets more than FORKABLE_ENV or
  GEMMA_GRPO_TEST_FORK=0; either way it is a process of its own.
  """
  if _forks(env) and not kwargs:
    proc = _forked(args, cwd=cwd, env={**cli_env(devices), **(env or {})}, timeout=timeout)
  else:
    proc = subprocess.run(
        [sys.executable, "-m", "gemma_grpo.commands.cli", *args],
        cwd=cwd, env={**cli_env(devices), **(env or {})}, capture_output=True, text=True,
        timeout=timeout, check=False, **kwargs,
    )
  if check and proc.returncode != 0:
    raise AssertionError(
        f"gemma-grpo {' '.join(args)} exited {proc.returncode}\n"
        f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
    )
  return proc


def run_python(code: str, *, cwd: pathlib.Path, devices: int = 1, timeout: int = 600,
               check: bool = True) -> subprocess.CompletedProcess:
  """Runs `python -c CODE` in `cwd`, as a user's script or notebook would."""
  env = cli_env(devices)
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
  if FORK:
    proc = _forked(code=code, cwd=cwd, env=env, timeout=timeout)
  else:
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
  if check and proc.returncode != 0:
    raise AssertionError(f"python -c exited {proc.returncode}\n--- stdout ---\n"
                         f"{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-6000:]}")
  return proc


def run_as_of_step(workdir: pathlib.Path, copy: pathlib.Path, step: int) -> pathlib.Path:
  """A copy of the run in `workdir` as it was right after its checkpoint at
  `step` (a stop then, or a kill -9 before the next checkpoint): later
  checkpoints and metrics removed. Resuming it trains the later steps again
  without training the earlier ones twice."""
  import json  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top

  from gemma_grpo.runtime import checkpoints  # pylint: disable=g-import-not-at-top

  shutil.copytree(workdir, copy)
  for saved in checkpoints.actor_dir(copy).iterdir():
    if saved.name.isdigit() and int(saved.name) > step:
      shutil.rmtree(saved)
  jsonl = copy / "tensorboard" / "metrics.jsonl"
  jsonl.write_text("".join(line + "\n" for line in jsonl.read_text().splitlines()
                           if json.loads(line)["step"] <= step))
  return copy


# Files that share the two_processes_four_steps fixture: one xdist worker runs
# them all, so the two-process run is made once, not once per worker.
TWO_PROCESS_FILES = ("test_distributed.py", "test_gpu_cluster.py", "test_tpu_rehearsal.py")
# Files that share the journey fixture (tests/journey.py), likewise.
JOURNEY_FILES = ("test_journey.py", "test_llama_cpp.py")
# The longest files first (test time on 2 cores, a cold run of 2026-12-05), so
# the two workers finish together; the order changes nothing else.
LONGEST_FIRST = ("journey", "two processes", "test_learner.py", "test_export.py", "test_multi_turn.py",
                 "test_mesh.py", "test_plan_programs.py", "test_plan.py", "test_sft.py",
                 "test_train.py", "test_reliability.py", "test_storage.py", "test_rollout.py",
                 "test_tokenizer.py", "test_evaluate.py", "test_model_loading.py", "test_api.py")


def _work_unit(file_name: str) -> str:
  if file_name in TWO_PROCESS_FILES:
    return "two processes"
  return "journey" if file_name in JOURNEY_FILES else file_name


def pytest_configure(config):
  """Converts the offline Gemma-3-270M (once per home, about 11 s) while the
  workers import and collect, instead of after, when every run waits for it
  under model_loading's lock."""
  if os.environ.get("PYTEST_XDIST_WORKER"):
    return
  config.stash[_CONVERTER] = subprocess.Popen(
      [sys.executable, "-c", "from gemma_grpo import config; from gemma_grpo.config import settings;"
       " from gemma_grpo.model import model_loading;"
       " model_loading.offline_270m_dir(settings.from_config(config.defaults()).model)"],
      cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pytest_unconfigure(config):
  converter = config.stash.get(_CONVERTER, None)
  if converter is not None:
    converter.wait()  # a failure shows again in the first test that loads the model


def pytest_collection_finish(session):
  """Exempts the collected modules (JAX, Tunix, ...) from garbage collection, as
  the commands do (commands.command.freeze_loaded_modules): Tunix forces full
  collections, and each would walk them all."""
  del session
  import gc  # pylint: disable=g-import-not-at-top

  gc.freeze()


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(_work_unit(item.path.name), len(rank)))
  import importlib.util  # pylint: disable=g-import-not-at-top

  if importlib.util.find_spec("torch") is None:
    # PyPI has no CPU build of torch for Python 3.12+ (pyproject.toml's test extra).
    skip = pytest.mark.skip(reason="needs torch; the test extra installs it on Python 3.11 only")
    for item in items:
      if "torch" in item.keywords:
        item.add_marker(skip)


@pytest.hookimpl(optionalhook=True)  # known only where xdist is loaded
def pytest_xdist_make_scheduler(config, log):
  """Whole files per worker (module and session fixtures are made once per worker).

  Like `--dist loadfile`, except that TWO_PROCESS_FILES go to one worker, and
  JOURNEY_FILES to one worker, in the order collected above. (xdist's own `loadgroup` marks do not take
  effect with pytest 9: xdist 3.8 renames the node id through an attribute
  pytest 9 no longer reads.)
  """
  from xdist.scheduler import LoadScopeScheduling  # pylint: disable=g-import-not-at-top

  class FileScheduling(LoadScopeScheduling):

    def _split_scope(self, nodeid: str) -> str:
      path = nodeid.split("::", 1)[0]
      return _work_unit(path.rsplit("/", 1)[-1])

  config.option.loadscopereorder = False
  return FileScheduling(config, log)


def _session_run(tmp_path_factory, name: str, args: list[str], devices: int = 1) -> pathlib.Path:
  """The work directory of `gemma-grpo train ARGS`, trained once per session.

  Every xdist worker gets the same run: the first to ask trains it, under a
  lock, and keeps its console beside (not in) the work directory.
  """
  import fcntl  # pylint: disable=g-import-not-at-top

  base = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    base = base.parent  # the session's directory, above each worker's
  workdir = base / name / "run"
  workdir.parent.mkdir(exist_ok=True)
  with open(base / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (workdir.parent / "stderr.txt").exists():
      proc = run_cli(["train", *args, "--workdir", str(workdir)], devices=devices)
      (workdir.parent / "stdout.txt").write_text(proc.stdout)
      (workdir.parent / "stderr.txt").write_text(proc.stderr)
  return workdir


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> pathlib.Path:
  """A work directory holding a finished 2-step run of configs/tiny.py.

  Shared by every test that needs a trained policy, in every xdist worker;
  treat it as read-only (copy it before resuming or corrupting it).
  """
  return _session_run(tmp_path_factory, "tiny_run", ["--config", "configs/tiny.py", *LEARNING])


# 4 prompts x 2 completions, so the batch splits evenly over every fsdp size
# tested, at a constant rate, so that a run's first steps do not depend on its
# max_steps: sharded and multi-process runs are compared with one_device_run
# over its 2 steps (tests/test_mesh.py, tests/test_distributed.py).
BATCH_OF_4 = ("--config", "configs/tiny.py", *LEARNING, "--config.train.batch_size=4",
              "--config.optim.warmup_fraction=0", "--config.optim.end_lr=0.05")


@pytest.fixture(scope="session")
def one_device_run(tmp_path_factory) -> pathlib.Path:
  """A finished 2-step run of BATCH_OF_4 on one device, read-only, shared."""
  return _session_run(tmp_path_factory, "one_device_run", list(BATCH_OF_4))


@pytest.fixture(scope="session")
def gsm8k_test_path() -> pathlib.Path:
  path = GSM8K_DIR / "test.jsonl"
  if not path.exists():
    pytest.skip(f"{path} not present")
  return path


def free_port() -> int:
  import socket  # pylint: disable=g-import-not-at-top

  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


# Two processes, 2 simulated CPU devices each, one (fsdp=2, tp=2) mesh over all 4:
# fsdp spans the processes, tp stays inside each. More devices per process
# test nothing more and cost more: with 4 each, gloo steps took twice as long.
DEVICES_PER_PROCESS = 2
TWO_PROCESS_ARGS = (*BATCH_OF_4, "--config.mesh.fsdp=2", "--config.mesh.tp=2",
                    "--config.train.max_steps=4")


def start_processes(args: list[str], *, num_processes: int = 2,
                    devices: int = DEVICES_PER_PROCESS,
                    env: dict[str, str] | None = None, logdir: pathlib.Path,
                    extra_args: dict[int, list[str]] | None = None) -> list:
  """Starts `gemma-grpo ARGS` as the processes of one JAX runtime on localhost.

  Each process gets `devices` simulated CPU devices and its rank by flags;
  its stdout and stderr go to logdir/p<rank>.{out,err}. Each starts as
  start_cli's runs do; returns objects with Popen's poll, wait, kill and
  send_signal.
  """
  coordinator = f"localhost:{free_port()}"
  logdir.mkdir(parents=True, exist_ok=True)
  procs = []
  for rank in range(num_processes):
    argv = [*args, *(extra_args or {}).get(rank, []), "--coordinator", coordinator,
            "--num-processes", str(num_processes), "--process-id", str(rank)]
    procs.append(start_cli(argv, out_path=logdir / f"p{rank}.out",
                           err_path=logdir / f"p{rank}.err", devices=devices, env=env))
  return procs


def wait_all(procs, timeout: float) -> list[int]:
  """Exit codes of `procs`; kills every one still running after `timeout` s."""
  import time  # pylint: disable=g-import-not-at-top

  deadline = time.monotonic() + timeout
  codes = []
  for proc in procs:
    try:
      codes.append(proc.wait(timeout=max(deadline - time.monotonic(), 0.1)))
    except subprocess.TimeoutExpired:
      for p in procs:
        p.kill()
      raise AssertionError(f"processes still running after {timeout} s") from None
  return codes


@dataclasses.dataclass
class TwoProcessRun:
  workdir: pathlib.Path
  logs: list[str]  # each task's stdout and stderr
  launcher: subprocess.CompletedProcess
  srun_args: list[str]


@pytest.fixture(scope="session")
def two_processes_four_steps(tmp_path_factory) -> TwoProcessRun:
  """An uninterrupted 4-step run of two processes (TWO_PROCESS_ARGS), read-only.

  Started the way a SLURM cluster runs it: launch/gpu_cluster.sh submits a
  batch script to a fake sbatch, whose fake srun starts two local tasks with
  SLURM's variables (tests/fake_slurm.py), so JAX's SLURM detection ranks
  them. One run serves three tests: the SLURM rehearsal
  (test_gpu_cluster), the one-process comparison (test_distributed) and the
  reference of the interrupted TPU rehearsal (test_tpu_rehearsal).
  """
  import fake_slurm  # pylint: disable=g-import-not-at-top

  root = tmp_path_factory.mktemp("two_processes")
  fake_slurm.install(root / "bin")
  env = cli_env(DEVICES_PER_PROCESS)
  # JAX_LOG_COMPILES: each task's log names every program it compiles.
  env.update(PATH=f"{root / 'bin'}:{env['PATH']}", FAKE_SLURM_LOGS=str(root),
             FAKE_JOB_ID=str(fake_slurm.job_id_with_a_free_port()), JAX_LOG_COMPILES="1")
  launcher = subprocess.run(
      ["bash", str(REPO / "launch" / "gpu_cluster.sh"), "slurm", "--nodes", "2",
       "--gpus-per-node", "0", *TWO_PROCESS_ARGS[:2], "--workdir", str(root / "run"),
       "--python", sys.executable, "--log-dir", str(root / "logs"), *TWO_PROCESS_ARGS[2:]],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  logs = [(root / f"task{rank}.log").read_text() for rank in range(2)]
  assert launcher.returncode == 0, (launcher.stderr[-2000:], [log[-3000:] for log in logs])
  return TwoProcessRun(root / "run", logs, launcher,
                       (root / "srun.args").read_text().splitlines())


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
  """A local GCS API server (tests/gcs_server.py) holding bucket `test-bucket`.

  Yields the environment that points gcsfs, google-cloud-storage and
  TensorStore at it; set in this process too, for in-process checks.
  """
  import time  # pylint: disable=g-import-not-at-top
  import urllib.request  # pylint: disable=g-import-not-at-top

  port = free_port()
  data = tmp_path_factory.mktemp("gcs")
  proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "gcs_server.py"), str(port),
                           str(data)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  url = f"http://localhost:{port}"
  for _ in range(100):
    try:
      urllib.request.urlopen(url + "/", timeout=1)
      break
    except OSError:
      time.sleep(0.1)
  env = {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
         "GOOGLE_CLOUD_PROJECT": "test-project"}
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  yield env
  for key, value in saved.items():
    if value is None:
      os.environ.pop(key, None)
    else:
      os.environ[key] = value
  proc.kill()


# Last: tests/journey.py imports this module's helpers. Imported here, the
# fixture serves test_journey.py and test_llama_cpp.py (JOURNEY_FILES).
from journey import journey  # pylint: disable=g-import-not-at-top,wrong-import-position,unused-import
