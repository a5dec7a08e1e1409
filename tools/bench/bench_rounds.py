"""What the summaries of the round-alternating benchmarks share (cluster_cost_summary.py,
security_cost_summary.py): their JSON lines by round and configuration, a kafka-bench closed-loop
scenario's figures, and the median."""
import json
import statistics


def load(path):
    """{round: {config: data}} from a file of {"round", "config", "data"} lines."""
    rounds = {}
    for line in open(path):
        if line.strip():
            d = json.loads(line)
            rounds.setdefault(d["round"], {})[d["config"]] = d["data"]
    return rounds


def closed(data, n):
    """(acks/s, p50 us, p99 us) of kafka-bench's closed:n scenario in `data`."""
    for s in data["scenarios"]:
        if s["kind"] == "closed" and s["connections"] == n:
            return s["ops_per_s"], s["latency"]["p50_us"], s["latency"]["p99_us"]
    raise SystemExit(f"no closed:{n} in {data}")


def med(xs):
    return statistics.median(xs)
