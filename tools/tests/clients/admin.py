"""confluent-kafka AdminClient and static-membership scenarios against an nvmq broker, driven by
tools/tests/suite/admin_clients.rs. Each prints what it checked and exits non-zero (with the reason)
on any failure. Usage: admin.py <bootstrap> <scenario>
"""
import sys
import time

from confluent_kafka import (Consumer, ConsumerGroupState,
                             KafkaError, KafkaException, Producer, TopicPartition)
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

BOOT = sys.argv[1]
WHAT = sys.argv[2]
WAIT = 30


def fail(msg):
    print("FAIL:", msg, flush=True)
    sys.exit(1)


def error_code(exc):
    """The KafkaError code inside an exception a future raised."""
    err = exc.args[0] if exc.args else None
    return err.code() if isinstance(err, KafkaError) else None


def produce(topic, per_partition, partitions):
    p = Producer({"bootstrap.servers": BOOT, "acks": "all"})
    for part in range(partitions):
        for i in range(per_partition):
            p.produce(topic, value=f"{part}-{i}".encode(), partition=part)
    if p.flush(WAIT):
        fail("messages left undelivered")


def consumer(group, client_id, instance=None):
    conf = {"bootstrap.servers": BOOT, "group.id": group, "client.id": client_id,
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "session.timeout.ms": 30000, "heartbeat.interval.ms": 500,
            "partition.assignment.strategy": "range"}
    if instance:
        conf["group.instance.id"] = instance
    c = Consumer(conf)
    return c


def wait_assigned(consumers, n_each):
    deadline = time.time() + 60
    while time.time() < deadline:
        for c in consumers:
            c.poll(0.2)
        if all(len(c.assignment()) == n_each for c in consumers):
            return
    fail(f"assignments never settled: {[c.assignment() for c in consumers]}")


def groups():
    """List, describe, delete groups and offsets, describe the cluster, list offsets."""
    a = AdminClient({"bootstrap.servers": BOOT})
    for f in a.create_topics([NewTopic("adm", 2, 1), NewTopic("other", 1, 1)]).values():
        f.result(WAIT)
    produce("adm", 5, 2)
    live = consumer("g-live", "live-client")
    live.subscribe(["adm"])
    wait_assigned([live], 2)
    live.commit(offsets=[TopicPartition("adm", 0, 3), TopicPartition("adm", 1, 4)],
                asynchronous=False)
    idle = consumer("g-idle", "idle-client")
    idle.commit(offsets=[TopicPartition("adm", 0, 2), TopicPartition("other", 0, 0)],
                asynchronous=False)

    listed = a.list_consumer_groups(request_timeout=WAIT).result(WAIT)
    states = {g.group_id: g.state for g in listed.valid}
    if states.get("g-live") != ConsumerGroupState.STABLE or \
            states.get("g-idle") != ConsumerGroupState.EMPTY:
        fail(f"list_consumer_groups: {states}")
    stable = a.list_consumer_groups(states={ConsumerGroupState.STABLE}).result(WAIT)
    if [g.group_id for g in stable.valid] != ["g-live"]:
        fail(f"the STABLE filter listed {[g.group_id for g in stable.valid]}")
    print(f"ok: listed {sorted(states.items())}", flush=True)

    d = a.describe_consumer_groups(["g-live"], request_timeout=WAIT)["g-live"].result(WAIT)
    parts = sorted((tp.topic, tp.partition) for m in d.members
                   for tp in m.assignment.topic_partitions)
    if d.state != ConsumerGroupState.STABLE or len(d.members) != 1 \
            or d.members[0].client_id != "live-client" or parts != [("adm", 0), ("adm", 1)] \
            or d.coordinator.id != 0 or d.partition_assignor != "range":
        fail(f"describe_consumer_groups: {d.state} {d.members} {parts} {d.coordinator}")
    print(f"ok: described g-live: {d.state}, member {d.members[0].member_id} holds {parts}",
          flush=True)

    try:
        a.delete_consumer_groups(["g-live"], request_timeout=WAIT)["g-live"].result(WAIT)
        fail("a group with a member was deleted")
    except KafkaException as e:
        if error_code(e) != KafkaError.NON_EMPTY_GROUP:
            fail(f"deleting a live group: {e}")
    print("ok: a group with a member is not deleted (NON_EMPTY_GROUP)", flush=True)

    # confluent-kafka has no OffsetDelete; kafka-python's admin client sends it.
    from kafka import KafkaAdminClient, TopicPartition as KTP
    from kafka.errors import GroupSubscribedToTopicError, NoError
    kp = KafkaAdminClient(bootstrap_servers=BOOT)
    res = kp.delete_group_offsets("g-live", [KTP("adm", 0)])
    if list(res.values()) != [GroupSubscribedToTopicError]:
        fail(f"deleting a subscribed topic's offset: {res}")
    res = kp.delete_group_offsets("g-idle", [KTP("other", 0)])
    if list(res.values()) != [NoError]:
        fail(f"deleting an offset: {res}")
    left = idle.committed([TopicPartition("adm", 0), TopicPartition("other", 0)], timeout=WAIT)
    if [tp.offset for tp in left] != [2, -1001]:
        fail(f"after deleting g-idle's offset of other-0, it has {left}")
    print("ok: offsets deleted, a subscribed topic's refused (GROUP_SUBSCRIBED_TO_TOPIC)",
          flush=True)

    live.close()  # leaves the group
    idle.close()
    for g, f in a.delete_consumer_groups(["g-live", "g-idle"], request_timeout=WAIT).items():
        f.result(WAIT)
    listed = a.list_consumer_groups(request_timeout=WAIT).result(WAIT)
    if {g.group_id for g in listed.valid} & {"g-live", "g-idle"}:
        fail(f"deleted groups still listed: {[g.group_id for g in listed.valid]}")
    print("ok: both groups deleted", flush=True)

    c = a.describe_cluster(request_timeout=WAIT).result(WAIT)
    if c.cluster_id != "nvmq" or c.controller.id != 0 or [n.id for n in c.nodes] != [0]:
        fail(f"describe_cluster: {c.cluster_id} {c.controller} {c.nodes}")
    print(f"ok: cluster {c.cluster_id}, controller {c.controller.id}", flush=True)

    specs = {TopicPartition("adm", 0): OffsetSpec.latest(),
             TopicPartition("adm", 1): OffsetSpec.earliest()}
    got = {tp.partition: f.result(WAIT).offset
           for tp, f in a.list_offsets(specs, request_timeout=WAIT).items()}
    if got != {0: 5, 1: 0}:
        fail(f"list_offsets: {got}")
    print(f"ok: list_offsets {got}", flush=True)


