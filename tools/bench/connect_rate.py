#!/usr/bin/env python3
"""connect_rate.py <host:port> <n> [ca.pem]: n times in a row, connect (over TLS, trusting ca.pem,
when given), send one ApiVersions v0, read its answer, close; prints {"connects_per_s", "p50_us"}
as JSON. Plain against TLS in the same run tells what a TLS handshake costs per connection."""
import json
import socket
import ssl
import statistics
import struct
import sys
import time

host, port = sys.argv[1].rsplit(":", 1)
n = int(sys.argv[2])
ctx = None
if len(sys.argv) > 3:
    ctx = ssl.create_default_context(cafile=sys.argv[3])
# ApiVersions v0: key 18, version 0, correlation id 1, client id "cr".
body = struct.pack(">hhih", 18, 0, 1, 2) + b"cr"
frame = struct.pack(">i", len(body)) + body


def once():
    s = socket.create_connection((host, int(port)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if ctx is not None:
        s = ctx.wrap_socket(s, server_hostname=host)
    s.sendall(frame)
    need, got = 4, b""
    while len(got) < need:
        chunk = s.recv(65536)
        if not chunk:
            raise SystemExit("connection closed before the answer")
        got += chunk
        if len(got) >= 4:
            need = 4 + struct.unpack(">i", got[:4])[0]
    s.close()


for _ in range(min(20, n)):  # warm-up
    once()
times = []
start = time.perf_counter()
for _ in range(n):
    t = time.perf_counter()
    once()
    times.append(time.perf_counter() - t)
elapsed = time.perf_counter() - start
print(json.dumps({"connects_per_s": n / elapsed, "p50_us": statistics.median(times) * 1e6}))
