#!/bin/bash
# front_door.sh <nvmq binary> <scratch dir> [rounds, default 3]
#
# The front-door comparison: per round, in this fixed order,
#   (a) nvmq bench on a fresh file: the device alone (1 writer, 4 KiB write + flush) and in
#       process 1 and 64 producers x 100 B;
#   (b) nvmq serve (flush always, fresh file) measured by nvmq kafka-bench --broker from another
#       process: closed:1, closed:64, batched, e2e, catchup, conns (with --server-pid); then SIGTERM;
#   (b2) the same with two device files (two logs, two writers, on the two event loops):
#       closed:64 (its topic's partitions spread over both devices);
#   (c) nvmq serve --ceiling (Produce checked and answered without the log): closed:1, closed:64;
#   (d) Redis (Debian's redis-server) with appendonly yes, appendfsync always then no, each on a
#       fresh dir and port: redis-benchmark -P 1 --csv XADD k '*' d <100 B> at -c 64 and -c 1,
#       -n sized for about REDIS_SECONDS.
# Everything goes to <scratch>/front-door.jsonl, one JSON object a line ({"round", "phase", ...});
# front_door_summary.py <scratch>/front-door.jsonl prints the medians and ratios as markdown.
#
# Knobs (environment): DURATION (3s, per kafka-bench / bench scenario), REDIS_SECONDS (5),
# BATCHED (64x100), E2E (8), CATCHUP_RECORDS (2000000), CONNS (1024), CLIENT_THREADS (1),
# SERVE_SIZE (2G), BENCH_SIZE (1G), PORT (19092; the script uses PORT..PORT+3).
# SERVE_EXTRA: more flags for every `nvmq serve` (e.g. "--loops 1").
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 <nvmq binary> <scratch dir> [rounds]" >&2
  exit 2
fi
bin=$(realpath "$1")
scratch=$2
rounds=${3:-3}
DURATION=${DURATION:-3s}
REDIS_SECONDS=${REDIS_SECONDS:-5}
BATCHED=${BATCHED:-64x100}
E2E=${E2E:-8}
CATCHUP_RECORDS=${CATCHUP_RECORDS:-2000000}
CONNS=${CONNS:-1024}
CLIENT_THREADS=${CLIENT_THREADS:-1}
SERVE_SIZE=${SERVE_SIZE:-2G}
BENCH_SIZE=${BENCH_SIZE:-1G}
PORT=${PORT:-19092}

[ -x "$bin" ] || { echo "$bin is not an executable" >&2; exit 2; }
case "$rounds" in ''|*[!0-9]*) echo "rounds must be a number, not '$rounds'" >&2; exit 2;; esac
if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
  echo "installing redis-server from Debian" >&2
  apt-get install -y redis-server >&2
fi
mkdir -p "$scratch"
scratch=$(realpath "$scratch")
out=$scratch/front-door.jsonl
: > "$out"
payload=$(head -c 100 /dev/zero | tr '\0' x)
read -r -a serve_extra <<< "${SERVE_EXTRA:-}"


