//! ApiVersions, Metadata, DescribeCluster, CreateTopics (with its configs, checked as
//! `config_api` checks them), CreatePartitions, DeleteTopics, FindCoordinator, InitProducerId.

use std::sync::Arc;

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    ApiVersionsResponse, BrokerId, CreatePartitionsRequest, CreatePartitionsResponse,
    CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse,
    DescribeClusterRequest, DescribeClusterResponse, FindCoordinatorRequest,
    FindCoordinatorResponse, InitProducerIdRequest, InitProducerIdResponse, MetadataRequest,
    MetadataResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use nvmq_log::LogError;
use uuid::Uuid;

use crate::acl::{check, operations, Operation, ResourceType};
use crate::broker::{valid_topic_name, Broker};
use crate::codes;
use crate::conn::{Ctx, Reply};
use crate::versions::TABLE;

/// The node id nvmq answers as (a single broker).
pub const NODE_ID: i32 = 0;
const CLUSTER_ID: &str = "nvmq";
/// Transactions are refused where a client starts them (FindCoordinator for a transaction,
/// InitProducerId with a transactional id) with an error no client retries, so that
/// `init_transactions()` fails at once instead of waiting out its timeout.
const NO_TRANSACTIONS: &str =
    "nvmq does not support transactions: unset transactional.id (idempotence works without it)";
/// DescribeCluster's endpoint types: brokers (1); controllers (2) are not served apart.
const ENDPOINT_BROKERS: i8 = 1;
/// Partitions one CreateTopics may ask for per topic: each is created durably (a flush apiece).
const MAX_PARTITIONS: u32 = 1000;

fn versions_body(error: i16, cluster: bool) -> ApiVersionsResponse {
    let mut r = ApiVersionsResponse::default();
    r.error_code = error;
    r.api_keys = TABLE
        .iter()
        .filter(|a| match cluster {
            true => crate::replica::served(a.key),
            false => !crate::replica::cluster_only(a.key),
        })
        .map(|a| {
            let mut v = ApiVersion::default();
            v.api_key = a.key as i16;
            v.min_version = a.min;
            v.max_version = a.max;
            v
        })
        .collect();
    r
}

/// The APIs and versions served; a node of a cluster leaves out those whose changes it does
/// not replicate yet (`replica::served`), so clients know before they ask.
pub fn api_versions(b: &Broker, ctx: &Ctx) -> Reply {
    ctx.ready(&versions_body(codes::NONE, b.replica().is_some()))
}

/// The answer to an ApiVersions version nvmq does not serve: UNSUPPORTED_VERSION in a v0 body.
pub fn api_versions_unsupported(ctx: &Ctx) -> Reply {
    ctx.ready(&versions_body(codes::UNSUPPORTED_VERSION, false))
}

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

/// A topic a Metadata request asks for: by name, or (v10+) by id alone.
enum Asked {
    Name(String),
    Id(Uuid),
}

