//! The records of large and compressed batches are checked off the event loop: while such a
//! check is held at its gate, the loop still answers other connections, and a later produce of
//! the same connection waits behind it (answers and appends stay in request order).

use crate::common;

use common::kafka_batches::{batch_of, claim, noise};
use common::{until, within};

use bytes::Bytes;
use frontend::client::{record_batch, Client};
use frontend::{CheckGate, Config, Server, ServerOptions};
use kafka_protocol::messages::ProduceRequest;
use kafka_protocol::records::Compression;

/// A broker of one event loop (so every connection shares it) whose checks pass `gate`.
struct OneLoop {
    gate: CheckGate,
    /// None once killed.
    s: Option<Server>,
}

impl OneLoop {
    fn server(&self) -> &Server {
        self.s.as_ref().expect("the server was killed")
    }
}

impl Drop for OneLoop {
    /// A failing test must not leave the broker's threads waiting at the gate: stopping the
    /// server joins them.
    fn drop(&mut self) {
        self.gate.release();
    }
}

/// Starts a `OneLoop` and a client `c` that created `topics`.
async fn one_loop(topics: &[&str]) -> (OneLoop, Client) {
    let gate = CheckGate::default();
    let (dev, _) = common::sim_device(21, 256 << 20, 200);
    let opts = ServerOptions {
        loops: 1,
        check_gate: Some(gate.clone()),
        ..ServerOptions::default()
    };
    let s = common::serve_devices_opts(vec![dev], Default::default(), Config::default(), opts);
    let mut c = Client::connect(s.local_addr(), "c").await.unwrap();
    for t in topics {
        common::create_topic(&mut c, t).await;
    }
    (OneLoop { gate, s: Some(s) }, c)
}

/// A gzip batch of `n` records of 1 KiB that do not compress (about n KiB on the wire).
fn gzip_batch(n: usize) -> Vec<u8> {
    let values: Vec<Bytes> = (0..n as u64)
        .map(|i| Bytes::from(noise(1024, 0x2545_f491_4f6c_dd1d + 2 * i)))
        .collect();
    batch_of(&values, Compression::Gzip)
}

/// A Produce frame (v7) of `batch` to partition 0 of `t`: (correlation id, frame).
fn frame(c: &mut Client, t: &str, batch: Vec<u8>, acks: i16) -> (i32, Bytes) {
    c.frame(7, &common::produce_request(t, 0, batch, acks))
        .expect("frame")
}

/// Produces one record of `value` to partition 0 of `t`: (error code, base offset). `stalled`:
/// what it means when no answer comes.
async fn produce_one(c: &mut Client, t: &str, value: &[u8], stalled: &str) -> (i16, i64) {
    let req = common::produce_request(t, 0, record_batch(&[value], None), -1);
    answer(&within(stalled, c.call(7, &req)).await.expect("produce"))
}

