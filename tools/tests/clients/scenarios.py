"""Kafka client scenarios against an nvmq broker, driven by tools/tests/suite/kafka_clients.rs and
kafka_security.rs.

Each scenario prints what it checked and exits non-zero (with the reason) on any failure.
Usage: scenarios.py <bootstrap> <scenario> [args...]
"""
import json
import sys
import time
import warnings

BOOT = sys.argv[1]
WHAT = sys.argv[2]
ARGS = sys.argv[3:]


def fail(msg):
    print("FAIL:", msg, flush=True)
    sys.exit(1)


def ck_produce(topic, n, partitions, extra=None, start=0, prefix="m", announce=False, wait=30):
    """confluent-kafka producer, acks=all, of <prefix>-<start> .. <prefix>-<start + n - 1>;
    returns {value: (partition, offset)} of delivered. With `announce`, prints "first
    acknowledged" when the first delivery is reported."""
    from confluent_kafka import Producer

    conf = {"bootstrap.servers": BOOT, "acks": "all", "linger.ms": 5}
    conf.update(extra or {})
    p = Producer(conf)
    got = {}
    errors = []

    def cb(err, msg):
        if err is not None:
            errors.append(str(err))
        else:
            got[msg.value().decode()] = (msg.partition(), msg.offset())
            if announce and len(got) == 1:
                print("first acknowledged", flush=True)

    for i in range(start, start + n):
        while True:
            try:
                p.produce(topic, value=f"{prefix}-{i}".encode(), partition=i % partitions,
                          on_delivery=cb)
                break
            except BufferError:
                p.poll(0.01)
        if i % 1000 == 0:
            p.poll(0)
    left = p.flush(wait)
    if left or errors:
        fail(f"{left} undelivered, errors {errors[:5]}")
    if len(got) != n:
        fail(f"{len(got)} of {n} delivered")
    return got


def ck_read_all(topic, partitions, expect, extra=None):
    """Reads every partition from offset 0 with assign(); checks values and offsets."""
    from confluent_kafka import Consumer, TopicPartition

    conf = {"bootstrap.servers": BOOT, "group.id": "reader", "enable.auto.commit": False,
            "auto.offset.reset": "earliest"}
    conf.update(extra or {})
    c = Consumer(conf)
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    seen = {}
    deadline = time.time() + 30
    while len(seen) < len(expect) and time.time() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            fail(f"consume error {m.error()}")
        v = m.value().decode()
        if v in seen:
            fail(f"{v} consumed twice")
        seen[v] = (m.partition(), m.offset())
    c.close()
    for v, where in expect.items():
        if seen.get(v) != where:
            fail(f"{v}: produced at {where}, consumed at {seen.get(v)}")
    extra = set(seen) - set(expect)
    if extra:
        fail(f"consumed values never produced: {sorted(extra)[:5]}")
    return seen


def create_topic(topic, partitions, extra=None):
    from confluent_kafka.admin import AdminClient, NewTopic

    a = AdminClient({"bootstrap.servers": BOOT, **(extra or {})})
    for f in a.create_topics([NewTopic(topic, num_partitions=partitions,
                                       replication_factor=1)]).values():
        f.result(10)
    md = a.list_topics(topic, timeout=10)
    if len(md.topics[topic].partitions) != partitions:
        fail(f"metadata shows {len(md.topics[topic].partitions)} partitions of {topic}")


def produce_consume():
    """CreateTopics, produce acks=all over 3 partitions, read all back by offset."""
    topic, n = "pc", 3000
    create_topic(topic, 3)
    got = ck_produce(topic, n, 3)
    ck_read_all(topic, 3, got)
    for p in range(3):
        offs = sorted(o for (pp, o) in got.values() if pp == p)
        if offs != list(range(len(offs))):
            fail(f"partition {p} offsets are not 0..{len(offs)}")
    print(f"ok: {n} messages produced with acks=all and read back at their offsets")


