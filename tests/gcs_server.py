"""A local Google Cloud Storage API server for tests: `python tests/gcs_server.py PORT DIR`.

It is the `gcp-storage-emulator` package with one gap filled: real GCS sends
an object's generation in the `x-goog-generation` header of every media
download, and TensorStore (under Orbax) reads it to make its conditional
writes; without it a checkpoint save fails with "Malformed StorageGeneration".
Clients find the server through STORAGE_EMULATOR_HOST (gcsfs,
google-cloud-storage) and TENSORSTORE_GCS_HTTP_URL (TensorStore).
"""

import sys
import time

from gcp_storage_emulator import server as emulator_server
from gcp_storage_emulator.handlers import objects

_download = objects.download


def _download_with_generation(request, response, storage, *args, **kwargs):
  _download(request, response, storage, *args, **kwargs)
  try:
    obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
  except Exception:  # pylint: disable=broad-exception-caught
    return  # not found: the original handler already answered 404
  response["x-goog-generation"] = str(obj["generation"])
  response["x-goog-metageneration"] = str(obj.get("metageneration", "1"))


objects.download = _download_with_generation  # also reached through objects.get(alt=media)
emulator_server.HANDLERS = tuple(
    (pattern, {verb: _download_with_generation if fn is _download else fn
               for verb, fn in handlers.items()})
    for pattern, handlers in emulator_server.HANDLERS)


def main() -> None:
  port, data_dir = int(sys.argv[1]), sys.argv[2]
  server = emulator_server.create_server("localhost", port, data_dir=data_dir,
                                         default_bucket="test-bucket")
  server.start()
  print(f"listening on {port}", flush=True)
  while True:
    time.sleep(3600)


if __name__ == "__main__":
  main()
