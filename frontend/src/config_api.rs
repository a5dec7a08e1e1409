//! DescribeConfigs, AlterConfigs and IncrementalAlterConfigs, for topics and the broker. Topic
//! configs are checked by `topic_config` and stored durably (`Broker::set_topic_configs`);
//! broker configs are the serve settings, read-only (`broker_config`).

use std::sync::Arc;

use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::{
    alter_configs_response, incremental_alter_configs_response, AlterConfigsRequest,
    AlterConfigsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};
use kafka_protocol::protocol::StrBytes;

use crate::acl::{check, Operation};
use crate::broker::Broker;
use crate::broker_config::{self, Setting};
use crate::codes;
use crate::conn::{Ctx, Reply};
use crate::topic_config::{self, TopicConfigs, KNOWN};

pub const INVALID_CONFIG: i16 = 40;

/// Kafka's resource types and config sources.
const TOPIC: i8 = 2;
const BROKER: i8 = 4;
const TOPIC_CONFIG: i8 = 1;
const STATIC_BROKER_CONFIG: i8 = 4;
const DEFAULT_CONFIG: i8 = 5;

/// A refusal: (error code, message).
type Failure = (i16, String);

/// Whether the principal may do `op` (DescribeConfigs or AlterConfigs) on the resource: a topic's
/// configs are the topic's, the broker's the cluster's (Kafka's checks).
fn may(b: &Broker, ctx: &Ctx, op: Operation, resource_type: i8, name: &str) -> Result<(), Failure> {
    let (allowed, code) = match resource_type {
        TOPIC => (
            check::topic(b, ctx, op, name),
            codes::TOPIC_AUTHORIZATION_FAILED,
        ),
        BROKER => (
            check::cluster(b, ctx, op),
            codes::CLUSTER_AUTHORIZATION_FAILED,
        ),
        _ => (true, codes::NONE),
    };
    if allowed {
        Ok(())
    } else {
        Err((
            code,
            format!("{} may not {op:?} {name:?}", ctx.session.principal()),
        ))
    }
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// The broker resource is named by its node id ("0"), or "" for the cluster-wide defaults.
fn is_this_broker(name: &str) -> bool {
    name.is_empty() || name == crate::admin::NODE_ID.to_string()
}

struct Entry {
    name: String,
    value: String,
    source: i8,
    read_only: bool,
    kind: topic_config::Kind,
    doc: &'static str,
    /// (name, value, source), most specific first.
    synonyms: Vec<(String, String, i8)>,
}

fn topic_entries(b: &Broker, set: &TopicConfigs) -> Vec<Entry> {
    KNOWN
        .iter()
        .map(|k| {
            let default = if k.name == topic_config::MAX_MESSAGE_BYTES {
                b.max_batch().to_string()
            } else {
                k.default.to_string()
            };
            let broker_name = broker_config::topic_default_name(k.name).unwrap_or(k.name);
            let mut synonyms = Vec::new();
            let own = set.set.get(k.name);
            if let Some(v) = own {
                synonyms.push((k.name.to_string(), v.clone(), TOPIC_CONFIG));
            }
            synonyms.push((broker_name.to_string(), default.clone(), DEFAULT_CONFIG));
            Entry {
                name: k.name.to_string(),
                value: own.cloned().unwrap_or(default),
                source: if own.is_some() {
                    TOPIC_CONFIG
                } else {
                    DEFAULT_CONFIG
                },
                read_only: false,
                kind: k.kind,
                doc: k.doc,
                synonyms,
            }
        })
        .collect()
}

fn broker_entries(b: &Broker) -> Vec<Entry> {
    broker_config::settings(b)
        .into_iter()
        .map(|st: Setting| {
            let source = if st.is_default {
                DEFAULT_CONFIG
            } else {
                STATIC_BROKER_CONFIG
            };
            Entry {
                synonyms: vec![(st.name.clone(), st.value.clone(), source)],
                name: st.name,
                value: st.value,
                source,
                read_only: true,
                kind: st.kind,
                doc: st.doc,
            }
        })
        .collect()
}

pub fn describe(b: &Arc<Broker>, ctx: &Ctx, req: DescribeConfigsRequest) -> Reply {
    let mut resp = DescribeConfigsResponse::default();
    for r in req.resources {
        let name = r.resource_name.as_str().to_string();
        let mut out = DescribeConfigsResult::default();
        out.resource_type = r.resource_type;
        out.resource_name = r.resource_name.clone();
        let allowed = may(b, ctx, Operation::DescribeConfigs, r.resource_type, &name);
        let entries = match r.resource_type {
            _ if allowed.is_err() => allowed.map(|()| Vec::new()),
            TOPIC if b.topics().map.contains_key(&name) => {
                Ok(topic_entries(b, &b.topic_configs(&name)))
            }
            TOPIC => Err((
                codes::UNKNOWN_TOPIC_OR_PARTITION,
                format!("no topic {name:?}"),
            )),
            BROKER if is_this_broker(&name) => Ok(broker_entries(b)),
            BROKER => Err((
                codes::INVALID_REQUEST,
                format!("no broker {name:?}: this is broker 0, the only one"),
            )),
            t => Err(unsupported_resource(t)),
        };
        match entries {
            Ok(entries) => {
                let wanted = r.configuration_keys.as_ref();
                out.configs = entries
                    .into_iter()
                    .filter(|e| wanted.is_none_or(|w| w.iter().any(|k| k.as_str() == e.name)))
                    .map(|e| {
                        result(
                            e,
                            ctx.version,
                            req.include_synonyms,
                            req.include_documentation,
                        )
                    })
                    .collect();
            }
            Err((code, msg)) => {
                out.error_code = code;
                out.error_message = Some(s(&msg));
            }
        }
        resp.results.push(out);
    }
    ctx.ready(&resp)
}

/// One config as DescribeConfigs `version` answers it (type and documentation from v3).
fn result(e: Entry, version: i16, synonyms: bool, docs: bool) -> DescribeConfigsResourceResult {
    let mut c = DescribeConfigsResourceResult::default();
    c.name = s(&e.name);
    c.value = Some(s(&e.value));
    c.read_only = e.read_only;
    c.config_source = e.source;
    c.is_sensitive = false;
    if version >= 3 {
        c.config_type = e.kind as i8;
    }
    c.documentation = (version >= 3 && docs).then(|| s(e.doc));
    if synonyms {
        c.synonyms = e
            .synonyms
            .into_iter()
            .map(|(n, v, source)| {
                let mut y = DescribeConfigsSynonym::default();
                y.name = s(&n);
                y.value = Some(s(&v));
                y.source = source;
                y
            })
            .collect();
    }
    c
}

fn unsupported_resource(t: i8) -> Failure {
    (
        codes::INVALID_REQUEST,
        format!("resource type {t}: nvmq has configs for topics (2) and the broker (4)"),
    )
}

/// A change to one resource: the topic's new config set, or why it cannot be made.
fn change(
    b: &Broker,
    ctx: &Ctx,
    resource_type: i8,
    name: &str,
    apply: impl FnOnce(&mut TopicConfigs) -> Result<(), String>,
) -> Result<TopicConfigs, Failure> {
    may(b, ctx, Operation::AlterConfigs, resource_type, name)?;
    match resource_type {
        TOPIC => {}
        BROKER => {
            return Err((
                codes::INVALID_REQUEST,
                "broker configs are read-only in nvmq: they are the serve flags (or its TOML file) and change with a restart".into(),
            ))
        }
        t => return Err(unsupported_resource(t)),
    }
    if !b.topics().map.contains_key(name) {
        return Err((
            codes::UNKNOWN_TOPIC_OR_PARTITION,
            format!("no topic {name:?}"),
        ));
    }
    let mut set = b.topic_configs(name);
    apply(&mut set).map_err(|m| (INVALID_CONFIG, m))?;
    set.validate(b.max_batch())
        .map_err(|m| (INVALID_CONFIG, m))?;
    Ok(set)
}

/// Stores a checked change unless only validating.
async fn commit(
    b: &Broker,
    name: &str,
    set: Result<TopicConfigs, Failure>,
    validate_only: bool,
) -> Result<(), Failure> {
    let set = set?;
    if validate_only {
        return Ok(());
    }
    match b.set_topic_configs(name, set).await {
        Ok(true) => Ok(()),
        Ok(false) => Err((
            codes::UNKNOWN_TOPIC_OR_PARTITION,
            format!("no topic {name:?}"),
        )),
        Err(e) => {
            tracing::warn!(topic = name, error = %e, "recording topic configs failed");
            Err((codes::KAFKA_STORAGE_ERROR, e.to_string()))
        }
    }
}

/// (code, message) as a response carries them.
fn outcome(r: Result<(), Failure>) -> (i16, Option<StrBytes>) {
    match r {
        Ok(()) => (codes::NONE, None),
        Err((code, m)) => (code, Some(s(&m))),
    }
}

/// AlterConfigs: the configs given replace the topic's whole set (those left out go back to
/// their defaults), as Kafka's legacy API does.
pub async fn alter(b: &Arc<Broker>, ctx: &Ctx, req: AlterConfigsRequest) -> Reply {
    let mut resp = AlterConfigsResponse::default();
    for r in req.resources {
        let name = r.resource_name.as_str().to_string();
        let set = change(b, ctx, r.resource_type, &name, |set| {
            set.set.clear();
            for c in &r.configs {
                let v = c.value.as_ref().map(|v| v.as_str().to_string());
                let v = v.ok_or_else(|| format!("{}: a null value", c.name.as_str()))?;
                set.set.insert(c.name.as_str().to_string(), v);
            }
            Ok(())
        });
        let (code, msg) = outcome(commit(b, &name, set, req.validate_only).await);
        let mut out = alter_configs_response::AlterConfigsResourceResponse::default();
        out.error_code = code;
        out.error_message = msg;
        out.resource_type = r.resource_type;
        out.resource_name = r.resource_name;
        resp.responses.push(out);
    }
    ctx.ready(&resp)
}

const SET: i8 = 0;
const DELETE: i8 = 1;
const APPEND: i8 = 2;
const SUBTRACT: i8 = 3;

/// One IncrementalAlterConfigs operation on a topic's set.
fn operate(set: &mut TopicConfigs, name: &str, op: i8, value: Option<&str>) -> Result<(), String> {
    let list_op = |set: &mut TopicConfigs, add: bool| {
        let known =
            topic_config::lookup(name).ok_or_else(|| format!("unknown topic config {name:?}"))?;
        if known.kind != topic_config::Kind::List {
            return Err(format!(
                "{name} is not a list: APPEND and SUBTRACT do not apply"
            ));
        }
        let current = set.set.get(name).map_or(known.default, |v| v.as_str());
        let mut items: Vec<String> = current
            .split(',')
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(String::from)
            .collect();
        for v in value.unwrap_or_default().split(',').map(str::trim) {
            if add && !items.iter().any(|i| i == v) {
                items.push(v.to_string());
            } else if !add {
                items.retain(|i| i != v);
            }
        }
        set.set.insert(name.to_string(), items.join(","));
        Ok(())
    };
    match op {
        SET => {
            let v = value.ok_or_else(|| format!("{name}: SET with a null value"))?;
            set.set.insert(name.to_string(), v.to_string());
            Ok(())
        }
        DELETE => {
            set.set.remove(name);
            Ok(())
        }
        APPEND => list_op(set, true),
        SUBTRACT => list_op(set, false),
        other => Err(format!("{name}: unknown operation {other}")),
    }
}

pub async fn incremental_alter(
    b: &Arc<Broker>,
    ctx: &Ctx,
    req: IncrementalAlterConfigsRequest,
) -> Reply {
    let mut resp = IncrementalAlterConfigsResponse::default();
    for r in req.resources {
        let name = r.resource_name.as_str().to_string();
        let set = change(b, ctx, r.resource_type, &name, |set| {
            r.configs.iter().try_for_each(|c| {
                let v = c.value.as_ref().map(|v| v.as_str());
                operate(set, c.name.as_str(), c.config_operation, v)
            })
        });
        let (code, msg) = outcome(commit(b, &name, set, req.validate_only).await);
        let mut out = incremental_alter_configs_response::AlterConfigsResourceResponse::default();
        out.error_code = code;
        out.error_message = msg;
        out.resource_type = r.resource_type;
        out.resource_name = r.resource_name;
        resp.responses.push(out);
    }
    ctx.ready(&resp)
}

/// CreateTopics' configs as a topic's set, checked as AlterConfigs checks them.
pub fn create_configs<'a>(
    b: &Broker,
    configs: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> Result<TopicConfigs, String> {
    let mut set = TopicConfigs::default();
    for (n, v) in configs {
        let v = v.ok_or_else(|| format!("{n}: a null value"))?;
        set.set.insert(n.to_string(), v.to_string());
    }
    set.validate(b.max_batch())?;
    Ok(set)
}
