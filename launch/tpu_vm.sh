#!/usr/bin/env bash
# Run gemma-grpo training on a Cloud TPU VM (one host or a pod slice) from a laptop with gcloud.
#
#   launch/tpu_vm.sh run --name g1b --zone us-west4-a --project MY_PROJECT \
#     --accelerator v5litepod-8 --spot --workdir gs://MY_BUCKET/g1b --watch
#
# Every worker runs, from its copy of this repository:
#   python -m gemma_grpo.train --config CONFIG --workdir WORKDIR [--config.x.y=v ...]
# See launch/README.md, and `launch/tpu_vm.sh --help` for every command and option.
# REPO_DIR (default: this script's repository) is the checkout that `setup` copies.
# Written for bash 3.2 too (the macOS /bin/bash): no associative arrays, no ${v,,}, and
# empty arrays are expanded as ${a[@]+"${a[@]}"}.
set -euo pipefail

PROG="launch/tpu_vm.sh"
REPO_DIR="${REPO_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"

# Settings: environment first, then command-line options override them.
TPU_NAME="${TPU_NAME:-}"
ZONE="${ZONE:-}"
PROJECT="${PROJECT:-}"
ACCELERATOR_TYPE="${ACCELERATOR_TYPE:-}"
RUNTIME_VERSION="${RUNTIME_VERSION:-}"     # default chosen from ACCELERATOR_TYPE
CONFIG="${CONFIG:-configs/gemma3_1b.py}"   # relative to the repository root on the worker
WORKDIR="${WORKDIR:-}"                     # gs://bucket/path, shared by all hosts
GIT_URL="${GIT_URL:-}"                     # URL[@REF]; empty: copy this checkout
JAX_VERSION="${JAX_VERSION:-0.10.2}"       # jax[tpu]==JAX_VERSION on the workers
WORKER_PYTHON="${WORKER_PYTHON:-3.11}"     # uv-managed Python for the workers' virtualenv
SPOT="${SPOT:-0}"
PREEMPTIBLE="${PREEMPTIBLE:-0}"
QUEUED="${QUEUED:-0}"
MAX_RESTARTS="${MAX_RESTARTS:-10}"
POLL_SECONDS="${POLL_SECONDS:-60}"
DRY_RUN=0
WATCH=0
WORKER=0
FOLLOW=0
LINES=100
OVERRIDES=()

# Fixed paths on every worker, expanded there ($HOME is the worker's).
# shellcheck disable=SC2016
{
  R_REPO='$HOME/gemma-grpo'
  R_VENV='$HOME/gemma-grpo-venv'
  R_RUNNER='$HOME/gemma-grpo-train.sh'
  R_TOKEN='$HOME/.gemma-grpo-hf-token'
  R_LOGS='$HOME/gemma-grpo-logs'
}