/// (error code, base offset) of the one partition's answer.
fn answer(r: &kafka_protocol::messages::ProduceResponse) -> (i16, i64) {
    let p = &r.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_check_stalls_neither_the_loop_nor_the_order_of_its_connection() {
    let (one, mut a) = one_loop(&["off", "other"]).await;
    let (gate, s) = (&one.gate, one.server());
    let mut b = Client::connect(s.local_addr(), "b").await.unwrap();

    gate.hold();
    const N: i64 = 512;
    let (g_id, g) = frame(&mut a, "off", gzip_batch(N as usize), -1);
    let (s_id, small) = frame(&mut a, "off", record_batch(&[b"after"], None), -1);
    a.send_raw(&[g.clone(), small.clone()].concat())
        .await
        .unwrap();
    until("the gzip batch's check never reached the gate", || {
        gate.waiting() == 1
    })
    .await;

    // Another connection of the same loop is answered while that check is held.
    let stalled = "another connection got no answer while a check was held: the loop is blocked";
    assert_eq!(produce_one(&mut b, "other", b"b", stalled).await, (0, 0));

    // The loop read A's second produce too (A holds both frames; the held check's bytes are
    // counted by the check) but did not append it ahead of the batch still being checked: B's
    // append to the same partition takes offset 0.
    let both = g.len() + small.len() - 8;
    until("the produce behind the held check was not read", || {
        s.queued_bytes() == both
    })
    .await;
    assert_eq!(
        produce_one(&mut b, "off", b"b0", stalled).await,
        (0, 0),
        "A's later produce went ahead of its held one"
    );
    assert_eq!(gate.waiting(), 1);

    // Released: both of A's produces are answered, in order, at the offsets after B's.
    gate.release();
    let (id, r) = within("no answer to the gzip produce", a.recv::<ProduceRequest>(7))
        .await
        .unwrap();
    assert_eq!((id, answer(&r)), (g_id, (0, 1)));
    let (id, r) = within(
        "no answer to the produce behind it",
        a.recv::<ProduceRequest>(7),
    )
    .await
    .unwrap();
    assert_eq!((id, answer(&r)), (s_id, (0, 1 + N)));
    assert_eq!(
        produce_one(&mut b, "off", b"b1", "no answer").await,
        (0, 2 + N)
    );
    until("bytes still counted with nothing held", || {
        s.queued_bytes() == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_a_batch_refused_off_the_loop_answers_each_partition_for_itself() {
    let (_one, mut c) = one_loop(&["good", "liar"]).await;
    // One request: a large gzip batch to "good", the same batch claiming a record more than it
    // holds to "liar" (both too large to check on the loop).
    let mut req = common::produce_request("good", 0, gzip_batch(256), -1);
    let liar = common::produce_request("liar", 0, claim(gzip_batch(256), 257), -1);
    req.topic_data.extend(liar.topic_data);
    let r = c.call(8, &req).await.unwrap();
    let good = &r.responses[0].partition_responses[0];
    let bad = &r.responses[1].partition_responses[0];
    assert_eq!((good.error_code, good.base_offset), (0, 0));
    assert_eq!(bad.error_code, 87, "{bad:?}"); // INVALID_RECORD
    let msg = bad
        .error_message
        .as_ref()
        .map(|m| m.to_string())
        .unwrap_or_default();
    assert!(msg.contains("257"), "{msg}");
    // Nothing of the refused batch was stored: the next append to "liar" takes offset 0.
    assert_eq!(produce_one(&mut c, "liar", b"x", "no answer").await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acks_zero_batch_refused_off_the_loop_closes_the_connection_before_later_requests() {
    let (one, mut c) = one_loop(&["z"]).await;
    let (gate, s) = (&one.gate, one.server());
    gate.hold();
    let (_, before) = frame(&mut c, "z", record_batch(&[b"before"], None), -1);
    let (_, bad) = frame(&mut c, "z", claim(gzip_batch(256), 300), 0);
    let (_, after) = frame(&mut c, "z", record_batch(&[b"after"], None), -1);
    c.send_raw(&[before, bad, after].concat()).await.unwrap();
    until("the bad batch's check never reached the gate", || {
        gate.waiting() == 1
    })
    .await;
    gate.release();
    let (_, r) = within(
        "no answer to the first produce",
        c.recv::<ProduceRequest>(7),
    )
    .await
    .unwrap();
    assert_eq!(answer(&r), (0, 0));
    assert!(
        within("the connection stayed open", c.recv_raw())
            .await
            .is_err(),
        "the request after the failed acks=0 produce was answered"
    );
    // Only the first record was stored.
    let mut d = Client::connect(s.local_addr(), "d").await.unwrap();
    assert_eq!(produce_one(&mut d, "z", b"x", "no answer").await, (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_counts_its_bytes_until_it_is_dropped_even_with_its_connection_gone() {
    let (mut one, mut c) = one_loop(&["gone"]).await;
    let probe = one.server().front_probe();
    let queued = move || probe().2;
    let gate = &one.gate;
    gate.hold();
    let (_, g) = frame(&mut c, "gone", gzip_batch(256), -1);
    c.send_raw(&g).await.unwrap();
    until("the check never reached the gate", || gate.waiting() == 1).await;
    // Counted once: by the job while the pool holds it, not by the connection too.
    until("the held request is not counted", || {
        queued() == g.len() - 4
    })
    .await;
    // The broker stops (its loop is not held up by the check), dropping the connection and
    // what it counted; the job still holds the frame and still counts it...
    let _broker = one.s.take().map(Server::kill);
    assert_eq!(queued(), g.len() - 4);
    // ...until a checking thread drops it unchecked: nobody waits for its answer.
    gate.release();
    until("the check's bytes were never given back", || queued() == 0).await;
    drop(c);
}