pub async fn metadata(b: &Arc<Broker>, ctx: &Ctx, req: MetadataRequest) -> Reply {
    let requested: Option<Vec<Asked>> = match req.topics {
        // v0: an empty list means every topic.
        Some(t) if t.is_empty() && ctx.version == 0 => None,
        Some(t) => Some(
            t.into_iter()
                .map(|t| match t.name {
                    Some(n) => Asked::Name(n.as_str().to_string()),
                    None => Asked::Id(t.topic_id),
                })
                .collect(),
        ),
        None => None,
    };
    let may_create = b.cfg.auto_create_topics && (ctx.version < 4 || req.allow_auto_topic_creation);
    let names: Vec<(Option<String>, Uuid, i16)> = match requested {
        // Every topic the principal may describe; the others are left out, unnamed.
        None => {
            let all: Vec<String> = b.topics().map.keys().cloned().collect();
            all.into_iter()
                .filter(|n| check::topic(b, ctx, Operation::Describe, n))
                .map(|n| (Some(n), Uuid::nil(), codes::NONE))
                .collect()
        }
        Some(list) => {
            let mut out = Vec::new();
            for asked in list {
                let n = match asked {
                    Asked::Name(n) => n,
                    Asked::Id(id) => {
                        // Never created by id: an id names a topic that exists.
                        let n = b.topics().name_of(&id).map(|n| n.to_string());
                        match n {
                            Some(n) if !check::topic(b, ctx, Operation::Describe, &n) => {
                                out.push((None, id, codes::TOPIC_AUTHORIZATION_FAILED))
                            }
                            Some(n) => out.push((Some(n), id, codes::NONE)),
                            None => out.push((None, id, codes::UNKNOWN_TOPIC_ID)),
                        }
                        continue;
                    }
                };
                let exists = b.topics().map.contains_key(&n);
                // Refused before its existence is looked at, so that it is not disclosed.
                let code = if !check::topic(b, ctx, Operation::Describe, &n) {
                    codes::TOPIC_AUTHORIZATION_FAILED
                } else if exists {
                    codes::NONE
                } else if !valid_topic_name(&n) {
                    codes::INVALID_TOPIC_EXCEPTION
                } else if may_create && !check::create_topic(b, ctx, &n) {
                    codes::TOPIC_AUTHORIZATION_FAILED
                } else if let Some(r) = b.replica().filter(|r| may_create && !r.is_leader()) {
                    // Created by the cluster's leader, which this node asks; the topic is
                    // served here once this node applied it (until then the client asks again).
                    let leader = r.view().leader.and_then(|l| r.members().get(&l).cloned());
                    let code = match leader {
                        Some(l) => {
                            let parts = b.cfg.default_partitions;
                            crate::replica::forward::create_topic(&l.kafka, &n, parts).await
                        }
                        None => codes::LEADER_NOT_AVAILABLE,
                    };
                    match code {
                        codes::NONE | codes::TOPIC_ALREADY_EXISTS
                            if b.topics().map.contains_key(&n) =>
                        {
                            codes::NONE
                        }
                        codes::NONE | codes::TOPIC_ALREADY_EXISTS => codes::LEADER_NOT_AVAILABLE,
                        other => other,
                    }
                } else if may_create {
                    match b.create_topic(&n, b.cfg.default_partitions).await {
                        Ok(_) => codes::NONE,
                        Err(e) => {
                            tracing::warn!(topic = %n, error = %e, "auto-creating a topic failed");
                            create_error_code(&e)
                        }
                    }
                } else {
                    codes::UNKNOWN_TOPIC_OR_PARTITION
                };
                out.push((Some(n), Uuid::nil(), code));
            }
            out
        }
    };
    let mut resp = MetadataResponse::default();
    let place = crate::placement::of(b);
    for a in &place.brokers {
        let mut broker = MetadataResponseBroker::default();
        broker.node_id = BrokerId(a.id);
        broker.host = StrBytes::from_string(a.host.clone());
        broker.port = a.port;
        resp.brokers.push(broker);
    }
    if ctx.version >= 2 {
        resp.cluster_id = Some(StrBytes::from_static_str(CLUSTER_ID));
    }
    resp.controller_id = BrokerId(if ctx.version >= 1 { place.leader } else { -1 });
    // The field is in v8-10 only (v11 moved it to DescribeCluster).
    if req.include_cluster_authorized_operations && (8..=10).contains(&ctx.version) {
        resp.cluster_authorized_operations = operations::cluster(b, ctx);
    }
    let topics = b.topics();
    for (n, asked_id, code) in names {
        let mut t = MetadataResponseTopic::default();
        t.error_code = code;
        if ctx.version >= 10 {
            // The id of the topic now under that name (nil when there is none).
            t.topic_id = n.as_deref().and_then(|n| topics.id(n)).unwrap_or(asked_id);
        }
        if code == codes::NONE && req.include_topic_authorized_operations && ctx.version >= 8 {
            if let Some(n) = n.as_deref() {
                t.topic_authorized_operations =
                    operations::authorized(b, ctx, ResourceType::Topic, n);
            }
        }
        if code == codes::NONE {
            let count = n
                .as_ref()
                .and_then(|n| topics.map.get(n))
                .map_or(0, |p| p.len());
            for i in 0..count {
                let mut p = MetadataResponsePartition::default();
                p.partition_index = i as i32;
                if place.leader < 0 {
                    p.error_code = codes::LEADER_NOT_AVAILABLE;
                }
                p.leader_id = BrokerId(place.leader);
                p.leader_epoch = place.epoch;
                p.replica_nodes = place.replicas.iter().map(|&r| BrokerId(r)).collect();
                p.isr_nodes = place.in_sync.iter().map(|&r| BrokerId(r)).collect();
                t.partitions.push(p);
            }
        }
        t.name = n.map(|n| name(&n));
        resp.topics.push(t);
    }
    ctx.ready(&resp)
}