usage() {
  cat <<EOF
Usage: $PROG COMMAND [options] [--config.KEY=VALUE ...] [-- extra trainer args]

Run gemma-grpo GRPO training on a Cloud TPU VM (single host or multi-host pod slice).

Commands:
  create   create the TPU VM (tpu-vm create), or a queued resource with --queued
  setup    copy this checkout (or --git URL[@REF] clone) to every worker and install it
  train    start training on all workers, detached (nohup); one log per worker
  logs     print the end of one worker's log (--worker N, --follow)
  status   TPU state, and whether training runs on each worker
  delete   delete the TPU VM (or the queued resource and its node)
  run      create, setup, train; with --watch, also watch (below)
  watch    poll the TPU until training finishes; on preemption delete, recreate,
           setup and train again (training resumes from the latest checkpoint in WORKDIR)

Options (environment variable in brackets):
  --name NAME            TPU VM name; also the queued resource name [TPU_NAME]
  --zone ZONE            e.g. us-west4-a [ZONE]
  --project PROJECT      Google Cloud project id [PROJECT]
  --accelerator TYPE     e.g. v5litepod-8, v4-32 (also --accelerator-type) [ACCELERATOR_TYPE]
  --version VERSION      TPU runtime; default from TYPE: v5litepod->v2-alpha-tpuv5-lite,
                         v5p->v2-alpha-tpuv5, v6e->v2-alpha-tpuv6e, v2/v3/v4->tpu-ubuntu2204-base
                         [RUNTIME_VERSION]
  --spot                 Spot VM [SPOT=1]
  --preemptible          preemptible VM (older TPU types; not with --queued) [PREEMPTIBLE=1]
  --queued               use a queued resource (queued-resources create/delete) [QUEUED=1]
  --config PATH          trainer config, relative to the repo (default: configs/gemma3_1b.py) [CONFIG]
  --workdir gs://B/P     checkpoints and logs; shared by all hosts, survives preemption [WORKDIR]
  --git URL[@REF]        setup clones URL (at REF) on every worker instead of copying [GIT_URL]
  --jax-version V        jax[tpu] version installed on the workers (default 0.10.2) [JAX_VERSION]
  --worker N             logs: which worker (default 0)
  --follow, -f           logs: keep following the log
  --lines N              logs: how many lines (default 100)
  --watch                run: keep watching after launching (see the watch command)
  --max-restarts N       watch: give up after N recreations (default 10) [MAX_RESTARTS]
  --poll-seconds S       watch: seconds between polls (default 60) [POLL_SECONDS]
  --dry-run              print every gcloud command (prefixed '+ ') and run none
  -h, --help             this help

--config.KEY=VALUE arguments (and anything after --) are passed to the trainer.
HF_TOKEN, if set, is copied to every worker as a mode-600 file (~/.gemma-grpo-hf-token) and
exported to the trainer from there; it never appears on a command line or in the output.

On each worker: repo ~/gemma-grpo, virtualenv ~/gemma-grpo-venv, launcher ~/gemma-grpo-train.sh,
logs ~/gemma-grpo-logs/train-worker-N.log (N = the worker's agent-worker-number from the TPU
metadata server, as used by --worker), exit status in train-worker-N.exit. When training
exits, worker 0 writes WORKDIR/DONE (exit 0) or WORKDIR/FAILED (otherwise).
EOF
}

die() { echo "$PROG: error: $*" >&2; exit 1; }
die2() { echo "$PROG: error: $*" >&2; exit 2; }
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

# Prints a note: to stdout under --dry-run (next to the commands), else to stderr.
note() { echo "# $*" >&3; }

# quote ARG: sets REPLY to ARG quoted for a POSIX shell, unquoted when that is safe.
quote() {
  local s="$1" q="'\\''"
  case "$s" in
    "") REPLY="''" ;;
    *[!A-Za-z0-9_@%+=:,./-]*) REPLY="'${s//\'/$q}'" ;;
    *) REPLY="$s" ;;
  esac
}

# show_cmd CMD...: prints '+ CMD' on one line, quoted so that it can be pasted into a shell.
show_cmd() {
  local line="+" a
  for a in "$@"; do
    case "$a" in
      --[a-z]*=*) quote "${a#*=}"; REPLY="${a%%=*}=$REPLY" ;;  # --command='...'
      *) quote "$a" ;;
    esac
    line="$line $REPLY"
  done
  echo "$line" >&3
}

# x CMD...: shows CMD, then runs it unless --dry-run.
x() {
  show_cmd "$@"
  if [[ "$DRY_RUN" == 1 ]]; then return 0; fi
  "$@"
}

# xq CMD...: like x, but shown only under --dry-run (for commands repeated while polling).
xq() {
  if [[ "$DRY_RUN" == 1 ]]; then show_cmd "$@"; return 0; fi
  "$@"
}

is_true() {
  case "$1" in 1 | true | TRUE | True | yes | YES | on | ON) return 0 ;; *) return 1 ;; esac
}

# ---------------------------------------------------------------------------------------
# Settings

need() {  # need VAR "how to set it": exit 2 when VAR is empty.
  if [[ -z "${!1:-}" ]]; then die2 "$1 is not set; $2"; fi
}

need_tpu() {
  need TPU_NAME "pass --name NAME or export TPU_NAME=NAME"
  need ZONE "pass --zone ZONE (e.g. us-west4-a) or export ZONE=..."
  need PROJECT "pass --project PROJECT_ID or export PROJECT=..."
}

