"""Remakes docs/images/tensorboard.png: TensorBoard's reward scalars of a tiny run, in headless Chromium.

  python docs/screenshot.py [--logdir DIR] [--out docs/images/tensorboard.png]

Without --logdir it first trains configs/tiny.py for 10 steps (about 30 s on
2 cores) with the toy reward a random model's output varies on, so one curve
moves. Needs Debian's chromium (`apt-get install chromium`).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parent.parent
TRAIN_ARGS = ("--config", "configs/tiny.py", "--config.train.max_steps=10",
              "--config.rewards.custom=tests.toy_rewards:vowel_share", "--config.optim.peak_lr=0.05")


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def tiny_run(root: pathlib.Path) -> pathlib.Path:
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
  subprocess.run([sys.executable, "-m", "gemma_grpo.train", *TRAIN_ARGS, "--workdir", str(root / "run")],
                 cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
  return root


def start_tensorboard(logdir: pathlib.Path, port: int) -> subprocess.Popen:
  """`tensorboard --logdir LOGDIR` as a user starts it; returns once it serves its runs."""
  binary = shutil.which("tensorboard") or str(pathlib.Path(sys.executable).parent / "tensorboard")
  proc = subprocess.Popen([binary, "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 60
  while time.time() < deadline:
    try:
      with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=5) as r:
        if r.read() not in (b"[]", b""):
          return proc
    except OSError:
      pass
    time.sleep(0.5)
  proc.kill()
  raise RuntimeError(f"tensorboard on {logdir} served no run within 60 s")


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--logdir", type=pathlib.Path, help="a directory of runs (default: train a tiny one)")
  parser.add_argument("--out", type=pathlib.Path, default=REPO / "docs" / "images" / "tensorboard.png")
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as tmp:
    logdir = args.logdir or tiny_run(pathlib.Path(tmp))
    port = free_port()
    server = start_tensorboard(logdir, port)
    try:
      # The classic scalars dashboard, filtered to the rewards: it draws without WebGL.
      url = f"http://127.0.0.1:{port}/#scalars&tagFilter=rewards%2Ftrain"
      subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                      "--window-size=1400,1680", "--virtual-time-budget=20000",
                      f"--screenshot={args.out.resolve()}", url],
                     check=True, capture_output=True, timeout=120)
    finally:
      server.terminate()
      server.wait(timeout=30)
  print(args.out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
