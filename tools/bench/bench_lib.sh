# bench_lib.sh: what the round-alternating benchmarks (cluster_cost.sh, security_cost.sh) share.
# Sourced after `set -euo pipefail`; the script sets `out` (its JSON-lines file) before emit.
#
# bench_args "$0" "$@": checks the arguments <nvmq binary> <scratch dir> [rounds, default 3]
# and sets bin, scratch, rounds, here.
bench_args() {
  local me=$1; shift
  if [ $# -lt 2 ]; then
    echo "usage: $me <nvmq binary> <scratch dir> [rounds]" >&2
    exit 2
  fi
  bin=$(realpath "$1")
  mkdir -p "$2"
  scratch=$(realpath "$2")
  rounds=${3:-3}
  here=$(dirname "$(realpath "$me")")
  children=()
  trap 'for p in "${children[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
}

# serve_start <log> <serve args...>: starts `nvmq serve` and waits until it serves; sets
# serve_pid (and kills it at exit if the script did not).
serve_start() {
  local log=$1; shift
  "$bin" serve "$@" > "$log" 2>&1 &
  serve_pid=$!
  children+=("$serve_pid")
  for _ in $(seq 1 600); do
    grep -q "nvmq serving Kafka on" "$log" && return 0
    kill -0 "$serve_pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.5
  done
  cat "$log" >&2; exit 1
}

# emit <round> <config> <json>: one line of $out.
emit() {
  python3 -c 'import json,sys; print(json.dumps({"round": int(sys.argv[1]), "config": sys.argv[2], "data": json.loads(sys.argv[3])}))' "$@" >> "$out"
}
