//! The few Kafka requests the rig sends, over the frontend's mini client.

use std::time::Duration;

use bytes::Bytes;
use frontend::client::Client;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    BrokerId, CreateTopicsRequest, FetchRequest, FetchResponse, MetadataRequest, ProduceRequest,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;

use crate::powercut::RigError;

pub const PRODUCE_VERSION: i16 = 7;
const FETCH_VERSION: i16 = 11;
const METADATA_VERSION: i16 = 8;
const CREATE_TOPICS_VERSION: i16 = 4;
const TOPIC_ALREADY_EXISTS: i16 = 36;

fn name(t: &str) -> TopicName {
    TopicName(StrBytes::from_string(t.to_string()))
}

/// Connects, giving up after `timeout`.
pub async fn connect(addr: &str, client_id: &str, timeout: Duration) -> Result<Client, RigError> {
    match tokio::time::timeout(timeout, Client::connect(addr, client_id)).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(source)) => Err(RigError::Net {
            op: "connecting",
            addr: addr.to_string(),
            source,
        }),
        Err(_) => Err(RigError::Net {
            op: "connecting",
            addr: addr.to_string(),
            source: std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer"),
        }),
    }
}

/// An acks=all produce of one record batch to one partition.
pub fn produce(topic: &str, partition: i32, batch: Vec<u8>, timeout_ms: i32) -> ProduceRequest {
    let mut p = PartitionProduceData::default();
    p.index = partition;
    p.records = Some(Bytes::from(batch));
    let mut td = TopicProduceData::default();
    td.name = name(topic);
    td.partition_data = vec![p];
    let mut r = ProduceRequest::default();
    r.acks = -1;
    r.timeout_ms = timeout_ms;
    r.topic_data = vec![td];
    r
}

/// Creates the run's topic if the broker does not know it (an existing topic is taken as is).
pub async fn create_topic(c: &mut Client, topic: &str, partitions: i32) -> Result<(), RigError> {
    let mut t = CreatableTopic::default();
    t.name = name(topic);
    t.num_partitions = partitions;
    t.replication_factor = 1;
    let mut r = CreateTopicsRequest::default();
    r.topics = vec![t];
    r.timeout_ms = 30_000;
    let resp = c
        .call(CREATE_TOPICS_VERSION, &r)
        .await
        .map_err(|source| RigError::Protocol {
            op: "CreateTopics",
            what: source.to_string(),
        })?;
    let code = resp.topics.first().map(|t| t.error_code).unwrap_or(-1);
    if code != 0 && code != TOPIC_ALREADY_EXISTS {
        return Err(RigError::Protocol {
            op: "CreateTopics",
            what: format!("topic {topic:?}: error code {code}"),
        });
    }
    Ok(())
}

/// Error code of a topic unknown to the broker.
pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;

/// What a Metadata answer says about one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicState {
    /// Every partition has a leader: this many partitions.
    Ready(i32),
    /// The broker does not know the topic.
    Unknown,
    /// Known but not ready (an error code on the topic or a partition).
    NotReady(String),
}

/// Asks Metadata about `topic` (never creating it).
pub async fn topic_state(c: &mut Client, topic: &str) -> Result<TopicState, RigError> {
    let mut mt = MetadataRequestTopic::default();
    mt.name = Some(name(topic));
    let mut m = MetadataRequest::default();
    m.topics = Some(vec![mt]);
    m.allow_auto_topic_creation = false;
    let resp = c
        .call(METADATA_VERSION, &m)
        .await
        .map_err(|source| RigError::Protocol {
            op: "Metadata",
            what: source.to_string(),
        })?;
    let t = resp.topics.first().ok_or_else(|| RigError::Protocol {
        op: "Metadata",
        what: format!("no answer for topic {topic:?}"),
    })?;
    if t.error_code == UNKNOWN_TOPIC_OR_PARTITION {
        return Ok(TopicState::Unknown);
    }
    let bad = t
        .partitions
        .iter()
        .find(|p| p.error_code != 0 || p.leader_id.0 < 0);
    if t.error_code != 0 || bad.is_some() {
        return Ok(TopicState::NotReady(format!(
            "topic {topic:?}: error code {}, partition {:?}",
            t.error_code,
            bad.map(|p| (p.partition_index, p.error_code))
        )));
    }
    Ok(TopicState::Ready(t.partitions.len() as i32))
}

/// One fetch of a partition from `offset`, without waiting for new data.
pub async fn fetch(
    c: &mut Client,
    topic: &str,
    partition: i32,
    offset: i64,
) -> Result<FetchResponse, RigError> {
    let mut p = FetchPartition::default();
    p.partition = partition;
    p.fetch_offset = offset;
    p.partition_max_bytes = 1 << 20;
    let mut ft = FetchTopic::default();
    ft.topic = name(topic);
    ft.partitions = vec![p];
    let mut r = FetchRequest::default();
    r.replica_id = BrokerId(-1);
    r.max_wait_ms = 0;
    r.min_bytes = 0;
    r.max_bytes = 8 << 20;
    r.topics = vec![ft];
    c.call(FETCH_VERSION, &r)
        .await
        .map_err(|source| RigError::Protocol {
            op: "Fetch",
            what: format!("{topic}/{partition} at {offset}: {source}"),
        })
}