children=()
cleanup() {
  for p in "${children[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# emit <round> <phase> <json file> [extra JSON object merged in]: one line into $out.
emit() {
  local extra=${4:-}
  [ -n "$extra" ] || extra='{}'
  python3 - "$1" "$2" "$3" "$extra" >> "$out" <<'PY'
import json, sys
r, phase, path, extra = sys.argv[1:5]
line = {"round": int(r), "phase": phase}
line.update(json.loads(extra))
line["data"] = json.load(open(path))
print(json.dumps(line, separators=(",", ":")))
PY
}

# serve_start <log> <args...>: starts nvmq serve, waits until it listens; sets $serve_pid.
serve_start() {
  local log=$1; shift
  # Emptied before the start, not by the child's redirection: the check below could otherwise
  # find the line a previous round's server wrote before the child opens the file.
  : > "$log"
  "$bin" serve "$@" > "$log" 2>&1 &
  serve_pid=$!
  children+=("$serve_pid")
  for _ in $(seq 1 600); do
    if grep -q "nvmq serving Kafka on" "$log"; then return 0; fi
    if ! kill -0 "$serve_pid" 2>/dev/null; then
      echo "nvmq serve exited:" >&2; cat "$log" >&2; exit 1
    fi
    sleep 0.5
  done
  echo "nvmq serve did not start in 300 s:" >&2; cat "$log" >&2; exit 1
}

serve_stop() {
  kill -TERM "$serve_pid"
  wait "$serve_pid" || { echo "nvmq serve exited with $? after SIGTERM" >&2; exit 1; }
}

kafka_bench() {
  "$bin" kafka-bench --broker "127.0.0.1:$1" --duration "$DURATION" \
    --client-threads "$CLIENT_THREADS" --json "${@:2}"
}

# redis_run <round> <fsync> <port>
redis_run() {
  local r=$1 fsync=$2 port=$3 dir=$scratch/redis-$2
  rm -rf "$dir"; mkdir -p "$dir"
  redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --appendonly yes \
    --appendfsync "$fsync" --save '' --daemonize no --logfile "$dir/redis.log" &
  local pid=$!
  children+=("$pid")
  for _ in $(seq 1 100); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  for clients in 64 1; do
    # A short probe sizes -n for about REDIS_SECONDS.
    local probe=$((clients * 300))
    local rps
    rps=$(redis-benchmark -p "$port" -c "$clients" -P 1 -n "$probe" --csv XADD k '*' d "$payload" \
      | python3 -c 'import csv,sys; rows=list(csv.DictReader(sys.stdin)); print(int(float(rows[-1]["rps"])))')
    local n=$(( rps * REDIS_SECONDS ))
    [ "$n" -ge 1000 ] || n=1000
    redis-benchmark -p "$port" -c "$clients" -P 1 -n "$n" --csv XADD k '*' d "$payload" > "$dir/csv"
    python3 - "$dir/csv" > "$dir/json" <<'PY'
import csv, json, sys
row = list(csv.DictReader(open(sys.argv[1])))[-1]
row["test"] = "XADD k * d <%d B>" % (len(row["test"]) - len("XADD k * d "))
print(json.dumps({k: (v if k == "test" else float(v)) for k, v in row.items()}))
PY
    emit "$r" redis "$dir/json" "{\"fsync\":\"$fsync\",\"clients\":$clients,\"requests\":$n}"
  done
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
}

for r in $(seq 1 "$rounds"); do
  t0=$(date +%s)
  # (a) the log in process, and the device alone.
  rm -f "$scratch/bench.img"
  "$bin" bench --device "file:$scratch/bench.img" --force --size "$BENCH_SIZE" \
    --producers 1,64 --record-size 100 --duration "$DURATION" --json > "$scratch/bench.json"
  emit "$r" bench "$scratch/bench.json"
  rm -f "$scratch/bench.img"
  echo "round $r: bench done" >&2

  # (b) nvmq serve, durable, from another process.
  rm -f "$scratch/serve.img"
  serve_start "$scratch/serve.log" --device "file:$scratch/serve.img" --size "$SERVE_SIZE" \
    --flush always --listen "127.0.0.1:$PORT" "${serve_extra[@]}"
  kafka_bench "$PORT" --server-pid "$serve_pid" \
    --scenario "closed:1,closed:64,batched:$BATCHED,e2e:$E2E,catchup:$CATCHUP_RECORDS,conns:$CONNS" \
    > "$scratch/durable.json"
  emit "$r" durable "$scratch/durable.json"
  serve_stop
  rm -f "$scratch/serve.img"
  echo "round $r: durable serve done" >&2

  # (b2) two devices.
  rm -f "$scratch/serve-a.img" "$scratch/serve-b.img"
  serve_start "$scratch/serve2.log" --device "file:$scratch/serve-a.img" \
    --device "file:$scratch/serve-b.img" --size "$SERVE_SIZE" --flush always \
    --listen "127.0.0.1:$PORT" "${serve_extra[@]}"
  kafka_bench "$PORT" --scenario closed:64 --topic-prefix two-devices > "$scratch/durable2.json"
  emit "$r" durable2 "$scratch/durable2.json"
  serve_stop
  rm -f "$scratch/serve-a.img" "$scratch/serve-b.img"
  echo "round $r: two-device serve done" >&2

  # (c) the same server answering Produce without the log.
  serve_start "$scratch/ceiling.log" --ceiling --device sim:capacity=256M \
    --listen "127.0.0.1:$((PORT + 3))" "${serve_extra[@]}"
  kafka_bench "$((PORT + 3))" --server-pid "$serve_pid" --scenario closed:1,closed:64 \
    > "$scratch/ceiling.json"
  emit "$r" ceiling "$scratch/ceiling.json"
  serve_stop
  echo "round $r: ceiling done" >&2

  # (d) Redis, fsync on every write, then never.
  redis_run "$r" always "$((PORT + 1))"
  redis_run "$r" no "$((PORT + 2))"
  echo "round $r: redis done ($(( $(date +%s) - t0 )) s)" >&2
done
echo "results: $out" >&2
