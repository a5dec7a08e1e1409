#!/bin/bash
# cluster_cost.sh <nvmq binary> <scratch dir> [rounds, default 3]
#
# What replication costs (issue 13): nvmq kafka-bench closed:1 and closed:64 (100 B records,
# acks=all, 8 partitions) against one `nvmq serve` and against a 3-node cluster (`--node-id`,
# `--peers`, on loopback), every node on a fresh file device of its own, all on this machine, in
# rounds that alternate the two so that the disk's drift hits them alike. The bench talks to the
# cluster's leader (found with `nvmq cluster status`). Output: <scratch>/cluster-cost.jsonl, one
# JSON object a line; cluster_cost_summary.py prints the medians and the ratios taken within
# each round. UNMERGED=1 adds a cluster whose leader writes every command as an entry of its
# own (--raft-merge-commands 1).
set -euo pipefail
. "$(dirname "$(realpath "$0")")/bench_lib.sh"
bench_args "$0" "$@"
DURATION=${DURATION:-5s}
SIZE=${SIZE:-2G}
BASE=${BASE:-19300}
out=$scratch/cluster-cost.jsonl
: > "$out"

stop_all() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
bench() { # <round> <config> <broker>
  local json
  json=$("$bin" kafka-bench --broker "$3" --duration "$DURATION" --json \
    --scenario closed:1,closed:64 --topic-prefix "kafka-bench-r$1")
  emit "$1" "$2" "$json"
}

cluster_round() { # <round> <config> [serve flags for every node...]
  local r=$1 config=$2 peers="" leader="" id st
  shift 2
  for id in 1 2 3; do
    peers+="${peers:+,}$id=127.0.0.1:$((BASE + id))/127.0.0.1:$((BASE + 10 + id))"
  done
  for id in 1 2 3; do
    dev="file:$scratch/n$id.img"
    "$bin" format --device "$dev" --size "$SIZE" --force > /dev/null
    serve_start "$scratch/n$id.log" --listen "127.0.0.1:$((BASE + id))" --device "$dev" \
      --node-id "$id" --peers "$peers" "$@"
    pids+=("$serve_pid")
  done
  for _ in $(seq 1 100); do
    if st=$("$bin" cluster status --json --bootstrap "127.0.0.1:$((BASE + 1)),127.0.0.1:$((BASE + 2)),127.0.0.1:$((BASE + 3))" 2>/dev/null); then
      leader=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["leader"])' "$st")
      break
    fi
    sleep 0.2
  done
  [ -n "$leader" ] || { echo "no leader elected" >&2; exit 1; }
  bench "$r" "$config" "127.0.0.1:$((BASE + leader))"
  stop_all
}

pids=()
for r in $(seq 1 "$rounds"); do
  # One broker.
  dev="file:$scratch/single.img"
  "$bin" format --device "$dev" --size "$SIZE" --force > /dev/null
  serve_start "$scratch/single.log" --listen "127.0.0.1:$BASE" --device "$dev"
  pids+=("$serve_pid")
  bench "$r" single "127.0.0.1:$BASE"
  stop_all
  # Three nodes; and, with UNMERGED=1, three nodes that write every command as an entry of
  # its own (--raft-merge-commands 1: the cluster before commands were merged).
  cluster_round "$r" cluster
  if [ "${UNMERGED:-0}" = 1 ]; then
    cluster_round "$r" cluster-unmerged --raft-merge-commands 1
  fi
done
python3 "$here/cluster_cost_summary.py" "$out"
