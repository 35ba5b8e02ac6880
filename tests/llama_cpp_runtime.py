"""llama.cpp, run from Python: tests/llama_cpp/llama_cpp.mjs under Node.

The runtime is node-llama-cpp's prebuilt llama.cpp, pinned in
tests/llama_cpp/package-lock.json and installed by `.ci/run` with
`npm ci --prefix tests/llama_cpp`. Where it is missing or does not load, the
caller gets one line saying why and what to run: the tests that need it fail
on it rather than skip, so CI cannot pass without llama.cpp having run.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import tempfile

HERE = pathlib.Path(__file__).resolve().parent / "llama_cpp"
SCRIPT = HERE / "llama_cpp.mjs"
INSTALL = "npm ci --prefix tests/llama_cpp"


class Unavailable(Exception):
  """llama.cpp cannot run here; the message is one line that says why and the fix."""


def package_version(node_dir: pathlib.Path = HERE) -> str:
  """The installed node-llama-cpp version, or raises Unavailable."""
  installed = node_dir / "node_modules" / "node-llama-cpp" / "package.json"
  if shutil.which("node") is None:
    raise Unavailable(f"llama.cpp: no `node` on PATH (Node 20 runs it); install Node, then `{INSTALL}`")
  if not installed.is_file():
    raise Unavailable(f"llama.cpp: {installed.relative_to(node_dir.parent.parent)} is missing; run `{INSTALL}`")
  return json.loads(installed.read_text())["version"]


def run(request: dict, *, timeout: float = 600, node_dir: pathlib.Path = HERE) -> dict:
  """Sends `request` to llama_cpp.mjs (its header says what it takes) and returns its answer."""
  package_version(node_dir)
  with tempfile.TemporaryDirectory(prefix="llama-cpp-") as tmp:
    request_path, response_path = pathlib.Path(tmp, "request.json"), pathlib.Path(tmp, "response.json")
    request_path.write_text(json.dumps(request))
    proc = subprocess.run(["node", str(node_dir / SCRIPT.name), str(request_path), str(response_path)],
                          cwd=node_dir, capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, "NODE_NO_WARNINGS": "1"})
    if proc.returncode != 0 or not response_path.is_file():
      lines = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
      why = next((line.strip() for line in lines if "Error" in line), lines[-1].strip() if lines else "no output")
      raise Unavailable(f"llama.cpp: node {SCRIPT.name} exited {proc.returncode}: {why}")
    return json.loads(response_path.read_text())
