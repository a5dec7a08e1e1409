#!/usr/bin/env python3
"""cluster_cost_summary.py <cluster-cost.jsonl>: medians over the rounds of cluster_cost.sh, and
what the 3-node cluster costs against one broker as ratios taken within each round (then their
median), as markdown. With UNMERGED=1 rounds, a second table sets the cluster against one that
writes every command as an entry of its own."""
import sys

from bench_rounds import closed, load, med

rounds = load(sys.argv[1])
rs = list(rounds.values())


def table(base, other, base_name, other_name):
    """One row per scenario: `other` against `base`, ratios taken within each round."""
    print(f"| scenario | {base_name} acks/s | {other_name} acks/s | acks ratio "
          f"| {base_name} p50 / p99 us | {other_name} p50 / p99 us | p99 ratio |")
    print("|---|---|---|---|---|---|---|")
    for n in (1, 64):
        b = [closed(r[base], n) for r in rs]
        o = [closed(r[other], n) for r in rs]
        acks = med([y[0] / x[0] for x, y in zip(b, o)])
        p99 = med([y[2] / x[2] for x, y in zip(b, o)])
        print(f"| closed:{n} | {med([x[0] for x in b]):,.0f} | {med([y[0] for y in o]):,.0f} "
              f"| {acks:.2f}x | {med([x[1] for x in b]):,.0f} / {med([x[2] for x in b]):,.0f} "
              f"| {med([y[1] for y in o]):,.0f} / {med([y[2] for y in o]):,.0f} | {p99:.2f}x |")


print(f"{len(rs)} rounds; medians, and cluster / single as the median of each round's ratio\n")
table("single", "cluster", "single", "cluster")
if all("cluster-unmerged" in r for r in rs):
    print("\nmerged commands (the default) against one entry per command "
          "(--raft-merge-commands 1), as the median of each round's ratio\n")
    table("cluster-unmerged", "cluster", "unmerged", "merged")