need_create() {
  need_tpu
  need ACCELERATOR_TYPE "pass --accelerator TYPE (e.g. v5litepod-8, v4-32) or export ACCELERATOR_TYPE=..."
  if [[ "$PREEMPTIBLE" == 1 && "$SPOT" == 1 ]]; then
    die2 "--spot and --preemptible both given; choose one"
  fi
  if [[ "$PREEMPTIBLE" == 1 && "$QUEUED" == 1 ]]; then
    die2 "queued resources have no --preemptible; use --spot with --queued"
  fi
  if [[ -z "$RUNTIME_VERSION" ]]; then
    case "$ACCELERATOR_TYPE" in
      v5litepod-* | v5e-*) RUNTIME_VERSION="v2-alpha-tpuv5-lite" ;;
      v5p-*) RUNTIME_VERSION="v2-alpha-tpuv5" ;;
      v6e-*) RUNTIME_VERSION="v2-alpha-tpuv6e" ;;
      v2-* | v3-* | v4-*) RUNTIME_VERSION="tpu-ubuntu2204-base" ;;
      *) die2 "RUNTIME_VERSION is not set and there is no default for $ACCELERATOR_TYPE; pass --version (list: gcloud compute tpus tpu-vm versions list --zone=$ZONE)" ;;
    esac
  fi
}

need_workdir() {
  need WORKDIR "pass --workdir gs://BUCKET/PATH or export WORKDIR=gs://BUCKET/PATH"
  case "$WORKDIR" in
    gs://?*) ;;
    *) die2 "WORKDIR must be a gs:// path shared by all hosts (got '$WORKDIR'); pass --workdir gs://BUCKET/PATH" ;;
  esac
  while [[ "$WORKDIR" == gs://*/ ]]; do WORKDIR="${WORKDIR%/}"; done
  if [[ "$WORKDIR" != gs://[!/]* ]]; then die2 "WORKDIR has no bucket: '$WORKDIR'"; fi
  need CONFIG "pass --config PATH or export CONFIG=configs/gemma3_1b.py"
}

# ---------------------------------------------------------------------------------------
# gcloud wrappers

tpu_vm() {  # tpu_vm VERB ARGS...: gcloud compute tpus tpu-vm VERB ARGS --zone --project
  local verb="$1"
  shift
  x gcloud compute tpus tpu-vm "$verb" "$@" --zone="$ZONE" --project="$PROJECT"
}

ssh_all() {  # ssh_all REMOTE_COMMAND: run it on every worker at once.
  tpu_vm ssh "$TPU_NAME" --worker=all --command="$1"
}

# tpu_state: prints the TPU node state (or the queued resource state with --queued),
# NOT_FOUND when there is none; fails on other errors (auth, network).
tpu_state() {
  local out rc=0 err="$STAGE/describe.err"
  if [[ "$QUEUED" == 1 ]]; then
    out="$(xq gcloud compute tpus queued-resources describe "$TPU_NAME" --zone="$ZONE" \
      --project="$PROJECT" --format='value(state.state)' 2>"$err")" || rc=$?
  else
    out="$(xq gcloud compute tpus tpu-vm describe "$TPU_NAME" --zone="$ZONE" \
      --project="$PROJECT" --format='value(state)' 2>"$err")" || rc=$?
  fi
  if [[ "$DRY_RUN" == 1 ]]; then echo "READY"; return 0; fi
  if [[ "$rc" != 0 ]]; then
    if grep -q 'NOT_FOUND' "$err"; then echo "NOT_FOUND"; return 0; fi
    cat "$err" >&2
    return 1
  fi
  out="${out//[[:space:]]/}"
  echo "${out:-UNKNOWN}"
}

# markers: prints DONE or FAILED when worker 0 wrote that marker into WORKDIR, else nothing.
markers() {
  local out line found=""
  out="$(xq gcloud storage ls "$WORKDIR/" 2>/dev/null)" || true
  while IFS= read -r line; do
    case "$line" in
      */DONE) found="DONE"; break ;;
      */FAILED) found="FAILED" ;;
    esac
  done <<<"$out"
  echo "$found"
}

clear_markers() {
  x gcloud storage rm --quiet --continue-on-error "$WORKDIR/DONE" "$WORKDIR/FAILED" \
    >/dev/null 2>&1 || true
}

# ---------------------------------------------------------------------------------------
# Steps. Each returns non-zero on failure by itself: they also run inside `if`, where
# bash ignores set -e.

create_tpu() {
  local preempt=()
  if [[ "$SPOT" == 1 ]]; then preempt=(--spot); fi
  if [[ "$PREEMPTIBLE" == 1 ]]; then preempt=(--preemptible); fi
  if [[ "$QUEUED" == 1 ]]; then
    x gcloud compute tpus queued-resources create "$TPU_NAME" --zone="$ZONE" --project="$PROJECT" \
      --node-id="$TPU_NAME" --accelerator-type="$ACCELERATOR_TYPE" \
      --runtime-version="$RUNTIME_VERSION" ${preempt[@]+"${preempt[@]}"}
  else
    tpu_vm create "$TPU_NAME" --accelerator-type="$ACCELERATOR_TYPE" \
      --version="$RUNTIME_VERSION" ${preempt[@]+"${preempt[@]}"}
  fi
}

delete_tpu() {
  if [[ "$QUEUED" == 1 ]]; then
    x gcloud compute tpus queued-resources delete "$TPU_NAME" --zone="$ZONE" --project="$PROJECT" \
      --force --quiet
  else
    tpu_vm delete "$TPU_NAME" --quiet
  fi
}

# wait_ready: polls until the TPU is READY (queued resource: ACTIVE); fails if it is lost.
wait_ready() {
  local state last="" errors=0
  while :; do
    state="$(tpu_state)" || state=""
    if [[ "$DRY_RUN" == 1 ]]; then return 0; fi
    if [[ "$state" != "$last" ]]; then log "$TPU_NAME: ${state:-describe failed}"; fi
    last="$state"
    case "$state" in
      READY | ACTIVE) return 0 ;;
      PREEMPTED | TERMINATED | STOPPED | SUSPENDING | SUSPENDED | FAILED | NOT_FOUND) return 1 ;;
      "") errors=$((errors + 1)); if [[ "$errors" -ge 10 ]]; then return 1; fi ;;
      *) errors=0 ;;
    esac
    sleep "$POLL_SECONDS"
  done
}