/// This broker, the cluster (the id Metadata gives), and the controller: this node; with the
/// operations the principal may do on the cluster when asked (KIP-430). v2's fenced brokers:
/// a single broker is never fenced, so the answer is the same with or without them.
pub fn describe_cluster(b: &Arc<Broker>, ctx: &Ctx, req: DescribeClusterRequest) -> Reply {
    let mut resp = DescribeClusterResponse::default();
    resp.endpoint_type = ENDPOINT_BROKERS;
    if ctx.version >= 1 && req.endpoint_type != ENDPOINT_BROKERS {
        resp.error_code = codes::UNSUPPORTED_ENDPOINT_TYPE;
        resp.error_message = Some(StrBytes::from_string(format!(
            "endpoint type {}: nvmq serves brokers (1) only",
            req.endpoint_type
        )));
        return ctx.ready(&resp);
    }
    resp.cluster_id = StrBytes::from_static_str(CLUSTER_ID);
    let place = crate::placement::of(b);
    resp.controller_id = BrokerId(place.leader);
    for a in &place.brokers {
        let mut broker = DescribeClusterBroker::default();
        broker.broker_id = BrokerId(a.id);
        broker.host = StrBytes::from_string(a.host.clone());
        broker.port = a.port;
        resp.brokers.push(broker);
    }
    resp.cluster_authorized_operations = if req.include_cluster_authorized_operations {
        operations::cluster(b, ctx)
    } else {
        operations::NOT_REQUESTED
    };
    ctx.ready(&resp)
}

/// The Kafka error for a create the log refused: a full registry is the broker's policy (a
/// documented limit, `LogError::RegistryFull` says which), anything else a storage error.
fn create_error_code(e: &LogError) -> i16 {
    match e {
        LogError::RegistryFull { .. } => codes::POLICY_VIOLATION,
        _ => codes::KAFKA_STORAGE_ERROR,
    }
}

