"""`tensorboard --logdir` on a finished tiny run serves every reward's scalars through its HTTP API."""

import json
import sys
import urllib.parse
import urllib.request

import pytest

from conftest import REPO
from conftest import free_port
from gemma_grpo.runtime import metrics

sys.path.insert(0, str(REPO / "docs"))
import screenshot  # pylint: disable=g-import-not-at-top,wrong-import-position  # starts the server as a user does

REWARD_FUNCTIONS = ("format_exact", "format_approx", "answer_correct", "number_match", "vowel_share")


def get(port: int, path: str, **query):
  url = f"http://127.0.0.1:{port}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
  with urllib.request.urlopen(url, timeout=30) as response:
    return json.loads(response.read())


def test_tensorboard_serves_each_reward_of_a_run_step_by_step(tiny_run):
  port = free_port()
  server = screenshot.start_tensorboard(tiny_run.parent, port)
  try:
    runs = get(port, "/data/runs")
    assert runs == ["run/tensorboard"]
    tags = get(port, "/data/plugin/scalars/tags")["run/tensorboard"]
    assert {f"rewards/train/{n}" for n in REWARD_FUNCTIONS} | {"rewards/train/sum"} <= set(tags)
    rows = metrics.read_jsonl(tiny_run / "tensorboard" / "metrics.jsonl")
    for name in (*REWARD_FUNCTIONS, "sum"):
      tag = f"rewards/train/{name}"
      points = get(port, "/data/plugin/scalars/scalars", run="run/tensorboard", tag=tag)
      assert [step for _, step, _ in points] == [1, 2], tag
      assert [value for _, _, value in points] == pytest.approx([row[tag] for row in rows], rel=1e-6), tag
  finally:
    server.terminate()
    server.wait(timeout=30)