# pack_checkout OUT: tars what git would commit (tracked + untracked-but-not-ignored files),
# minus runs/ and virtualenvs; without git, everything minus the usual excludes.
pack_checkout() {
  local out="$1" venvs=() d
  for d in "$REPO_DIR"/*/; do
    if [[ -f "$d/pyvenv.cfg" ]]; then d="${d%/}"; venvs+=("${d##*/}/"); fi
  done
  (
    cd "$REPO_DIR" || exit 1
    export COPYFILE_DISABLE=1  # no macOS ._ files
    if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
      git ls-files -z --cached --others --exclude-standard | {
        while IFS= read -r -d '' f; do
          keep=1
          case "$f" in runs/* | .venv/* | venv/*) keep=0 ;; esac
          for v in ${venvs[@]+"${venvs[@]}"}; do
            case "$f" in "$v"*) keep=0 ;; esac
          done
          if [[ "$keep" == 1 && (-e "$f" || -L "$f") ]]; then printf '%s\0' "$f"; fi
        done
      } | tar --null -T - -czf "$out"
    else
      local excludes=(--exclude=./.git --exclude=./runs --exclude=./.venv --exclude=./venv
        --exclude=__pycache__ --exclude='*.pyc')
      for v in ${venvs[@]+"${venvs[@]}"}; do excludes+=("--exclude=./${v%/}"); done
      tar "${excludes[@]}" -czf "$out" .
    fi
  )
}

# parse_git SPEC: sets GIT_REPO and GIT_REF from URL[@REF]. The ref is what follows the first
# '@' after the first '/' of the part after any scheme, so git@host:org/repo and
# https://user@host/repo keep their '@', and refs may contain '/'.
parse_git() {
  local spec="$1" scheme="" rest="$1" re='^([^/]*/[^@]*)@(.+)$'
  GIT_REPO="$spec"
  GIT_REF=""
  if [[ "$spec" == *://* ]]; then
    scheme="${spec%%://*}://"
    rest="${spec#*://}"
  fi
  if [[ "$rest" =~ $re ]]; then
    GIT_REPO="$scheme${BASH_REMATCH[1]}"
    GIT_REF="${BASH_REMATCH[2]}"
  fi
}

install_command() {  # JAX_VERSION and WORKER_PYTHON are checked to be plain versions.
  local jax="\"jax[tpu]==$JAX_VERSION\"" py="$WORKER_PYTHON"
  echo "export PATH=\"\$HOME/.local/bin:\$PATH\"" \
    "&& { command -v uv >/dev/null 2>&1 || python3 -m pip install --user --quiet uv" \
    "|| curl -LsSf https://astral.sh/uv/install.sh | sh; }" \
    "&& { [ -x \"$R_VENV/bin/python\" ] || uv venv --seed --python $py \"$R_VENV\"; }" \
    "&& \"$R_VENV/bin/python\" -m pip install --quiet -e \"$R_REPO\"" \
    "&& \"$R_VENV/bin/python\" -m pip install --quiet $jax" \
    "&& echo \"\$(hostname): gemma-grpo installed in $R_VENV\""
}

setup_tpu() {
  local install
  install="$(install_command)"
  if [[ -n "$GIT_URL" ]]; then
    parse_git "$GIT_URL"
    quote "$GIT_REPO"
    local fetch="rm -rf \"$R_REPO\" && git clone --quiet $REPLY \"$R_REPO\""
    if [[ -n "$GIT_REF" ]]; then
      quote "$GIT_REF"
      fetch="$fetch && git -C \"$R_REPO\" checkout --quiet $REPLY"
    fi
    ssh_all "set -euo pipefail; $fetch && $install" || return
  else
    local tarball="$STAGE/gemma-grpo.tar.gz"
    note "pack $REPO_DIR (git-tracked and untracked, not-ignored files; no runs/ or virtualenvs) into $tarball"
    if [[ "$DRY_RUN" != 1 ]]; then
      pack_checkout "$tarball" || { log "could not pack $REPO_DIR"; return 1; }
    fi
    tpu_vm scp "$tarball" "$TPU_NAME:gemma-grpo.tar.gz" --worker=all || return
    ssh_all "set -euo pipefail; rm -rf \"$R_REPO\" && mkdir -p \"$R_REPO\"\
 && tar -xzf \"\$HOME/gemma-grpo.tar.gz\" -C \"$R_REPO\" && rm -f \"\$HOME/gemma-grpo.tar.gz\"\
 && $install" || return
  fi
}

# write_runner FILE: the launcher each worker runs; CONFIG, WORKDIR and overrides baked in.
write_runner() {
  {
    echo '#!/usr/bin/env bash'
    echo "# Written by $PROG train. Runs gemma-grpo training on this TPU worker:"
    echo '#   bash ~/gemma-grpo-train.sh start    train in the background (nohup); log per worker'
    echo '#   bash ~/gemma-grpo-train.sh status   is training running here? how did it end?'
    echo '#   bash ~/gemma-grpo-train.sh run      train in the foreground (what start detaches)'
    echo 'set -uo pipefail'
    printf 'CONFIG=%q\n' "$CONFIG"
    printf 'WORKDIR=%q\n' "$WORKDIR"
    printf 'OVERRIDES=('
    local o
    for o in ${OVERRIDES[@]+"${OVERRIDES[@]}"}; do printf ' %q' "$o"; done
    printf ' )\n'
    cat <<'EOF'
repo="$HOME/gemma-grpo"
python="$HOME/gemma-grpo-venv/bin/python"
log_dir="$HOME/gemma-grpo-logs"
token_file="$HOME/.gemma-grpo-hf-token"

# This worker's index: TPU_WORKER_ID if set, else the TPU metadata server's
# agent-worker-number (the index `gcloud ... --worker=N` uses), else 0.
worker_index() {
  local w="${TPU_WORKER_ID:-}"
  if [[ -z "$w" ]]; then
    w="$(curl -sf --max-time 10 -H 'Metadata-Flavor: Google' \
      http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number \
      2>/dev/null)" || w=""
  fi
  if [[ "$w" =~ ^[0-9]+$ ]]; then echo "$w"; else echo 0; fi
}
worker="$(worker_index)"
log="$log_dir/train-worker-$worker.log"
pid_file="$log_dir/train-worker-$worker.pid"
exit_file="$log_dir/train-worker-$worker.exit"

# Running: launched, not yet exited (the exit file), and the process is there.
is_running() {
  [[ ! -f "$exit_file" && -f "$pid_file" ]] && kill -0 "$(<"$pid_file")" 2>/dev/null
}

upload() {  # upload FILE GS_URL
  if command -v gcloud >/dev/null 2>&1; then
    gcloud storage cp --quiet "$1" "$2"
  else
    gsutil -q cp "$1" "$2"
  fi
}

case "${1:-}" in
  start)
    if is_running; then
      echo "worker $worker: training already running (pid $(<"$pid_file")); log: $log" >&2
      exit 1
    fi
    if [[ ! -x "$python" ]]; then
      echo "worker $worker: $python not found; run 'launch/tpu_vm.sh setup' first" >&2
      exit 1
    fi
    mkdir -p "$log_dir"
    rm -f "$exit_file"
    nohup bash "$0" run >/dev/null 2>&1 </dev/null &
    echo "$!" >"$pid_file"
    echo "worker $worker: training started (pid $!); log: $log"
    ;;
  run)
    mkdir -p "$log_dir"
    rm -f "$exit_file"
    exec >>"$log" 2>&1
    # A preempted VM sends SIGTERM to everything; then the run did not fail, so no marker.
    terminated=0
    trap 'terminated=1' TERM INT
    if [[ -r "$token_file" ]]; then
      HF_TOKEN="$(<"$token_file")"
      export HF_TOKEN
    fi
    export PYTHONUNBUFFERED=1
    # Several hosts in the slice: the trainer joins them with
    # jax.distributed.initialize(), which reads ranks from the metadata server.
    endpoints="$(curl -sf --max-time 10 -H 'Metadata-Flavor: Google' \
      http://metadata.google.internal/computeMetadata/v1/instance/attributes/worker-network-endpoints \
      2>/dev/null)" || endpoints=""
    if [[ "$endpoints" == *,* ]]; then export GEMMA_GRPO_DISTRIBUTED=1; fi
    echo "[$(date -u +%FT%TZ)] worker $worker: python -m gemma_grpo.train --config $CONFIG" \
      "--workdir $WORKDIR ${OVERRIDES[*]+${OVERRIDES[*]}}"
    cd "$repo" || exit 1
    "$python" -m gemma_grpo.train --config "$CONFIG" --workdir "$WORKDIR" \
      ${OVERRIDES[@]+"${OVERRIDES[@]}"}
    rc=$?
    echo "$rc" >"$exit_file"
    echo "[$(date -u +%FT%TZ)] worker $worker: training exited with status $rc"
    if [[ "$worker" == 0 && "$terminated" == 0 ]]; then
      if [[ "$rc" == 0 ]]; then marker=DONE; else marker=FAILED; fi
      upload "$exit_file" "$WORKDIR/$marker" || echo "worker 0: could not write $WORKDIR/$marker"
    fi
    exit "$rc"
    ;;
  status)
    if is_running; then
      echo "worker $worker: training running (pid $(<"$pid_file")); log: $log"
    elif [[ -f "$exit_file" ]]; then
      echo "worker $worker: training exited with status $(<"$exit_file"); log: $log"
    else
      echo "worker $worker: training not running; log: $log"
    fi
    if [[ -s "$log" ]]; then echo "  last log line: $(tail -n 1 "$log")"; fi
    ;;
  *)
    echo "usage: bash $0 {start|run|status}" >&2
    exit 2
    ;;
