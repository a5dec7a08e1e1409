//! A follower's auto-creation of a topic (Metadata with allow_auto_topic_creation), forwarded
//! to the leader as a CreateTopics request over Kafka, as Kafka's brokers forward it to their
//! controller: a client that only ever asks one node still gets its topic.

use std::time::Duration;

use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::{CreateTopicsRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::client::Client;
use crate::codes;

/// How long a forwarded creation may take before the client is told to ask again.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);

/// Asks the leader at `leader` (its Kafka address) to create `name`; the Kafka error code of
/// its answer, or LEADER_NOT_AVAILABLE when it could not be asked.
pub async fn create_topic(leader: &str, name: &str, partitions: u32) -> i16 {
    let ask = async {
        let mut c = Client::connect(leader, "nvmq-forward").await?;
        let mut t = CreatableTopic::default();
        t.name = TopicName(StrBytes::from_string(name.to_string()));
        t.num_partitions = i32::try_from(partitions).unwrap_or(i32::MAX);
        t.replication_factor = -1;
        let mut r = CreateTopicsRequest::default();
        r.topics = vec![t];
        r.timeout_ms = FORWARD_TIMEOUT.as_millis() as i32;
        let resp = c.call(2, &r).await?;
        Ok::<i16, std::io::Error>(
            resp.topics
                .first()
                .map_or(codes::UNKNOWN_SERVER_ERROR, |t| t.error_code),
        )
    };
    match tokio::time::timeout(FORWARD_TIMEOUT, ask).await {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => {
            tracing::warn!(topic = name, leader, error = %e, "forwarding a topic's creation");
            codes::LEADER_NOT_AVAILABLE
        }
        Err(_) => codes::LEADER_NOT_AVAILABLE,
    }
}
