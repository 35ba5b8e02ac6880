#!/usr/bin/env bash
# Run gemma-grpo training on several GPU hosts: one process per host, all of a host's GPUs in it,
# joined by jax.distributed into one mesh.
#
#   launch/gpu_cluster.sh slurm --nodes 2 --gpus-per-node 8 --workdir gs://BUCKET/g1b
#   launch/gpu_cluster.sh hosts --hosts 10.0.0.2,10.0.0.3 --workdir gs://BUCKET/g1b
#
# `slurm` writes a batch script and submits it with sbatch; srun starts one task per node and
# JAX reads each task's rank from SLURM's variables. `hosts` starts the trainer on each host
# over ssh with explicit ranks (--coordinator/--num-processes/--process-id), waits for all, and
# keeps one log per host. Each host needs this repository and its virtualenv at the same path.
# See launch/README.md. Written for bash 3.2 too (macOS).
set -euo pipefail

PROG="launch/gpu_cluster.sh"
REPO_DIR="${REPO_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"

CONFIG="${CONFIG:-configs/gemma3_1b.py}"
WORKDIR="${WORKDIR:-}"
REMOTE_REPO="${REMOTE_REPO:-$REPO_DIR}"     # the repository on every host
PYTHON="${PYTHON:-$REMOTE_REPO/.venv/bin/python}"
NODES="${NODES:-2}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
PARTITION="${PARTITION:-}"
TIME_LIMIT="${TIME_LIMIT:-}"
JOB_NAME="${JOB_NAME:-gemma-grpo}"
HOSTS="${HOSTS:-}"
PORT="${PORT:-8476}"
LOG_DIR="${LOG_DIR:-runs/logs}"
DRY_RUN=0
OVERRIDES=()

usage() {
  cat <<EOF
Usage: $PROG slurm [options] [--config.KEY=VALUE ...] [-- extra trainer args]
       $PROG hosts --hosts H0,H1,... [options] [--config.KEY=VALUE ...] [-- extra trainer args]

Commands:
  slurm   write a batch script (one task per node) and submit it with sbatch
  hosts   ssh to each host, start its process with its rank, wait for all; host 0 coordinates

Options (environment variable in brackets):
  --config PATH          trainer config, relative to the repository (default configs/gemma3_1b.py) [CONFIG]
  --workdir DIR          gs://BUCKET/PATH or a file system every host shares [WORKDIR]
  --repo DIR             the repository on every host (default: this checkout's path) [REMOTE_REPO]
  --python PATH          the Python on every host (default REPO/.venv/bin/python) [PYTHON]
  --log-dir DIR          where logs go (slurm: on the cluster; hosts: here) (default runs/logs) [LOG_DIR]
  slurm:
  --nodes N              nodes, one task each (default 2) [NODES]
  --gpus-per-node G      GPUs per node (default 8) [GPUS_PER_NODE]
  --partition P          SLURM partition [PARTITION]
  --time T               SLURM time limit, e.g. 24:00:00 [TIME_LIMIT]
  --job-name NAME        (default gemma-grpo) [JOB_NAME]
  hosts:
  --hosts H0,H1,...      the hosts, process 0 first; ssh must reach each without a password [HOSTS]
  --port P               process 0's coordination port on H0 (default 8476) [PORT]
  --dry-run              print what would run (commands prefixed '+ ') and run nothing
  -h, --help             this help

--config.KEY=VALUE arguments (and anything after --) are passed to the trainer.
EOF
}

die2() { echo "$PROG: error: $*" >&2; exit 2; }

quote() {  # sets REPLY to $1 quoted for a POSIX shell, unquoted when that is safe
  local s="$1" q="'\\''"
  case "$s" in
    "") REPLY="''" ;;
    *[!A-Za-z0-9_@%+=:,./-]*) REPLY="'${s//\'/$q}'" ;;
    *) REPLY="$s" ;;
  esac
}

joined() {  # joined ARGS...: sets REPLY to the args quoted and joined by spaces
  local out="" a
  for a in "$@"; do quote "$a"; out="${out:+$out }$REPLY"; done
  REPLY="$out"
}

trainer_args() {  # the trainer's command line, quoted, without rank flags
  joined "$PYTHON" -m gemma_grpo.train --config "$CONFIG" --workdir "$WORKDIR" \
    ${OVERRIDES[@]+"${OVERRIDES[@]}"}
}

need() { if [[ -z "${!1:-}" ]]; then die2 "$1 is not set; $2"; fi; }

