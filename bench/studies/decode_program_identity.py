"""Is the one-turn decode loop the program it was before tool calls? (Settled: yes.)

  python bench/studies/decode_program_identity.py --rev 6c3457e

Lowers the grouped engine's decode loop (`rollout._decode`, what a run
without `rollout.tools` executes) on configs/tiny.py, greedy and sampled with
log-probs, from this checkout and from gemma_grpo/rl/rollout.py at git revision
REV, and prints whether their StableHLO texts are byte-identical. Identical
text compiles to the identical executable, so the multi-turn engine costs
the one-turn path nothing. Output: docs/results/tools/decode_program_identity.txt.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import pathlib
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[2]
for path in (REPO, REPO / "tests"):
  if str(path) not in sys.path:
    sys.path.insert(0, str(path))


def module_at(rev: str):
  """gemma_grpo/rl/rollout.py as it was at `rev`, imported under another name."""
  source = subprocess.run(["git", "show", f"{rev}:gemma_grpo/rl/rollout.py"], cwd=REPO,
                          check=True, capture_output=True, text=True).stdout
  path = pathlib.Path(tempfile.mkdtemp()) / "rollout_then.py"
  path.write_text(source)
  spec = importlib.util.spec_from_file_location("rollout_then", path)
  module = importlib.util.module_from_spec(spec)
  sys.modules["rollout_then"] = module
  spec.loader.exec_module(module)
  return module


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rev", required=True, help="a revision before tool calls, e.g. 6c3457e")
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
    sampling, with_logps, screen = engine.settings(rollout_config, rollout_config.return_logprobs)
    fn, fn_args, kwargs = engine.prefill_call(
        jnp.zeros((3, 64), jnp.int32), jax.random.PRNGKey(0), rows_per_prompt=2,
        sampling=sampling, screen_width=screen)
    with mesh:
      decode, decode_args, decode_kwargs = engine.decode_call(
          fn(*fn_args, **kwargs), jnp.asarray([1, 106], jnp.int32), jax.random.PRNGKey(0),
          new_tokens=8, sampling=sampling, with_logps=with_logps, screen_width=screen)
      now = decode.lower(*decode_args, **decode_kwargs).as_text()
      before = then._decode.lower(*decode_args, **decode_kwargs).as_text()  # pylint: disable=protected-access
    digest = lambda text: hashlib.sha256(text.encode()).hexdigest()[:16]  # pylint: disable=unnecessary-lambda-assignment
    print(f"{name}: this checkout {digest(now)}, {args.rev} {digest(before)},"
          f" {len(now.splitlines())} lines; identical: {now == before}")


if __name__ == "__main__":
  main()
