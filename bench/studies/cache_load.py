"""How long does XLA:CPU take to load one program from JAX's persistent cache?

  python bench/studies/cache_load.py [--program jit__train_step] [--cache-dir DIR]
  perf record -g -o /tmp/cache_load.data -- python bench/studies/cache_load.py   # where it goes
  perf report -i /tmp/cache_load.data --no-children --sort symbol --stdio
About 30 s; needs a cache a run has filled (default ~/.cache/gemma_grpo/xla).

Takes the largest cache entry of PROGRAM (the cache holds the tests' tiny
programs too; the 270M's train step is the largest), then times, in this
process, what JAX does on a cache hit (jax._src.compilation_cache.get_executable_and_time):
reading the file, decompressing it, and the backend's deserialize_executable,
which rebuilds the executable for one CPU device. Prints the three times, the
entry's sizes and how many of the program's fusions XLA:CPU hands to YNNPACK. A diagnostic for bench/first_step.py's "compile or load"
column; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import time


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--program", default="jit__train_step")
  parser.add_argument("--cache-dir", default="~/.cache/gemma_grpo/xla")
  args = parser.parse_args()
  entries = sorted(pathlib.Path(os.path.expanduser(args.cache_dir)).glob(f"{args.program}-*"),
                   key=lambda p: p.stat().st_size)
  if not entries:
    raise SystemExit(f"no {args.program} entry in {args.cache_dir}: run a training first")
  entry = entries[-1]

  # JAX's own cache-hit path, step by step (private modules: a diagnostic).
  from jax._src import compilation_cache  # pylint: disable=g-import-not-at-top
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  from jax._src.lib import xla_client  # pylint: disable=g-import-not-at-top

  backend = xla_bridge.get_backend()
  start = time.perf_counter()
  stored = entry.read_bytes()
  read_s = time.perf_counter() - start
  start = time.perf_counter()
  serialized, compile_s = compilation_cache.extract_executable_and_time(
      compilation_cache.decompress_executable(stored))
  decompress_s = time.perf_counter() - start
  start = time.perf_counter()
  one_device = xla_client.DeviceList(tuple(backend.devices()[:1]))
  executable = backend.deserialize_executable(serialized, one_device, xla_client.CompileOptions())
  load_s = time.perf_counter() - start
  print(f"{entry.name}: {len(stored) / 1e6:.1f} MB stored, {len(serialized) / 1e6:.1f} MB"
        f" serialized; its compile took {compile_s} s (whole seconds, as JAX stores it)")
  print(f"read {read_s:.2f} s | decompress {decompress_s:.2f} s | deserialize {load_s:.1f} s")
  hlo = executable.hlo_modules()[0].to_string()
  print(f"{hlo.count('__ynn_fusion')} YNNPACK fusions, {hlo.count(chr(10))} lines of optimized HLO")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
