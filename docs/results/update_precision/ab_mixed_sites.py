# Evidence, committed with its output in abd1839: it imports the module paths and signatures of then
# (they have moved since). To rerun it: git worktree add /tmp/at-abd1839 abd1839
import sys, time, subprocess, json
# run update_step with both checkouts alternating
for r in range(2):
  for name, pp in (("f32", "/work/main"), ("mixed", "/tmp/mp")):
    out = subprocess.run([sys.executable, "/work/main/bench/update_step.py", "--repeats", "3"], env={**__import__("os").environ, "PYTHONPATH": pp}, capture_output=True, text=True)
    d = json.loads(out.stdout.strip().splitlines()[-1]); print(name, d["median_seconds"], d["seconds"], d["loss"], d["gemma_grpo"], flush=True)
