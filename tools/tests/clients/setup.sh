#!/usr/bin/env bash
# Installs the Kafka clients the protocol tests drive (idempotent): Debian's kcat (librdkafka
# 2.0.2) and, in a venv, confluent-kafka (bundled librdkafka 2.x) and kafka-python; kafkajs
# with npm when a second directory is given.
# Usage: setup.sh <venv-dir> [<node-dir>] (with a node-dir: kafkajs installed there too)
set -euo pipefail
venv=${1:?usage: setup.sh <venv-dir> [<node-dir>]}
if ! command -v kcat >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat >/dev/null
    else
        echo "kcat is missing and this user cannot apt-get install it" >&2
        exit 1
    fi
fi
if ! "$venv/bin/python" -c 'import confluent_kafka, kafka' >/dev/null 2>&1; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q confluent-kafka kafka-python
fi
# kafkajs (pure JavaScript, node 20) for the admin-client tests, when a directory is given.
node_dir=${2:-}
if [ -n "$node_dir" ] && [ ! -d "$node_dir/node_modules/kafkajs" ]; then
    mkdir -p "$node_dir"
    npm install --silent --no-audit --no-fund --prefix "$node_dir" kafkajs@2 >/dev/null
fi