def compressed():
    """confluent-kafka with each codec the broker checks, then kafka-python with gzip; every
    batch is decompressed and checked by the broker, and read back at its offsets."""
    from kafka import KafkaProducer

    for codec in ["gzip", "snappy", "lz4", "zstd"]:
        topic = f"z-{codec}"
        create_topic(topic, 1)
        got = ck_produce(topic, 2000, 1, {"compression.type": codec, "linger.ms": 50})
        ck_read_all(topic, 1, got)
        offs = sorted(o for (_, o) in got.values())
        if offs != list(range(2000)):
            fail(f"{codec}: offsets are not 0..2000")
    p = KafkaProducer(bootstrap_servers=BOOT, acks="all", compression_type="gzip", linger_ms=50)
    futs = [p.send("z-kp", value=f"k-{i}".encode(), partition=0) for i in range(500)]
    offs = [f.get(timeout=30).offset for f in futs]
    p.close()
    if sorted(offs) != list(range(500)):
        fail(f"kafka-python gzip offsets {sorted(offs)[:5]}...")
    print("ok: gzip, snappy, lz4, zstd (confluent-kafka) and gzip (kafka-python) stored and read back")


def kafka_python():
    """kafka-python (idempotent by default in 3.x): produce, then read back with assign+seek."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    topic, n = "kp", 500
    p = KafkaProducer(bootstrap_servers=BOOT, acks="all")
    futs = [p.send(topic, value=f"k-{i}".encode(), partition=0) for i in range(n)]
    meta = [f.get(timeout=30) for f in futs]
    p.close()
    offs = [m.offset for m in meta]
    if offs != list(range(n)):
        fail(f"kafka-python offsets {offs[:5]}...")
    c = KafkaConsumer(bootstrap_servers=BOOT, group_id=None, enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    c.seek_to_beginning(tp)
    vals = []
    deadline = time.time() + 30
    while len(vals) < n and time.time() < deadline:
        for recs in c.poll(timeout_ms=500).values():
            vals.extend((r.offset, r.value.decode()) for r in recs)
    c.close()
    if vals != [(i, f"k-{i}") for i in range(n)]:
        fail(f"kafka-python read back {len(vals)} records, first {vals[:3]}")
    print(f"ok: kafka-python produced {n} and read them back in order")


def idempotent():
    """enable.idempotence=true: every message stored exactly once, in order."""
    topic, n = "idem", 5000
    got = ck_produce(topic, n, 1, {"enable.idempotence": True, "linger.ms": 1,
                                   "max.in.flight.requests.per.connection": 5})
    ck_read_all(topic, 1, got)
    offs = sorted(o for (_, o) in got.values())
    if offs != list(range(n)):
        fail("idempotent producer's offsets are not contiguous")
    order = [got[f"m-{i}"][1] for i in range(n)]
    if order != list(range(n)):
        fail("idempotent producer's messages are not in send order")
    print(f"ok: idempotent producer stored {n} messages once each, in order")


def group_consumer(name, group, topic):
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": BOOT, "group.id": group, "client.id": name,
                     "enable.auto.commit": False, "auto.offset.reset": "earliest",
                     "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                     "partition.assignment.strategy": "range"})


def group_rebalance():
    """Two members share a 4-partition topic; one leaves; the other takes every partition and
    commits what it consumed. Prints the commits as JSON on the last line."""
    from confluent_kafka import TopicPartition

    topic, group = ARGS[0], ARGS[1]
    create_topic(topic, 4)
    got = ck_produce(topic, 400, 4)
    a = group_consumer("a", group, topic)
    b = group_consumer("b", group, topic)
    a.subscribe([topic])
    b.subscribe([topic])
    deadline = time.time() + 60
    while time.time() < deadline:
        a.poll(0.2)
        b.poll(0.2)
        if len(a.assignment()) == 2 and len(b.assignment()) == 2:
            break
    la, lb = sorted(p.partition for p in a.assignment()), sorted(p.partition for p in b.assignment())
    if len(la) != 2 or len(lb) != 2 or set(la) & set(lb):
        fail(f"two members did not split 4 partitions: a={la} b={lb}")
    print(f"two members: a={la} b={lb}", flush=True)
    b.close()  # LeaveGroup
    deadline = time.time() + 60
    seen = {}
    while time.time() < deadline and (len(a.assignment()) != 4 or len(seen) < len(got)):
        m = a.poll(0.2)
        if m is not None and not m.error():
            seen[m.value().decode()] = (m.partition(), m.offset())
    if len(a.assignment()) != 4:
        fail(f"after b left, a holds {len(a.assignment())} partitions")
    if seen != got:
        fail(f"a consumed {len(seen)} of {len(got)} messages after the rebalance")
    print("after leave: a holds all 4 partitions and consumed everything", flush=True)
    ends = {}
    for (p, o) in got.values():
        ends[p] = max(ends.get(p, -1), o + 1)
    a.commit(offsets=[TopicPartition(topic, p, o) for p, o in ends.items()], asynchronous=False)
    a.close()
    print(json.dumps({str(p): o for p, o in sorted(ends.items())}))


def committed():
    """Prints a group's committed offsets as JSON."""
    from confluent_kafka import Consumer, TopicPartition

    topic, group, parts = ARGS[0], ARGS[1], int(ARGS[2])
    c = Consumer({"bootstrap.servers": BOOT, "group.id": group, "enable.auto.commit": False})
    res = c.committed([TopicPartition(topic, p) for p in range(parts)], timeout=20)
    c.close()
    print(json.dumps({str(tp.partition): tp.offset for tp in res}))


