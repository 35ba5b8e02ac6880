"""Hugging Face hub access that answers at once on a machine without network.

huggingface_hub retries a failed request with back-off, so a download that
cannot succeed (no DNS, no route, a firewall) takes tens of seconds to fail. One
TCP connection to the hub, with a short timeout, tells first; when it fails
the download runs with `local_files_only`: a cached copy is still used, and a
missing one fails in the time of that probe.
"""

from __future__ import annotations

import os
import pathlib
import socket
import urllib.parse

import huggingface_hub
from huggingface_hub import constants
from huggingface_hub import errors as hub_errors

from gemma_grpo import errors

PROBE_TIMEOUT_S = 3.0


class Unreachable(OSError):
  """The hub cannot be reached and the cache has no copy."""


def reachable(timeout_s: float = PROBE_TIMEOUT_S) -> bool:
  """Whether a TCP connection to the hub endpoint (HF_ENDPOINT) opens in time."""
  if constants.HF_HUB_OFFLINE:
    return False
  url = urllib.parse.urlparse(constants.ENDPOINT)
  port = url.port or (443 if url.scheme == "https" else 80)
  try:
    socket.create_connection((url.hostname, port), timeout=timeout_s).close()
  except OSError:
    return False
  return True


def _download(fetch, *args, **kwargs) -> str:
  if reachable():
    return fetch(*args, **kwargs)
  try:
    return fetch(*args, local_files_only=True, **kwargs)
  except hub_errors.LocalEntryNotFoundError:
    host = urllib.parse.urlparse(constants.ENDPOINT).hostname
    raise Unreachable(f"{host} is out of reach from this machine and no copy is cached") from None


def download_file(repo_id: str, filename: str, **kwargs) -> str:
  """`hf_hub_download`, from the cache only when the hub is out of reach."""
  return _download(huggingface_hub.hf_hub_download, repo_id, filename, **kwargs)


def download_repo(repo_id: str, **kwargs) -> str:
  """`snapshot_download`, from the cache only when the hub is out of reach."""
  return _download(huggingface_hub.snapshot_download, repo_id, **kwargs)


def push_folder(folder: pathlib.Path, repo_id: str) -> str:
  """Uploads `folder` to a private model repo.

  The token is HF_TOKEN's, else the one `hf auth login` saved.
  """
  api = huggingface_hub.HfApi(token=os.environ.get("HF_TOKEN") or None)
  try:
    url = api.create_repo(repo_id, private=True, exist_ok=True, repo_type="model")
    api.upload_folder(
        folder_path=str(folder), repo_id=repo_id, repo_type="model",
        commit_message="gemma-grpo export",
    )
  except (hub_errors.HfHubHTTPError, OSError, ValueError, RuntimeError) as e:
    # RuntimeError: huggingface_hub's report of a failed LFS upload.
    first = (str(e).splitlines() or [""])[0][:200]
    # The Hub's own reason ("Invalid credentials ...") is on a later line.
    reason = (getattr(e, "server_message", None) or "").strip().splitlines()
    said = f"; the Hub says: {reason[0][:200]}" if reason else ""
    raise errors.UserError(
        f"--push-to-hub {repo_id}: upload failed ({type(e).__name__}: {first}{said}); the export"
        f" is complete in {folder}; check HF_TOKEN (or `hf auth login`) and retry"
    ) from None
  return str(url)
