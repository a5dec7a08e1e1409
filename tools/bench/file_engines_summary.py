#!/usr/bin/env python3
"""file_engines_summary.py <out dir>: medians over the runs of file_engines.sh, per engine and
scenario (acks/s, p50, p99, flushes/s), and the io_uring / threads ratio of each."""
import glob
import json
import os
import statistics
import sys

out = sys.argv[1]
rows = {}  # (engine, producers, size) -> list of scenarios
for path in sorted(glob.glob(os.path.join(out, "*-*.json"))):
    engine = os.path.basename(path).split("-")[0]
    for run in json.load(open(path))["runs"]:
        for s in run["scenarios"]:
            rows.setdefault((engine, s["producers"], s["record_size"]), []).append(s)

def med(engine, p, size, key):
    return statistics.median(s[key] for s in rows[(engine, p, size)])

keys = [("acks_per_s", "acks/s"), ("p50_us", "p50 us"), ("p99_us", "p99 us"),
        ("flushes_per_s", "flushes/s")]
print(f"{'producers':>9} {'bytes':>6} {'engine':>8} {'runs':>4} "
      + " ".join(f"{h:>10}" for _, h in keys))
for (engine, p, size) in sorted(k for k in rows if k[0] == "threads"):
    for e in ("threads", "uring"):
        if (e, p, size) not in rows:
            continue
        vals = [med(e, p, size, k) for k, _ in keys]
        print(f"{p:>9} {size:>6} {e:>8} {len(rows[(e, p, size)]):>4} "
              + " ".join(f"{v:>10.0f}" for v in vals))
    if ("uring", p, size) in rows:
        ratios = [med("uring", p, size, k) / med("threads", p, size, k) for k, _ in keys]
        print(f"{'':>9} {'':>6} {'ratio':>8} {'':>4} " + " ".join(f"{r:>10.2f}" for r in ratios))