esac
EOF
  } >"$1"
}

train_tpu() {
  local runner="$STAGE/gemma-grpo-train.sh" token="$STAGE/.gemma-grpo-hf-token" files shown o
  write_runner "$runner" || return
  files=("$runner")
  if [[ -n "${HF_TOKEN:-}" ]]; then
    if [[ "$DRY_RUN" != 1 ]]; then
      # printf is a builtin: the token is in no process's argv, and the file is mode 600.
      (umask 077 && printf '%s' "$HF_TOKEN" >"$token") || return
    fi
    files+=("$token")
  fi
  shown="python -m gemma_grpo.train"
  for o in --config "$CONFIG" --workdir "$WORKDIR" ${OVERRIDES[@]+"${OVERRIDES[@]}"}; do
    quote "$o"
    shown="$shown $REPLY"
  done
  note "every worker runs: ${HF_TOKEN:+HF_TOKEN=*** }$shown"
  clear_markers
  tpu_vm scp "${files[@]}" "$TPU_NAME:" --worker=all || return
  ssh_all "chmod 600 \"$R_TOKEN\" 2>/dev/null; bash \"$R_RUNNER\" start" || return
}

# watch_tpu: until worker 0 marks the run DONE (exit 0) or FAILED (exit 1), poll; when the
# TPU is preempted or gone, delete it, create it again, set it up and train again, which
# resumes from the latest checkpoint in WORKDIR; at most MAX_RESTARTS times.
watch_tpu() {
  if [[ "$DRY_RUN" == 1 ]]; then
    note "watch: every ${POLL_SECONDS}s, until WORKDIR/DONE or WORKDIR/FAILED appears:"
    markers >/dev/null
    tpu_state >/dev/null
    note "when the TPU is PREEMPTED/TERMINATED (queued: SUSPENDED/FAILED) or gone, at most $MAX_RESTARTS times:"
    delete_tpu
    note "then create, setup and train as above"
    return 0
  fi
  local restarts=0 state last="" marker errors=0
  log "watching $TPU_NAME every ${POLL_SECONDS}s until $WORKDIR/DONE (max restarts: $MAX_RESTARTS)"
  while :; do
    marker="$(markers)"
    if [[ "$marker" == DONE ]]; then
      log "training finished: $WORKDIR/DONE"
      return 0
    fi
    state="$(tpu_state)" || state=""
    if [[ "$state" != "$last" ]]; then log "$TPU_NAME: ${state:-describe failed}"; fi
    last="$state"
    case "$state" in
      READY | ACTIVE)
        errors=0
        # Trusted only while the TPU is up: a preempted worker may have died mid-write.
        if [[ "$marker" == FAILED ]]; then
          log "training failed ($WORKDIR/FAILED); see: $PROG logs --name $TPU_NAME --zone $ZONE --project $PROJECT"
          return 1
        fi
        ;;
      PREEMPTED | TERMINATED | SUSPENDED | FAILED | NOT_FOUND)
        errors=0
        if [[ "$restarts" -ge "$MAX_RESTARTS" ]]; then
          log "giving up: $TPU_NAME is $state after $restarts restarts (--max-restarts $MAX_RESTARTS)"
          return 1
        fi
        restarts=$((restarts + 1))
        log "$TPU_NAME is $state: recreating it (restart $restarts/$MAX_RESTARTS); training resumes from $WORKDIR"
        delete_tpu || log "delete failed; creating anyway"
        if create_tpu && wait_ready && setup_tpu && train_tpu; then
          log "restart $restarts: training relaunched"
        else
          log "restart $restarts did not complete; looking again in ${POLL_SECONDS}s"
        fi
        last=""
        ;;
      "")
        errors=$((errors + 1))
        if [[ "$errors" -ge 10 ]]; then
          log "giving up: could not describe $TPU_NAME $errors times in a row"
          return 1
        fi
        ;;
    esac
    sleep "$POLL_SECONDS"
  done
}