batch_script() {
  local train
  trainer_args
  train="$REPLY"
  quote "$REMOTE_REPO"
  local repo="$REPLY"
  quote "$LOG_DIR"
  local logs="$REPLY"
  echo '#!/usr/bin/env bash'
  echo "#SBATCH --job-name=$JOB_NAME"
  echo "#SBATCH --nodes=$NODES"
  echo '#SBATCH --ntasks-per-node=1'
  echo "#SBATCH --gpus-per-node=$GPUS_PER_NODE"
  echo "#SBATCH --output=$LOG_DIR/%x-%j.log"
  if [[ -n "$PARTITION" ]]; then echo "#SBATCH --partition=$PARTITION"; fi
  if [[ -n "$TIME_LIMIT" ]]; then echo "#SBATCH --time=$TIME_LIMIT"; fi
  echo "# Written by $PROG. One task per node; JAX reads each task's rank from SLURM_*."
  echo 'set -euo pipefail'
  echo "cd $repo && mkdir -p $logs"
  echo 'export PYTHONUNBUFFERED=1'
  echo '# If one task fails, srun stops the others (the trainer also does, within seconds).'
  echo "srun --kill-on-bad-exit=1 $train"
}

cmd_slurm() {
  [[ "$NODES" =~ ^[1-9][0-9]*$ ]] || die2 "--nodes must be a positive number, got '$NODES'"
  [[ "$GPUS_PER_NODE" =~ ^[0-9]+$ ]] || die2 "--gpus-per-node must be a number, got '$GPUS_PER_NODE'"
  local script
  if [[ "$DRY_RUN" == 1 ]]; then
    echo "# batch script:"
    batch_script
    echo "+ sbatch BATCH_SCRIPT"
    return 0
  fi
  command -v sbatch >/dev/null 2>&1 || die2 "sbatch is not on PATH; run this on a SLURM login node"
  mkdir -p "$LOG_DIR"
  script="$LOG_DIR/$JOB_NAME.sbatch"
  batch_script >"$script"
  echo "batch script: $script" >&2
  sbatch "$script"
}

cmd_hosts() {
  need HOSTS "pass --hosts H0,H1,... (process 0's host first)"
  [[ "$PORT" =~ ^[0-9]+$ ]] || die2 "--port must be a number, got '$PORT'"
  local hosts=() host i=0 train remote pids=() codes=0 rc
  IFS=, read -r -a hosts <<<"$HOSTS"
  [[ "${#hosts[@]}" -ge 1 && -n "${hosts[0]}" ]] || die2 "--hosts is empty"
  trainer_args
  train="$REPLY"
  quote "$REMOTE_REPO"
  local repo="$REPLY"
  if [[ "$DRY_RUN" != 1 ]]; then mkdir -p "$LOG_DIR"; fi
  for host in "${hosts[@]}"; do
    remote="cd $repo && PYTHONUNBUFFERED=1 exec $train --coordinator ${hosts[0]}:$PORT"
    remote="$remote --num-processes ${#hosts[@]} --process-id $i"
    joined ssh "$host" "$remote"
    echo "+ $REPLY > $LOG_DIR/host-$i.log 2>&1 &"
    if [[ "$DRY_RUN" != 1 ]]; then
      # shellcheck disable=SC2029  # expanded here on purpose: each host's own rank
      ssh "$host" "$remote" >"$LOG_DIR/host-$i.log" 2>&1 </dev/null &
      pids+=("$!")
    fi
    i=$((i + 1))
  done
  if [[ "$DRY_RUN" == 1 ]]; then return 0; fi
  i=0
  for host in "${hosts[@]}"; do
    rc=0
    wait "${pids[$i]}" || rc=$?
    echo "host $i ($host): exit $rc; log $LOG_DIR/host-$i.log" >&2
    if [[ "$rc" != 0 && "$codes" == 0 ]]; then codes="$rc"; fi
    i=$((i + 1))
  done
  return "$codes"
}

set_opt() {
  case "$1" in
    --config) CONFIG="$2" ;;
    --workdir) WORKDIR="$2" ;;
    --repo) REMOTE_REPO="$2"; PYTHON="${PYTHON_SET:-$2/.venv/bin/python}" ;;
    --python) PYTHON="$2"; PYTHON_SET="$2" ;;
    --log-dir) LOG_DIR="$2" ;;
    --nodes) NODES="$2" ;;
    --gpus-per-node) GPUS_PER_NODE="$2" ;;
    --partition) PARTITION="$2" ;;
    --time) TIME_LIMIT="$2" ;;
    --job-name) JOB_NAME="$2" ;;
    --hosts) HOSTS="$2" ;;
    --port) PORT="$2" ;;
    *) die2 "unknown option $1 (see $PROG --help)" ;;
  esac
}

main() {
  if [[ $# -eq 0 ]]; then usage >&2; exit 2; fi
  local command="$1"
  shift
  case "$command" in
    -h | --help | help) usage; exit 0 ;;
    slurm | hosts) ;;
    *) die2 "unknown command '$command' (see $PROG --help)" ;;
  esac
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --) shift; OVERRIDES+=("$@"); break ;;
      --config.*) OVERRIDES+=("$1") ;;
      -h | --help) usage; exit 0 ;;
      --dry-run) DRY_RUN=1 ;;
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
  need WORKDIR "pass --workdir gs://BUCKET/PATH (or a file system every host shares)"
  "cmd_$command"
}

main "$@"
