//! The protocol on the wire, in process: ordering, pipelining, acks=0, long polling,
//! idempotence, bad input. (The real-client tests are tools/tests/suite/kafka_clients.rs.)

use crate::common;

use std::time::{Duration, Instant};

use frontend::client::{record_batch, Client};
use frontend::codes;
use frontend::versions;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiVersionsRequest, ApiVersionsResponse, FetchRequest, InitProducerIdRequest, MetadataRequest,
    ProduceRequest, TopicName,
};
use kafka_protocol::protocol::{Decodable, StrBytes};

fn topic(n: &str) -> TopicName {
    TopicName(StrBytes::from_string(n.to_string()))
}

fn produce(t: &str, part: i32, batch: Vec<u8>, acks: i16) -> ProduceRequest {
    common::produce_request(t, part, batch, acks)
}

fn fetch(t: &str, offset: i64, wait_ms: i32, min_bytes: i32) -> FetchRequest {
    let mut p = FetchPartition::default();
    p.fetch_offset = offset;
    p.partition_max_bytes = 1 << 20;
    let mut ft = FetchTopic::default();
    ft.topic = topic(t);
    ft.partitions = vec![p];
    let mut r = FetchRequest::default();
    r.replica_id = kafka_protocol::messages::BrokerId(-1);
    r.max_wait_ms = wait_ms;
    r.min_bytes = min_bytes;
    r.max_bytes = 50 << 20;
    r.topics = vec![ft];
    r
}

