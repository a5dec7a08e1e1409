#!/bin/bash
# file_engines.sh <nvmq binary> <device file> <runs> <out dir>
# `nvmq bench` on one file device, alternating the io_uring engine and the I/O threads run by run
# (same machine, same file), 1/64/256 producers x 100 B and 1 KiB, flush=always. Each run's JSON
# goes to <out dir>/<engine>-<n>.json; file_engines_summary.py prints the medians.
set -eu
bin=$1 img=$2 runs=$3 out=$4
mkdir -p "$out"
for n in $(seq 1 "$runs"); do
  for engine in threads uring; do
    "$bin" bench --device "file:$img,engine=$engine" --force --size 1G \
      --producers 1,64,256 --record-size 100,1024 --duration 3s \
      --json --out "$out/$engine-$n.json" > /dev/null
    echo "run $n $engine done"
  done
done
