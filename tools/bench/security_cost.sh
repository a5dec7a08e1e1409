#!/bin/bash
# security_cost.sh <nvmq binary> <scratch dir> [rounds, default 3]
#
# What each security feature costs, measured against the same broker without it, in rounds that
# alternate the configurations (plain, TLS, authorizer) so that the disk's drift hits them alike:
#   - per request: nvmq kafka-bench closed:1 and closed:64 (100 B, acks=all, flush always, a fresh
#     file device each) against serve plain, with --tls-cert/--tls-key (the bench over TLS), and
#     with --authorizer and ACLs allowing User:ANONYMOUS (made once by a super user, then the
#     broker restarted without super users, so every request is checked);
#   - per connection: connections/s of a client that connects, sends one ApiVersions, reads the
#     answer and closes, plain against TLS (a full handshake each; tools/bench/connect_rate.py).
# Needs openssl (certificates) and the confluent-kafka venv of tools/tests/clients/setup.sh
# (VENV, default target/tmp/kafka-clients-venv) to create the ACLs.
# Output: <scratch>/security-cost.jsonl, one JSON object a line; security_cost_summary.py prints
# the medians and the ratios taken within each round.
set -euo pipefail
. "$(dirname "$(realpath "$0")")/bench_lib.sh"
bench_args "$0" "$@"
DURATION=${DURATION:-3s}
CONNECTS=${CONNECTS:-500}
PORT=${PORT:-19192}
VENV=${VENV:-target/tmp/kafka-clients-venv}
out=$scratch/security-cost.jsonl
: > "$out"

# A CA, and the broker's certificate it signs (a self-signed leaf is refused as a CA).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
  -keyout "$scratch/ca.key" -out "$scratch/ca.pem" -subj /CN=bench-ca 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$scratch/key.pem" -out "$scratch/server.csr" -subj /CN=127.0.0.1 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\n' > "$scratch/san.ext"
openssl x509 -req -in "$scratch/server.csr" -CA "$scratch/ca.pem" -CAkey "$scratch/ca.key" \
  -CAcreateserial -days 1 -extfile "$scratch/san.ext" -out "$scratch/cert.pem" 2>/dev/null
tls=(--tls-cert "$scratch/cert.pem" --tls-key "$scratch/key.pem")

serve_stop() { kill -TERM "$serve_pid"; wait "$serve_pid" || true; }

# The authorizer's device: ACLs letting User:ANONYMOUS do everything the bench does.
acl_dev="file:$scratch/acl.img"
"$bin" format --device "$acl_dev" --size 2G --force > /dev/null
serve_start "$scratch/acl-setup.log" --listen "127.0.0.1:$PORT" --device "$acl_dev" --authorizer --super-users User:ANONYMOUS
"$VENV/bin/python" - "127.0.0.1:$PORT" <<'PY'
import sys
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient,
                                   ResourcePatternType, ResourceType)
a = AdminClient({"bootstrap.servers": sys.argv[1]})
allow, lit = AclPermissionType.ALLOW, ResourcePatternType.LITERAL
pre = ResourcePatternType.PREFIXED
bs = [AclBinding(ResourceType.TOPIC, "kafka-bench", pre, "User:ANONYMOUS", "*", AclOperation.ALL, allow),
      AclBinding(ResourceType.BROKER, "kafka-cluster", lit, "User:ANONYMOUS", "*", AclOperation.ALL, allow)]
for f in a.create_acls(bs, request_timeout=15).values():
    f.result()
PY
serve_stop

for r in $(seq 1 "$rounds"); do
  for config in plain tls acl; do
    dev="file:$scratch/$config.img"
    extra=()
    bench=()
    case $config in
      plain) "$bin" format --device "$dev" --size 2G --force > /dev/null ;;
      tls) "$bin" format --device "$dev" --size 2G --force > /dev/null
           extra=("${tls[@]}"); bench=(--tls-ca "$scratch/ca.pem") ;;
      acl) dev=$acl_dev; extra=(--authorizer) ;;
    esac
    serve_start "$scratch/$config.log" --listen "127.0.0.1:$PORT" --device "$dev" "${extra[@]}"
    json=$("$bin" kafka-bench --broker "127.0.0.1:$PORT" --duration "$DURATION" --json \
      --scenario closed:1,closed:64 --topic-prefix "kafka-bench-r$r" "${bench[@]}")
    emit "$r" "$config" "$json"
    if [ "$config" != acl ]; then
      ca=""
      [ "$config" = tls ] && ca=$scratch/ca.pem
      emit "$r" "$config-connect" "$(python3 "$here/connect_rate.py" "127.0.0.1:$PORT" "$CONNECTS" $ca)"
    fi
    serve_stop
  done
done
python3 "$here/security_cost_summary.py" "$out"