def tls():
    """Over security.protocol=SSL trusting the CA in ARGS[0] (with the client certificate and
    key in ARGS[1:3] when given): CreateTopics, produce acks=all, read back by offset."""
    sec = {"security.protocol": "SSL", "ssl.ca.location": ARGS[0]}
    if len(ARGS) == 3:
        sec.update({"ssl.certificate.location": ARGS[1], "ssl.key.location": ARGS[2]})
    topic, n = "tls", 500
    create_topic(topic, 2, sec)
    got = ck_produce(topic, n, 2, sec)
    ck_read_all(topic, 2, got, sec)
    print(f"ok: {n} messages produced and read back over TLS")


def tls_untrusted():
    """A client trusting only the CA in ARGS[0] (not the broker's) reaches no broker: its
    metadata request fails, and librdkafka reports the certificate check that failed."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    errors = []
    a = AdminClient({"bootstrap.servers": BOOT, "security.protocol": "SSL",
                     "ssl.ca.location": ARGS[0], "error_cb": lambda e: errors.append(str(e)),
                     "log_level": 0})
    try:
        a.list_topics(timeout=5)
        fail("metadata answered to a client that does not trust the broker's certificate")
    except KafkaException as e:
        errors.append(str(e))
    # error_cb runs only inside poll().
    deadline = time.time() + 10
    while not any("certificate verify failed" in e for e in errors) and time.time() < deadline:
        a.poll(0.2)
    if not any("certificate verify failed" in e for e in errors):
        fail(f"no certificate verification error among {errors[:5]}")
    print("ok: refused:", next(e for e in errors if "certificate verify failed" in e))


def kp_expired():
    """kafka-python logging in as ARGS (user password, SCRAM-SHA-512) over SASL_SSL, trusting the
    CA in ARGS[2] that signed the broker's expired certificate: no broker is available, and what
    kafka-python reports (its log and its exception) names the expired certificate."""
    import logging

    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    reported = []

    class Keep(logging.Handler):
        def emit(self, record):
            reported.append(record.getMessage())

    logging.getLogger("kafka").addHandler(Keep())
    logging.getLogger("kafka").setLevel(logging.INFO)
    try:
        p = KafkaProducer(bootstrap_servers=BOOT, security_protocol="SASL_SSL",
                          ssl_cafile=ARGS[2], sasl_mechanism="SCRAM-SHA-512",
                          sasl_plain_username=ARGS[0], sasl_plain_password=ARGS[1],
                          bootstrap_timeout_ms=5000)
        p.close()
        fail("kafka-python connected to a broker with an expired certificate")
    except KafkaError as e:
        reported.append(f"{type(e).__name__}: {e}")
    said = [r for r in reported if "certificate has expired" in r]
    if not said:
        fail(f"kafka-python did not say the certificate expired: {reported[-5:]}")
    print("ok: refused:", said[0])


def produce_log():
    """Produces forever (until killed or the broker dies), printing each acknowledged value."""
    from confluent_kafka import Producer

    topic = ARGS[0]
    p = Producer({"bootstrap.servers": BOOT, "acks": "all", "linger.ms": 2,
                  "message.timeout.ms": 3000, "reconnect.backoff.max.ms": 200})

    def cb(err, msg):
        if err is None:
            print("ack", msg.value().decode(), msg.offset(), flush=True)

    i = 0
    while True:
        try:
            p.produce(topic, value=f"d-{i}".encode(), partition=0, on_delivery=cb)
            i += 1
        except BufferError:
            pass
        p.poll(0.001 if i % 50 else 0.01)


def produce_range():
    """confluent-kafka producing r-<from> .. r-<to - 1> to partition 0 of a topic with acks=all,
    one request in flight (a retry after a failover cannot reorder), requests of at most 5
    records (so that a failover lands among many), and retries for up to 60 s; exits 0 only
    when every record was acknowledged."""
    topic, start, end = ARGS[0], int(ARGS[1]), int(ARGS[2])
    conf = {"enable.idempotence": False, "max.in.flight.requests.per.connection": 1,
            "batch.num.messages": 5, "message.timeout.ms": 60000,
            "reconnect.backoff.max.ms": 200}
    got = ck_produce(topic, end - start, 1, conf, start=start, prefix="r", announce=True,
                     wait=90)
    print(f"ok: {len(got)} acknowledged by confluent-kafka")


def read_values():
    """Prints every value of partition 0 of a topic, one per line, then 'end <hw>'."""
    from confluent_kafka import Consumer, TopicPartition

    topic = ARGS[0]
    c = Consumer({"bootstrap.servers": BOOT, "group.id": "verify", "enable.auto.commit": False})
    lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=20)
    c.assign([TopicPartition(topic, 0, 0)])
    n = 0
    deadline = time.time() + 60
    while n < hi and time.time() < deadline:
        m = c.poll(0.5)
        if m is None or m.error():
            continue
        print("val", m.value().decode(), m.offset())
        n = m.offset() + 1
    c.close()
    print("end", hi, flush=True)


def acl_filter(rtype=None, name=None, pattern=None, principal=None):
    from confluent_kafka.admin import (AclBindingFilter, AclOperation, AclPermissionType,
                                       ResourcePatternType, ResourceType)

    return AclBindingFilter(rtype or ResourceType.ANY, name, pattern or ResourcePatternType.ANY,
                            principal, None, AclOperation.ANY, AclPermissionType.ANY)


def acl_admin():
    """AdminClient create_acls, describe_acls (ANY, MATCH), delete_acls; a super user's."""
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient,
                                       ResourcePatternType, ResourceType)

    a = AdminClient({"bootstrap.servers": BOOT})
    allow, deny = AclPermissionType.ALLOW, AclPermissionType.DENY
    lit, pre = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    bindings = [
        AclBinding(ResourceType.TOPIC, "a", lit, "User:alice", "*", AclOperation.WRITE, allow),
        AclBinding(ResourceType.TOPIC, "orders-", pre, "User:bob", "*", AclOperation.READ, allow),
        AclBinding(ResourceType.GROUP, "g", lit, "User:alice", "*", AclOperation.READ, deny),
    ]
    for f in a.create_acls(bindings, request_timeout=15).values():
        f.result()
    got = a.describe_acls(acl_filter(), request_timeout=15).result()
    if sorted(map(str, got)) != sorted(map(str, bindings)):
        fail(f"described {got}, created {bindings}")
    m = a.describe_acls(acl_filter(ResourceType.TOPIC, "orders-eu", ResourcePatternType.MATCH),
                        request_timeout=15).result()
    if [(x.name, x.principal) for x in m] != [("orders-", "User:bob")]:
        fail(f"MATCH orders-eu described {m}")
    done = a.delete_acls([acl_filter(principal="User:alice")], request_timeout=15)
    deleted = [r for f in done.values() for r in f.result()]
    if len(deleted) != 2:
        fail(f"deleting alice's ACLs deleted {deleted}")
    left = a.describe_acls(acl_filter(), request_timeout=15).result()
    if [x.principal for x in left] != ["User:bob"]:
        fail(f"left after delete: {left}")
    print(f"ok: {len(bindings)} ACLs created, described (ANY, MATCH), {len(deleted)} deleted")


