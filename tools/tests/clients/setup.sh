#!/usr/bin/env bash
# Installs the Kafka clients the protocol tests drive (idempotent): Debian's kcat (librdkafka
# 2.0.2) and, in a venv, confluent-kafka (bundled librdkafka 2.x) and kafka-python.
# Usage: setup.sh <venv-dir>
set -euo pipefail
venv=${1:?usage: setup.sh <venv-dir>}
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
