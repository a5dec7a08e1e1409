//! Limits in bytes and connections, against hostile clients: too many connections from one
//! address, a client that pipelines large Fetches and never reads, a Fetch asking for more than
//! the broker's cap, frames that announce much and send little. Each time a normal client on
//! another connection is still served.

mod common;

use std::time::{Duration, Instant};

use frontend::client::{record_batch, request_frame, set_correlation_id, Client};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiVersionsRequest, FetchRequest, MetadataRequest, ProduceRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn topic(n: &str) -> TopicName {
    TopicName(StrBytes::from_string(n.to_string()))
}

fn produce(t: &str, batch: Vec<u8>) -> ProduceRequest {
    common::produce_request(t, 0, batch, -1)
}

fn fetch(t: &str, max_bytes: i32) -> FetchRequest {
    let mut p = FetchPartition::default();
    p.fetch_offset = 0;
    p.partition_max_bytes = max_bytes;
    let mut ft = FetchTopic::default();
    ft.topic = topic(t);
    ft.partitions = vec![p];
    let mut r = FetchRequest::default();
    r.replica_id = kafka_protocol::messages::BrokerId(-1);
    r.max_wait_ms = 0;
    r.min_bytes = 1;
    r.max_bytes = max_bytes;
    r.topics = vec![ft];
    r
}

/// Creates `t` and fills it with `batches` batches of one `value_len`-byte record.
async fn fill(c: &mut Client, t: &str, batches: usize, value_len: usize) {
    let mut m = MetadataRequest::default();
    let mut mt = MetadataRequestTopic::default();
    mt.name = Some(topic(t));
    m.topics = Some(vec![mt]);
    m.allow_auto_topic_creation = true;
    c.call(8, &m).await.expect("metadata");
    let value = vec![0x61u8; value_len];
    for _ in 0..batches {
        let r = c
            .call(7, &produce(t, record_batch(&[&value], None)))
            .await
            .expect("produce");
        assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
    }
}

/// A normal client's round trip: a durable produce, acknowledged.
async fn still_served(c: &mut Client, t: &str) {
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        c.call(7, &produce(t, record_batch(&[b"normal"], None))),
    )
    .await
    .expect("a normal producer waited more than 10 s")
    .expect("produce");
    assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
}

/// The server closed the connection: reads reach end of stream (after whatever it had sent).
async fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = vec![0u8; 1 << 20];
    let end = Instant::now() + limit;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

