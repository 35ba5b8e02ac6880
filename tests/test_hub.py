"""Hub access on a machine that cannot reach the hub (gemma_grpo/runtime/hub.py)."""

import socket

from huggingface_hub import constants
import pytest

from conftest import free_port
from gemma_grpo.tasks import data
from gemma_grpo import errors
from gemma_grpo.runtime import hub


@pytest.fixture
def closed_endpoint(monkeypatch, tmp_path):
  """The hub endpoint is a local port nobody listens on; the cache is empty."""
  monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")
  monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))


def test_a_closed_endpoint_is_unreachable_and_a_listening_one_is_reachable(closed_endpoint, monkeypatch):
  assert not hub.reachable()
  with socket.socket() as server:
    server.bind(("127.0.0.1", 0))
    server.listen()
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
    assert hub.reachable()


def test_offline_downloads_use_the_cache_only(closed_endpoint, monkeypatch):
  calls = []

  def fake_download(repo_id, filename, **kwargs):
    calls.append(kwargs)
    return "/cached/file"

  monkeypatch.setattr("huggingface_hub.hf_hub_download", fake_download)
  assert hub.download_file("openai/gsm8k", "x.parquet", repo_type="dataset") == "/cached/file"
  assert calls == [{"repo_type": "dataset", "local_files_only": True}]


def test_gsm8k_from_an_unreachable_hub_is_one_line_naming_the_host(closed_endpoint):
  # huggingface_hub alone retries with back-off for ~24 s before this answer.
  with pytest.raises(errors.UserError, match=r"127\.0\.0\.1 is out of reach from this machine"
                     r" and no copy is cached\); pass a local GSM8K"):
    data.load_gsm8k_hub("test")
