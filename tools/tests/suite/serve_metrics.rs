//! `nvmq serve --metrics-addr`: a Prometheus scrape of the running broker shows the acks a
//! Kafka producer got, the flushes behind them, the recovery, the writer's health and each
//! partition's offsets.

use bytes::Bytes;
use frontend::client::{record_batch, Client};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{MetadataRequest, ProduceRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::common::{metric as value, scrape};

#[test]
fn a_scrape_shows_the_acks_a_kafka_producer_got_and_the_flushes_behind_them() {
    let serving = crate::common::serve(&[
        "--device",
        "sim:flush=200us,capacity=256M",
        "--listen",
        "127.0.0.1:0",
        "--metrics-addr",
        "127.0.0.1:0",
    ]);
    let kafka = serving.kafka.clone();
    let metrics = serving.metrics.clone().expect("metrics address");

    let before = scrape(&metrics);
    assert!(before.starts_with("HTTP/1.1 200"), "{before}");
    assert_eq!(value(&before, "nvmq_writer_fatal"), 0.0);
    let acked_before = value(&before, "nvmq_appends_acked_total");

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let mut c = Client::connect(kafka.as_str(), "metrics-test")
            .await
            .expect("connect");
        let name = TopicName(StrBytes::from_static_str("m"));
        let mut m = MetadataRequest::default();
        let mut mt = MetadataRequestTopic::default();
        mt.name = Some(name.clone());
        m.topics = Some(vec![mt]);
        m.allow_auto_topic_creation = true;
        c.call(8, &m).await.expect("metadata");
        for i in 0..10u8 {
            let mut p = PartitionProduceData::default();
            p.records = Some(Bytes::from(record_batch(&[&[i; 100]], None)));
            let mut td = TopicProduceData::default();
            td.name = name.clone();
            td.partition_data = vec![p];
            let mut r = ProduceRequest::default();
            r.acks = -1;
            r.timeout_ms = 10_000;
            r.topic_data = vec![td];
            let resp = c.call(7, &r).await.expect("produce");
            assert_eq!(resp.responses[0].partition_responses[0].error_code, 0);
        }
        // While this connection is open, the front door counts it.
        let during = scrape(&metrics);
        assert!(value(&during, "nvmq_connections") >= 1.0, "{during}");
        assert_eq!(value(&during, "nvmq_connections_refused_total"), 0.0);
    });

    let after = scrape(&metrics);
    let acked = value(&after, "nvmq_appends_acked_total") - acked_before;
    assert!(acked >= 10.0, "10 acks=all produces, {acked} acks counted");
    assert!(value(&after, "nvmq_flushes_total") >= 10.0);
    assert!(value(&after, "nvmq_append_ack_latency_seconds_count") >= 10.0);
    assert!(value(&after, "nvmq_recovery_scanned_bytes") > 0.0);
    assert!(value(&after, "nvmq_log_used_bytes") > 0.0);
    assert_eq!(value(&after, "nvmq_scrub_damaged_batches"), 0.0);
    // Each partition's offsets: "m" (auto-created with one partition) took ten records.
    let m0 = "{topic=\"m\",partition=\"0\"}";
    assert_eq!(
        value(&after, &format!("nvmq_partition_end_offset{m0}")),
        10.0
    );
    assert_eq!(
        value(&after, &format!("nvmq_partition_start_offset{m0}")),
        0.0
    );
    drop(serving);
}
