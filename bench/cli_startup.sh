#!/usr/bin/env bash
# Seconds from a CLI command to its exit on bad input or --help (best of 3):
# what a user waits for a typo. Run from the checkout with the venv active.
# Usage: bash bench/cli_startup.sh
for cmd in "gemma-grpo export --help" "gemma-grpo eval --help" "gemma-grpo train --config nope.py" \
           "gemma-grpo sft --config nope.py" "gemma-grpo eval --config nope.py"; do
  best=999
  for _ in 1 2 3; do
    start=$(date +%s.%N); $cmd >/dev/null 2>&1; end=$(date +%s.%N)
    t=$(echo "$end - $start" | bc); best=$(echo "if ($t < $best) $t else $best" | bc)
  done
  printf "%.3f s  %s\n" "$best" "$cmd"
done