async fn create(c: &mut Client, t: &str) {
    let mut m = MetadataRequest::default();
    let mut mt = MetadataRequestTopic::default();
    mt.name = Some(topic(t));
    m.topics = Some(vec![mt]);
    m.allow_auto_topic_creation = true;
    let r = c.call(8, &m).await.expect("metadata");
    assert_eq!(r.topics[0].error_code, 0);
    assert_eq!(r.topics[0].partitions.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_produces_are_answered_in_order_and_fetch_patches_offsets() {
    let (addr, _b) = common::serve(Default::default()).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    create(&mut c, "p").await;
    // 100 requests in flight at once, 3 records each.
    let mut ids = Vec::new();
    for i in 0..100u32 {
        let v = i.to_be_bytes();
        let b = record_batch(&[&v, &v, &v], None);
        ids.push(c.send(7, &produce("p", 0, b, -1)).await.unwrap());
    }
    for (i, id) in ids.iter().enumerate() {
        let (got, r) = c.recv::<ProduceRequest>(7).await.unwrap();
        assert_eq!(got, *id, "answers out of order");
        let pr = &r.responses[0].partition_responses[0];
        assert_eq!((pr.error_code, pr.base_offset), (0, 3 * i as i64));
    }
    let f = c.call(11, &fetch("p", 4, 0, 1)).await.unwrap();
    let pd = &f.responses[0].partitions[0];
    assert_eq!(pd.high_watermark, 300);
    let recs = pd.records.clone().unwrap();
    // The first batch returned holds offset 4: base offset 3, rewritten from the 0 sent.
    assert_eq!(i64::from_be_bytes(recs[..8].try_into().unwrap()), 3);
    let mut buf = recs.clone();
    let batches = kafka_protocol::records::RecordBatchDecoder::decode_all(&mut buf).unwrap();
    assert_eq!(batches[0].records[1].offset, 4);
    assert_eq!(batches[1].records[0].offset, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_zero_gets_no_answer_and_the_next_request_stays_in_step() {
    let (addr, _b) = common::serve(Default::default()).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    create(&mut c, "z").await;
    c.send(7, &produce("z", 0, record_batch(&[b"x"], None), 0))
        .await
        .unwrap();
    let r = c.call(3, &ApiVersionsRequest::default()).await.unwrap();
    assert_eq!(r.error_code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_at_the_end_waits_for_new_durable_data() {
    let (addr, _b) = common::serve(Default::default()).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    create(&mut c, "w").await;
    let id = c.send(11, &fetch("w", 0, 5000, 1)).await.unwrap();
    let started = Instant::now();
    let mut p = Client::connect(addr, "p").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    p.call(7, &produce("w", 0, record_batch(&[b"late"], None), -1))
        .await
        .unwrap();
    let (got, f) = c.recv::<FetchRequest>(11).await.unwrap();
    assert_eq!(got, id);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the fetch waited out its timeout"
    );
    assert_eq!(f.responses[0].partitions[0].high_watermark, 1);
    assert!(f.responses[0].partitions[0]
        .records
        .as_ref()
        .is_some_and(|r| !r.is_empty()));
    // Nothing new: the fetch comes back empty after max_wait.
    let t = Instant::now();
    let f = c.call(11, &fetch("w", 1, 300, 1)).await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(250));
    assert_eq!(
        f.responses[0].partitions[0]
            .records
            .as_ref()
            .map_or(0, |r| r.len()),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_retry_is_stored_once_and_a_gap_is_refused() {
    let (addr, _b) = common::serve(Default::default()).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    create(&mut c, "i").await;
    let mut init = InitProducerIdRequest::default();
    init.transactional_id = None;
    let ip = c.call(1, &init).await.unwrap();
    assert_eq!(ip.error_code, 0);
    let pid = ip.producer_id.0;
    let b0 = record_batch(&[b"a", b"b"], Some((pid, 0, 0)));
    let first = c.call(7, &produce("i", 0, b0.clone(), -1)).await.unwrap();
    let retry = c.call(7, &produce("i", 0, b0, -1)).await.unwrap();
    let (f, r) = (
        &first.responses[0].partition_responses[0],
        &retry.responses[0].partition_responses[0],
    );
    assert_eq!((f.error_code, r.error_code), (0, 0));
    assert_eq!(f.base_offset, r.base_offset, "the retry was stored again");
    let gap = c
        .call(
            7,
            &produce("i", 0, record_batch(&[b"c"], Some((pid, 0, 5))), -1),
        )
        .await
        .unwrap();
    assert_eq!(
        gap.responses[0].partition_responses[0].error_code,
        codes::OUT_OF_ORDER_SEQUENCE_NUMBER
    );
    let next = c
        .call(
            7,
            &produce("i", 0, record_batch(&[b"c"], Some((pid, 0, 2))), -1),
        )
        .await
        .unwrap();
    assert_eq!(next.responses[0].partition_responses[0].base_offset, 2);
    // A second producer id is a different one.
    let ip2 = c.call(1, &init).await.unwrap();
    assert_ne!(ip2.producer_id.0, pid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_batches_and_unknown_partitions_get_per_partition_errors() {
    let (addr, _b) = common::serve(Default::default()).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    create(&mut c, "c").await;
    let mut b = record_batch(&[b"x"], None);
    let last = b.len() - 1;
    b[last] ^= 0xff;
    let r = c.call(7, &produce("c", 0, b, -1)).await.unwrap();
    assert_eq!(
        r.responses[0].partition_responses[0].error_code,
        codes::CORRUPT_MESSAGE
    );
    let r = c
        .call(7, &produce("c", 3, record_batch(&[b"x"], None), -1))
        .await
        .unwrap();
    assert_eq!(
        r.responses[0].partition_responses[0].error_code,
        codes::UNKNOWN_TOPIC_OR_PARTITION
    );
    let r = c
        .call(7, &produce("nope", 0, record_batch(&[b"x"], None), -1))
        .await
        .unwrap();
    assert_eq!(
        r.responses[0].partition_responses[0].error_code,
        codes::UNKNOWN_TOPIC_OR_PARTITION
    );
    let f = c.call(11, &fetch("c", 99, 0, 1)).await.unwrap();
    assert_eq!(
        f.responses[0].partitions[0].error_code,
        codes::OFFSET_OUT_OF_RANGE
    );
}

/// A connection the server closed: the next read sees end of stream.
async fn closed(c: &mut Client) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(5), c.recv_raw()).await,
        Ok(Err(_))
    )
}

fn raw(key: i16, version: i16, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    let len = 4 + 4 + 2 + 1 + body.len();
    f.extend((len as i32).to_be_bytes());
    f.extend(key.to_be_bytes());
    f.extend(version.to_be_bytes());
    f.extend(9i32.to_be_bytes());
    f.extend(1i16.to_be_bytes());
    f.push(b'x');
    f.extend(body);
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_close_only_their_own_connection() {
    let (addr, _b) = common::serve(Default::default()).await;
    let mut bystander = Client::connect(addr, "ok").await.unwrap();
    bystander
        .call(3, &ApiVersionsRequest::default())
        .await
        .unwrap();

    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("oversized frame", (1i32 << 30).to_be_bytes().to_vec()),
        ("negative length", (-5i32).to_be_bytes().to_vec()),
        ("short frame", [0, 0, 0, 3, 0, 18, 0].to_vec()),
        ("unknown api key", raw(999, 0, &[])),
        ("unserved api", raw(32, 0, &[])),
        ("truncated produce v2", raw(0, 2, &[0, 0, 0, 0])),
        ("produce v9", raw(0, 9, &[0; 20])),
        ("fetch v12", raw(1, 12, &[0; 40])),
        ("truncated metadata", raw(3, 1, &[0, 0, 0, 2, 0, 1])),
        (
            "absurd topic count",
            raw(3, 1, &0x7fff_ffffi32.to_be_bytes()),
        ),
        (
            "absurd produce count",
            raw(
                0,
                7,
                &[0xff, 0xff, 0, 1, 0, 0, 0, 1, 0x7f, 0xff, 0xff, 0xff],
            ),
        ),
    ];
    for (what, frame) in cases {
        let mut c = Client::connect(addr, "bad").await.unwrap();
        c.send_raw(&frame).await.unwrap();
        assert!(closed(&mut c).await, "{what}: connection not closed");
        // Everyone else is still served.
        let r = bystander
            .call(3, &ApiVersionsRequest::default())
            .await
            .unwrap();
        assert_eq!(r.error_code, 0, "{what}");
    }

    // An ApiVersions version above the served range: UNSUPPORTED_VERSION in a v0 body, listing
    // what is served, and the connection stays open.
    let mut c = Client::connect(addr, "new").await.unwrap();
    c.send_raw(&raw(18, 9, &[])).await.unwrap();
    let b = c.recv_raw().await.unwrap();
    let r = ApiVersionsResponse::decode(&mut b.slice(4..), 0).unwrap();
    assert_eq!(r.error_code, codes::UNSUPPORTED_VERSION);
    assert!(r
        .api_keys
        .iter()
        .any(|k| k.api_key == 0 && Some(k.max_version) == versions::lookup(0).map(|a| a.max)));
    assert_eq!(
        c.call(3, &ApiVersionsRequest::default())
            .await
            .unwrap()
            .error_code,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_or_stalled_connection_is_closed() {
    let (addr, _b) = common::serve(frontend::Config {
        idle_timeout: Duration::from_millis(300),
        ..Default::default()
    })
    .await;
    let mut idle = Client::connect(addr, "idle").await.unwrap();
    idle.call(3, &ApiVersionsRequest::default()).await.unwrap();
    // Half a frame, then nothing.
    let mut stalled = Client::connect(addr, "stalled").await.unwrap();
    stalled.send_raw(&[0, 0, 0, 40, 0, 18]).await.unwrap();
    let t = Instant::now();
    assert!(closed(&mut idle).await, "idle connection left open");
    assert!(closed(&mut stalled).await, "stalled connection left open");
    assert!(t.elapsed() >= Duration::from_millis(200));
    // A busy connection is not idle: a long poll longer than the idle timeout is answered.
    let mut busy = Client::connect(addr, "busy").await.unwrap();
    create(&mut busy, "idle-t").await;
    let f = busy.call(11, &fetch("idle-t", 0, 600, 1)).await.unwrap();
    assert_eq!(f.responses[0].partitions[0].error_code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_partitions_grows_a_topic_and_refuses_to_shrink_it() {
    use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
    use kafka_protocol::messages::CreatePartitionsRequest;
    let (addr, b) = common::serve(Default::default()).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    create(&mut c, "grow").await;
    let req = |t: &str, count: i32| {
        let mut pt = CreatePartitionsTopic::default();
        pt.name = topic(t);
        pt.count = count;
        pt.assignments = None;
        let mut r = CreatePartitionsRequest::default();
        r.topics = vec![pt];
        r.timeout_ms = 5000;
        r
    };
    let code = |r: kafka_protocol::messages::CreatePartitionsResponse| r.results[0].error_code;
    assert_eq!(code(c.call(1, &req("grow", 3)).await.unwrap()), 0);
    assert_eq!(b.broker().topics().map["grow"].len(), 3);
    assert_eq!(
        code(c.call(1, &req("grow", 2)).await.unwrap()),
        codes::INVALID_PARTITIONS
    );
    assert_eq!(
        code(c.call(1, &req("nope", 2)).await.unwrap()),
        codes::UNKNOWN_TOPIC_OR_PARTITION
    );
    // The new partition takes data.
    let r = c
        .call(7, &produce("grow", 2, record_batch(&[b"x"], None), -1))
        .await
        .unwrap();
    assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
}
