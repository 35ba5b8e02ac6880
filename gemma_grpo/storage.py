"""Where a run's files live: a local directory or a `gs://` URL, one interface.

Every path a run reads or writes comes from `path()`: a local path is an
absolute pathlib.Path (Orbax refuses relative ones); a `gs://` URL, an
etils.epath.Path, goes
through fsspec's gcsfs for our own files, while checkpoints go through Orbax
and TensorStore, which speak GCS themselves. Object stores have no append and
no rename of directories, so the few files we grow (metrics.jsonl) are
rewritten whole, and small files are replaced in one write.

Tests point every client at a local GCS API server: gcsfs and
google-cloud-storage read STORAGE_EMULATOR_HOST, TensorStore reads
TENSORSTORE_GCS_HTTP_URL.
"""

from __future__ import annotations

import io
import os
import pathlib
import uuid
from typing import Union

from etils import epath

from gemma_grpo import errors

PathLike = Union[str, os.PathLike, epath.Path]


def is_remote(path: PathLike) -> bool:
  return "://" in os.fspath(path)


def path(location: PathLike) -> epath.Path:
  """`location` as a path object: a URL as an epath.Path, a local path as an
  absolute pathlib.Path (the same interface, plus what epath leaves out for
  object stores, such as recursive globs)."""
  text = os.fspath(location)
  if is_remote(text):
    if not text.startswith("gs://"):
      raise errors.UserError(
          f"{text}: only local paths and gs:// URLs are supported for work directories")
    return epath.Path(text.rstrip("/"))
  return pathlib.Path(os.path.abspath(os.path.expanduser(text)))


def check_writable(work: epath.Path, flag: str = "--workdir") -> None:
  """Raises UserError in one line unless `work` can be written (gs:// only).

  A missing bucket or missing credentials would otherwise surface at the
  first checkpoint, minutes into the run, as a traceback from TensorStore.
  """
  if not is_remote(work):
    return
  # Unique: two processes probing one directory at once must not delete each other's.
  probe = work / f".gemma-grpo-write-probe-{uuid.uuid4().hex}"
  try:
    probe.write_text("ok")
    probe.unlink()
  except Exception as e:  # pylint: disable=broad-exception-caught
    first = (str(e).strip().splitlines() or [""])[0][:160]
    bucket = os.fspath(work)[len("gs://"):].split("/")[0]
    raise errors.UserError(
        f"{flag} {work}: cannot write there ({type(e).__name__}: {first}); check that"
        f" bucket gs://{bucket} exists and that this machine has credentials that may"
        " write to it (`gcloud auth application-default login`, or the VM's service"
        " account)") from None


def write_text(target: epath.Path, text: str) -> None:
  """Replaces `target` whole: a rename locally, one object write on GCS."""
  if is_remote(target):
    target.write_text(text)
    return
  tmp = target.with_name(target.name + ".tmp")
  tmp.write_text(text)
  os.replace(tmp, target)


def save_figure(figure, target: epath.Path) -> None:
  """matplotlib's savefig, to a local path or an object."""
  buffer = io.BytesIO()
  figure.savefig(buffer, format=target.suffix.lstrip(".") or "png")
  target.write_bytes(buffer.getvalue())


class AppendFile:
  """A text file that grows by lines: appended locally, rewritten on GCS.

  Lines already in the file (a resumed run) are kept.
  """

  def __init__(self, target: epath.Path):
    self._target = target
    self._remote = is_remote(target)
    if self._remote:
      self._text = target.read_text() if target.exists() else ""
      self._file = None
    else:
      self._file = open(os.fspath(target), "a", encoding="utf-8")

  def write(self, line: str) -> None:
    if self._remote:
      self._text += line
    else:
      self._file.write(line)

  def flush(self) -> None:
    if self._remote:
      self._target.write_text(self._text)
    else:
      self._file.flush()

  def close(self) -> None:
    self.flush()
    if self._file is not None:
      self._file.close()
      self._file = None