# ---------------------------------------------------------------------------------------
# Commands

cmd_create() {
  need_create
  create_tpu
  if [[ "$QUEUED" == 1 && "$DRY_RUN" != 1 ]]; then
    log "queued; setup works once it is ACTIVE: $PROG status --queued --name $TPU_NAME --zone $ZONE --project $PROJECT"
  fi
}
cmd_setup() { need_tpu; setup_tpu; }
cmd_train() { need_tpu; need_workdir; train_tpu; }
cmd_delete() { need_tpu; delete_tpu; }
cmd_watch() { need_create; need_workdir; watch_tpu; }

cmd_logs() {
  need_tpu
  local follow=""
  if [[ "$FOLLOW" == 1 ]]; then follow="-F "; fi
  tpu_vm ssh "$TPU_NAME" --worker="$WORKER" \
    --command="tail -n $LINES $follow\"$R_LOGS/train-worker-$WORKER.log\""
}

cmd_status() {
  need_tpu
  local state marker
  state="$(tpu_state)" || die "could not describe $TPU_NAME (see the gcloud error above)"
  if [[ "$DRY_RUN" != 1 ]]; then echo "TPU $TPU_NAME ($ZONE): $state"; fi
  case "$state" in
    READY | ACTIVE)
      ssh_all "if [ -f \"$R_RUNNER\" ]; then bash \"$R_RUNNER\" status;\
 else echo \"\$(hostname): training never started here\"; fi"
      ;;
  esac
  if [[ -n "$WORKDIR" ]]; then
    need_workdir
    marker="$(markers)"
    if [[ "$DRY_RUN" != 1 ]]; then echo "WORKDIR $WORKDIR: ${marker:-no DONE/FAILED marker yet}"; fi
  fi
}

