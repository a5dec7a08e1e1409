#!/usr/bin/env python3
"""security_cost_summary.py <security-cost.jsonl>: medians over the rounds of security_cost.sh,
and each feature's cost as ratios taken within each round (then their median), as markdown."""
import sys

from bench_rounds import closed, load, med

rounds = load(sys.argv[1])


print("| scenario | plain acks/s | TLS acks/s | TLS / plain | authorizer acks/s | authorizer / plain |")
print("|---|---|---|---|---|---|")
for n in (1, 64):
    row = {c: [closed(r[c], n)[0] for r in rounds.values()] for c in ("plain", "tls", "acl")}
    tls_ratio = med([closed(r["tls"], n)[0] / closed(r["plain"], n)[0] for r in rounds.values()])
    acl_ratio = med([closed(r["acl"], n)[0] / closed(r["plain"], n)[0] for r in rounds.values()])
    print(f"| closed:{n} | {med(row['plain']):,.0f} | {med(row['tls']):,.0f} | {tls_ratio:.2f}x "
          f"| {med(row['acl']):,.0f} | {acl_ratio:.2f}x |")
for n in (1, 64):
    p50 = {c: med([closed(r[c], n)[1] for r in rounds.values()]) for c in ("plain", "tls", "acl")}
    p99 = {c: med([closed(r[c], n)[2] for r in rounds.values()]) for c in ("plain", "tls", "acl")}
    print(f"\nclosed:{n} p50/p99 us: plain {p50['plain']:.0f}/{p99['plain']:.0f}, "
          f"TLS {p50['tls']:.0f}/{p99['tls']:.0f}, authorizer {p50['acl']:.0f}/{p99['acl']:.0f}")
plain = [r["plain-connect"]["connects_per_s"] for r in rounds.values()]
tls = [r["tls-connect"]["connects_per_s"] for r in rounds.values()]
extra = [1e6 / r["tls-connect"]["connects_per_s"] - 1e6 / r["plain-connect"]["connects_per_s"]
         for r in rounds.values()]
print(f"\nconnect + ApiVersions + close: plain {med(plain):,.0f}/s, TLS {med(tls):,.0f}/s; "
      f"a TLS connection costs {med(extra):,.0f} us more (median of {len(rounds)} rounds)")
