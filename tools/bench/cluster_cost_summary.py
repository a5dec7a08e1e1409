#!/usr/bin/env python3
"""cluster_cost_summary.py <cluster-cost.jsonl>: medians over the rounds of cluster_cost.sh, and
what the 3-node cluster costs against one broker as ratios taken within each round (then their
median), as markdown."""
import sys

from bench_rounds import closed, load, med

rounds = load(sys.argv[1])


rs = list(rounds.values())
print(f"{len(rs)} rounds; medians, and cluster / single as the median of each round's ratio\n")
print("| scenario | single acks/s | cluster acks/s | acks ratio | single p50 / p99 us "
      "| cluster p50 / p99 us | p99 ratio |")
print("|---|---|---|---|---|---|---|")
for n in (1, 64):
    single = [closed(r["single"], n) for r in rs]
    cluster = [closed(r["cluster"], n) for r in rs]
    acks = med([c[0] / s[0] for s, c in zip(single, cluster)])
    p99 = med([c[2] / s[2] for s, c in zip(single, cluster)])
    print(f"| closed:{n} | {med([s[0] for s in single]):,.0f} | {med([c[0] for c in cluster]):,.0f} "
          f"| {acks:.2f}x | {med([s[1] for s in single]):,.0f} / {med([s[2] for s in single]):,.0f} "
          f"| {med([c[1] for c in cluster]):,.0f} / {med([c[2] for c in cluster]):,.0f} | {p99:.2f}x |")