pub async fn create_topics(b: &Arc<Broker>, ctx: &Ctx, req: CreateTopicsRequest) -> Reply {
    let mut resp = CreateTopicsResponse::default();
    // Each partition has a replica on every node: 1 on a single broker.
    let factor = i32::try_from(crate::placement::of(b).replicas.len()).unwrap_or(i32::MAX);
    for t in req.topics {
        let n = t.name.as_str().to_string();
        let mut r = CreatableTopicResult::default();
        r.name = t.name.clone();
        let partitions = if t.num_partitions == -1 {
            Ok(b.cfg.default_partitions)
        } else {
            u32::try_from(t.num_partitions)
                .ok()
                .filter(|&p| p > 0 && p <= MAX_PARTITIONS)
                .ok_or(())
        };
        let configs = crate::config_api::create_configs(
            b,
            t.configs
                .iter()
                .map(|c| (c.name.as_str(), c.value.as_ref().map(|v| v.as_str()))),
        );
        let (code, msg) = if !check::create_topic(b, ctx, &n) {
            (
                codes::TOPIC_AUTHORIZATION_FAILED,
                format!("{} may not create topic {n:?}", ctx.session.principal()),
            )
        } else if !valid_topic_name(&n) {
            (
                codes::INVALID_TOPIC_EXCEPTION,
                format!("topic name {n:?} is not valid"),
            )
        } else if !t.assignments.is_empty()
            || !(t.replication_factor == -1 || i32::from(t.replication_factor) == factor)
        {
            (
                codes::INVALID_REPLICATION_FACTOR,
                format!("every partition has {factor} replicas here, one on each node"),
            )
        } else if b.replica().is_some_and(|r| !r.is_leader()) {
            (
                codes::NOT_CONTROLLER,
                "topics are created through the cluster's leader".to_string(),
            )
        } else if let Err(()) = partitions {
            (
                codes::INVALID_PARTITIONS,
                format!("{} partitions", t.num_partitions),
            )
        } else if b.topics().map.contains_key(&n) {
            (
                codes::TOPIC_ALREADY_EXISTS,
                format!("topic {n:?} already exists"),
            )
        } else if let Err(m) = &configs {
            (crate::config_api::INVALID_CONFIG, m.clone())
        } else if req.validate_only {
            match b.create_room(&n, partitions.unwrap_or(1)) {
                Ok(()) => (codes::NONE, String::new()),
                Err(e) => (create_error_code(&e), e.to_string()),
            }
        } else {
            let configs = configs.unwrap_or_default();
            match b
                .create_topic_with(&n, partitions.unwrap_or(1), configs)
                .await
            {
                Ok(true) => (codes::NONE, String::new()),
                Ok(false) => (
                    codes::TOPIC_ALREADY_EXISTS,
                    format!("topic {n:?} already exists"),
                ),
                Err(e) => {
                    tracing::warn!(topic = %n, error = %e, "creating a topic failed");
                    (create_error_code(&e), e.to_string())
                }
            }
        };
        r.error_code = code;
        if code != codes::NONE && ctx.version >= 1 {
            r.error_message = Some(StrBytes::from_string(msg));
        }
        // v5+: what was created (Kafka's -1 on an error), v7+ its id. Its configs are the
        // broker's defaults, which DescribeConfigs lists: none is set per topic here.
        if code == codes::NONE && ctx.version >= 5 {
            r.num_partitions = partitions.map_or(-1, |p| p as i32);
            r.replication_factor = i16::try_from(factor).unwrap_or(i16::MAX);
            r.configs = Some(Vec::new());
        }
        if code == codes::NONE && ctx.version >= 7 {
            r.topic_id = b.topics().id(&n).unwrap_or_default();
        }
        resp.topics.push(r);
    }
    ctx.ready(&resp)
}

const INVALID_REPLICA_ASSIGNMENT: i16 = 39;

pub async fn create_partitions(b: &Arc<Broker>, ctx: &Ctx, req: CreatePartitionsRequest) -> Reply {
    let mut resp = CreatePartitionsResponse::default();
    for t in req.topics {
        let n = t.name.as_str().to_string();
        let only_here = t.assignments.as_ref().is_none_or(|a| {
            a.iter()
                .all(|x| x.broker_ids.iter().all(|id| id.0 == NODE_ID))
        });
        let allowed = check::topic(b, ctx, Operation::Alter, &n);
        let (code, msg) = match u32::try_from(t.count)
            .ok()
            .filter(|&c| c > 0 && c <= MAX_PARTITIONS)
        {
            _ if !allowed => (
                codes::TOPIC_AUTHORIZATION_FAILED,
                format!("{} may not alter topic {n:?}", ctx.session.principal()),
            ),
            None => (codes::INVALID_PARTITIONS, format!("{} partitions", t.count)),
            Some(_) if !only_here => (
                INVALID_REPLICA_ASSIGNMENT,
                format!("a single broker (node {NODE_ID}) holds every partition"),
            ),
            Some(count) if req.validate_only => {
                match b.topics().map.get(&n).map(|p| p.len() as u32) {
                    None => (codes::UNKNOWN_TOPIC_OR_PARTITION, format!("no topic {n:?}")),
                    Some(have) if have >= count => (
                        codes::INVALID_PARTITIONS,
                        format!("topic {n:?} has {have} partitions"),
                    ),
                    Some(_) => (codes::NONE, String::new()),
                }
            }
            Some(count) => match b.grow_topic(&n, count).await {
                Ok(None) => (codes::UNKNOWN_TOPIC_OR_PARTITION, format!("no topic {n:?}")),
                Ok(Some(Err(have))) => (
                    codes::INVALID_PARTITIONS,
                    format!("topic {n:?} has {have} partitions"),
                ),
                Ok(Some(Ok(()))) => (codes::NONE, String::new()),
                Err(e) => (create_error_code(&e), e.to_string()),
            },
        };
        let mut r = CreatePartitionsTopicResult::default();
        r.name = t.name;
        r.error_code = code;
        if code != codes::NONE {
            r.error_message = Some(StrBytes::from_string(msg));
        }
        resp.results.push(r);
    }
    ctx.ready(&resp)
}

