#!/usr/bin/env python3
"""front_door_summary.py <front-door.jsonl>: the medians over the rounds of front_door.sh, and the
issue's ratios computed within each round (then their median), as markdown tables for docs/performance.md.
"""
import json
import statistics
import sys


def load(path):
    rounds = {}
    for line in open(path):
        line = line.strip()
        if not line:
            continue
        d = json.loads(line)
        rounds.setdefault(d["round"], []).append(d)
    return rounds


def figures(lines):
    """One round's figures: name -> value (absent when that part did not run)."""
    f = {}
    for d in lines:
        data, phase = d["data"], d["phase"]
        if phase == "bench":
            run = data["runs"][0]
            f["device_alone"] = run["baseline"]["write_flush_per_s"]
            for s in run["scenarios"]:
                if s["record_size"] == 100:
                    f[f"inproc_{s['producers']}"] = s["acks_per_s"]
                    f[f"inproc_{s['producers']}_p50"] = s["p50_us"]
                    f[f"inproc_{s['producers']}_p99"] = s["p99_us"]
        elif phase in ("durable", "durable2", "ceiling"):
            for s in data["scenarios"]:
                kind, lat = s["kind"], s["latency"]
                if kind == "closed":
                    n = s["connections"]
                    f[f"{phase}_{n}"] = s["ops_per_s"]
                    f[f"{phase}_{n}_p50"] = lat["p50_us"]
                    f[f"{phase}_{n}_p99"] = lat["p99_us"]
                elif kind == "batched":
                    f["batched_records"] = s["records_per_s"]
                    f["batched_requests"] = s["requests_per_s"]
                    f["batched_p50"] = lat["p50_us"]
                    f["batched_p99"] = lat["p99_us"]
                    f["batched_name"] = s["scenario"]
                elif kind == "e2e":
                    e = s["e2e"]
                    f["e2e_ack_p50"] = e["ack_to_receive"]["p50_us"]
                    f["e2e_ack_p99"] = e["ack_to_receive"]["p99_us"]
                    f["e2e_send_p50"] = e["send_to_receive"]["p50_us"]
                    f["e2e_send_p99"] = e["send_to_receive"]["p99_us"]
                    f["e2e_early"] = e["early"] / max(e["matched"], 1)
                    f["e2e_name"] = s["scenario"]
                elif kind == "catchup":
                    f["catchup_records"] = s["records_per_s"]
                    f["catchup_mb"] = s["catchup"]["mb_per_s"]
                elif kind == "conns":
                    f["conns_name"] = s["scenario"]
                    f["conns_acks"] = s["ops_per_s"]
                    m = s.get("memory")
                    if m:
                        f["conns_rss_per"] = m["rss_per_connection_kib"]
                        f["conns_hwm_per"] = m["hwm_per_connection_kib"]
                        f["conns_rss_after"] = m["rss_after_kib"] / 1024
                        f["conns_hwm_after"] = m["hwm_after_kib"] / 1024
        elif phase == "redis":
            key = f"redis_{d['fsync']}_{d['clients']}"
            f[key] = data["rps"]
            f[key + "_p50"] = data["p50_latency_ms"] * 1000
            f[key + "_p99"] = data["p99_latency_ms"] * 1000

    def ratio(name, a, b):
        if a in f and b in f and f[b]:
            f[name] = f[a] / f[b]

    ratio("r_ceiling", "durable_64", "ceiling_64")
    ratio("r_redis_no", "durable_64", "redis_no_64")
    ratio("r_redis_always", "durable_64", "redis_always_64")
    ratio("r_device", "durable_1", "device_alone")
    ratio("r_inproc_1", "inproc_1", "device_alone")
    ratio("r_inproc_64", "inproc_64", "inproc_1")
    ratio("r_tail", "durable_64_p99", "durable_64_p50")
    ratio("r_two_devices", "durable2_64", "durable_64")
    return f


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: front_door_summary.py <front-door.jsonl>")
    rounds = load(sys.argv[1])
    per_round = [figures(rounds[r]) for r in sorted(rounds)]
    n = len(per_round)

    def med(key):
        vals = [f[key] for f in per_round if key in f and not isinstance(f[key], str)]
        return (statistics.median(vals), vals) if vals else (None, [])

    def name(key, default):
        for f in per_round:
            if key in f:
                return f[key]
        return default

    def fmt(v, kind):
        if v is None:
            return "-"
        if kind == "x":
            return f"{v:.2f}x"
        if kind == "us":
            return f"{v:,.0f} µs"
        if kind == "kib":
            return f"{v:,.1f} KiB"
        if kind == "mib":
            return f"{v:,.1f} MiB"
        if kind == "pct":
            return f"{100 * v:.1f}%"
        return f"{v:,.0f}"

    batched = name("batched_name", "batched")
    e2e = name("e2e_name", "e2e")
    conns = name("conns_name", "conns")
    # (label, key, kind, target, check)
    rows = [
        ("durable closed:64 / ceiling closed:64", "r_ceiling", "x", ">= 0.8x", lambda v: v >= 0.8),
        ("durable closed:64 / Redis appendfsync no, 64 clients", "r_redis_no", "x", ">= 0.8x", lambda v: v >= 0.8),
        ("durable closed:64 / Redis appendfsync always, 64 clients", "r_redis_always", "x", "", None),
        ("durable closed:64 p99 / p50", "r_tail", "x", "<= 2x", lambda v: v <= 2),
        ("durable closed:1 / device alone write+flush/s", "r_device", "x", ">= 0.8x", lambda v: v >= 0.8),
        ("two devices closed:64 / one device closed:64", "r_two_devices", "x", ">= 1.6x", lambda v: v >= 1.6),
        ("in process 1 producer / device alone", "r_inproc_1", "x", ">= 0.9x", lambda v: v >= 0.9),
        ("in process 64 producers / 1 producer", "r_inproc_64", "x", ">= 25x", lambda v: v >= 25),
        (f"durable {batched} records/s", "batched_records", "n", ">= 1,500,000", lambda v: v >= 1.5e6),
        (f"durable {e2e}: ack to receive p50", "e2e_ack_p50", "us", "<= 1,000 µs", lambda v: v <= 1000),
        (f"durable {e2e}: ack to receive p99", "e2e_ack_p99", "us", "", None),
        (f"durable {e2e}: send to receive p50", "e2e_send_p50", "us", "", None),
        (f"durable {e2e}: records received before their ack", "e2e_early", "pct", "", None),
        ("durable catchup: records/s (one partition, one consumer)", "catchup_records", "n", ">= 2,000,000", lambda v: v >= 2e6),
        ("durable catchup: MB/s", "catchup_mb", "n", "", None),
        (f"durable {conns}: server RSS per connection", "conns_rss_per", "kib", "bounded", None),
        (f"durable {conns}: server RSS with them open", "conns_rss_after", "mib", "", None),
        (f"durable {conns}: server VmHWM", "conns_hwm_after", "mib", "", None),
        (f"durable {conns}: acks/s", "conns_acks", "n", "", None),
    ]
    print(f"Medians of {n} round(s); ratios are computed within each round, then their median.\n")
    print("| figure | median | target | met | per round |")
    print("|---|---|---|---|---|")
    for label, key, kind, target, check in rows:
        v, vals = med(key)
        met = "" if v is None or check is None else ("yes" if check(v) else "no")
        each = ", ".join(fmt(x, kind) for x in vals)
        print(f"| {label} | {fmt(v, kind)} | {target} | {met} | {each} |")

    print("\nSide by side (100 B records or XADD fields, ops/s; p50 / p99 in µs; medians):\n")
    print("| system | 1 client ops/s | p50 / p99 | 64 clients ops/s | p50 / p99 |")
    print("|---|---|---|---|---|")
    systems = [
        ("device alone (1 writer, 4 KiB write + flush)", "device_alone", None),
        ("nvmq in process (`nvmq bench`, flush always)", "inproc_1", "inproc_64"),
        ("nvmq over Kafka, durable (flush always)", "durable_1", "durable_64"),
        ("nvmq over Kafka, durable, two devices", None, "durable2_64"),
        ("nvmq over Kafka, `--ceiling` (no log)", "ceiling_1", "ceiling_64"),
        ("Redis XADD, appendfsync always", "redis_always_1", "redis_always_64"),
        ("Redis XADD, appendfsync no", "redis_no_1", "redis_no_64"),
    ]
    for label, one, many in systems:
        cells = []
        for key in (one, many):
            if key is None:
                cells += ["", ""]
                continue
            v = med(key)[0]
            p50, p99 = med(key + "_p50")[0], med(key + "_p99")[0]
            lat = "" if p50 is None else f"{p50:,.0f} / {p99:,.0f}"
            cells += [fmt(v, "n"), lat]
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
