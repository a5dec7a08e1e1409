//! The one version table: it is what ApiVersions advertises and what the request reader accepts.
//! Every version in it is served (tests/suite/advertised.rs sends each one a request).
//!
//! Maxima are the newest versions the codec (kafka-protocol 0.18) decodes whose meaning nvmq
//! serves whole, flexible (tagged-field) versions included, so current clients (librdkafka 2.x,
//! the Java client 3.x/4.x, kafkajs) never fall back. Where an API stops below the codec's
//! newest, the next version means something nvmq does not do (docs/kafka-compatibility.md says
//! which). Produce, Fetch, FindCoordinator and InitProducerId reach the codec's (Kafka 4.1's)
//! newest: Produce v12 and InitProducerId v5 only tell the broker the client knows
//! transactions v2 (KIP-890), which nvmq refuses at any version; FindCoordinator v5 may answer
//! TRANSACTION_ABORTABLE and v6 may ask for a share-group coordinator, which nvmq refuses as
//! Kafka refuses a key type it does not serve; Fetch v18 adds a follower's high watermark,
//! which a broker without followers has no use for.
//! Fetch and Produce v13+ name topics by id: `topic_ids` derives each topic's id from its
//! durable incarnation, so ids are stable across restarts and new for a re-created topic.
//! The config, DeleteRecords, DescribeLogDirs, group tooling and DescribeCluster APIs serve
//! their flexible versions too.

use kafka_protocol::messages::ApiKey;

/// One API and the versions advertised and served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiRange {
    pub key: ApiKey,
    pub min: i16,
    pub max: i16,
}

const fn api(key: ApiKey, min: i16, max: i16) -> ApiRange {
    ApiRange { key, min, max }
}

/// Produce starts at v0 because older librdkafka (2.0.2 under Debian's kcat among them)
/// compresses only when Produce v0 is in the broker's range. Kafka 4 advertises v0 and closes the
/// connection on it; nvmq serves v0–2 instead (`produce::decode_request`): their requests and
/// answers are v3's less a field or two, and the v2 batches they may carry are taken as at v3
/// (older message formats get UNSUPPORTED_FOR_MESSAGE_FORMAT for their partition).
pub const TABLE: &[ApiRange] = &[
    api(ApiKey::Produce, 0, 13),
    api(ApiKey::Fetch, 4, 18),
    api(ApiKey::ListOffsets, 1, 10),
    api(ApiKey::Metadata, 0, 13),
    api(ApiKey::OffsetCommit, 2, 9),
    api(ApiKey::OffsetFetch, 1, 9),
    api(ApiKey::FindCoordinator, 0, 6),
    api(ApiKey::JoinGroup, 0, 9),
    api(ApiKey::Heartbeat, 0, 4),
    api(ApiKey::LeaveGroup, 0, 5),
    api(ApiKey::SyncGroup, 0, 5),
    api(ApiKey::ApiVersions, 0, 4),
    api(ApiKey::CreateTopics, 2, 7),
    api(ApiKey::DeleteTopics, 1, 6),
    api(ApiKey::CreatePartitions, 0, 3),
    api(ApiKey::InitProducerId, 0, 5),
    // The codec knows v1–3 (v2 on flexible); nvmq serves them all.
    api(ApiKey::DescribeAcls, 1, 3),
    api(ApiKey::CreateAcls, 1, 3),
    api(ApiKey::DeleteAcls, 1, 3),
    // librdkafka requires v0 in the range (its feature check) though it then uses v1.
    api(ApiKey::SaslHandshake, 0, 1),
    api(ApiKey::SaslAuthenticate, 0, 2),
    api(ApiKey::DescribeUserScramCredentials, 0, 0),
    api(ApiKey::AlterUserScramCredentials, 0, 0),
    api(ApiKey::DeleteRecords, 0, 2),
    api(ApiKey::DescribeConfigs, 1, 4),
    api(ApiKey::AlterConfigs, 0, 2),
    api(ApiKey::DescribeLogDirs, 1, 4),
    api(ApiKey::IncrementalAlterConfigs, 0, 1),
    api(ApiKey::OffsetForLeaderEpoch, 2, 4),
    api(ApiKey::DescribeGroups, 0, 6),
    api(ApiKey::ListGroups, 0, 5),
    api(ApiKey::DeleteGroups, 0, 2),
    api(ApiKey::OffsetDelete, 0, 0),
    api(ApiKey::DescribeCluster, 0, 2),
    // A node of a cluster only (`replica::cluster_only`): the Raft group's voters.
    api(ApiKey::DescribeQuorum, 0, 2),
];

