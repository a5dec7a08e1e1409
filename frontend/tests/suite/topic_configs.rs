//! Topic and broker configs (DescribeConfigs, AlterConfigs, IncrementalAlterConfigs, CreateTopics'
//! configs), what the honoured ones do (max.message.bytes, retention.ms, retention.bytes),
//! DeleteRecords and DescribeLogDirs, over the wire against an in-process broker.

use crate::common;

use std::collections::HashMap;

use bytes::Bytes;
use frontend::client::{record_batch, Client};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::describe_configs_response::DescribeConfigsResult;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

const INVALID_CONFIG: i16 = 40;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn topic(n: &str) -> TopicName {
    TopicName(s(n))
}

async fn describe(
    c: &mut Client,
    v: i16,
    kind: i8,
    name: &str,
    keys: Option<&[&str]>,
) -> DescribeConfigsResult {
    let mut res = describe_configs_request::DescribeConfigsResource::default();
    res.resource_type = kind;
    res.resource_name = s(name);
    res.configuration_keys = keys.map(|k| k.iter().map(|k| s(k)).collect());
    let mut r = DescribeConfigsRequest::default();
    r.resources = vec![res];
    r.include_synonyms = true;
    r.include_documentation = v >= 3;
    let mut out = c.call(v, &r).await.expect("describe configs");
    out.results.remove(0)
}

/// name → (value, source, read_only).
fn values(r: &DescribeConfigsResult) -> HashMap<String, (String, i8, bool)> {
    r.configs
        .iter()
        .map(|c| {
            let v = c.value.as_ref().map(|v| v.to_string()).unwrap_or_default();
            (c.name.to_string(), (v, c.config_source, c.read_only))
        })
        .collect()
}

/// IncrementalAlterConfigs of one topic: (code, message).
async fn incremental(
    c: &mut Client,
    v: i16,
    kind: i8,
    name: &str,
    ops: &[(&str, i8, Option<&str>)],
    validate_only: bool,
) -> (i16, String) {
    let mut res = incremental_alter_configs_request::AlterConfigsResource::default();
    res.resource_type = kind;
    res.resource_name = s(name);
    res.configs = ops
        .iter()
        .map(|(n, op, val)| {
            let mut a = incremental_alter_configs_request::AlterableConfig::default();
            a.name = s(n);
            a.config_operation = *op;
            a.value = val.map(s);
            a
        })
        .collect();
    let mut r = IncrementalAlterConfigsRequest::default();
    r.resources = vec![res];
    r.validate_only = validate_only;
    let out = c.call(v, &r).await.expect("incremental alter");
    let x = &out.responses[0];
    let msg = x.error_message.as_ref().map(|m| m.to_string());
    (x.error_code, msg.unwrap_or_default())
}