#[cfg(target_os = "linux")]
fn status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_per_address_limit_are_closed_at_once() {
    let s = common::server_on(
        common::sim_device(1, 64 << 20, 200).0,
        frontend::Config {
            max_connections_per_ip: 3,
            ..Default::default()
        },
    );
    let addr = s.local_addr();
    let mut ok = Vec::new();
    for i in 0..3 {
        let mut c = Client::connect(addr, &format!("c{i}")).await.unwrap();
        c.call(3, &ApiVersionsRequest::default()).await.unwrap();
        ok.push(c);
    }
    let mut extra = TcpStream::connect(addr).await.unwrap();
    let frame = request_frame(3, &ApiVersionsRequest::default(), 1, "extra").unwrap();
    let _ = extra.write_all(&frame).await;
    assert!(
        closed_within(&mut extra, Duration::from_secs(5)).await,
        "a fourth connection from the address was served"
    );
    assert_eq!(s.connections(), (3, 1));
    // The three are still served, and one closing makes room.
    ok[0].call(3, &ApiVersionsRequest::default()).await.unwrap();
    drop(ok.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.connections().0 > 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut again = Client::connect(addr, "again").await.unwrap();
    again.call(3, &ApiVersionsRequest::default()).await.unwrap();
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_pipelines_fetches_and_never_reads_is_bounded_then_closed() {
    non_reader_bounded_then_closed(200, false).await;
}

/// The same when the answers must be read from the device (the records left the tail cache): a
/// Fetch that is not answered at once costs nothing to start, so the budget must hold back
/// making its answer, not only starting it (before: every one was read and queued, 320 MB).
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_when_the_answers_come_from_the_device() {
    non_reader_bounded_then_closed(50, true).await;
}

/// A client sends `fetches` Fetches of up to 50 MB of a 6.4 MB partition in one go and never
/// reads; with `past_cache`, 40 MB written to another topic first push the partition out of the
/// tail cache (32 MiB). The broker holds at most its budget and one answer for it, a normal
/// client is still served, and the write timeout closes it.
#[cfg(target_os = "linux")]
async fn non_reader_bounded_then_closed(fetches: i32, past_cache: bool) {
    // The RSS measured is the whole test process's: one such run at a time.
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _alone = ONE_AT_A_TIME.lock().await;
    let budget = 4usize << 20;
    let s = common::server_on(
        common::sim_device(2, 256 << 20, 200).0,
        frontend::Config {
            max_connection_bytes: budget,
            write_timeout: Duration::from_secs(2),
            ..Default::default()
        },
    );
    let addr = s.local_addr();
    let mut normal = Client::connect(addr, "normal").await.unwrap();
    // 6.4 MB in the partition: every Fetch from offset 0 answers with all of it.
    fill(&mut normal, "big", 64, 100_000).await;
    if past_cache {
        fill(&mut normal, "push", 400, 100_000).await;
    }
    let rss_before = status_kib("VmRSS:");
    let mut hog = TcpStream::connect(addr).await.unwrap();
    // Fetches of up to 50 MB each, sent in one go and never read.
    let mut frame = request_frame(11, &fetch("big", 50 << 20), 0, "hog").unwrap();
    let mut all = Vec::new();
    for id in 0..fetches {
        set_correlation_id(&mut frame, id);
        all.extend_from_slice(&frame);
    }
    hog.write_all(&all).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let held = s.queued_bytes();
    let grew_mib = status_kib("VmRSS:").saturating_sub(rss_before) / 1024;
    println!(
        "a client that never reads: the broker holds {held} B for it; RSS grew {grew_mib} MiB"
    );
    // It holds answers (it asked for up to 1.3 GB of them), but no more than the budget plus the
    // one answer (6.4 MB here) started while under it, and the frames of its requests.
    assert!(
        held > 0,
        "nothing held for a client with {fetches} Fetches unanswered"
    );
    assert!(held <= budget + (7 << 20), "held {held} B");
    assert!(grew_mib < 64, "RSS grew {grew_mib} MiB");
    still_served(&mut normal, "big").await;
    // The client never reads: closed after the write timeout (watched from the server, since
    // reading would make it a reader), and its bytes given back.
    let deadline = Instant::now() + Duration::from_secs(15);
    while s.connections().0 > 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        s.connections().0,
        1,
        "a client that never reads was not closed"
    );
    assert_eq!(s.queued_bytes(), 0);
    assert!(closed_within(&mut hog, Duration::from_secs(10)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_answer_stays_within_the_brokers_cap_whatever_it_asks() {
    let cap = 256usize << 10;
    let s = common::server_on(
        common::sim_device(3, 64 << 20, 200).0,
        frontend::Config {
            fetch_max_bytes: cap,
            ..Default::default()
        },
    );
    let mut c = Client::connect(s.local_addr(), "c").await.unwrap();
    fill(&mut c, "capped", 20, 100_000).await;
    let r = c.call(11, &fetch("capped", i32::MAX)).await.unwrap();
    let got = r.responses[0].partitions[0]
        .records
        .as_ref()
        .map_or(0, |b| b.len());
    // Whole batches, up to the cap (one batch always, so a consumer moves on).
    assert!(got > 0 && got <= cap, "{got} B answered, cap {cap}");
    assert!(got < 2_000_000, "the whole partition was answered");
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_that_announce_much_and_send_little_get_no_big_buffers() {
    let s = common::server_on(
        common::sim_device(4, 64 << 20, 200).0,
        frontend::Config {
            max_frame: 64 << 20,
            ..Default::default()
        },
    );
    let addr = s.local_addr();
    let vm_before = status_kib("VmSize:");
    let mut liars = Vec::new();
    for _ in 0..200 {
        let mut t = TcpStream::connect(addr).await.unwrap();
        // A Produce frame announcing 60 MiB, then 20 KiB of it, then nothing.
        let mut f = ((60u32 << 20) as i32).to_be_bytes().to_vec();
        f.extend_from_slice(&[0, 0, 0, 7]);
        f.extend(std::iter::repeat_n(0u8, 20 << 10));
        t.write_all(&f).await.unwrap();
        liars.push(t);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let grew_mib = status_kib("VmSize:").saturating_sub(vm_before) / 1024;
    println!("200 frames announcing 60 MiB each: virtual size grew {grew_mib} MiB");
    // Before: each connection reserved the announced 60 MiB (12 GB of address space).
    assert!(grew_mib < 1024, "virtual size grew {grew_mib} MiB");
    let mut normal = Client::connect(addr, "normal").await.unwrap();
    fill(&mut normal, "n", 1, 10).await;
    still_served(&mut normal, "n").await;
}