cmd_run() {
  need_create
  need_workdir
  create_tpu
  wait_ready || die "$TPU_NAME did not become ready"
  setup_tpu
  train_tpu
  if [[ "$WATCH" == 1 ]]; then
    watch_tpu
  elif [[ "$DRY_RUN" != 1 ]]; then
    log "training started; follow it with: $PROG logs --name $TPU_NAME --zone $ZONE --project $PROJECT --follow"
  fi
}

# ---------------------------------------------------------------------------------------
# Arguments

set_opt() {  # set_opt OPTION VALUE
  case "$1" in
    --name) TPU_NAME="$2" ;;
    --zone) ZONE="$2" ;;
    --project) PROJECT="$2" ;;
    --accelerator | --accelerator-type) ACCELERATOR_TYPE="$2" ;;
    --version | --runtime-version) RUNTIME_VERSION="$2" ;;
    --config) CONFIG="$2" ;;
    --workdir) WORKDIR="$2" ;;
    --git) GIT_URL="$2" ;;
    --jax-version) JAX_VERSION="$2" ;;
    --worker) WORKER="$2" ;;
    --lines) LINES="$2" ;;
    --max-restarts) MAX_RESTARTS="$2" ;;
    --poll-seconds) POLL_SECONDS="$2" ;;
    *) die2 "unknown option $1 (see $PROG --help)" ;;
  esac
}

