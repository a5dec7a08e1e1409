//! Kafka requests the tests send to `nvmq serve` through `frontend::client`.

use std::time::Duration;

use frontend::client::{produce_one_each, Client};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

/// How long one request may wait for its answer before the broker counts as stalled.
pub const ANSWER_WAIT: Duration = Duration::from_secs(60);

pub fn tname(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

pub async fn connect(addr: &str, client_id: &str) -> Client {
    Client::connect(addr, client_id).await.expect("connect")
}

/// Creates `topic` (one partition) through Metadata's auto-creation.
pub async fn auto_create(c: &mut Client, topic: &str) {
    let mut m = MetadataRequest::default();
    let mut mt = MetadataRequestTopic::default();
    mt.name = Some(tname(topic));
    m.topics = Some(vec![mt]);
    m.allow_auto_topic_creation = true;
    c.call(8, &m).await.expect("metadata");
}

/// Sends [`produce_one_each`] and waits up to [`ANSWER_WAIT`]: the base offset of partition 0's
/// record, and the error codes of the partitions that failed.
pub async fn produce(
    c: &mut Client,
    topic: &str,
    partitions: i32,
    value: &[u8],
) -> Result<(i64, Vec<i16>), String> {
    let req = produce_one_each(topic, partitions, value);
    let resp = tokio::time::timeout(ANSWER_WAIT, c.call(7, &req))
        .await
        .map_err(|_| format!("no answer to a Produce to {topic} within {ANSWER_WAIT:?}"))?
        .map_err(|e| format!("Produce to {topic}: {e}"))?;
    let parts = resp
        .responses
        .iter()
        .flat_map(|t| t.partition_responses.iter());
    let base = parts
        .clone()
        .find(|p| p.index == 0)
        .map_or(-1, |p| p.base_offset);
    let errors = parts.map(|p| p.error_code).filter(|&e| e != 0).collect();
    Ok((base, errors))
}
