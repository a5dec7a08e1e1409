//! Every (API, version) that ApiVersions advertises is served: a minimal valid request at that
//! version gets a well-formed answer (its header and body decode at that version with no byte
//! left over), never a closed connection. A client picks any version in the advertised range, so
//! a version advertised but not served is a connection that breaks for someone.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Buf, Bytes};
use frontend::client::{record_batch, Client};
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_delete_request::{
    OffsetDeleteRequestPartition, OffsetDeleteRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Request, StrBytes};

const TOPIC: &str = "versions";
const GROUP: &str = "versions-group";

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn topic(n: &str) -> TopicName {
    TopicName(s(n))
}

/// Sends `req` at `version` on a fresh connection and checks the answer decodes exactly.
async fn answered<R: Request>(addr: SocketAddr, version: i16, req: &R) -> Result<(), String> {
    let mut c = Client::connect(addr, "versions")
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let id = c
        .send(version, req)
        .await
        .map_err(|e| format!("send: {e}"))?;
    let mut b = tokio::time::timeout(Duration::from_secs(15), c.recv_raw())
        .await
        .map_err(|_| "no answer within 15 s".to_string())?
        .map_err(|e| format!("no answer (connection closed?): {e}"))?;
    let key = ApiKey::try_from(R::KEY).map_err(|_| format!("api key {}", R::KEY))?;
    let h = ResponseHeader::decode(&mut b, key.response_header_version(version))
        .map_err(|e| format!("response header: {e}"))?;
    if h.correlation_id != id {
        return Err(format!("correlation id {} for {id}", h.correlation_id));
    }
    R::Response::decode(&mut b, version).map_err(|e| format!("response body: {e}"))?;
    if b.has_remaining() {
        return Err(format!(
            "{} bytes left after the response body",
            b.remaining()
        ));
    }
    Ok(())
}

/// The id of the test's topic, from Metadata v12.
async fn topic_id(addr: SocketAddr) -> Result<uuid::Uuid, String> {
    let mut c = Client::connect(addr, "versions")
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut t = MetadataRequestTopic::default();
    t.name = Some(topic(TOPIC));
    let mut m = MetadataRequest::default();
    m.topics = Some(vec![t]);
    let r = c.call(12, &m).await.map_err(|e| format!("metadata: {e}"))?;
    match r.topics.first() {
        Some(t) if !t.topic_id.is_nil() => Ok(t.topic_id),
        _ => Err("Metadata v12 gave the topic no id".into()),
    }
}

/// Produce v0–2 (message format v0/v1 era) is outside what the codec encodes: the request and
/// answer are laid out by hand. The request is v3's without the transactional id; the answer
/// is v3's without log_append_time (v0–1) and throttle_time (v0).
async fn produce_legacy(
    addr: SocketAddr,
    version: i16,
    records: &[u8],
) -> Result<Vec<(i16, i64)>, String> {
    let mut body = Vec::new();
    body.extend((-1i16).to_be_bytes()); // acks
    body.extend(5000i32.to_be_bytes()); // timeout_ms
    body.extend(1i32.to_be_bytes());
    body.extend((TOPIC.len() as i16).to_be_bytes());
    body.extend(TOPIC.as_bytes());
    body.extend(1i32.to_be_bytes());
    body.extend(0i32.to_be_bytes()); // partition
    body.extend((records.len() as i32).to_be_bytes());
    body.extend(records);
    let mut f = Vec::new();
    f.extend(0i16.to_be_bytes());
    f.extend(version.to_be_bytes());
    f.extend(77i32.to_be_bytes());
    f.extend(1i16.to_be_bytes());
    f.push(b'x');
    f.extend(body);
    let mut frame = (f.len() as i32).to_be_bytes().to_vec();
    frame.extend(f);
    let mut c = Client::connect(addr, "legacy")
        .await
        .map_err(|e| format!("connect: {e}"))?;
    c.send_raw(&frame).await.map_err(|e| format!("send: {e}"))?;
    let mut b: Bytes = tokio::time::timeout(Duration::from_secs(15), c.recv_raw())
        .await
        .map_err(|_| "no answer within 15 s".to_string())?
        .map_err(|e| format!("no answer (connection closed?): {e}"))?;
    let need = |b: &Bytes, n: usize| {
        if b.remaining() < n {
            Err(format!(
                "answer ends early ({} bytes left, {n} needed)",
                b.remaining()
            ))
        } else {
            Ok(())
        }
    };
    need(&b, 8)?;
    if b.get_i32() != 77 {
        return Err("wrong correlation id".into());
    }
    let mut answers = Vec::new();
    for _ in 0..b.get_i32() {
        need(&b, 2)?;
        let n = b.get_i16().max(0) as usize;
        need(&b, n + 4)?;
        b.advance(n);
        for _ in 0..b.get_i32() {
            need(&b, 14)?;
            let _index = b.get_i32();
            let code = b.get_i16();
            answers.push((code, b.get_i64()));
            if version >= 2 {
                need(&b, 8)?;
                b.get_i64();
            }
        }
    }
    if version >= 1 {
        need(&b, 4)?;
        b.get_i32();
    }
    if b.has_remaining() {
        return Err(format!("{} bytes left after the answer", b.remaining()));
    }
    Ok(answers)
}

