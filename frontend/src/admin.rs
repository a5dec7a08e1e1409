//! ApiVersions, Metadata, DescribeCluster, CreateTopics, CreatePartitions, DeleteTopics,
//! FindCoordinator, InitProducerId.

use std::sync::Arc;

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
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
/// DescribeCluster's cluster_authorized_operations when the client did not ask for them.
const OPERATIONS_NOT_REQUESTED: i32 = i32::MIN;
/// DescribeCluster's endpoint types: brokers (1); controllers (2) are not served apart.
const ENDPOINT_BROKERS: i8 = 1;
/// Partitions one CreateTopics may ask for per topic: each is created durably (a flush apiece).
const MAX_PARTITIONS: u32 = 1000;

fn versions_body(error: i16) -> ApiVersionsResponse {
    let mut r = ApiVersionsResponse::default();
    r.error_code = error;
    r.api_keys = TABLE
        .iter()
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

pub fn api_versions(ctx: &Ctx) -> Reply {
    ctx.ready(&versions_body(codes::NONE))
}

/// The answer to an ApiVersions version nvmq does not serve: UNSUPPORTED_VERSION in a v0 body.
pub fn api_versions_unsupported(ctx: &Ctx) -> Reply {
    ctx.ready(&versions_body(codes::UNSUPPORTED_VERSION))
}

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

pub async fn metadata(b: &Arc<Broker>, ctx: &Ctx, req: MetadataRequest) -> Reply {
    let requested: Option<Vec<String>> = match req.topics {
        // v0: an empty list means every topic.
        Some(t) if t.is_empty() && ctx.version == 0 => None,
        Some(t) => Some(
            t.into_iter()
                .filter_map(|t| t.name.map(|n| n.as_str().to_string()))
                .collect(),
        ),
        None => None,
    };
    let may_create = b.cfg.auto_create_topics && (ctx.version < 4 || req.allow_auto_topic_creation);
    let names: Vec<(String, i16)> = match requested {
        None => b
            .topics()
            .map
            .keys()
            .map(|n| (n.clone(), codes::NONE))
            .collect(),
        Some(list) => {
            let mut out = Vec::new();
            for n in list {
                let exists = b.topics().map.contains_key(&n);
                let code = if exists {
                    codes::NONE
                } else if !valid_topic_name(&n) {
                    codes::INVALID_TOPIC_EXCEPTION
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
                out.push((n, code));
            }
            out
        }
    };
    let mut resp = MetadataResponse::default();
    let mut broker = MetadataResponseBroker::default();
    broker.node_id = BrokerId(NODE_ID);
    broker.host = StrBytes::from_string(b.cfg.advertise_host.clone());
    broker.port = b.cfg.advertise_port;
    resp.brokers = vec![broker];
    if ctx.version >= 2 {
        resp.cluster_id = Some(StrBytes::from_static_str(CLUSTER_ID));
    }
    resp.controller_id = BrokerId(if ctx.version >= 1 { NODE_ID } else { -1 });
    let topics = b.topics();
    for (n, code) in names {
        let mut t = MetadataResponseTopic::default();
        t.name = Some(name(&n));
        t.error_code = code;
        if code == codes::NONE {
            let count = topics.map.get(&n).map_or(0, |p| p.len());
            for i in 0..count {
                let mut p = MetadataResponsePartition::default();
                p.partition_index = i as i32;
                p.leader_id = BrokerId(NODE_ID);
                p.leader_epoch = crate::epoch::LEADER_EPOCH;
                p.replica_nodes = vec![BrokerId(NODE_ID)];
                p.isr_nodes = vec![BrokerId(NODE_ID)];
                t.partitions.push(p);
            }
        }
        resp.topics.push(t);
    }
    ctx.ready(&resp)
}

/// This broker, the cluster (the id Metadata gives), and the controller: this node. Authorized
/// operations are reported as not requested (-2147483648) even when asked: nvmq has no ACLs
/// to report from, and "every operation" would be a claim it cannot back.
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
    resp.controller_id = BrokerId(NODE_ID);
    let mut broker = DescribeClusterBroker::default();
    broker.broker_id = BrokerId(NODE_ID);
    broker.host = StrBytes::from_string(b.cfg.advertise_host.clone());
    broker.port = b.cfg.advertise_port;
    resp.brokers = vec![broker];
    resp.cluster_authorized_operations = OPERATIONS_NOT_REQUESTED;
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
        let (code, msg) = if !valid_topic_name(&n) {
            (
                codes::INVALID_TOPIC_EXCEPTION,
                format!("topic name {n:?} is not valid"),
            )
        } else if !t.assignments.is_empty() || !matches!(t.replication_factor, -1 | 1) {
            (
                codes::INVALID_REPLICATION_FACTOR,
                "a single broker holds one replica of each partition".to_string(),
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
        } else if req.validate_only {
            match b.create_room(&n, partitions.unwrap_or(1)) {
                Ok(()) => (codes::NONE, String::new()),
                Err(e) => (create_error_code(&e), e.to_string()),
            }
        } else {
            match b.create_topic(&n, partitions.unwrap_or(1)).await {
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
        let (code, msg) = match u32::try_from(t.count)
            .ok()
            .filter(|&c| c > 0 && c <= MAX_PARTITIONS)
        {
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
    for t in req.topic_names {
        let mut r = DeletableTopicResult::default();
        r.name = Some(t.clone());
        r.error_code = match b.delete_topic(t.as_str()).await {
            Ok(true) => codes::NONE,
            Ok(false) => codes::UNKNOWN_TOPIC_OR_PARTITION,
            Err(e) => {
                tracing::warn!(topic = t.as_str(), error = %e, "deleting a topic failed");
                codes::KAFKA_STORAGE_ERROR
            }
        };
        resp.responses.push(r);
    }
    ctx.ready(&resp)
}

pub fn find_coordinator(b: &Arc<Broker>, ctx: &Ctx, req: FindCoordinatorRequest) -> Reply {
    let mut resp = FindCoordinatorResponse::default();
    if req.key_type != 0 {
        // A transaction coordinator (key type 1): refused for good, not "not available yet".
        resp.error_code = codes::TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
        resp.node_id = BrokerId(-1);
        resp.port = -1;
        if ctx.version >= 1 {
            resp.error_message = Some(StrBytes::from_static_str(NO_TRANSACTIONS));
        }
    } else {
        resp.node_id = BrokerId(NODE_ID);
        resp.host = StrBytes::from_string(b.cfg.advertise_host.clone());
        resp.port = b.cfg.advertise_port;
    }
    ctx.ready(&resp)
}

pub fn init_producer_id(b: &Arc<Broker>, ctx: &Ctx, req: InitProducerIdRequest) -> Reply {
    let b = b.clone();
    let ctx = ctx.clone();
    Box::pin(async move {
        let mut resp = InitProducerIdResponse::default();
        resp.producer_id = kafka_protocol::messages::ProducerId(-1);
        resp.producer_epoch = -1;
        if req.transactional_id.as_ref().is_some_and(|t| !t.is_empty()) {
            tracing::debug!("{NO_TRANSACTIONS}");
            resp.error_code = codes::TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
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