def acl_setup():
    """As a super user: topics a and b; User:ANONYMOUS may write (only) to a, read b, read group
    g and describe the cluster. The super user is told every cluster operation."""
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient,
                                       ResourcePatternType, ResourceType)

    for t in ("a", "b"):
        create_topic(t, 1)
    a = AdminClient({"bootstrap.servers": BOOT})
    lit, allow = ResourcePatternType.LITERAL, AclPermissionType.ALLOW
    anon = "User:ANONYMOUS"
    bindings = [
        AclBinding(ResourceType.TOPIC, "a", lit, anon, "*", AclOperation.WRITE, allow),
        AclBinding(ResourceType.TOPIC, "b", lit, anon, "*", AclOperation.READ, allow),
        AclBinding(ResourceType.GROUP, "g", lit, anon, "*", AclOperation.READ, allow),
        AclBinding(ResourceType.BROKER, "kafka-cluster", lit, anon, "*", AclOperation.DESCRIBE,
                   allow),
    ]
    for f in a.create_acls(bindings, request_timeout=15).values():
        f.result()
    c = a.describe_cluster(include_authorized_operations=True, request_timeout=15).result()
    every = {"CREATE", "CLUSTER_ACTION", "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "IDEMPOTENT_WRITE",
             "ALTER", "DESCRIBE"}
    told = names(c.authorized_operations)
    if told != every:
        fail(f"the super user was told cluster operations {sorted(told)}")
    print(f"ok: topics a, b; User:ANONYMOUS may write to a, read b and g, describe the cluster; "
          f"the super user may {sorted(told)}")