pub async fn delete_topics(b: &Arc<Broker>, ctx: &Ctx, req: DeleteTopicsRequest) -> Reply {
    let mut resp = DeleteTopicsResponse::default();
    // v6 names each topic by name or by id.
    let asked: Vec<(Option<TopicName>, Uuid)> = if ctx.version >= 6 {
        req.topics
            .into_iter()
            .map(|t| (t.name, t.topic_id))
            .collect()
    } else {
        req.topic_names
            .into_iter()
            .map(|n| (Some(n), Uuid::nil()))
            .collect()
    };
    for (asked_name, asked_id) in asked {
        let mut r = DeletableTopicResult::default();
        r.topic_id = asked_id;
        let t = match asked_name {
            Some(n) => Some(n),
            None => b.topics().name_of(&asked_id).map(name),
        };
        let Some(t) = t else {
            r.error_code = codes::UNKNOWN_TOPIC_ID; // v6 only: only it names topics by id
            r.error_message = Some(StrBytes::from_string(format!(
                "no topic with id {asked_id}"
            )));
            resp.responses.push(r);
            continue;
        };
        if ctx.version >= 6 {
            r.topic_id = b.topics().id(t.as_str()).unwrap_or(asked_id);
        }
        r.name = Some(t.clone());
        let (code, msg) = if !check::topic(b, ctx, Operation::Delete, t.as_str()) {
            (
                codes::TOPIC_AUTHORIZATION_FAILED,
                Some(format!("not allowed to delete topic {:?}", t.as_str())),
            )
        } else {
            match b.delete_topic(t.as_str()).await {
                Ok(true) => (codes::NONE, None),
                Ok(false) => (
                    codes::UNKNOWN_TOPIC_OR_PARTITION,
                    Some(format!("no topic {:?}", t.as_str())),
                ),
                Err(e) => {
                    tracing::warn!(topic = t.as_str(), error = %e, "deleting a topic failed");
                    (codes::KAFKA_STORAGE_ERROR, Some(e.to_string()))
                }
            }
        };
        r.error_code = code;
        if ctx.version >= 5 {
            r.error_message = msg.map(StrBytes::from_string);
        }
        resp.responses.push(r);
    }
    ctx.ready(&resp)
}

pub fn find_coordinator(b: &Arc<Broker>, ctx: &Ctx, req: FindCoordinatorRequest) -> Reply {
    let mut resp = FindCoordinatorResponse::default();
    if ctx.version >= 4 {
        // Batched (KIP-699): one answer per key.
        resp.coordinators = req
            .coordinator_keys
            .into_iter()
            .map(|key| {
                let (code, message, node, host, port) = coordinator(b, ctx, req.key_type, &key);
                let mut c = Coordinator::default();
                c.key = key;
                c.error_code = code;
                c.error_message = message;
                c.node_id = node;
                c.host = host;
                c.port = port;
                c
            })
            .collect();
    } else {
        let (code, message, node, host, port) = coordinator(b, ctx, req.key_type, &req.key);
        resp.error_code = code;
        if ctx.version >= 1 {
            resp.error_message = message;
        }
        resp.node_id = node;
        resp.host = host;
        resp.port = port;
    }
    ctx.ready(&resp)
}

