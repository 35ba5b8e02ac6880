#!/usr/bin/env bash
# GSM8K, SFT then GRPO: the chain RESULTS.md reports, with its evidence kept.
#
#   bash bench/gsm8k.sh ../shared/data/gsm8k runs/gsm8k docs/results/gsm8k
#
# GSM8K_DIR holds GSM8K's train.jsonl and test.jsonl (as on the hub). Trains
# SFT (80 updates) and GRPO from it (20 steps), then evaluates the SFT model,
# the GRPO model and the base on GSM8K test problems 1-256 (greedy, 256 new
# tokens, batches of 16: problems 1-128 are the same eight batches as a
# 128-problem eval). Keeps every eval's eval.json and samples.jsonl.gz, the
# runs' metrics.jsonl and plots, each stage's console output and its wall
# time and peak RSS (/usr/bin/time -v) in EVIDENCE. About 2 h on 2 cores.
# With EVIDENCE = docs/results/gsm8k, `python bench/tables.py` writes RESULTS.md's
# GSM8K tables (every comparison, with its interval) from these files.
set -euo pipefail
GSM8K=$(realpath "$1"); RUNS=$2; EVIDENCE=$3
mkdir -p "$RUNS" "$EVIDENCE"
sed -n 1,256p "$GSM8K/test.jsonl" > "$RUNS/test_1_256.jsonl"
EVAL=(--data "$RUNS/test_1_256.jsonl" --num-test 256 --max-new-tokens 256 --batch-size 16)

stage() {  # stage NAME COMMAND...: run it, keep its console and time -v report
  local name=$1; shift
  echo "== $name: $*" | tee "$EVIDENCE/$name.console.txt"
  /usr/bin/time -v -o "$EVIDENCE/$name.time.txt" "$@" 2>&1 | tee -a "$EVIDENCE/$name.console.txt"
}
keep_eval() {  # keep_eval NAME: the eval files of runs/NAME in EVIDENCE/NAME
  mkdir -p "$EVIDENCE/$1"
  cp "$RUNS/$1/eval.json" "$EVIDENCE/$1/"
  gzip -9 -c "$RUNS/$1/samples.jsonl" > "$EVIDENCE/$1/samples.jsonl.gz"
}
keep_run() {  # keep_run WORKDIR NAME: a training run's metrics, plots and in-training evals
  mkdir -p "$EVIDENCE/$2"
  cp "$1/tensorboard/metrics.jsonl" "$EVIDENCE/$2/" 2>/dev/null || true
  cp -r "$1/plots" "$EVIDENCE/$2/"
  if [ -d "$1/eval" ]; then cp -r "$1/eval" "$EVIDENCE/$2/"; fi
}

stage sft gemma-grpo sft --config configs/gemma3_270m_sft.py \
    --config.data.source="$GSM8K/train.jsonl" --workdir "$RUNS/sft"
keep_run "$RUNS/sft" sft_run
stage eval_sft gemma-grpo eval --workdir "$RUNS/sft" "${EVAL[@]}" --out "$RUNS/eval_sft"
keep_eval eval_sft
stage grpo python -m gemma_grpo.train --config configs/gemma3_270m_sft_grpo.py \
    --config.model.init_lora_from="$RUNS/sft" \
    --config.data.source="$GSM8K/train.jsonl" --workdir "$RUNS/sft_grpo"
keep_run "$RUNS/sft_grpo" sft_grpo_run
stage eval_sft_grpo gemma-grpo eval --workdir "$RUNS/sft_grpo" "${EVAL[@]}" \
    --out "$RUNS/eval_sft_grpo" --compare "$RUNS/eval_sft"
keep_eval eval_sft_grpo
stage eval_base gemma-grpo eval --config configs/gemma3_270m_sft.py "${EVAL[@]}" \
    --out "$RUNS/eval_base"
keep_eval eval_base
echo "done: $EVIDENCE"