def static_member():
    """Two static members split a topic; one restarts under its instance id and gets its
    partition back while the other never rebalances."""
    a = AdminClient({"bootstrap.servers": BOOT})
    a.create_topics([NewTopic("st", 2, 1)])["st"].result(WAIT)
    assigned_b = []
    m1 = consumer("g-static", "m1", instance="inst-1")
    m2 = consumer("g-static", "m2", instance="inst-2")
    m1.subscribe(["st"])
    m2.subscribe(["st"], on_assign=lambda c, ps: assigned_b.append(sorted(p.partition for p in ps)))
    wait_assigned([m1, m2], 1)
    before = sorted(p.partition for p in m1.assignment())
    other = sorted(p.partition for p in m2.assignment())
    print(f"two static members: m1={before} m2={other}", flush=True)
    assigned_b.clear()  # from here on, any assignment m2 gets is a rebalance
    m1.close()  # a static member does not leave: its place waits for it
    m1 = consumer("g-static", "m1", instance="inst-1")
    m1.subscribe(["st"])
    deadline = time.time() + 60
    while time.time() < deadline and len(m1.assignment()) != 1:
        m1.poll(0.2)
        m2.poll(0.2)
    after = sorted(p.partition for p in m1.assignment())
    if after != before:
        fail(f"the restarted member got {after}, not its {before}")
    for _ in range(10):  # time for a rebalance, were one to start
        m2.poll(0.2)
        m1.poll(0.2)
    if assigned_b or sorted(p.partition for p in m2.assignment()) != other:
        fail(f"the other member rebalanced: its assignments {assigned_b}")
    d = a.describe_consumer_groups(["g-static"])["g-static"].result(WAIT)
    inst = sorted(m.group_instance_id for m in d.members)
    if d.state != ConsumerGroupState.STABLE or inst != ["inst-1", "inst-2"]:
        fail(f"described {d.state} with instances {inst}")
    print(f"ok: m1 restarted with {after}; m2 kept {other} without a rebalance", flush=True)
    m1.close()
    m2.close()
    # Static members do not leave on close: an operator removes them by instance id (kafka-python
    # sends LeaveGroup v3's batch).
    from kafka import KafkaAdminClient
    from kafka.admin import MemberToRemove
    from kafka.errors import NoError
    kp = KafkaAdminClient(bootstrap_servers=BOOT)
    res = kp.remove_group_members("g-static", [MemberToRemove(group_instance_id="inst-1"),
                                               MemberToRemove(group_instance_id="inst-2")])
    if set(res.values()) != {NoError}:
        fail(f"removing the static members: {res}")
    d = a.describe_consumer_groups(["g-static"])["g-static"].result(WAIT)
    if d.state != ConsumerGroupState.EMPTY or d.members:
        fail(f"after removing both: {d.state} {d.members}")
    print("ok: both static members removed by instance id", flush=True)


def transactions():
    """init_transactions() fails at once with a fatal, named error: not a timeout."""
    p = Producer({"bootstrap.servers": BOOT, "transactional.id": "tx-1"})
    try:
        p.init_transactions(30)
        fail("init_transactions succeeded")
    except KafkaException as e:
        err = e.args[0]
        if err.code() != KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED or err.retriable():
            fail(f"init_transactions: {err}")
        print(f"ok: init_transactions refused: {err}", flush=True)


{"groups": groups, "static_member": static_member, "transactions": transactions}[WHAT]()
