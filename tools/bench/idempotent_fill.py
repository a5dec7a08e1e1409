# Fills a broker with ~N bytes of record values from one idempotent producer (acks=all).
import sys, time
from confluent_kafka import Producer
bootstrap, topic, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
              "linger.ms": 20, "batch.size": 1000000, "queue.buffering.max.kbytes": 262144,
              "message.max.bytes": 4000000})
value = b"x" * 1000
sent = 0
t = time.time()
errors = []
def cb(err, msg):
    if err is not None:
        errors.append(err)
i = 0
while sent < total:
    try:
        p.produce(topic, value, partition=i % 4, callback=cb)
        sent += len(value); i += 1
    except BufferError:
        p.poll(0.05)
    if i % 10000 == 0:
        p.poll(0)
p.flush(120)
print(f"{sent} bytes in {i} messages, {time.time()-t:.1f}s, errors={len(errors)}")