def names(ops):
    """The names of a client's authorized operations (None when the broker did not say)."""
    if ops is None:
        fail("no authorized operations in the answer")
    return {o.name for o in ops}


def acl_operations():
    """Not a super user: AdminClient's describe_topics, describe_consumer_groups and
    describe_cluster with include_authorized_operations tell User:ANONYMOUS exactly what its ACLs
    give (KIP-430), implied Describe included."""
    from confluent_kafka import Consumer, TopicCollection, TopicPartition
    from confluent_kafka.admin import AdminClient

    # Offsets committed for group g (Read on g and on b): the group exists, Empty.
    c = Consumer({"bootstrap.servers": BOOT, "group.id": "g", "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition("b", 0, 0)], asynchronous=False)
    c.close()
    a = AdminClient({"bootstrap.servers": BOOT})
    got = {}
    for t, f in a.describe_topics(TopicCollection(["a", "b"]), include_authorized_operations=True,
                                  request_timeout=15).items():
        got[t] = names(f.result().authorized_operations)
    for g, f in a.describe_consumer_groups(["g"], include_authorized_operations=True,
                                           request_timeout=15).items():
        got[g] = names(f.result().authorized_operations)
    got["cluster"] = names(a.describe_cluster(include_authorized_operations=True,
                                              request_timeout=15).result().authorized_operations)
    want = {"a": {"WRITE", "DESCRIBE"}, "b": {"READ", "DESCRIBE"}, "g": {"READ", "DESCRIBE"},
            "cluster": {"DESCRIBE"}}
    if got != want:
        fail(f"told {got}, want {want}")
    print(f"ok: authorized operations {sorted((k, sorted(v)) for k, v in got.items())}")


def acl_denied():
    """Not a super user: producing to a is delivered, to b fails TOPIC_AUTHORIZATION_FAILED; an
    idempotent producer gets its producer id from Write on a alone (KIP-679) and delivers."""
    from confluent_kafka import KafkaError, Producer

    def produce(topics, idempotent):
        p = Producer({"bootstrap.servers": BOOT, "acks": "all", "message.timeout.ms": 20000,
                      "enable.idempotence": idempotent})
        reports = {}

        def dr(err, msg):
            reports[msg.topic()] = err

        for t in topics:
            p.produce(t, b"value", on_delivery=dr)
        left = p.flush(30)
        if left:
            fail(f"{left} messages never reported (idempotent: {idempotent})")
        return reports

    reports = produce(["a", "b"], False)
    if reports.get("a") is not None:
        fail(f"the allowed message failed: {reports.get('a')}")
    err = reports.get("b")
    if err is None or err.code() != KafkaError.TOPIC_AUTHORIZATION_FAILED:
        fail(f"the denied message reported {err}")
    idem = produce(["a"], True).get("a")
    if idem is not None:
        fail(f"the idempotent producer's message failed: {idem}")
    print(f"ok: a delivered (also idempotent, by Write on a alone), b refused with {err.name()}")


def negotiated():
    """Produces and consumes in a group with librdkafka's protocol debug log on; prints the
    highest version of each request it sent: 'versions {"Produce": 10, ...}'."""
    import logging
    import re

    from confluent_kafka import Consumer, Producer

    seen = {}

    class Versions(logging.Handler):
        def emit(self, rec):
            m = re.search(r"Sent (\w+)Request \(v(\d+)", rec.getMessage())
            if m:
                seen[m[1]] = max(seen.get(m[1], -1), int(m[2]))

    log = logging.getLogger("rdkafka-protocol")
    log.addHandler(Versions())
    log.setLevel(logging.DEBUG)
    log.propagate = False
    conf = {"bootstrap.servers": BOOT, "debug": "protocol", "logger": log}
    p = Producer({**conf, "acks": "all", "enable.idempotence": True})
    errors = []
    p.produce("negotiated", b"v", on_delivery=lambda e, m: e and errors.append(str(e)))
    if p.flush(30) or errors:
        fail(f"not delivered: {errors}")
    c = Consumer({**conf, "group.id": "negotiated", "auto.offset.reset": "earliest"})
    c.subscribe(["negotiated"])
    deadline = time.time() + 30
    got = None
    while got is None and time.time() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got = m.value()
    if got != b"v":
        fail(f"consumed {got!r}")
    c.commit(asynchronous=False)
    c.close()
    print("versions", json.dumps(seen, sort_keys=True), flush=True)


def sasl(mechanism, user, password, ca=None):
    """SASL_PLAINTEXT, or SASL_SSL trusting the CA file `ca`."""
    conf = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
            "sasl.username": user, "sasl.password": password}
    if ca:
        conf.update({"security.protocol": "SASL_SSL", "ssl.ca.location": ca})
    return conf


def sasl_ssl_setup():
    """As the super user ARGS[0] (password ARGS[1]; CA ARGS[2]) over SASL_SSL with SCRAM-SHA-512:
    topics a and b, and ACLs letting User:alice write and read a (and use any group)."""
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient,
                                       ResourcePatternType, ResourceType)

    user, password, ca = ARGS
    conf = sasl("SCRAM-SHA-512", user, password, ca)
    for t in ("a", "b"):
        create_topic(t, 1, conf)
    lit, allow = ResourcePatternType.LITERAL, AclPermissionType.ALLOW
    bindings = [
        AclBinding(ResourceType.TOPIC, "a", lit, "User:alice", "*", AclOperation.WRITE, allow),
        AclBinding(ResourceType.TOPIC, "a", lit, "User:alice", "*", AclOperation.READ, allow),
        AclBinding(ResourceType.GROUP, "*", lit, "User:alice", "*", AclOperation.READ, allow),
    ]
    a = AdminClient({"bootstrap.servers": BOOT, **conf})
    for f in a.create_acls(bindings, request_timeout=15).values():
        f.result()
    print("ok: topics a, b; alice may write and read a")


