"""A fake `gcloud` whose TPU VM is real processes on this machine (the rehearsal).

`gcloud compute tpus tpu-vm create` makes a "VM" of FAKE_WORKERS workers, each
a home directory under $FAKE_CLOUD/vm; `scp` copies into those homes; `ssh
--worker=all --command=C` runs C with bash on every worker at once, each in
its own session with the environment a TPU VM host gives its processes: its
HOME, a metadata server (a fake `curl` answering agent-worker-number and
worker-network-endpoints), and its rank for jax.distributed. On a real TPU VM
JAX reads the rank from the metadata server, which needs TPU hardware; here
the worker gets it as JAX_COORDINATOR_ADDRESS/JAX_NUM_PROCESSES/JAX_PROCESS_ID,
and the simulated CPU devices of FAKE_XLA_FLAGS. The "image" has this test's Python with every
dependency: a fake `uv venv` makes a virtualenv whose python is that one and
whose `pip install` is recorded, not run (there is no network, and no TPU for
jax[tpu]). `describe` reports the VM's state, `delete` kills its processes and
wipes its disks, and `storage ls/cp/rm` act on the GCS API server that
STORAGE_EMULATOR_HOST names.

Not gcloud: `fake_tpu_cloud.py --preempt` is a maintenance event: SIGTERM to
every process of every worker (0.5 s apart), a wait until they have exited,
then the VM reports PREEMPTED.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

STATE = os.environ["FAKE_CLOUD"]
VM = os.path.join(STATE, "vm")
IMAGE_BIN = os.path.join(STATE, "image-bin")
WORKERS = int(os.environ.get("FAKE_WORKERS", "2"))

FAKE_CURL = """#!/usr/bin/env bash
# The TPU metadata server, for this worker.
url="${@: -1}"
case "$url" in
  */agent-worker-number) echo "$FAKE_WORKER" ;;
  */worker-network-endpoints) echo "%s" ;;
  *) exit 7 ;;
esac
"""

FAKE_UV = """#!/usr/bin/env bash
# `uv venv --seed --python V DIR`: a virtualenv whose python is the image's.
set -e
[ "$1" = venv ] || { echo "fake uv: only 'venv' is supported" >&2; exit 2; }
dir="${@: -1}"
mkdir -p "$dir/bin"
cat >"$dir/bin/python" <<'PY'
#!/usr/bin/env bash
if [ "${1:-} ${2:-} ${3:-}" = "-m pip install" ]; then
  echo "$*" >>"$FAKE_CLOUD/pip-installs.log"
  exit 0
