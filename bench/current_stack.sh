#!/usr/bin/env bash
# The offline default on one Python's stack: versions, `pip check`, 2 training
# steps (8 held-out problems evaluated before and after), then `eval --workdir`.
#   bash bench/current_stack.sh VENV > docs/results/stack/pythonX.Y.txt
# VENV: a virtual environment holding `pip install -e .` of this checkout
# (.ci/run makes .venv on Python 3.11 and .venv312 on 3.12). About 6 min on a 2-core CPU.
set -euo pipefail
venv=$(cd "$1" && pwd)
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
cp -r "$repo/configs" "$work/"
cd "$work"
export JAX_PLATFORMS=cpu
echo "$ $venv/bin/python -VV; pip list; pip check   ($(date -u '+%Y-%m-%d %H:%M UTC'), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
"$venv/bin/python" -VV
"$venv/bin/python" -m pip list 2>/dev/null | grep -iE '^(jax|jaxlib|flax|optax|orbax-checkpoint|google-tunix|qwix|grain|numpy|transformers) '
"$venv/bin/python" -m pip check
quiet() { grep -vE 'cuda drivers|absl::Init|^WARNING: All log|Warning|^  |^For other|variable\[|warnings.warn'; }
args=(--config configs/gemma3_270m.py --workdir runs/gemma3_270m --config.train.max_steps=2
      --config.eval.num_examples=8 --config.eval.batch_size=8)
echo "$ python -m gemma_grpo.train ${args[*]}"
"$venv/bin/python" -m gemma_grpo.train "${args[@]}" 2>&1 | quiet
echo "$ gemma-grpo eval --workdir runs/gemma3_270m --num-test 8"
"$venv/bin/gemma-grpo" eval --workdir runs/gemma3_270m --num-test 8 2>&1 | quiet
rm -rf "$work"