def sasl_ssl_denied():
    """As ARGS[0] (password ARGS[1]; CA ARGS[2]) over SASL_SSL with SCRAM-SHA-512: producing to a
    is delivered and read back, to b fails with TOPIC_AUTHORIZATION_FAILED."""
    from confluent_kafka import KafkaError, Producer

    user, password, ca = ARGS
    conf = sasl("SCRAM-SHA-512", user, password, ca)
    got = ck_produce("a", 20, 1, conf)
    ck_read_all("a", 1, got, conf)
    p = Producer({"bootstrap.servers": BOOT, "acks": "all", "message.timeout.ms": 20000, **conf})
    reports = []
    p.produce("b", b"denied", on_delivery=lambda err, msg: reports.append(err))
    if p.flush(30):
        fail("the message to b was never reported")
    err = reports[0] if reports else None
    if err is None or err.code() != KafkaError.TOPIC_AUTHORIZATION_FAILED:
        fail(f"producing to b reported {err}")
    print(f"ok: 20 to a produced and read back, b refused with {err.name()}")


def sasl_ok():
    """Produces and reads back 50 records logged in as ARGS: mechanism user password topic."""
    mech, user, password, topic = ARGS[:4]
    conf = sasl(mech, user, password, ARGS[4] if len(ARGS) > 4 else None)
    got = ck_produce(topic, 50, 1, conf)
    ck_read_all(topic, 1, got, conf)
    print(f"ok: {mech} as {user}: 50 produced and read back", flush=True)


