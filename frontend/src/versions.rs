//! The one version table: it is what ApiVersions advertises and what the request reader accepts.
//!
//! Maxima stay on non-flexible versions (except ApiVersions, whose v3 every modern client sends
//! first), so the clients we are tested with (librdkafka 2.0.2 under Debian's kcat, librdkafka 2.x
//! in confluent-kafka, kafka-python) all negotiate down to versions we decode.

use kafka_protocol::messages::ApiKey;

/// One API: the range advertised, and the lowest version actually served (Produce advertises v0
/// because librdkafka < 2.11 only compresses when Produce v0 is in range, but v0–2 carry message
/// format v0/v1, which nvmq refuses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiRange {
    pub key: ApiKey,
    pub min: i16,
    pub max: i16,
    pub served_from: i16,
}

const fn api(key: ApiKey, min: i16, max: i16) -> ApiRange {
    ApiRange {
        key,
        min,
        max,
        served_from: min,
    }
}

pub const TABLE: &[ApiRange] = &[
    ApiRange {
        key: ApiKey::Produce,
        min: 0,
        max: 8,
        served_from: 3,
    },
    api(ApiKey::Fetch, 4, 11),
    api(ApiKey::ListOffsets, 1, 5),
    api(ApiKey::Metadata, 0, 8),
    api(ApiKey::OffsetCommit, 2, 7),
    api(ApiKey::OffsetFetch, 1, 5),
    api(ApiKey::FindCoordinator, 0, 2),
    api(ApiKey::JoinGroup, 0, 5),
    api(ApiKey::Heartbeat, 0, 3),
    api(ApiKey::LeaveGroup, 0, 3),
    api(ApiKey::SyncGroup, 0, 3),
    api(ApiKey::ApiVersions, 0, 3),
    api(ApiKey::CreateTopics, 2, 4),
    api(ApiKey::DeleteTopics, 1, 3),
    api(ApiKey::CreatePartitions, 0, 1),
    api(ApiKey::InitProducerId, 0, 1),
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
        Some(a) if version >= a.served_from && version <= a.max => Support::Served,
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
            assert!(
                a.served_from >= valid.min && a.max <= valid.max,
                "{:?}: serving {}..{} but the codec decodes {}",
                a.key,
                a.served_from,
                a.max,
                valid
            );
            assert!(a.min <= a.served_from && a.served_from <= a.max);
        }
    }

    #[test]
    fn support_follows_the_table() {
        assert_eq!(support(0, 3), Support::Served);
        assert_eq!(support(0, 2), Support::Unsupported);
        assert_eq!(support(0, 9), Support::Unsupported);
        assert_eq!(support(18, 3), Support::Served);
        assert_eq!(support(18, 4), Support::Unsupported);
        assert_eq!(support(1000, 0), Support::UnknownApi);
        assert_eq!(
            support(ApiKey::DescribeConfigs as i16, 0),
            Support::UnknownApi
        );
    }
}
