# Evidence, committed with its output in 47f987b: it imports the module paths and signatures of then
# (they have moved since). To rerun it: git worktree add /tmp/at-47f987b 47f987b
# usage: REPO=<checkout> RUN_HOME=<home with ~/.cache/gemma_grpo/gemma-3-270m converted> \
#   bash run_two_processes.sh CACHE_DIR OUT_DIR [extra train flags]
# Two processes of 4 simulated CPU devices on one (fsdp=4, tp=2) mesh, configs/tiny.py, 4 steps.
cache=$1; out=$2; shift 2
rm -rf $out && mkdir -p $out
port=$((20000 + RANDOM % 20000))
cd "${REPO:-$(dirname "$0")/../../..}"; for r in 0 1; do HOME=${RUN_HOME:-$HOME} JAX_COMPILATION_CACHE_DIR=$cache JAX_LOG_COMPILES=1 JAX_EXPLAIN_CACHE_MISSES=1 XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu python -m gemma_grpo.cli train --config configs/tiny.py --config.rewards.custom=tests.toy_rewards:vowel_share --config.optim.peak_lr=0.05 --config.train.batch_size=4 --config.mesh.fsdp=4 --config.mesh.tp=2 --config.train.max_steps=4 --workdir $out/run --coordinator localhost:$port --num-processes 2 --process-id $r "$@" > $out/p$r.log 2>&1 & done
wait
grep "^step\|since start\|Traceback\|Error" $out/p0.log | cut -c1-150
echo "train_step compiles: $(grep -c 'Finished XLA compilation of jit(_train_step)' $out/p0.log)"
grep "Finished XLA compilation" $out/p0.log | awk '{t+=$(NF-1)} END {print "compile s", t}'