fi
exec %s "$@"
PY
chmod +x "$dir/bin/python"
"""


def _log(args):
  with open(os.path.join(STATE, "calls.jsonl"), "a") as f:
    f.write(json.dumps(args) + "\n")


def _option(args, name, default=None):
  for a in args:
    if a.startswith(f"--{name}="):
      return a.split("=", 1)[1]
  return default


def _workers(args):
  which = _option(args, "worker", "0")
  return list(range(WORKERS)) if which == "all" else [int(which)]


def _home(worker):
  return os.path.join(VM, f"worker-{worker}")


def _read(name, default=None):
  path = os.path.join(VM, name)
  return open(path).read().strip() if os.path.exists(path) else default


def _write(name, text):
  with open(os.path.join(VM, name), "w") as f:
    f.write(text)


def _sessions():
  return [int(s) for s in (_read("sessions", "") or "").split()]


def _alive(session):
  try:
    os.killpg(session, 0)
    return True
  except (ProcessLookupError, PermissionError):
    return False


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def create():
  if os.path.exists(VM):
    sys.exit("ERROR: (gcloud.compute.tpus.tpu-vm.create) ALREADY_EXISTS: the node exists")
  for worker in range(WORKERS):
    os.makedirs(_home(worker))
  _write("port", str(_free_port()))
  _write("sessions", "")
  _write("state", "READY")
  os.makedirs(IMAGE_BIN, exist_ok=True)
  endpoints = ",".join(f"unknown:unknown:10.130.0.{w + 2}" for w in range(WORKERS))
  for name, text in (("curl", FAKE_CURL % endpoints), ("uv", FAKE_UV % sys.executable)):
    path = os.path.join(IMAGE_BIN, name)
    with open(path, "w") as f:
      f.write(text)
    os.chmod(path, 0o755)


def describe():
  state = _read("state")
  if state is None:
    sys.exit("ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND: Resource"
             " 'projects/p/locations/z/nodes/t1' was not found")
  print(state)


def delete():
  for session in _sessions():
    if _alive(session):
      os.killpg(session, signal.SIGKILL)
  shutil.rmtree(VM, ignore_errors=True)


def scp(args):
  positional = [a for a in args if not a.startswith("--")]
  sources, target = positional[:-1], positional[-1].split(":", 1)[1]
  for worker in _workers(args):
    for source in sources:
      dest = os.path.join(_home(worker), target) if target else _home(worker)
      shutil.copy(source, dest)


def ssh(args):
  command = _option(args, "command")
  procs = []
  for worker in _workers(args):
    env = dict(os.environ)
    env.update(
        HOME=_home(worker), PATH=f"{IMAGE_BIN}:{os.environ['PATH']}", FAKE_WORKER=str(worker),
        JAX_COORDINATOR_ADDRESS=f"localhost:{_read('port')}",
        JAX_NUM_PROCESSES=str(WORKERS), JAX_PROCESS_ID=str(worker),
        XLA_FLAGS=os.environ["FAKE_XLA_FLAGS"], JAX_PLATFORMS="cpu")
    procs.append(subprocess.Popen(["bash", "-c", command], env=env, cwd=_home(worker),
                                  start_new_session=True))
  _write("sessions", " ".join(str(s) for s in _sessions() + [p.pid for p in procs]))
  sys.exit(max(p.wait() for p in procs))


def _listing(url: str) -> list[str]:
  """What is directly in the bucket folder `url`, as gs:// URLs.

  Asked of the GCS API server over plain HTTP: `watch` lists the work
  directory every poll, and importing gcsfs for each took 0.7 CPU-s.
  """
  import urllib.parse  # pylint: disable=g-import-not-at-top
  import urllib.request  # pylint: disable=g-import-not-at-top

  bucket, _, folder = url.removeprefix("gs://").partition("/")
  prefix = folder.rstrip("/") + "/" if folder.strip("/") else ""
  query = urllib.parse.urlencode({"prefix": prefix, "delimiter": "/"})
  with urllib.request.urlopen(
      f"{os.environ['STORAGE_EMULATOR_HOST']}/storage/v1/b/{bucket}/o?{query}") as response:
    found = json.load(response)
  names = [p.rstrip("/") for p in found.get("prefixes", [])]
  names += [item["name"] for item in found.get("items", [])]
  return sorted(f"gs://{bucket}/{name}" for name in names)


def storage(args):
  verb, urls = args[1], [a for a in args[2:] if not a.startswith("--")]
  if verb == "ls":
    entries = _listing(urls[0])
    if not entries:
      sys.exit("ERROR: (gcloud.storage.ls) One or more URLs matched no objects.")
    print("\n".join(entries))
    return
  from etils import epath  # pylint: disable=g-import-not-at-top

  if verb == "cp":
    epath.Path(urls[1]).write_bytes(open(urls[0], "rb").read())
  elif verb == "rm":
    for url in urls:
      if epath.Path(url).exists():
        epath.Path(url).unlink()
  else:
    sys.exit(f"fake gcloud: storage {verb} is not supported")


def preempt():
  for session in _sessions():
    if _alive(session):
      os.killpg(session, signal.SIGTERM)
      time.sleep(0.5)
  deadline = time.monotonic() + 300
  while any(_alive(s) for s in _sessions()) and time.monotonic() < deadline:
    time.sleep(0.2)
  _write("state", "PREEMPTED")


def main(args):
  if args == ["--preempt"]:
    return preempt()
  _log(args)
  if args[:1] == ["storage"]:
    return storage(args)
  verb = args[3] if args[:3] == ["compute", "tpus", "tpu-vm"] else None
  handlers = {"create": create, "describe": describe, "delete": delete,
              "scp": lambda: scp(args[4:]), "ssh": lambda: ssh(args[4:])}
  if verb not in handlers:
    sys.exit(f"fake gcloud: {' '.join(args[:4])} is not supported")
  return handlers[verb]()


if __name__ == "__main__":
  main(sys.argv[1:])
