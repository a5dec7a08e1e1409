#!/bin/bash
# serve_startup.sh fill <bin> <img> <term|kill>   : create + fill ~1 GiB from an idempotent producer, stop
# serve_startup.sh time <bin> <img> <n>           : n times: copy img, start, time until serving, SIGKILL
set -u
D=$(dirname "$0")
PY=${PY:-target/tmp/kafka-clients-venv/bin/python}
PORT=29517
wait_serving() { # file pid
  for _ in $(seq 1 6000); do
    grep -q "nvmq serving Kafka" "$1" && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.01
  done
  return 1
}
case $1 in
fill)
  rm -f "$3"
  "$2" serve --device "file:$3" --size 2G --listen 127.0.0.1:$PORT --default-partitions 4 > "$3.fill.log" 2>&1 &
  pid=$!
  wait_serving "$3.fill.log" $pid || { cat "$3.fill.log"; exit 1; }
  $PY "$D/idempotent_fill.py" 127.0.0.1:$PORT bench $((1 << 30))
  if [ "$4" = term ]; then kill -TERM $pid; else kill -KILL $pid; fi
  wait $pid
  tail -n 3 "$3.fill.log"
  ;;
time)
  for i in $(seq 1 "$4"); do
    cp "$3" "$3.run"
    out="$3.run.log"
    t0=$(date +%s.%N)
    "$2" serve --device "file:$3.run" --listen 127.0.0.1:$PORT --default-partitions 4 > "$out" 2>&1 &
    pid=$!
    wait_serving "$out" $pid || { cat "$out"; exit 1; }
    t1=$(date +%s.%N)
    kill -KILL $pid; wait $pid 2>/dev/null
    echo "run $i: $(echo "$t1 - $t0" | bc) s; $(grep -E 'producer state|recovered|recovery' "$out" | sed -e 's/.*index/index/' | cut -c1-200 | tr '\n' ' ')"
  done
  rm -f "$3.run"
  ;;
esac
