//! The walk against the codec: for every served (API, version), a request the codec encodes
//! (arrays of one, strings set, tagged fields unknown and known) is walked to its last byte, and
//! counts past the end are refused.

use bytes::Bytes;
use kafka_protocol::messages::create_partitions_request::{
    CreatePartitionsAssignment, CreatePartitionsTopic,
};
use kafka_protocol::messages::create_topics_request::{
    CreatableReplicaAssignment, CreatableTopic, CreatableTopicConfig,
};
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::fetch_request::{
    FetchPartition, FetchTopic, ForgottenTopic, ReplicaState,
};
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, StrBytes};
use uuid::Uuid;

use super::*;
use crate::versions::TABLE;

fn st(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn tn(v: &str) -> TopicName {
    TopicName(st(v))
}

const ID: Uuid = Uuid::from_u128(0x1234_5678_9abc_def0_1234_5678_9abc_def0);

/// A request of `api` at `v` with every array holding one element.
fn sample(api: ApiKey, v: i16) -> Option<Vec<u8>> {
    let mut b = Vec::new();
    let flex = api.request_header_version(v) >= 2;
    // An unknown tagged field at the top, which the walk must skip.
    let mut extra = std::collections::BTreeMap::new();
    if flex {
        extra.insert(77, Bytes::from_static(b"tagged"));
    }
    let r = match api {
        ApiKey::Produce if v < 3 => return None,
        ApiKey::Produce => {
            let mut p = PartitionProduceData::default();
            p.records = Some(Bytes::from_static(b"records"));
            let mut t = TopicProduceData::default();
            if v >= 13 {
                t.topic_id = ID;
            } else {
                t.name = tn("t");
            }
            t.partition_data = vec![p];
            let mut r = ProduceRequest::default();
            r.transactional_id = Some(TransactionalId(st("tx")));
            r.topic_data = vec![t];
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::Fetch => {
            let mut p = FetchPartition::default();
            p.partition_max_bytes = 9;
            if v >= 17 {
                p.replica_directory_id = ID; // a known tag of the partition
            }
            if v >= 18 {
                p.high_watermark = 41; // another (a follower's high watermark)
            }
            let mut t = FetchTopic::default();
            let mut f = ForgottenTopic::default();
            if v >= 13 {
                t.topic_id = ID;
                f.topic_id = ID;
            } else {
                t.topic = tn("t");
                f.topic = tn("f");
            }
            t.partitions = vec![p];
            f.partitions = vec![3];
            let mut r = FetchRequest::default();
            r.topics = vec![t];
            if v >= 7 {
                r.forgotten_topics_data = vec![f];
            }
            if v >= 11 {
                r.rack_id = st("rack");
            }
            if v >= 12 {
                r.cluster_id = Some(st("cluster")); // a known top-level tag
            }
            if v >= 15 {
                let mut rs = ReplicaState::default();
                rs.replica_id = BrokerId(5);
                r.replica_state = rs;
            }
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::ListOffsets => {
            let mut t = ListOffsetsTopic::default();
            t.name = tn("t");
            t.partitions = vec![ListOffsetsPartition::default()];
            let mut r = ListOffsetsRequest::default();
            r.topics = vec![t];
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::Metadata => {
            let mut t = MetadataRequestTopic::default();
            t.name = Some(tn("t"));
            if v >= 10 {
                t.topic_id = ID;
            }
            let mut r = MetadataRequest::default();
            r.topics = Some(vec![t]);
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::OffsetCommit => {
            let mut p = OffsetCommitRequestPartition::default();
            p.committed_metadata = Some(st("m"));
            let mut t = OffsetCommitRequestTopic::default();
            t.name = tn("t");
            t.partitions = vec![p];
            let mut r = OffsetCommitRequest::default();
            r.group_id = GroupId(st("g"));
            if v >= 7 {
                r.group_instance_id = Some(st("i"));
            }
            r.topics = vec![t];
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::OffsetFetch => {
            let mut r = OffsetFetchRequest::default();
            if v >= 8 {
                let mut t = OffsetFetchRequestTopics::default();
                t.name = tn("t");
                t.partition_indexes = vec![1];
                let mut g = OffsetFetchRequestGroup::default();
                g.group_id = GroupId(st("g"));
                g.topics = Some(vec![t]);
                if v >= 9 {
                    g.member_id = Some(st("m"));
                }
                r.groups = vec![g];
            } else {
                let mut t = OffsetFetchRequestTopic::default();
                t.name = tn("t");
                t.partition_indexes = vec![1];
                r.group_id = GroupId(st("g"));
                r.topics = Some(vec![t]);
            }
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::FindCoordinator => {
            let mut r = FindCoordinatorRequest::default();
            if v >= 4 {
                r.coordinator_keys = vec![st("g")];
            } else {
                r.key = st("g");
            }
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::JoinGroup => {
            let mut p = JoinGroupRequestProtocol::default();
            p.name = st("range");
            p.metadata = Bytes::from_static(b"meta");
            let mut r = JoinGroupRequest::default();
            r.group_id = GroupId(st("g"));
            r.protocol_type = st("consumer");
            r.protocols = vec![p];
            if v >= 8 {
                r.reason = Some(st("why"));
            }
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::Heartbeat => {
            let mut r = HeartbeatRequest::default();
            r.group_id = GroupId(st("g"));
            r.member_id = st("m");
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::LeaveGroup => {
            let mut r = LeaveGroupRequest::default();
            r.group_id = GroupId(st("g"));
            if v >= 3 {
                let mut m = MemberIdentity::default();
                m.member_id = st("m");
                if v >= 5 {
                    m.reason = Some(st("why"));
                }
                r.members = vec![m];
            } else {
                r.member_id = st("m");
            }
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::SyncGroup => {
            let mut a = SyncGroupRequestAssignment::default();
            a.member_id = st("m");
            a.assignment = Bytes::from_static(b"assigned");
            let mut r = SyncGroupRequest::default();
            r.group_id = GroupId(st("g"));
            if v >= 5 {
                r.protocol_type = Some(st("consumer"));
                r.protocol_name = Some(st("range"));
            }
            r.assignments = vec![a];
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::ApiVersions => {
            let mut r = ApiVersionsRequest::default();
            if v >= 3 {
                r.client_software_name = st("walk");
                r.client_software_version = st("1");
            }
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::CreateTopics => {
            let mut a = CreatableReplicaAssignment::default();
            a.broker_ids = vec![BrokerId(0)];
            let mut c = CreatableTopicConfig::default();
            c.name = st("retention.ms");
            c.value = Some(st("1"));
            let mut t = CreatableTopic::default();
            t.name = tn("t");
            t.assignments = vec![a];
            t.configs = vec![c];
            let mut r = CreateTopicsRequest::default();
            r.topics = vec![t];
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::DeleteTopics => {
            let mut r = DeleteTopicsRequest::default();
            if v >= 6 {
                let mut t = DeleteTopicState::default();
                t.name = Some(tn("t"));
                t.topic_id = ID;
                r.topics = vec![t];
            } else {
                r.topic_names = vec![tn("t")];
            }
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::CreatePartitions => {
            let mut a = CreatePartitionsAssignment::default();
            a.broker_ids = vec![BrokerId(0)];
            let mut t = CreatePartitionsTopic::default();
            t.name = tn("t");
            t.assignments = Some(vec![a]);
            let mut r = CreatePartitionsRequest::default();
            r.topics = vec![t];
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::InitProducerId => {
            let mut r = InitProducerIdRequest::default();
            r.transactional_id = Some(TransactionalId(st("tx")));
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::CreateAcls => {
            let mut c = create_acls_request::AclCreation::default();
            c.resource_type = 2;
            c.resource_name = st("t");
            c.resource_pattern_type = 3;
            c.principal = st("User:alice");
            c.host = st("*");
            c.operation = 4;
            c.permission_type = 3;
            let mut r = CreateAclsRequest::default();
            r.creations = vec![c];
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::DeleteAcls => {
            let mut f = delete_acls_request::DeleteAclsFilter::default();
            f.resource_type_filter = 2;
            f.resource_name_filter = Some(st("t"));
            f.pattern_type_filter = 3;
            f.principal_filter = None;
            f.host_filter = Some(st("*"));
            f.operation = 1;
            f.permission_type = 1;
            let mut r = DeleteAclsRequest::default();
            r.filters = vec![f.clone(), f];
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::DescribeAcls => {
            let mut r = DescribeAclsRequest::default();
            r.resource_type_filter = 2;
            r.resource_name_filter = Some(st("t"));
            r.pattern_type_filter = 3;
            r.principal_filter = Some(st("User:alice"));
            r.host_filter = None;
            r.operation = 1;
            r.permission_type = 1;
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::SaslHandshake => {
            let mut r = SaslHandshakeRequest::default();
            r.mechanism = st("SCRAM-SHA-256");
            r.encode(&mut b, v)
        }
        ApiKey::SaslAuthenticate => {
            let mut r = SaslAuthenticateRequest::default();
            r.auth_bytes = Bytes::from_static(b"n,,n=alice,r=abc");
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::DescribeUserScramCredentials => {
            let mut u = describe_user_scram_credentials_request::UserName::default();
            u.name = st("alice");
            let mut r = DescribeUserScramCredentialsRequest::default();
            r.users = Some(vec![u.clone(), u]);
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::AlterUserScramCredentials => {
            let mut d = alter_user_scram_credentials_request::ScramCredentialDeletion::default();
            d.name = st("bob");
            d.mechanism = 1;
            let mut u = alter_user_scram_credentials_request::ScramCredentialUpsertion::default();
            u.name = st("alice");
            u.mechanism = 2;
            u.iterations = 4096;
            u.salt = Bytes::from_static(b"salt");
            u.salted_password = Bytes::from_static(&[7; 64]);
            let mut r = AlterUserScramCredentialsRequest::default();
            r.deletions = vec![d];
            r.upsertions = vec![u];
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::DescribeConfigs => {
            let mut res = describe_configs_request::DescribeConfigsResource::default();
            res.resource_type = 2;
            res.resource_name = st("t");
            res.configuration_keys = Some(vec![st("retention.ms"), st("cleanup.policy")]);
            let mut r = DescribeConfigsRequest::default();
            r.resources = vec![res.clone(), res];
            r.include_synonyms = true;
            r.include_documentation = v >= 3;
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::AlterConfigs => {
            let mut c = alter_configs_request::AlterableConfig::default();
            c.name = st("retention.ms");
            c.value = Some(st("60000"));
            let mut res = alter_configs_request::AlterConfigsResource::default();
            res.resource_type = 2;
            res.resource_name = st("t");
            res.configs = vec![c.clone(), c];
            let mut r = AlterConfigsRequest::default();
            r.resources = vec![res];
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::IncrementalAlterConfigs => {
            let mut c = incremental_alter_configs_request::AlterableConfig::default();
            c.name = st("retention.ms");
            c.config_operation = 0;
            c.value = None;
            let mut res = incremental_alter_configs_request::AlterConfigsResource::default();
            res.resource_type = 2;
            res.resource_name = st("t");
            res.configs = vec![c.clone(), c];
            let mut r = IncrementalAlterConfigsRequest::default();
            r.resources = vec![res];
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::DeleteRecords => {
            let mut p = delete_records_request::DeleteRecordsPartition::default();
            p.partition_index = 1;
            p.offset = 5;
            let mut t = delete_records_request::DeleteRecordsTopic::default();
            t.name = tn("t");
            t.partitions = vec![p.clone(), p];
            let mut r = DeleteRecordsRequest::default();
            r.topics = vec![t];
            r.timeout_ms = 1000;
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::DescribeLogDirs => {
            let mut t = describe_log_dirs_request::DescribableLogDirTopic::default();
            t.topic = tn("t");
            t.partitions = vec![0, 1];
            let mut r = DescribeLogDirsRequest::default();
            r.topics = Some(vec![t]);
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::ListGroups => {
            let mut r = ListGroupsRequest::default();
            if v >= 4 {
                r.states_filter = vec![st("Stable"), st("Empty")];
            }
            if v >= 5 {
                r.types_filter = vec![st("classic"), st("consumer")];
            }
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::DescribeGroups => {
            let mut r = DescribeGroupsRequest::default();
            r.groups = vec![GroupId(st("g")), GroupId(st("h"))];
            r.include_authorized_operations = v >= 3;
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::DeleteGroups => {
            let mut r = DeleteGroupsRequest::default();
            r.groups_names = vec![GroupId(st("g")), GroupId(st("h"))];
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::OffsetDelete => {
            let mut p = offset_delete_request::OffsetDeleteRequestPartition::default();
            p.partition_index = 3;
            let mut t = offset_delete_request::OffsetDeleteRequestTopic::default();
            t.name = tn("t");
            t.partitions = vec![p.clone(), p];
            let mut r = OffsetDeleteRequest::default();
            r.group_id = GroupId(st("g"));
            r.topics = vec![t];
            r.encode(&mut b, v)
        }
        ApiKey::DescribeCluster => {
            let mut r = DescribeClusterRequest::default();
            r.include_cluster_authorized_operations = true;
            r.endpoint_type = 1;
            r.include_fenced_brokers = v >= 2;
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::OffsetForLeaderEpoch => {
            let mut p = offset_for_leader_epoch_request::OffsetForLeaderPartition::default();
            p.partition = 1;
            p.current_leader_epoch = 0;
            p.leader_epoch = 0;
            let mut t = offset_for_leader_epoch_request::OffsetForLeaderTopic::default();
            t.topic = tn("t");
            t.partitions = vec![p.clone(), p];
            let mut r = OffsetForLeaderEpochRequest::default();
            r.replica_id = BrokerId(-1);
            r.topics = vec![t];
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        ApiKey::DescribeQuorum => {
            let mut p = describe_quorum_request::PartitionData::default();
            p.partition_index = 1;
            let mut t = describe_quorum_request::TopicData::default();
            t.topic_name = tn("__nvmq_raft");
            t.partitions = vec![p.clone(), p];
            let mut r = DescribeQuorumRequest::default();
            r.topics = vec![t];
            r.unknown_tagged_fields = extra;
            r.encode(&mut b, v)
        }
        other => panic!("{other:?} is served but has no sample here: add one"),
    };
    r.unwrap_or_else(|e| panic!("{api:?} v{v}: the sample does not encode: {e}"));
    Some(b)
}

#[test]
fn every_served_version_is_walked_to_its_last_byte() {
    let mut walked_versions = 0;
    for a in TABLE {
        for v in a.min..=a.max {
            let Some(body) = sample(a.key, v) else {
                continue;
            };
            assert_eq!(
                walked(a.key, v, &body),
                Ok(body.len()),
                "{:?} v{v}: the walk and the codec disagree on the layout",
                a.key
            );
            // Cut anywhere, the body is refused or still walks no further than its end.
            for cut in 0..body.len() {
                if let Ok(n) = walked(a.key, v, &body[..cut]) {
                    assert!(n <= cut);
                }
            }
            walked_versions += 1;
        }
    }
    assert!(
        walked_versions > 100,
        "only {walked_versions} versions walked"
    );
}

#[test]
fn absurd_counts_are_refused_before_decoding() {
    // Metadata v1 with a topic count of two billion and no topics.
    let body = 0x7fff_ffffi32.to_be_bytes();
    assert!(check(ApiKey::Metadata, 1, &body).is_err());
    assert!(check(ApiKey::Metadata, 1, &(-1i32).to_be_bytes()).is_ok());
    assert!(check(ApiKey::Metadata, 0, &(-1i32).to_be_bytes()).is_err());
    let mut ok = 1i32.to_be_bytes().to_vec();
    ok.extend(3i16.to_be_bytes());
    ok.extend(b"abc");
    assert!(check(ApiKey::Metadata, 1, &ok).is_ok());
    assert!(check(ApiKey::Metadata, 1, &ok[..ok.len() - 1]).is_err());
}

#[test]
fn absurd_compact_counts_and_tags_are_refused() {
    // Metadata v12: a compact topic count of 2^32 - 2 (varint of u32::MAX), nothing after.
    let huge = [0xff, 0xff, 0xff, 0xff, 0x0f];
    let e = check(ApiKey::Metadata, 12, &huge).unwrap_err();
    assert!(
        e.contains("string length") || e.contains("varint") || e.contains("needs"),
        "{e}"
    );
    // A varint running past 32 bits or past the end.
    assert!(check(ApiKey::Metadata, 12, &[0xff, 0xff, 0xff, 0xff, 0x7f]).is_err());
    assert!(check(ApiKey::Metadata, 12, &[0x80]).is_err());
    // DeleteTopics v5: a compact array of names claiming a million, holding one.
    let mut b = vec![0xc1, 0x84, 0x3d]; // 1,000,001
    b.extend([2, b'x']);
    b.extend(0i32.to_be_bytes());
    b.push(0);
    assert!(check(ApiKey::DeleteTopics, 5, &b).is_err());
    // Metadata v12: no topics (compact 1), two booleans, then a tagged field claiming more
    // bytes than there are; without it, the body is whole.
    let mut m12 = vec![1u8, 1, 0];
    m12.extend([1, 9, 100]); // one tag, number 9, of 100 bytes
    m12.extend([0; 10]);
    assert!(check(ApiKey::Metadata, 12, &m12).is_err());
    m12.truncate(3);
    m12.push(0);
    assert_eq!(walked(ApiKey::Metadata, 12, &m12), Ok(4));
    // Fetch v17: the known partition tag 0 (a uuid) claiming a size other than 16.
    let body = sample(ApiKey::Fetch, 17).unwrap_or_default();
    let at = body
        .windows(18)
        .position(|w| w[..2] == [0, 16] && w[2..] == ID.as_bytes()[..])
        .expect("the replica directory id tag");
    let mut lying = body.clone();
    lying[at + 1] = 15;
    let e = check(ApiKey::Fetch, 17, &lying).unwrap_err();
    assert!(e.contains("claims 15 bytes and holds 16"), "{e}");
}

#[test]
fn absurd_compact_counts_are_refused_before_decoding() {
    let api = ApiKey::AlterUserScramCredentials;
    // Deletions: a varint count of about 2^32 and nothing behind it.
    assert!(check(api, 0, &[0xff, 0xff, 0xff, 0xff, 0x0f]).is_err());
    // A varint longer than five bytes.
    assert!(check(api, 0, &[0xff, 0xff, 0xff, 0xff, 0xff, 0x01]).is_err());
    // No deletions, one upsertion (user "u", SHA-256, 4096 iterations, 1-byte salt and
    // salted password), no tagged fields.
    let mut ok = vec![1, 2, 2, b'u', 1];
    ok.extend(4096i32.to_be_bytes());
    ok.extend([2, 9, 2, 9, 0, 0]);
    assert!(check(api, 0, &ok).is_ok());
    assert!(check(api, 0, &ok[..ok.len() - 1]).is_err());
    // Describe: null (every user) or a list of names.
    let d = ApiKey::DescribeUserScramCredentials;
    assert!(check(d, 0, &[0, 0]).is_ok());
    assert!(check(d, 0, &[2, 2, b'u', 0, 0]).is_ok());
    assert!(check(d, 0, &[0x80, 0x80, 0x80, 0x80, 0x08, 0]).is_err());
    // A tagged field longer than the body.
    assert!(check(d, 0, &[0, 1, 0, 100]).is_err());
}

#[test]
fn compact_counts_and_tagged_fields_are_walked() {
    // ListGroups v4: states filter ["Stable"], no tagged fields.
    let mut ok = vec![2, 7];
    ok.extend(b"Stable");
    ok.push(0);
    assert!(check(ApiKey::ListGroups, 4, &ok).is_ok());
    assert!(check(ApiKey::ListGroups, 4, &ok[..ok.len() - 1]).is_err());
    // A count of two billion (as a varint) with nothing behind it.
    assert!(check(ApiKey::ListGroups, 4, &[0xff, 0xff, 0xff, 0xff, 0x07, 0]).is_err());
    // A varint that never ends.
    assert!(check(ApiKey::ListGroups, 4, &[0xff; 8]).is_err());
    // DescribeCluster v0: a tagged field claiming more bytes than there are.
    assert!(check(ApiKey::DescribeCluster, 0, &[0, 0]).is_ok());
    assert!(check(ApiKey::DescribeCluster, 0, &[0, 1, 0, 9, 1]).is_err());
    assert!(check(ApiKey::DescribeCluster, 0, &[0, 1, 0, 1, 1]).is_ok());
}
