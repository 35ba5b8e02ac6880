"""Where a warm first step spends its compile time: JAX compile events, summed per (event, program).

  python bench/studies/compile_events.py --config configs/gemma3_270m.py --workdir /tmp/fs6 \
      --config.train.max_steps=2 --config.eval.every_steps=0 --config.ckpt.every_steps=2

A diagnostic run as it was made on 2026-12-02 (output: docs/results/first_step.txt):
the trainer under a listener of jax.monitoring duration events, plus wall
timers around JAX's cache-key computation and persistent-cache read (wrapped
here, in this script only). Prints the 12 largest totals at exit. Asserts nothing.
"""
import atexit, sys, collections, time
from gemma_grpo.commands import train
from jax import monitoring
from jax._src import compiler, cache_key
durs = collections.Counter()
monitoring.register_event_duration_secs_listener(lambda event, d, **kw: durs.__setitem__((event, kw.get("fun_name")), durs[(event, kw.get("fun_name"))] + d))
# time the cache-key computation and the cache read, by wrapping them here (a diagnostic, not product code)
orig_key = cache_key.get; orig_read = compiler._cache_read
def timed(name, fn):
  def wrapper(*a, **k):
    t = time.time(); out = fn(*a, **k); durs[(name, None)] += time.time() - t; return out
  return wrapper
cache_key.get = timed("cache_key.get", orig_key)
compiler._cache_read = timed("_cache_read", orig_read)
def report():
  for k, t in durs.most_common(12):
    print(f"{t:7.2f} {k}", file=sys.stderr)
atexit.register(report)
sys.exit(train.main(sys.argv[1:]))
