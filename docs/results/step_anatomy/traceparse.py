import gzip, json, sys, glob, collections
def load(d):
    f = sorted(glob.glob(d + "/**/*.trace.json.gz", recursive=True))[-1]
    return json.load(gzip.open(f))
def summarize(d, top=30, div=1):
    tr = load(d)
    ev = tr["traceEvents"] if isinstance(tr, dict) else tr
    names = {}
    for e in ev:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
    agg = collections.Counter(); cnt = collections.Counter()
    for e in ev:
        if e.get("ph") != "X": continue
        tn = names.get((e["pid"], e["tid"]), "")
        n = e["name"]
        agg[n] += e.get("dur", 0); cnt[n] += 1
    tot = 0
    for n, us in agg.most_common(top):
        print(f"{us/1e6/div:8.3f} s {cnt[n]:6d}  {n[:100]}")
if __name__ == "__main__":
    summarize(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30)
