#!/usr/bin/env bash
# What a device call sends: tracked and untracked-not-ignored files, plus the
# carried .whl/ (the limit is 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/../.."
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
wheels=$(find .whl -name '*.whl' -printf '%s\n' 2>/dev/null | awk '{s += $1} END {print s + 0}')
awk -v t="$tree" -v w="$wheels" 'BEGIN {
  printf "travels: working tree %.1f MiB + wheels %.1f MiB = %.1f MiB of 64 MiB\n", t / 2^20, w / 2^20, (t + w) / 2^20
  if (t + w > 56 * 2^20) { print "too close to the 64 MiB limit" > "/dev/stderr"; exit 1 }
}'
