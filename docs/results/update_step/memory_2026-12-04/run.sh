# Ad hoc, 2026-12-04; /tmp/ab_old is `git archive da7deed`. Output: output.txt.
cd "$(dirname "$0")"
for p in none gateup nothing; do
  rm -rf /tmp/xla_dump_$p
  XLA_FLAGS=--xla_dump_to=/tmp/xla_dump_$p PYTHONPATH=/tmp/ab_old python remat_trials.py $p 2>/dev/null | tail -1
  python aggregate_buffers.py /tmp/xla_dump_$p 8
done
# After f368d0a (the recomputed feed-forward): this checkout, as it is.
rm -rf /tmp/xla_dump_new
XLA_FLAGS=--xla_dump_to=/tmp/xla_dump_new PYTHONPATH=../../../.. python remat_trials.py none 2>/dev/null | tail -1
python aggregate_buffers.py /tmp/xla_dump_new 8
