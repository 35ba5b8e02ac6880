"""`gemma-grpo ARGS` (or `python -c CODE`) as a fresh process that skips the imports.

A CLI run of the tiny config spends about 7 of its 20 s importing JAX, Tunix,
Qwix, Orbax, grain and the rest, and the suite starts dozens of them. Here a
stdlib fork server (multiprocessing's "forkserver") imports those modules
once, before any JAX backend exists, and forks each run from it: every run is
still its own process, with its own devices (XLA_FLAGS is read when the
backend starts, after the fork), working directory, environment, stdout,
stderr and exit code, but none of the import time.

Only runs whose environment differs from the suite's in nothing but
XLA_FLAGS, PYTHONUNBUFFERED, PYTHONPATH (applied here to sys.path) and
variables read at run time (conftest.FORKABLE_ENV) come here
(conftest.run_cli and run_python decide): JAX reads its other settings from
the environment at import, which happened in the server.
"""

from __future__ import annotations

import atexit
import io
import multiprocessing
from multiprocessing import forkserver
import os
import signal
import subprocess
import sys

# What `gemma-grpo train|sft|eval|export` import; all safe to import before
# a JAX backend starts (none of them starts one).
PRELOAD = [
    "jax", "flax.nnx", "optax", "orbax.checkpoint", "grain", "qwix", "tensorboardX",
    "tunix.rl.rl_cluster", "tunix.rl.grpo.grpo_learner", "tunix.sft.peft_trainer",
    "reasoning_gym", "matplotlib.pyplot", "safetensors.numpy", "sentencepiece",
    "gemma_grpo.commands.cli", "gemma_grpo.commands.train", "gemma_grpo.commands.sft", "gemma_grpo.commands.evaluate",
    "gemma_grpo.commands.export", "gemma_grpo.commands.plots", "gemma_grpo.rl.learner.learner", "gemma_grpo.rl.run.cluster",
    "gemma_grpo.rl.engine.rollout", "gemma_grpo.model.lora", "gemma_grpo.model.model_loading", "gemma_grpo.tasks.data",
    "gemma_grpo.runtime.checkpoints", "gemma_grpo.rl.run.step_hooks", "gemma_grpo.runtime.guards",
    # What the commands import once the config is checked: transformers alone takes seconds.
    "gemma_grpo.rl.run.training_run", "gemma_grpo.sft.sft", "gemma_grpo.rl.eval.evaluation",
    "gemma_grpo.model.hf_export", "gemma_grpo.runtime.curves",
    # Not an import only: parses the offline tokenizer that most runs load.
    "tests.forked_cli_tokenizer",
]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_context = None


def _fork_context():
  global _context
  if _context is None:
    _context = multiprocessing.get_context("forkserver")
    _context.set_forkserver_preload(PRELOAD)
    # Python 3.11's fork server ignores the sys.path it is sent and skips a
    # preload it cannot import without a word: it finds `tests.` modules
    # through PYTHONPATH, set to the repository while it starts.
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, saved]))
    try:
      forkserver.ensure_running()
    finally:
      if saved is None:
        del os.environ["PYTHONPATH"]
      else:
        os.environ["PYTHONPATH"] = saved
  return _context


def _child(argv: list[str] | None, code: str | None, cwd: str, env: dict[str, str],
           out_path: str, err_path: str) -> None:
  """The forked process: becomes `python -m gemma_grpo.commands.cli ARGV` (or `python -c CODE`) in `cwd`."""
  for fd, path in ((1, out_path), (2, err_path)):
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(target, fd)
    os.close(target)
  sys.stdout = io.TextIOWrapper(open(1, "wb", buffering=0, closefd=False), write_through=True)
  sys.stderr = io.TextIOWrapper(open(2, "wb", buffering=0, closefd=False), write_through=True)
  os.chdir(cwd)
  os.environ.clear()
  os.environ.update(env)
  # What the interpreter does at start: PYTHONPATH, then the script's directory
  # (`python -m` and `-c` both put the working directory first).
  sys.path[:0] = [cwd, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
  sys.argv = ["-c"] if code is not None else ["gemma-grpo", *argv]
  signal.signal(signal.SIGINT, signal.default_int_handler)
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  import importlib  # pylint: disable=g-import-not-at-top
  import warnings  # pylint: disable=g-import-not-at-top

  # As pyproject.toml's filterwarnings holds the tests: a deprecation that
  # gemma_grpo's own code triggers is an error.
  warnings.filterwarnings("error", category=DeprecationWarning, module="gemma_grpo")

  from gemma_grpo.commands import cli  # pylint: disable=g-import-not-at-top
  from gemma_grpo.runtime import console  # pylint: disable=g-import-not-at-top

  importlib.reload(console)  # it notes the process's start time at import
  try:
    if code is not None:
      exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})  # pylint: disable=exec-used
      status = 0
    else:
      status = cli.main(argv)
  except SystemExit as e:
    status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
  except BaseException:  # pylint: disable=broad-exception-caught
    import traceback  # pylint: disable=g-import-not-at-top

    traceback.print_exc()
    status = 1
  # multiprocessing ends a child with os._exit: run what a normal exit would.
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)  # pylint: disable=protected-access


def run(argv: list[str] | None = None, *, code: str | None = None, cwd: str,
        env: dict[str, str], timeout: float, output_dir: str) -> subprocess.CompletedProcess:
  """Runs the CLI with `argv` (or `code`) in a forked process, like subprocess.run.

  Raises subprocess.TimeoutExpired after `timeout` s, the process killed.
  """
  os.makedirs(output_dir, exist_ok=True)
  out_path = os.path.join(output_dir, "forked.out")
  err_path = os.path.join(output_dir, "forked.err")
  shown = ["python", "-c", code] if code is not None else ["gemma-grpo", *argv]
  proc = _fork_context().Process(target=_child, args=(argv, code, cwd, env, out_path, err_path))
  proc.start()
  proc.join(timeout)
  if proc.exitcode is None:
    proc.kill()
    proc.join()
    raise subprocess.TimeoutExpired(shown, timeout)
  with open(out_path) as out, open(err_path) as err:
    stdout, stderr = out.read(), err.read()
  status = proc.exitcode  # -N when killed by signal N, as subprocess reports it
  return subprocess.CompletedProcess(shown, status, stdout, stderr)


class Started:
  """A CLI run started by `start`: the parts of subprocess.Popen the tests use."""

  def __init__(self, process, shown: list[str]):
    self._process, self._shown = process, shown
    self.pid = process.pid

  def poll(self) -> int | None:
    return self._process.exitcode

  def wait(self, timeout: float | None = None) -> int:
    self._process.join(timeout)
    if self._process.exitcode is None:
      raise subprocess.TimeoutExpired(self._shown, timeout)
    return self._process.exitcode

  def kill(self) -> None:
    self._process.kill()

  def send_signal(self, sig: int) -> None:
    os.kill(self.pid, sig)


def start(argv: list[str], *, cwd: str, env: dict[str, str], out_path: str,
          err_path: str) -> Started:
  """Starts the CLI with `argv` in a forked process and returns at once, like Popen."""
  proc = _fork_context().Process(target=_child, args=(argv, None, cwd, env, out_path, err_path))
  proc.start()
  return Started(proc, ["gemma-grpo", *argv])