async fn produce(c: &mut Client, t: &str, values: &[&[u8]]) -> (i16, i64) {
    let r = c
        .call(
            7,
            &common::produce_request(t, 0, record_batch(values, None), -1),
        )
        .await
        .expect("produce");
    let p = &r.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

/// Fetch of partition 0 at `offset`: (error code, log start offset, bytes of records).
async fn fetch(c: &mut Client, t: &str, offset: i64) -> (i16, i64, usize) {
    let mut p = FetchPartition::default();
    p.partition = 0;
    p.fetch_offset = offset;
    p.partition_max_bytes = 1 << 20;
    let mut ft = FetchTopic::default();
    ft.topic = topic(t);
    ft.partitions = vec![p];
    let mut r = FetchRequest::default();
    r.max_wait_ms = 0;
    r.max_bytes = 1 << 20;
    r.topics = vec![ft];
    let out = c.call(11, &r).await.expect("fetch");
    let pd = &out.responses[0].partitions[0];
    let n = pd.records.as_ref().map_or(0, Bytes::len);
    (pd.error_code, pd.log_start_offset, n)
}

async fn earliest(c: &mut Client, t: &str) -> i64 {
    let mut p = ListOffsetsPartition::default();
    p.partition_index = 0;
    p.timestamp = -2;
    let mut lt = ListOffsetsTopic::default();
    lt.name = topic(t);
    lt.partitions = vec![p];
    let mut r = ListOffsetsRequest::default();
    r.replica_id = BrokerId(-1);
    r.topics = vec![lt];
    let out = c.call(5, &r).await.expect("list offsets");
    out.topics[0].partitions[0].offset
}

async fn delete_records(c: &mut Client, v: i16, t: &str, offset: i64) -> (i16, i64) {
    let mut p = delete_records_request::DeleteRecordsPartition::default();
    p.partition_index = 0;
    p.offset = offset;
    let mut dt = delete_records_request::DeleteRecordsTopic::default();
    dt.name = topic(t);
    dt.partitions = vec![p];
    let mut r = DeleteRecordsRequest::default();
    r.topics = vec![dt];
    r.timeout_ms = 5000;
    let out = c.call(v, &r).await.expect("delete records");
    let x = &out.topics[0].partitions[0];
    (x.error_code, x.low_watermark)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_configs_are_described_altered_and_refused_with_reasons() {
    let (addr, _s) = common::serve(Default::default()).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    common::create_topic(&mut c, "cfg").await;

    // Defaults at v1 (non-flexible) and v4 (flexible), with synonyms and documentation.
    for v in [1, 4] {
        let d = describe(&mut c, v, 2, "cfg", None).await;
        assert_eq!(d.error_code, 0);
        let m = values(&d);
        assert_eq!(m["retention.ms"], ("-1".into(), 5, false));
        assert_eq!(m["cleanup.policy"], ("delete".into(), 5, false));
        assert!(m["max.message.bytes"].0.parse::<u64>().unwrap() > 0);
        let rm = d
            .configs
            .iter()
            .find(|x| x.name.as_str() == "retention.ms")
            .unwrap();
        assert_eq!(rm.synonyms[0].name.as_str(), "log.retention.ms");
        if v >= 3 {
            assert!(rm.documentation.as_ref().is_some_and(|d| !d.is_empty()));
        }
    }
    let only = describe(&mut c, 4, 2, "cfg", Some(&["retention.bytes"])).await;
    assert_eq!(only.configs.len(), 1);
    assert_eq!(describe(&mut c, 4, 2, "nope", None).await.error_code, 3);

    // validate_only checks and stores nothing.
    let ok = incremental(
        &mut c,
        1,
        2,
        "cfg",
        &[("retention.ms", 0, Some("60000"))],
        true,
    )
    .await;
    assert_eq!(ok.0, 0);
    assert_eq!(
        values(&describe(&mut c, 4, 2, "cfg", None).await)["retention.ms"].0,
        "-1"
    );
    // SET, at v0 and v1.
    for (v, val) in [(0, "60000"), (1, "120000")] {
        let r = incremental(
            &mut c,
            v,
            2,
            "cfg",
            &[("retention.ms", 0, Some(val))],
            false,
        )
        .await;
        assert_eq!(r.0, 0, "{r:?}");
        let m = values(&describe(&mut c, 4, 2, "cfg", None).await);
        assert_eq!(m["retention.ms"], (val.into(), 1, false));
    }
    let set = describe(&mut c, 4, 2, "cfg", Some(&["retention.ms"])).await;
    let syn: Vec<(String, i8)> = set.configs[0]
        .synonyms
        .iter()
        .map(|y| (y.name.to_string(), y.source))
        .collect();
    assert_eq!(
        syn,
        [("retention.ms".into(), 1), ("log.retention.ms".into(), 5)]
    );

    // Refused: compact (also by APPEND), an unknown name, a bad value; none changes anything.
    for ops in [
        vec![("cleanup.policy", 0, Some("compact"))],
        vec![("cleanup.policy", 2, Some("compact"))],
        vec![
            ("retention.ms", 0, Some("60000")),
            ("no.such.config", 0, Some("1")),
        ],
        vec![("retention.bytes", 0, Some("-7"))],
        vec![("retention.bytes", 0, Some("lots"))],
        vec![("max.message.bytes", 0, Some("999999999999"))],
        vec![("segment.bytes", 2, Some("1"))],
    ] {
        let (code, msg) = incremental(&mut c, 1, 2, "cfg", &ops, false).await;
        assert_eq!(code, INVALID_CONFIG, "{ops:?}");
        assert!(!msg.is_empty(), "{ops:?}: no message");
    }
    let (_, msg) = incremental(
        &mut c,
        1,
        2,
        "cfg",
        &[("cleanup.policy", 0, Some("compact"))],
        false,
    )
    .await;
    assert!(msg.contains("compact"), "{msg}");
    assert_eq!(
        values(&describe(&mut c, 4, 2, "cfg", None).await)["retention.ms"].0,
        "120000"
    );
    // An accepted no-op, and DELETE back to the default.
    let r = incremental(
        &mut c,
        1,
        2,
        "cfg",
        &[
            ("segment.bytes", 0, Some("1048576")),
            ("retention.ms", 1, None),
        ],
        false,
    )
    .await;
    assert_eq!(r.0, 0, "{r:?}");
    let m = values(&describe(&mut c, 4, 2, "cfg", None).await);
    assert_eq!(m["retention.ms"], ("-1".into(), 5, false));
    assert_eq!(m["segment.bytes"], ("1048576".into(), 1, false));
    // Unknown topic.
    let r = incremental(
        &mut c,
        1,
        2,
        "nope",
        &[("retention.ms", 0, Some("1"))],
        false,
    )
    .await;
    assert_eq!(r.0, 3);

    // AlterConfigs replaces the whole set: segment.bytes left out goes back to its default.
    for v in [0, 2] {
        let mut a = alter_configs_request::AlterableConfig::default();
        a.name = s("retention.bytes");
        a.value = Some(s("4096"));
        let mut res = alter_configs_request::AlterConfigsResource::default();
        res.resource_type = 2;
        res.resource_name = s("cfg");
        res.configs = vec![a];
        let mut r = AlterConfigsRequest::default();
        r.resources = vec![res];
        let out = c.call(v, &r).await.unwrap();
        assert_eq!(out.responses[0].error_code, 0);
        let m = values(&describe(&mut c, 4, 2, "cfg", None).await);
        assert_eq!(m["retention.bytes"], ("4096".into(), 1, false));
        assert_eq!(m["segment.bytes"].1, 5);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_configs_are_the_serve_settings_read_only() {
    let cfg = frontend::Config {
        default_partitions: 3,
        settings: vec![("nvmq.flush".into(), "always".into(), true)],
        ..Default::default()
    };
    let (addr, _s) = common::serve(cfg).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    for v in [1, 4] {
        let d = describe(&mut c, v, 4, "0", None).await;
        assert_eq!(d.error_code, 0);
        let m = values(&d);
        assert_eq!(m["num.partitions"], ("3".into(), 4, true));
        assert_eq!(m["auto.create.topics.enable"], ("true".into(), 5, true));
        assert_eq!(m["nvmq.flush"], ("always".into(), 5, true));
        assert!(d.configs.iter().all(|x| x.read_only));
    }
    assert_ne!(describe(&mut c, 4, 4, "7", None).await.error_code, 0);
    // Group configs (resource type 32): not something nvmq has.
    assert_ne!(describe(&mut c, 4, 32, "g", None).await.error_code, 0);
    let (code, msg) = incremental(
        &mut c,
        1,
        4,
        "0",
        &[("num.partitions", 0, Some("5"))],
        false,
    )
    .await;
    assert_eq!(code, 42);
    assert!(msg.contains("read-only"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_topics_takes_configs_and_fails_only_the_topic_with_a_bad_one() {
    let (addr, _s) = common::serve(Default::default()).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    let t = |n: &str, cfgs: &[(&str, &str)]| {
        let mut t = CreatableTopic::default();
        t.name = topic(n);
        t.num_partitions = 1;
        t.replication_factor = 1;
        t.configs = cfgs
            .iter()
            .map(|(k, v)| {
                let mut x = CreatableTopicConfig::default();
                x.name = s(k);
                x.value = Some(s(v));
                x
            })
            .collect();
        t
    };
    let mut r = CreateTopicsRequest::default();
    r.timeout_ms = 5000;
    r.topics = vec![
        t(
            "good",
            &[("retention.ms", "3600000"), ("min.insync.replicas", "1")],
        ),
        t("compacted", &[("cleanup.policy", "compact")]),
    ];
    let out = c.call(4, &r).await.unwrap();
    assert_eq!(out.topics[0].error_code, 0);
    assert_eq!(out.topics[1].error_code, INVALID_CONFIG);
    let msg = out.topics[1].error_message.as_ref().unwrap().to_string();
    assert!(msg.contains("compact"), "{msg}");
    let m = values(&describe(&mut c, 4, 2, "good", None).await);
    assert_eq!(m["retention.ms"], ("3600000".into(), 1, false));
    assert_eq!(
        describe(&mut c, 4, 2, "compacted", None).await.error_code,
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_message_bytes_refuses_larger_batches_with_message_too_large() {
    let (addr, _s) = common::serve(Default::default()).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    common::create_topic(&mut c, "small").await;
    let r = incremental(
        &mut c,
        1,
        2,
        "small",
        &[("max.message.bytes", 0, Some("1000"))],
        false,
    )
    .await;
    assert_eq!(r.0, 0);
    let big = vec![1u8; 2000];
    assert_eq!(produce(&mut c, "small", &[&big]).await.0, 10);
    assert_eq!(produce(&mut c, "small", &[b"tiny"]).await, (0, 0));
    // Back to the default: the same batch goes through.
    let r = incremental(
        &mut c,
        1,
        2,
        "small",
        &[("max.message.bytes", 1, None)],
        false,
    )
    .await;
    assert_eq!(r.0, 0);
    assert_eq!(produce(&mut c, "small", &[&big]).await, (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_records_raises_the_log_start_offset() {
    let (addr, _s) = common::serve(Default::default()).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    common::create_topic(&mut c, "dr").await;
    for i in 0..5u8 {
        assert_eq!(produce(&mut c, "dr", &[&[i; 100]]).await.0, 0);
    }
    assert_eq!(delete_records(&mut c, 0, "dr", 3).await, (0, 3));
    assert_eq!(earliest(&mut c, "dr").await, 3);
    assert_eq!(fetch(&mut c, "dr", 2).await.0, 1, "below the start");
    let (code, start, n) = fetch(&mut c, "dr", 3).await;
    assert_eq!((code, start), (0, 3));
    assert!(n > 0);
    // Lower than the start: nothing changes, the start is answered.
    assert_eq!(delete_records(&mut c, 2, "dr", 1).await, (0, 3));
    // Past the high watermark: refused.
    assert_eq!(delete_records(&mut c, 1, "dr", 6).await.0, 1);
    // -1: up to the high watermark.
    assert_eq!(delete_records(&mut c, 2, "dr", -1).await, (0, 5));
    assert_eq!(earliest(&mut c, "dr").await, 5);
    assert_eq!(delete_records(&mut c, 2, "none", 0).await.0, 3);
    // New records are served from the start on.
    assert_eq!(produce(&mut c, "dr", &[b"after"]).await, (0, 5));
    assert!(fetch(&mut c, "dr", 5).await.2 > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_makes_old_records_unreadable() {
    let (addr, server) = common::serve(Default::default()).await;
    let b = server.broker().clone();
    let mut c = Client::connect(addr, "t").await.unwrap();
    common::create_topic(&mut c, "by-bytes").await;
    common::create_topic(&mut c, "by-time").await;
    let value = vec![9u8; 1000];
    for _ in 0..10 {
        assert_eq!(produce(&mut c, "by-bytes", &[&value]).await.0, 0);
    }
    // About three batches' worth: the oldest seven go, whole batches, at least 3000 bytes stay.
    let r = incremental(
        &mut c,
        1,
        2,
        "by-bytes",
        &[("retention.bytes", 0, Some("3000"))],
        false,
    )
    .await;
    assert_eq!(r.0, 0);
    b.enforce_retention(frontend::producers::now_ms())
        .await
        .unwrap();
    let start = earliest(&mut c, "by-bytes").await;
    assert!((6..=7).contains(&start), "start {start}");
    assert_eq!(fetch(&mut c, "by-bytes", start - 1).await.0, 1);

    for _ in 0..3 {
        assert_eq!(produce(&mut c, "by-time", &[&value]).await.0, 0);
    }
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    let between = frontend::producers::now_ms();
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    for _ in 0..2 {
        assert_eq!(produce(&mut c, "by-time", &[&value]).await.0, 0);
    }
    let r = incremental(
        &mut c,
        1,
        2,
        "by-time",
        &[("retention.ms", 0, Some("3600000"))],
        false,
    )
    .await;
    assert_eq!(r.0, 0);
    // An hour after `between`: the three records before it expired, the two after did not.
    b.enforce_retention(between + 3_600_000).await.unwrap();
    assert_eq!(earliest(&mut c, "by-time").await, 3);
    assert_eq!(fetch(&mut c, "by-time", 2).await.0, 1);
    assert_eq!(fetch(&mut c, "by-time", 3).await.0, 0);
    // A day later all of them.
    b.enforce_retention(between + 86_400_000).await.unwrap();
    assert_eq!(earliest(&mut c, "by-time").await, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_log_dirs_lists_each_device_and_its_partitions_sizes() {
    let cfg = frontend::Config {
        log_dirs: vec!["sim:a".into(), "sim:b".into()],
        default_partitions: 4,
        ..Default::default()
    };
    let devs = vec![
        common::sim_device(1, 64 << 20, 100).0,
        common::sim_device(2, 64 << 20, 100).0,
    ];
    let server = common::serve_devices(devs, cfg);
    let mut c = Client::connect(server.local_addr(), "t").await.unwrap();
    common::create_topic(&mut c, "spread").await;
    let value = vec![5u8; 1000];
    for p in 0..4 {
        let r = c
            .call(
                7,
                &common::produce_request("spread", p, record_batch(&[&value], None), -1),
            )
            .await
            .unwrap();
        assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
    }
    for v in [1, 4] {
        let mut all = DescribeLogDirsRequest::default();
        all.topics = None;
        let out = c.call(v, &all).await.unwrap();
        let dirs: Vec<String> = out.results.iter().map(|r| r.log_dir.to_string()).collect();
        assert_eq!(dirs, ["sim:a", "sim:b"]);
        let mut seen = Vec::new();
        for r in &out.results {
            for t in r.topics.iter().filter(|t| t.name.as_str() == "spread") {
                for p in &t.partitions {
                    assert!(
                        (1000..2000).contains(&p.partition_size),
                        "partition {} size {}",
                        p.partition_index,
                        p.partition_size
                    );
                    assert_eq!(p.offset_lag, 0);
                    seen.push(p.partition_index);
                }
            }
        }
        seen.sort();
        assert_eq!(seen, [0, 1, 2, 3]);
    }
}
