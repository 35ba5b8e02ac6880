"""Ad hoc (2026-12-04): the largest buffer kinds of a dumped XLA program.

  python aggregate_buffers.py DUMP_DIR [N]

Reads DUMP_DIR/*jit_loss*memory-usage-report.txt (XLA_FLAGS=--xla_dump_to)
and sums allocation sizes by shape (allocations one value owns) or by the
list of shapes sharing them; the first entry is the embedding argument.
"""
import collections
import pathlib
import re
import sys

report = next(pathlib.Path(sys.argv[1]).glob("*jit_loss*memory-usage-report.txt"))
mib = collections.Counter()
count = collections.Counter()
for line in report.read_text().splitlines():
  parts = line.split(";")
  if len(parts) < 5 or not parts[3].strip().isdigit():
    continue
  size, unit = re.match(r"([\d.]+)(GiB|MiB|KiB|B)", parts[1].strip()).groups()
  scale = {"GiB": 1024, "MiB": 1, "KiB": 1 / 1024, "B": 1 / 2**20}[unit]
  key = parts[4].strip() if int(parts[3]) == 1 else "shared: " + parts[4].strip()[:80]
  mib[key] += float(size) * scale
  count[key] += 1
for key, total in mib.most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 15):
  print(f"{total:8.1f} MiB  x{count[key]:3d}  {key[:120]}")
print(f"{sum(mib.values()):8.1f} MiB in all (arguments included)")