def sasl_refused():
    """A producer logging in as ARGS (mechanism user password) gets an authentication error."""
    from confluent_kafka import KafkaError, Producer

    mech, user, password = ARGS[:3]
    errors = []
    conf = {"bootstrap.servers": BOOT, "error_cb": errors.append}
    conf.update(sasl(mech, user, password, ARGS[3] if len(ARGS) > 3 else None))
    p = Producer(conf)
    p.produce("refused", value=b"never")
    deadline = time.time() + 30
    while time.time() < deadline and not any(
            e.code() == KafkaError._AUTHENTICATION for e in errors):
        p.poll(0.5)
    auth = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    if not auth:
        fail(f"no authentication error, got {[str(e) for e in errors]}")
    if "invalid credentials" not in str(auth[0]):
        fail(f"unexpected message: {auth[0]}")
    print(f"refused: {mech} as {user}: {auth[0]}", flush=True)


def scram_admin():
    """As ARGS (user password, SCRAM-SHA-512), adds carol with AdminClient, describes her, logs
    in as her, deletes her."""
    from confluent_kafka.admin import (AdminClient, ScramCredentialInfo, ScramMechanism,
                                       UserScramCredentialDeletion,
                                       UserScramCredentialUpsertion)

    user, password = ARGS
    a = AdminClient({"bootstrap.servers": BOOT, **sasl("SCRAM-SHA-512", user, password)})
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192)
    up = UserScramCredentialUpsertion("carol", info, b"carol-pw-4")
    for f in a.alter_user_scram_credentials([up]).values():
        f.result(timeout=30)
    d = a.describe_user_scram_credentials(["carol"])["carol"].result(timeout=30)
    got = [(i.mechanism, i.iterations) for i in d.scram_credential_infos]
    if got != [(ScramMechanism.SCRAM_SHA_256, 8192)]:
        fail(f"carol described as {got}")
    produced = ck_produce("by-carol", 5, 1, sasl("SCRAM-SHA-256", "carol", "carol-pw-4"))
    gone = UserScramCredentialDeletion("carol", ScramMechanism.SCRAM_SHA_256)
    for f in a.alter_user_scram_credentials([gone]).values():
        f.result(timeout=30)
    left = a.describe_user_scram_credentials().result(timeout=30)
    if "carol" in left:
        fail(f"carol still listed after her deletion: {list(left)}")
    print(f"ok: carol added ({got}), produced {len(produced)}, deleted; users {sorted(left)}",
          flush=True)


