import sys, re, glob, collections
sys.path.insert(0, "docs/results/step_anatomy")
from traceparse import load
trdir, dumpdir, pattern, calls = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
# map fusion name -> result shape from the optimised HLO
hlo = sorted(glob.glob(f"{dumpdir}/*{pattern}*after_optimizations.txt"), key=len)
shape = {}
for f in hlo:
    for line in open(f):
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (\S+?) (fusion|custom-call|copy|transpose|dot|convolution)\(", line)
        if m: shape.setdefault(m.group(1), m.group(2))
tr = load(trdir); ev = tr["traceEvents"] if isinstance(tr, dict) else tr
agg = collections.Counter(); cnt = collections.Counter(); kind = collections.Counter()
for e in ev:
    if e.get("ph") != "X": continue
    n = e["name"]
    if n.startswith(("ThunkExecutor", "$", "Slinky", "PjitFunction")): continue
    base = re.sub(r"\.\d+$", "", n)
    key = (base, shape.get(n, "?"))
    agg[key] += e["dur"]; cnt[key] += 1; kind[base] += e["dur"]
print("by kind (s per call):")
for k, us in kind.most_common(15): print(f"  {us/1e6/calls:7.3f}  {k}")
print("by shape:")
for k, us in agg.most_common(40): print(f"  {us/1e6/calls:7.3f} s {cnt[k]/calls:6.0f} ops  {k[0]:28s} {k[1][:90]}")
