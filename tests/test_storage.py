"""gs:// work directories against a local GCS API server (tests/gcs_server.py)."""

import json
import shutil
import time

from etils import epath
import pytest

from conftest import LEARNING, run_cli
from gemma_grpo import errors
from gemma_grpo import storage


@pytest.mark.parametrize("given, expected", [
    ("gs://bucket/run/", "gs://bucket/run"),
    ("gs://bucket/run", "gs://bucket/run"),
])
def test_urls_stay_urls(given, expected):
  assert str(storage.path(given)) == expected
  assert storage.is_remote(given)


def test_local_paths_become_absolute(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert str(storage.path("runs/x")) == str(tmp_path / "runs" / "x")
  assert not storage.is_remote("runs/x")


def test_other_schemes_are_one_line_errors():
  with pytest.raises(errors.UserError, match="only local paths and gs:// URLs"):
    storage.path("s3://bucket/run")


def test_append_file_keeps_earlier_lines_locally_and_in_a_bucket(tmp_path, gcs_server):
  del gcs_server
  for target in (epath.Path(tmp_path / "m.jsonl"), epath.Path("gs://test-bucket/append/m.jsonl")):
    first = storage.AppendFile(target)
    first.write("1\n")
    first.close()
    second = storage.AppendFile(target)  # a resumed run
    second.write("2\n")
    second.flush()
    assert target.read_text() == "1\n2\n", target
    second.write("3\n")
    second.close()
    assert target.read_text() == "1\n2\n3\n", target


def test_a_missing_bucket_fails_at_start_in_one_line(gcs_server):
  proc = run_cli(["train", "--config", "configs/tiny.py", "--workdir", "gs://no-such-bucket/run"],
                 env=gcs_server, check=False, timeout=300)
  assert proc.returncode == 2, proc.stderr[-3000:]
  lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert len(lines) == 1 and "--workdir gs://no-such-bucket/run: cannot write there" in lines[0]
  assert "bucket gs://no-such-bucket exists" in lines[0]
  assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_resume_eval_and_export_from_a_bucket(tmp_path, gcs_server, tiny_run):
  # A run written into a bucket from the start is rehearsed with two processes
  # in tests/test_tpu_rehearsal.py; here one process resumes a run that was
  # copied into a bucket, then eval and export read it there.
  url = f"gs://test-bucket/run-{time.time_ns()}"
  work = epath.Path(url)
  for local in tiny_run.rglob("*"):
    if local.is_file():
      (work / local.relative_to(tiny_run).as_posix()).write_bytes(local.read_bytes())
  args = ["train", "--config", "configs/tiny.py", *LEARNING, "--workdir", url]
  resumed = run_cli([*args, "--config.train.max_steps=3"], env=gcs_server)
  assert f"Resuming from step 2 in {url}" in resumed.stderr
  assert sorted(p.name for p in (work / "checkpoints" / "actor").iterdir()
                if p.name.isdigit()) == ["1", "2", "3"]
  rows = [json.loads(line) for line in (work / "tensorboard" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [1, 2, 3]
  assert len(list((work / "tensorboard").glob("events.out.tfevents.*"))) == 2  # one per start
  assert (work / "plots" / "rewards.png").read_bytes()[:4] == b"\x89PNG"
  assert json.loads((work / "config.json").read_text())["train"]["max_steps"] == 3
  assert not (work / "trainer.lock").exists()  # the lease is given back at the end

  run_cli(["eval", "--workdir", url, "--data", "reasoning_gym:gsm_symbolic", "--num-test", "2"],
          env=gcs_server)
  report = json.loads((work / "eval_step3" / "eval.json").read_text())
  assert report["settings"]["data"]["num_problems"] == 2

  out = tmp_path / "export"
  run_cli(["export", "--workdir", url, "--out", str(out)], env=gcs_server)
  assert (out / "model.safetensors").stat().st_size > 0
  shutil.rmtree(out)
