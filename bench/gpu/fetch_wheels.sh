#!/usr/bin/env bash
# Downloads bench/gpu/wheels.txt as cp312 manylinux wheels into .whl/ (git
# ignores it; the device call carries it), then prints what would travel.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
grep -v '^\s*#' bench/gpu/wheels.txt | grep -v '^\s*$' | while read -r wheel; do
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d .whl "$wheel"
done
bash bench/gpu/travel_size.sh