parse_args() {
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --) shift; OVERRIDES+=("$@"); break ;;
      --config.*) OVERRIDES+=("$1") ;;
      -h | --help) usage; exit 0 ;;
      --dry-run) DRY_RUN=1 ;;
      --spot) SPOT=1 ;;
      --preemptible) PREEMPTIBLE=1 ;;
      --queued) QUEUED=1 ;;
      --watch) WATCH=1 ;;
      --follow | -f) FOLLOW=1 ;;
      --*=*) set_opt "${1%%=*}" "${1#*=}" ;;
      --*)
        if [[ $# -lt 2 ]]; then die2 "$1 needs a value (see $PROG --help)"; fi
        set_opt "$1" "$2"
        shift
        ;;
      *) die2 "unexpected argument '$1' (see $PROG --help)" ;;
    esac
    shift
  done
  local v
  for v in SPOT PREEMPTIBLE QUEUED; do
    if is_true "${!v}"; then printf -v "$v" 1; else printf -v "$v" 0; fi
  done
  [[ "$WORKER" =~ ^[0-9]+$ ]] || die2 "--worker must be a worker index (0, 1, ...), got '$WORKER'"
  [[ "$LINES" =~ ^[0-9]+$ ]] || die2 "--lines must be a number, got '$LINES'"
  [[ "$MAX_RESTARTS" =~ ^[0-9]+$ ]] || die2 "MAX_RESTARTS (--max-restarts) must be a number, got '$MAX_RESTARTS'"
  [[ "$JAX_VERSION" =~ ^[0-9][0-9A-Za-z.+-]*$ ]] || die2 "JAX_VERSION (--jax-version) must be a version like 0.10.2, got '$JAX_VERSION'"
  [[ "$WORKER_PYTHON" =~ ^[0-9][0-9.]*$ ]] || die2 "WORKER_PYTHON must be a Python version like 3.11, got '$WORKER_PYTHON'"
  [[ "$POLL_SECONDS" =~ ^[0-9]+([.][0-9]+)?$ ]] ||
    die2 "POLL_SECONDS (--poll-seconds) must be a number of seconds, got '$POLL_SECONDS'"
}

main() {
  if [[ $# -eq 0 ]]; then usage >&2; exit 2; fi
  local command="$1"
  shift
  case "$command" in
    -h | --help | help) usage; exit 0 ;;
    create | setup | train | logs | status | delete | run | watch) ;;
    *) die2 "unknown command '$command' (see $PROG --help)" ;;
  esac
  parse_args "$@"
  if [[ "$DRY_RUN" != 1 ]] && ! command -v gcloud >/dev/null 2>&1; then
    die2 "gcloud is not on PATH; install the Google Cloud SDK (https://cloud.google.com/sdk/docs/install)"
  fi
  if [[ "$DRY_RUN" == 1 ]]; then exec 3>&1; else exec 3>&2; fi
  STAGE="$(mktemp -d "${TMPDIR:-/tmp}/gemma-grpo-launch.XXXXXX")"
  trap 'rm -rf "$STAGE"' EXIT
  "cmd_$command"
}

main "$@"
