"""Is the one-turn decode loop the program it was at another revision? (Settled: yes.)

  python bench/studies/decode_program_identity.py --rev 6c3457e

Lowers the grouped engine's decode loop (`rollout._decode`, what a run
without `rollout.tools` executes) on configs/tiny.py, greedy and sampled with
log-probs, from this checkout and from the decode path's modules at git
revision REV, and prints whether their StableHLO texts are byte-identical.
Identical text compiles to the identical executable. The decode path is the
engine (LAYOUTS: where rollout.py stood at each revision) and, at revisions
that have them, the modules split out of it (DECODE_PATH); the rest of
gemma_grpo is this checkout's at both, so a revision's engine must import
the rest under the names this checkout has: revisions since rl/engine/ do.
Against 6c3457e, before tool calls, it showed that the multi-turn engine
costs the one-turn path nothing; it ran at 08289ba, when the old flat names
still imported (docs/results/tools/decode_program_identity.txt): rerun that
comparison from a checkout of 08289ba.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import pathlib
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[2]
for path in (REPO, REPO / "tests"):
  if str(path) not in sys.path:
    sys.path.insert(0, str(path))


# The decode path's modules split out of rollout.py, each after those it imports.
DECODE_PATH = ("decode_dots", "sampling", "lm_head_screen", "decode_layers", "multi_turn")
# (the engine's folder, its package) now, in rl/ before rl/engine/, and before the layers.
LAYOUTS = (("gemma_grpo/rl/engine", "gemma_grpo.rl.engine"), ("gemma_grpo/rl", "gemma_grpo.rl"),
           ("gemma_grpo", "gemma_grpo"))


def source_at(rev: str, path: str) -> str | None:
  """The text of `path` at `rev`; None where it did not exist."""
  shown = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=REPO, capture_output=True,
                         text=True)
  return shown.stdout if shown.returncode == 0 else None


def load(name: str, source: str):
  """`source` as a module named `name`, run now."""
  path = pathlib.Path(tempfile.mkdtemp()) / f"{name.rpartition('.')[2]}.py"
  path.write_text(source)
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


def module_at(rev: str):
  """The engine module as it was at `rev`, run on that revision's decode path.

  While it loads, each DECODE_PATH module that existed at `rev` stands in for
  this checkout's under its own name (in sys.modules and in its package), so
  the engine's imports bind the revision's; then this checkout's return.
  """
  found = next(((folder, package, source) for folder, package in LAYOUTS
                if (source := source_at(rev, f"{folder}/rollout.py"))), None)
  if found is None:
    sys.exit(f"--rev {rev}: no rollout.py in any of {[folder for folder, _ in LAYOUTS]}")
  folder, package_name, engine = found
  package = importlib.import_module(package_name)
  now = {}
  try:
    for short in DECODE_PATH:
      source = source_at(rev, f"{folder}/{short}.py")
      if source is None:
        continue
      name = f"{package_name}.{short}"
      now[short] = sys.modules.get(name)
      setattr(package, short, load(name, source))
    return load("rollout_then", engine)
  finally:
    for short, module in now.items():
      name = f"{package_name}.{short}"
      if module is None:
        del sys.modules[name]
        delattr(package, short)
      else:
        sys.modules[name] = module
        setattr(package, short, module)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rev", required=True,
                      help="the revision to compare with, e.g. 6c3457e (before tool calls)")
  args = parser.parse_args()
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  import test_rollout  # pylint: disable=g-import-not-at-top
  from conftest import device_mesh  # pylint: disable=g-import-not-at-top

  then = module_at(args.rev)
  mesh = device_mesh()
  _, _, engine = test_rollout.build(mesh)
  settings = {"greedy": test_rollout.config(),
              "sampled, with log-probs": test_rollout.config(
                  temperature=0.9, top_p=1.0, top_k=50, return_logprobs=True)}
  for name, rollout_config in settings.items():
    sampling, with_logps, screen_width = engine.settings(rollout_config,
                                                         rollout_config.return_logprobs)
    fn, fn_args, kwargs = engine.prefill_call(
        jnp.zeros((3, 64), jnp.int32), jax.random.PRNGKey(0), rows_per_prompt=2,
        sampling=sampling, screen_width=screen_width)
    with mesh:
      decode, decode_args, decode_kwargs = engine.decode_call(
          fn(*fn_args, **kwargs), jnp.asarray([1, 106], jnp.int32), jax.random.PRNGKey(0),
          new_tokens=8, sampling=sampling, with_logps=with_logps, screen_width=screen_width)
      now = decode.lower(*decode_args, **decode_kwargs).as_text()
      before = then._decode.lower(*decode_args, **decode_kwargs).as_text()  # pylint: disable=protected-access
    digest = lambda text: hashlib.sha256(text.encode()).hexdigest()[:16]  # pylint: disable=unnecessary-lambda-assignment
    print(f"{name}: this checkout {digest(now)}, {args.rev} {digest(before)},"
          f" {len(now.splitlines())} lines; identical: {now == before}")


if __name__ == "__main__":
  main()