/// FindCoordinator's key types (Kafka's `CoordinatorType`): groups, transactions and (v6+,
/// KIP-932) share groups.
const KEY_GROUP: i8 = 0;
const KEY_TRANSACTION: i8 = 1;
const KEY_SHARE: i8 = 2;

/// The coordinator of a key of `key_type`: this broker for groups the principal may describe;
/// none for transactions, and INVALID_REQUEST for any other type (share groups among them),
/// which is Kafka's answer to a key type it does not serve: a client gives up at once rather
/// than retrying as it would COORDINATOR_NOT_AVAILABLE.
fn coordinator(
    b: &Broker,
    ctx: &Ctx,
    key_type: i8,
    key: &StrBytes,
) -> (i16, Option<StrBytes>, BrokerId, StrBytes, i32) {
    let refused = |code, why: Option<StrBytes>| (code, why, BrokerId(-1), StrBytes::default(), -1);
    match key_type {
        KEY_GROUP if !check::group(b, ctx, Operation::Describe, key.as_str()) => {
            refused(codes::GROUP_AUTHORIZATION_FAILED, None)
        }
        // The group lives on the node asked (a cluster does not replicate groups yet).
        KEY_GROUP => {
            let place = crate::placement::of(b);
            let (host, port) = place
                .me()
                .map_or((b.cfg.advertise_host.clone(), b.cfg.advertise_port), |a| {
                    (a.host.clone(), a.port)
                });
            (
                codes::NONE,
                None,
                BrokerId(place.node_id),
                StrBytes::from_string(host),
                port,
            )
        }
        // A transaction coordinator: refused for good, not "not available yet".
        KEY_TRANSACTION => refused(
            codes::TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            Some(StrBytes::from_static_str(NO_TRANSACTIONS)),
        ),
        KEY_SHARE => refused(
            codes::INVALID_REQUEST,
            Some(StrBytes::from_static_str(
                "nvmq does not serve share groups (KIP-932): key type 2 has no coordinator",
            )),
        ),
        other => refused(
            codes::INVALID_REQUEST,
            Some(StrBytes::from_string(format!(
                "unknown coordinator key type {other}: nvmq serves groups (0) only"
            ))),
        ),
    }
}

pub fn init_producer_id(b: &Arc<Broker>, ctx: &Ctx, req: InitProducerIdRequest) -> Reply {
    let b = b.clone();
    let ctx = ctx.clone();
    Box::pin(async move {
        let mut resp = InitProducerIdResponse::default();
        resp.producer_id = kafka_protocol::messages::ProducerId(-1);
        resp.producer_epoch = -1;
        // v3+ may name the producer (id and epoch, both or neither) to bump its epoch. As in
        // Kafka, a producer without a transactional id gets a new id instead.
        let named = (req.producer_id.0 != -1, req.producer_epoch != -1);
        if req.transactional_id.as_ref().is_some_and(|t| !t.is_empty()) {
            tracing::debug!("{NO_TRANSACTIONS}");
            resp.error_code = codes::TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
        } else if named.0 != named.1 {
            resp.error_code = codes::INVALID_REQUEST;
        } else if !check::idempotent_producer(&b, &ctx) {
            resp.error_code = codes::CLUSTER_AUTHORIZATION_FAILED;
        } else {
            match b.new_producer_id().await {
                Ok(id) => {
                    resp.producer_id = kafka_protocol::messages::ProducerId(id);
                    resp.producer_epoch = 0;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "handing out a producer id failed");
                    resp.error_code = codes::KAFKA_STORAGE_ERROR;
                }
            }
        }
        ctx.encode(&resp)
    })
}