/// A minimal valid request for (key, version), sent and checked.
async fn check(addr: SocketAddr, key: i16, v: i16) -> Result<(), String> {
    let api = ApiKey::try_from(key).map_err(|_| format!("unknown api key {key}"))?;
    match api {
        ApiKey::Produce if v < 3 => {
            produce_legacy(addr, v, &record_batch(&[b"legacy"], None)).await?;
            Ok(())
        }
        ApiKey::Produce => {
            let mut p = PartitionProduceData::default();
            p.index = 0;
            p.records = Some(Bytes::from(record_batch(&[b"x"], None)));
            let mut t = TopicProduceData::default();
            if v >= 13 {
                t.topic_id = topic_id(addr).await?;
            } else {
                t.name = topic(TOPIC);
            }
            t.partition_data = vec![p];
            let mut r = ProduceRequest::default();
            r.acks = -1;
            r.timeout_ms = 5000;
            r.topic_data = vec![t];
            answered(addr, v, &r).await
        }
        ApiKey::Fetch => {
            let mut p = FetchPartition::default();
            p.partition_max_bytes = 1 << 20;
            let mut t = FetchTopic::default();
            if v >= 13 {
                t.topic_id = topic_id(addr).await?;
            } else {
                t.topic = topic(TOPIC);
            }
            t.partitions = vec![p];
            let mut r = FetchRequest::default();
            r.replica_id = BrokerId(-1);
            r.max_bytes = 1 << 20;
            r.topics = vec![t];
            answered(addr, v, &r).await
        }
        ApiKey::ListOffsets => {
            let mut p = ListOffsetsPartition::default();
            p.timestamp = -1;
            let mut t = ListOffsetsTopic::default();
            t.name = topic(TOPIC);
            t.partitions = vec![p];
            let mut r = ListOffsetsRequest::default();
            r.replica_id = BrokerId(-1);
            r.topics = vec![t];
            answered(addr, v, &r).await
        }
        ApiKey::Metadata => {
            let mut t = MetadataRequestTopic::default();
            t.name = Some(topic(TOPIC));
            let mut r = MetadataRequest::default();
            r.topics = Some(vec![t]);
            answered(addr, v, &r).await
        }
        ApiKey::OffsetCommit => {
            let mut p = OffsetCommitRequestPartition::default();
            p.committed_offset = 0;
            let mut t = OffsetCommitRequestTopic::default();
            t.name = topic(TOPIC);
            t.partitions = vec![p];
            let mut r = OffsetCommitRequest::default();
            r.group_id = GroupId(s(GROUP));
            r.generation_id_or_member_epoch = -1;
            r.retention_time_ms = -1;
            r.topics = vec![t];
            answered(addr, v, &r).await
        }
        ApiKey::OffsetFetch => {
            let mut t = OffsetFetchRequestTopic::default();
            t.name = topic(TOPIC);
            t.partition_indexes = vec![0];
            let mut r = OffsetFetchRequest::default();
            if v >= 8 {
                // Groups, each with its topics.
                let mut ts = OffsetFetchRequestTopics::default();
                ts.name = topic(TOPIC);
                ts.partition_indexes = vec![0];
                let mut g = OffsetFetchRequestGroup::default();
                g.group_id = GroupId(s(GROUP));
                g.topics = Some(vec![ts]);
                r.groups = vec![g];
                r.topics = Some(Vec::new());
            } else {
                r.group_id = GroupId(s(GROUP));
                r.topics = Some(vec![t]);
            }
            answered(addr, v, &r).await
        }
        ApiKey::FindCoordinator => {
            let mut r = FindCoordinatorRequest::default();
            if v >= 4 {
                r.coordinator_keys = vec![s(GROUP)];
            } else {
                r.key = s(GROUP);
            }
            answered(addr, v, &r).await
        }
        ApiKey::JoinGroup => {
            let mut p = JoinGroupRequestProtocol::default();
            p.name = s("range");
            p.metadata = Bytes::from_static(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            let mut r = JoinGroupRequest::default();
            // A group of its own per version: a join completes once its members are in.
            r.group_id = GroupId(s(&format!("join-{v}")));
            r.session_timeout_ms = 10_000;
            r.rebalance_timeout_ms = 10_000;
            r.protocol_type = s("consumer");
            r.protocols = vec![p];
            answered(addr, v, &r).await
        }
        ApiKey::Heartbeat => {
            let mut r = HeartbeatRequest::default();
            r.group_id = GroupId(s(GROUP));
            r.member_id = s("nobody");
            answered(addr, v, &r).await
        }
        ApiKey::LeaveGroup => {
            let mut r = LeaveGroupRequest::default();
            r.group_id = GroupId(s(GROUP));
            if v >= 3 {
                let mut m = MemberIdentity::default();
                m.member_id = s("nobody");
                r.members = vec![m];
            } else {
                r.member_id = s("nobody");
            }
            answered(addr, v, &r).await
        }
        ApiKey::SyncGroup => {
            let mut r = SyncGroupRequest::default();
            r.group_id = GroupId(s(GROUP));
            r.member_id = s("nobody");
            answered(addr, v, &r).await
        }
        ApiKey::ApiVersions => {
            let mut r = ApiVersionsRequest::default();
            r.client_software_name = s("versions-test");
            r.client_software_version = s("1");
            answered(addr, v, &r).await
        }
        ApiKey::CreateTopics => {
            let mut t = CreatableTopic::default();
            t.name = topic(&format!("created-{v}"));
            t.num_partitions = 1;
            t.replication_factor = 1;
            let mut r = CreateTopicsRequest::default();
            r.topics = vec![t];
            r.timeout_ms = 5000;
            answered(addr, v, &r).await
        }
        ApiKey::DeleteTopics => {
            let mut r = DeleteTopicsRequest::default();
            let gone = topic(&format!("created-{}", 2 + v % 6));
            if v >= 6 {
                let mut by_name = DeleteTopicState::default();
                by_name.name = Some(gone);
                r.topics = vec![by_name];
            } else {
                r.topic_names = vec![gone];
            }
            r.timeout_ms = 5000;
            answered(addr, v, &r).await
        }
        ApiKey::CreatePartitions => {
            let mut t = CreatePartitionsTopic::default();
            t.name = topic(TOPIC);
            t.count = 2 + i32::from(v);
            t.assignments = None;
            let mut r = CreatePartitionsRequest::default();
            r.topics = vec![t];
            r.timeout_ms = 5000;
            answered(addr, v, &r).await
        }
        ApiKey::InitProducerId => {
            let mut r = InitProducerIdRequest::default();
            r.transactional_id = None;
            r.transaction_timeout_ms = 60_000;
            answered(addr, v, &r).await
        }
        ApiKey::CreateAcls => {
            let mut c = kafka_protocol::messages::create_acls_request::AclCreation::default();
            c.resource_type = 2;
            c.resource_name = s(TOPIC);
            c.principal = s("User:alice");
            c.host = s("*");
            c.operation = 3;
            c.permission_type = 3;
            let mut r = CreateAclsRequest::default();
            r.creations = vec![c];
            answered(addr, v, &r).await
        }
        ApiKey::DescribeAcls => {
            let mut r = DescribeAclsRequest::default();
            r.resource_type_filter = 1;
            r.pattern_type_filter = 1;
            r.operation = 1;
            r.permission_type = 1;
            answered(addr, v, &r).await
        }
        ApiKey::DeleteAcls => {
            let mut f = kafka_protocol::messages::delete_acls_request::DeleteAclsFilter::default();
            f.resource_type_filter = 2;
            f.pattern_type_filter = 1;
            f.operation = 1;
            f.permission_type = 1;
            let mut r = DeleteAclsRequest::default();
            r.filters = vec![f];
            answered(addr, v, &r).await
        }
        // Without SASL configured these are refused (UNSUPPORTED_SASL_MECHANISM,
        // ILLEGAL_SASL_STATE) in a well-formed answer; tests/sasl.rs logs in with them.
        ApiKey::SaslHandshake => {
            let mut r = SaslHandshakeRequest::default();
            r.mechanism = s("PLAIN");
            answered(addr, v, &r).await
        }
        ApiKey::SaslAuthenticate => {
            let mut r = SaslAuthenticateRequest::default();
            r.auth_bytes = Bytes::from_static(b"\0u\0p");
            answered(addr, v, &r).await
        }
        ApiKey::DescribeUserScramCredentials => {
            answered(addr, v, &DescribeUserScramCredentialsRequest::default()).await
        }
        ApiKey::AlterUserScramCredentials => {
            answered(addr, v, &AlterUserScramCredentialsRequest::default()).await
        }
        ApiKey::DescribeConfigs => {
            let mut res = describe_configs_request::DescribeConfigsResource::default();
            res.resource_type = 2;
            res.resource_name = s(TOPIC);
            res.configuration_keys = None;
            let mut r = DescribeConfigsRequest::default();
            r.resources = vec![res];
            r.include_synonyms = true;
            r.include_documentation = v >= 3;
            answered(addr, v, &r).await
        }
        ApiKey::AlterConfigs => {
            let mut c = alter_configs_request::AlterableConfig::default();
            c.name = s("retention.ms");
            c.value = Some(s("-1"));
            let mut res = alter_configs_request::AlterConfigsResource::default();
            res.resource_type = 2;
            res.resource_name = s(TOPIC);
            res.configs = vec![c];
            let mut r = AlterConfigsRequest::default();
            r.resources = vec![res];
            r.validate_only = true;
            answered(addr, v, &r).await
        }
        ApiKey::IncrementalAlterConfigs => {
            let mut c = incremental_alter_configs_request::AlterableConfig::default();
            c.name = s("retention.ms");
            c.config_operation = 0;
            c.value = Some(s("-1"));
            let mut res = incremental_alter_configs_request::AlterConfigsResource::default();
            res.resource_type = 2;
            res.resource_name = s(TOPIC);
            res.configs = vec![c];
            let mut r = IncrementalAlterConfigsRequest::default();
            r.resources = vec![res];
            r.validate_only = true;
            answered(addr, v, &r).await
        }
        ApiKey::DeleteRecords => {
            let mut p = delete_records_request::DeleteRecordsPartition::default();
            p.partition_index = 0;
            p.offset = 0;
            let mut t = delete_records_request::DeleteRecordsTopic::default();
            t.name = topic(TOPIC);
            t.partitions = vec![p];
            let mut r = DeleteRecordsRequest::default();
            r.topics = vec![t];
            r.timeout_ms = 5000;
            answered(addr, v, &r).await
        }
        ApiKey::DescribeLogDirs => {
            let mut r = DescribeLogDirsRequest::default();
            r.topics = None;
            answered(addr, v, &r).await
        }
        ApiKey::ListGroups => {
            let mut r = ListGroupsRequest::default();
            if v >= 4 {
                r.states_filter = vec![s("Stable"), s("Empty")];
            }
            if v >= 5 {
                r.types_filter = vec![s("classic")];
            }
            answered(addr, v, &r).await
        }
        ApiKey::DescribeGroups => {
            let mut r = DescribeGroupsRequest::default();
            r.groups = vec![GroupId(s(GROUP)), GroupId(s("join-5"))];
            r.include_authorized_operations = v >= 3;
            answered(addr, v, &r).await
        }
        ApiKey::DeleteGroups => {
            let mut r = DeleteGroupsRequest::default();
            r.groups_names = vec![GroupId(s(&format!("no-such-group-{v}")))];
            answered(addr, v, &r).await
        }
        ApiKey::OffsetDelete => {
            let mut t = OffsetDeleteRequestTopic::default();
            t.name = topic(TOPIC);
            t.partitions = vec![OffsetDeleteRequestPartition::default()];
            let mut r = OffsetDeleteRequest::default();
            r.group_id = GroupId(s(GROUP));
            r.topics = vec![t];
            answered(addr, v, &r).await
        }
        ApiKey::DescribeCluster => {
            let mut r = DescribeClusterRequest::default();
            r.include_cluster_authorized_operations = true;
            r.endpoint_type = 1;
            r.include_fenced_brokers = v >= 2;
            answered(addr, v, &r).await
        }
        ApiKey::OffsetForLeaderEpoch => {
            let mut p = OffsetForLeaderPartition::default();
            p.current_leader_epoch = 0;
            p.leader_epoch = 0;
            let mut t = OffsetForLeaderTopic::default();
            t.topic = topic(TOPIC);
            t.partitions = vec![p];
            let mut r = OffsetForLeaderEpochRequest::default();
            r.replica_id = BrokerId(-1);
            r.topics = vec![t];
            answered(addr, v, &r).await
        }
        other => Err(format!(
            "{other:?} is advertised but this test has no request for it: add one"
        )),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_advertised_version_gets_a_well_formed_answer() {
    // With the authorizer on and the client a super user, every request takes its checked path
    // (the ACL APIs theirs in full) and is allowed.
    let cfg = frontend::Config {
        authorizer: true,
        super_users: vec![frontend::session::Principal::anonymous()],
        ..Default::default()
    };
    let (addr, _s) = common::serve(cfg).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    let advertised = c.call(0, &ApiVersionsRequest::default()).await.unwrap();
    assert_eq!(advertised.error_code, 0);
    // The topic the requests name.
    let mut t = MetadataRequestTopic::default();
    t.name = Some(topic(TOPIC));
    let mut m = MetadataRequest::default();
    m.topics = Some(vec![t]);
    assert_eq!(c.call(1, &m).await.unwrap().topics[0].error_code, 0);
    let mut failures = Vec::new();
    let mut checked = 0;
    for k in &advertised.api_keys {
        for v in k.min_version..=k.max_version {
            checked += 1;
            if let Err(e) = check(addr, k.api_key, v).await {
                let name = ApiKey::try_from(k.api_key)
                    .map(|a| format!("{a:?}"))
                    .unwrap_or_else(|_| k.api_key.to_string());
                failures.push(format!("{name} v{v}: {e}"));
            }
        }
    }
    assert!(checked > 50, "only {checked} versions advertised");
    assert!(
        failures.is_empty(),
        "advertised but not served:\n{}",
        failures.join("\n")
    );
}

/// Produce v0–2 take v2 batches as v3 does; an old-format message set is refused for its
/// partition, by name, in a well-formed answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_v0_to_v2_store_v2_batches_and_refuse_older_formats() {
    let (addr, _s) = common::serve(Default::default()).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    let mut t = MetadataRequestTopic::default();
    t.name = Some(topic(TOPIC));
    let mut m = MetadataRequest::default();
    m.topics = Some(vec![t]);
    assert_eq!(c.call(1, &m).await.unwrap().topics[0].error_code, 0);
    for v in 0..=2i16 {
        let got = produce_legacy(addr, v, &record_batch(&[b"a", b"b"], None))
            .await
            .unwrap();
        assert_eq!(got, vec![(0, 2 * i64::from(v))], "v{v}");
    }
    // A magic-1 message set of one message: offset, size, crc, magic, attributes, timestamp,
    // null key, value.
    let mut msg = vec![1u8, 0];
    msg.extend(0i64.to_be_bytes());
    msg.extend((-1i32).to_be_bytes());
    msg.extend(3i32.to_be_bytes());
    msg.extend(b"old");
    let mut set = 0i64.to_be_bytes().to_vec();
    set.extend(((4 + msg.len()) as i32).to_be_bytes());
    set.extend(0u32.to_be_bytes());
    set.extend(msg);
    let got = produce_legacy(addr, 1, &set).await.unwrap();
    assert_eq!(
        got,
        vec![(frontend::codes::UNSUPPORTED_FOR_MESSAGE_FORMAT, -1)]
    );
}
