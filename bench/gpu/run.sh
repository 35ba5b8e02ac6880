#!/usr/bin/env bash
# The one command for a lent GPU machine (bench/gpu/README.md): install the
# carried wheels without a network, then first_light.py into $OUT.
#   bash bench/gpu/run.sh [first_light.py flags]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/first_light}
mkdir -p "$OUT"
site=${GEMMA_GRPO_SITE:-/tmp/site}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$site" .whl/*.whl || { echo "run.sh: installing .whl/ failed" >&2; exit 1; }
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jax_cache}
nvidia-smi 2>&1 | head -15 | tee "$OUT/nvidia_smi.txt"
timeout -k 10 "${FIRST_LIGHT_TIMEOUT:-470}" python3 bench/gpu/first_light.py --out "$OUT" "$@" 2>&1 \
  | tee "$OUT/first_light.txt"
exit "${PIPESTATUS[0]}"
