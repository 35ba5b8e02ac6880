"""Freed heap pages go back to the operating system."""

import subprocess
import sys

import pytest

from gemma_grpo.runtime import host_memory

# Many blocks under glibc's initial mmap threshold (128 KiB), freed while one
# block allocated after them keeps the heap's top in use, so glibc's automatic
# trimming of the top cannot return them: only malloc_trim can.
FRAGMENTED_HEAP = """
import re, sys
import numpy as np
from gemma_grpo.runtime import host_memory

def anon_mb():
  return int(re.search(r"RssAnon:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) / 1024

blocks = [np.ones(96 * 1024 // 8) for _ in range(4000)]  # 375 MiB
pin = np.ones(96 * 1024 // 8)
del blocks
before = anon_mb()
released = host_memory.release_free_memory()
print(released, before - anon_mb())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_freed_heap_blocks_are_returned():
  out = subprocess.run([sys.executable, "-c", FRAGMENTED_HEAP], capture_output=True,
                       text=True, check=True).stdout.split()
  if out[0] == "False":
    pytest.skip("this C library has no malloc_trim")
  assert float(out[1]) > 300, f"only {out[1]} MiB returned of 375 MiB freed"


def test_a_c_library_without_malloc_trim_is_a_no_op(monkeypatch):
  class MuslLike:  # musl and macOS's libc have no malloc_trim
    pass

  monkeypatch.setattr(host_memory.ctypes, "CDLL", lambda name: MuslLike())
  host_memory._malloc_trim.cache_clear()
  try:
    assert host_memory.release_free_memory() is False
  finally:
    host_memory._malloc_trim.cache_clear()