def admin_configs():
    """confluent-kafka's AdminClient: describe, alter and incrementally alter a topic's configs,
    create a topic with configs, delete records, describe log dirs when this client has it, and
    a refused cleanup.policy=compact showing INVALID_CONFIG."""
    from confluent_kafka import KafkaException, TopicPartition
    from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry,
                                       ConfigResource, NewTopic)

    a = AdminClient({"bootstrap.servers": BOOT})
    topic = "admin-cfg"
    for f in a.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1,
                                       config={"retention.ms": "3600000"})]).values():
        f.result(10)

    def described():
        res = ConfigResource(ConfigResource.Type.TOPIC, topic)
        return {k: v for k, v in a.describe_configs([res])[res].result(10).items()}

    d = described()
    if d["retention.ms"].value != "3600000" or d["retention.ms"].is_default:
        fail(f"retention.ms after create: {d['retention.ms']}")
    if d["cleanup.policy"].value != "delete" or not d["cleanup.policy"].is_default:
        fail(f"cleanup.policy default: {d['cleanup.policy']}")
    print("ok: create_topics with a config, describe_configs shows it")

    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.bytes", "1048576",
                    incremental_operation=AlterConfigOpType.SET)])
    a.incremental_alter_configs([res])[res].result(10)
    d = described()
    if d["retention.bytes"].value != "1048576" or d["retention.ms"].value != "3600000":
        fail(f"after incremental_alter_configs: {d['retention.bytes']}, {d['retention.ms']}")
    print("ok: incremental_alter_configs sets one config, keeps the others")

    res = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config={"max.message.bytes": "100000"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # what older tools still call
        a.alter_configs([res])[res].result(10)
    d = described()
    if d["max.message.bytes"].value != "100000" or not d["retention.ms"].is_default:
        fail(f"after alter_configs: {d['max.message.bytes']}, {d['retention.ms']}")
    print("ok: alter_configs replaces the set")

    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)])
    try:
        a.incremental_alter_configs([res])[res].result(10)
        fail("cleanup.policy=compact was accepted")
    except KafkaException as e:
        err = e.args[0]
        if err.name() != "INVALID_CONFIG" or "compact" not in err.str():
            fail(f"compact refused with {err.name()}: {err.str()}")
        print(f"ok: cleanup.policy=compact refused: {err.name()}: {err.str()}")
    for f in a.create_topics([NewTopic("admin-compacted", num_partitions=1, replication_factor=1,
                                       config={"cleanup.policy": "compact"})]).values():
        try:
            f.result(10)
            fail("a compacted topic was created")
        except KafkaException as e:
            if e.args[0].name() != "INVALID_CONFIG":
                fail(f"create with compact: {e.args[0].name()}")
    print("ok: create_topics with cleanup.policy=compact refused with INVALID_CONFIG")

    b = ConfigResource(ConfigResource.Type.BROKER, "0")
    bd = a.describe_configs([b])[b].result(10)
    if not bd or not all(v.is_read_only for v in bd.values()):
        fail("broker configs missing or not read-only")
    print(f"ok: {len(bd)} broker configs, all read-only")

    got = ck_produce(topic, 10, 1)
    if sorted(o for (_, o) in got.values()) != list(range(10)):
        fail("offsets are not 0..10")
    if not hasattr(a, "delete_records"):
        fail("this confluent-kafka has no delete_records")
    fs = a.delete_records([TopicPartition(topic, 0, 6)])
    low = list(fs.values())[0].result(10)
    if low.low_watermark != 6:
        fail(f"delete_records low watermark {low.low_watermark}")
    from confluent_kafka import Consumer
    c = Consumer({"bootstrap.servers": BOOT, "group.id": "wm"})
    lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    c.close()
    if (lo, hi) != (6, 10):
        fail(f"watermarks after delete_records: {(lo, hi)}")
    print("ok: delete_records moved the low watermark to 6 (list offsets earliest says so)")
    if hasattr(a, "describe_log_dirs"):
        print("note: describe_log_dirs exists in this client")
    else:
        print("note: confluent-kafka has no describe_log_dirs; kafka-python checks it")


def kp_log_dirs():
    """kafka-python's admin client: describe_log_dirs lists each device and the partitions."""
    from kafka.admin import KafkaAdminClient

    a = KafkaAdminClient(bootstrap_servers=BOOT)
    r = a.describe_log_dirs()
    text = repr(r)
    sizes = [p["partition_size"] for b in r for d in b["log_dirs"] for t in d["topics"]
             if t["name"] == "admin-cfg" for p in t["partitions"]]
    if len(sizes) != 1 or sizes[0] <= 0:
        fail(f"describe_log_dirs: admin-cfg partition sizes {sizes}: {text[:400]}")
    print(f"ok: describe_log_dirs: {text[:300]}")
    a.close()


{
    "acl_admin": acl_admin,
    "acl_setup": acl_setup,
    "acl_denied": acl_denied,
    "acl_operations": acl_operations,
    "negotiated": negotiated,
    "sasl_ok": sasl_ok,
    "sasl_refused": sasl_refused,
    "scram_admin": scram_admin,
    "produce_consume": produce_consume,
    "kafka_python": kafka_python,
    "kp_expired": kp_expired,
    "compressed": compressed,
    "idempotent": idempotent,
    "group_rebalance": group_rebalance,
    "committed": committed,
    "produce_log": produce_log,
    "produce_range": produce_range,
    "read_values": read_values,
    "tls": tls,
    "sasl_ssl_setup": sasl_ssl_setup,
    "sasl_ssl_denied": sasl_ssl_denied,
    "tls_untrusted": tls_untrusted,
    "admin_configs": admin_configs,
    "kp_log_dirs": kp_log_dirs,
}[WHAT]()