/// How a request's (key, version) stands against the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    Served,
    /// Known API, version outside what is served.
    Unsupported,
    /// An API key nvmq does not implement (or Kafka does not define).
    UnknownApi,
}

pub fn lookup(key: i16) -> Option<&'static ApiRange> {
    TABLE.iter().find(|a| a.key as i16 == key)
}

pub fn support(key: i16, version: i16) -> Support {
    match lookup(key) {
        None => Support::UnknownApi,
        Some(a) if version >= a.min && version <= a.max => Support::Served,
        Some(_) => Support::Unsupported,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_served_version_is_one_the_codec_decodes() {
        for a in TABLE {
            let valid = a.key.valid_versions();
            // Produce v0–2 are decoded as v3 (see `produce::decode_request`).
            let min = if a.key == ApiKey::Produce {
                a.min.max(crate::produce::LEGACY_MAX + 1)
            } else {
                a.min
            };
            assert!(
                min >= valid.min && a.max <= valid.max,
                "{:?}: serving {}..{} but the codec decodes {}",
                a.key,
                min,
                a.max,
                valid
            );
            assert!(a.min <= a.max);
        }
    }

    /// What Java 4.1 clients send of these (the codec's requests are generated from Kafka
    /// 4.1.0's schemas, unstable versions left out) is served whole: a codec upgrade that raises
    /// one shows up here. (`ApiKey::valid_versions` is not the measure: it says InitProducerId
    /// 0-6, from the response schema, while the request stops at v5.)
    #[test]
    fn the_data_path_apis_reach_the_codecs_newest() {
        use kafka_protocol::messages::{
            FetchRequest, FindCoordinatorRequest, InitProducerIdRequest, ProduceRequest,
        };
        use kafka_protocol::protocol::Message;
        let newest = [
            (ApiKey::Produce, ProduceRequest::VERSIONS.max),
            (ApiKey::Fetch, FetchRequest::VERSIONS.max),
            (
                ApiKey::FindCoordinator,
                FindCoordinatorRequest::VERSIONS.max,
            ),
            (ApiKey::InitProducerId, InitProducerIdRequest::VERSIONS.max),
        ];
        assert_eq!(newest.map(|(_, v)| v), [13, 18, 6, 5], "the codec moved");
        for (key, max) in newest {
            assert_eq!(lookup(key as i16).map(|a| a.max), Some(max), "{key:?}");
        }
    }

    #[test]
    fn support_follows_the_table() {
        assert_eq!(support(0, 3), Support::Served);
        assert_eq!(support(0, 0), Support::Served);
        assert_eq!(support(0, -1), Support::Unsupported);
        assert_eq!(support(0, 13), Support::Served);
        assert_eq!(support(0, 14), Support::Unsupported);
        assert_eq!(support(18, 4), Support::Served);
        assert_eq!(support(18, 5), Support::Unsupported);
        assert_eq!(support(1000, 0), Support::UnknownApi);
        assert_eq!(
            support(ApiKey::DescribeConfigs as i16, 0),
            Support::Unsupported
        );
        assert_eq!(support(ApiKey::DescribeConfigs as i16, 4), Support::Served);
        assert_eq!(
            support(ApiKey::DescribeAcls as i16, 0),
            Support::Unsupported
        );
        assert_eq!(support(ApiKey::ElectLeaders as i16, 0), Support::UnknownApi);
    }
}
