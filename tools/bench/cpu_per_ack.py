#!/usr/bin/env python3
"""cpu_per_ack.py <kafka-bench command ...>: the CPU time the broker processes spend per
acknowledged record, by process and thread name.

PIDS (comma-separated) names the broker processes (one `nvmq serve`, or every node of a
cluster). The bench command must run one scenario with `--json`. After WARMUP seconds
(default 4: past kafka-bench's warm-up) the user and system time of every thread of those
processes is read from /proc, again WINDOW seconds later (default 6), and the difference is
divided by the acks the bench counted in that window (its rate times the window). Throughput
on this machine swings 2x from day to day; CPU per ack swings far less, and shows which
thread pays for what.
"""
import collections
import json
import os
import subprocess
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")


def ticks(pids):
    """(pid, thread name) -> user + system clock ticks, summed over threads of that name."""
    out = collections.Counter()
    for p in pids:
        for t in os.listdir(f"/proc/{p}/task"):
            try:
                st = open(f"/proc/{p}/task/{t}/stat").read()
            except OSError:
                continue  # the thread ended
            name = st[st.index("(") + 1:st.rindex(")")]
            fields = st[st.rindex(")") + 2:].split()
            out[(p, name)] += int(fields[11]) + int(fields[12])
    return out


def main():
    pids = [int(p) for p in os.environ["PIDS"].split(",")]
    bench = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, text=True)
    time.sleep(float(os.environ.get("WARMUP", "4")))
    before, t0 = ticks(pids), time.time()
    time.sleep(float(os.environ.get("WINDOW", "6")))
    after, t1 = ticks(pids), time.time()
    out, _ = bench.communicate()
    if bench.returncode != 0:
        sys.exit(f"the bench failed ({bench.returncode})")
    rate = json.loads(out)["scenarios"][0]["ops_per_s"]
    acks = rate * (t1 - t0)
    total = 0.0
    for (p, name), n in sorted(after.items()):
        us = (n - before.get((p, name), 0)) / HZ * 1e6 / acks
        total += us
        if us >= 0.05:
            print(f"{p} {name:20s} {us:7.1f} us/ack")
    print(f"total {total:.1f} us/ack at {rate:,.0f} acks/s")


main()
