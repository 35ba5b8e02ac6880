import sys, re, glob, collections
sys.path.insert(0, "docs/results/step_anatomy")
from traceparse import load
trdir, dumpdir, pattern = sys.argv[1], sys.argv[2], sys.argv[3]
hlo = sorted(glob.glob(f"{dumpdir}/*{pattern}*after_optimizations.txt"), key=len)
shape = {}
for fn in hlo:
    for line in open(fn):
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (\S+?) ([a-z\-]+)\(", line)
        if m: shape.setdefault(m.group(1), m.group(2))
tr = load(trdir); ev = tr["traceEvents"] if isinstance(tr, dict) else tr
skip = ("ThunkExecutor", "$", "Slinky", "PjitFunction", "Common", "Handle", "Allocate", "Parse", "end:")
ops = [e for e in ev if e.get("ph") == "X" and not e["name"].startswith(skip)]
# only thread-level distinct: one op may appear on several threads (ynn workers). key by (tid)
pts = []
for i, e in enumerate(ops):
    pts.append((e["ts"], 1, i)); pts.append((e["ts"] + e["dur"], -1, i))
pts.sort(key=lambda p: (p[0], p[1]))
active = set(); last = pts[0][0]; conc = collections.Counter(); solo = collections.Counter()
for t, d, i in pts:
    dt = t - last
    threads = {ops[j]["tid"] for j in active}
    conc[len(threads)] += dt
    if len(threads) == 1:
        names = {ops[j]["name"] for j in active}
        for n in names: solo[(re.sub(r"\.\d+$", "", n), shape.get(n, "?"))] += dt / len(names)
    if d == 1: active.add(i)
    else: active.discard(i)
    last = t
tot = sum(conc.values())
print("span ms", tot/1e3, {k: round(v/1e3) for k, v in sorted(conc.items())})
tids = collections.Counter(); 
for e in ops: tids[e["tid"]] += e["dur"]
print("busy per thread ms", {k: round(v/1e3) for k,v in tids.items()})
print("one-thread-only time by op:")
for k, v in solo.most_common(25): print(f"  {v/1e3:8.1f} ms  {k[0]:28s} {k[1][:80]}")
