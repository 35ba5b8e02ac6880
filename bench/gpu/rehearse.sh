#!/usr/bin/env bash
# Rehearses the GPU call on this CPU, as the lent machine would run it: a
# Python 3.12 environment holding the machine's own packages
# (bench/gpu/image.txt, CPU builds here), a copy of what the call sends (the
# working tree and .whl/), bench/gpu/run.sh --smoke in it with
# JAX_PLATFORMS=cpu. Its log and JSON go to docs/results/gpu/rehearsal/.
#   bash bench/gpu/fetch_wheels.sh && bash bench/gpu/rehearse.sh [IMAGE_VENV]
set -euo pipefail
cd "$(dirname "$0")/../.."
image=${1:-/tmp/gemma_grpo_gpu_image}
if [ ! -x "$image/bin/python3" ]; then
  py312=""
  for candidate in "$(command -v python3.12 || true)" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12.*/bin/python3; do
    if [ -z "$py312" ] && [ -x "$candidate" ] &&
       "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      py312=$candidate
    fi
  done
  "$py312" -m venv "$image"
  "$image/bin/python3" -m pip install --quiet --upgrade pip
  "$image/bin/python3" -m pip install --quiet -r bench/gpu/image.txt
  # What those packages' requirements added that the machine's image lacks (KINDS.md's list).
  "$image/bin/python3" -m pip uninstall --quiet -y annotated-types pydantic pydantic-core \
    typing-inspection tzdata
fi
device=$(mktemp -d)
git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$device"
cp -r .whl "$device/"
out=docs/results/gpu/rehearsal
mkdir -p "$out"
status=0
(cd "$device" && PATH="$image/bin:$PATH" OUT="$device/out" JAX_PLATFORMS=cpu \
   GEMMA_GRPO_SITE="$device/site" bash bench/gpu/run.sh --smoke) || status=$?
cp "$device/out/first_light.json" "$device/out/first_light.txt" "$out/"
{ echo "rehearsal: $(date -u '+%Y-%m-%d %H:%M UTC'), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs),"\
       "image $("$image/bin/python3" -c 'import platform, jax; print("Python", platform.python_version(), "jax", jax.__version__)'), exit $status"
  bash bench/gpu/travel_size.sh; } | tee -a "$out/first_light.txt"
rm -rf "$device"
exit "$status"
