//! The broker's configs as DescribeConfigs lists them: the effective settings (Kafka's names
//! where one means the same, the serve flags' own otherwise), all read-only: they are set by
//! `nvmq serve` flags or its TOML file and change with a restart.

use crate::broker::{Broker, Config};
use crate::topic_config::{self, Kind};

/// One broker config: its name, value, type, whether it is at its default, what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    pub name: String,
    pub value: String,
    pub kind: Kind,
    pub is_default: bool,
    pub doc: &'static str,
}

fn setting(name: &str, value: String, default: String, kind: Kind, doc: &'static str) -> Setting {
    Setting {
        name: name.to_string(),
        is_default: value == default,
        value,
        kind,
        doc,
    }
}

/// The broker-level default of a topic config (its synonym), as Kafka names it.
pub fn topic_default_name(topic_config: &str) -> Option<&'static str> {
    Some(match topic_config {
        topic_config::RETENTION_MS => "log.retention.ms",
        topic_config::RETENTION_BYTES => "log.retention.bytes",
        topic_config::CLEANUP_POLICY => "log.cleanup.policy",
        topic_config::MAX_MESSAGE_BYTES => "message.max.bytes",
        _ => return None,
    })
}

/// Every broker config, in a stable order.
pub fn settings(b: &Broker) -> Vec<Setting> {
    let c = &b.cfg;
    let d = Config::default();
    let ms = |v: std::time::Duration| v.as_millis().to_string();
    let listeners = |c: &Config| format!("PLAINTEXT://{}:{}", c.advertise_host, c.advertise_port);
    let max_batch = b.max_batch().to_string();
    let mut out = vec![
        setting("broker.id", "0".into(), "0".into(), Kind::Int, "The one node id nvmq answers as."),
        setting("advertised.listeners", listeners(c), listeners(&d), Kind::List,
            "Where clients are told to connect (serve --advertise)."),
        setting("auto.create.topics.enable", c.auto_create_topics.to_string(),
            d.auto_create_topics.to_string(), Kind::Boolean,
            "Metadata creates unknown topics (serve --no-auto-create turns it off)."),
        setting("num.partitions", c.default_partitions.to_string(), d.default_partitions.to_string(),
            Kind::Int, "Partitions of an auto-created topic (serve --default-partitions)."),
        setting("socket.request.max.bytes", c.max_frame.to_string(), d.max_frame.to_string(),
            Kind::Int, "Largest request frame (serve --max-frame)."),
        setting("connections.max.idle.ms", ms(c.idle_timeout), ms(d.idle_timeout), Kind::Long,
            "An idle connection is closed after this long."),
        setting("queued.max.request.bytes", c.max_queued_bytes.to_string(),
            d.max_queued_bytes.to_string(), Kind::Long,
            "Bytes of requests and answers held over all connections (serve --max-queued-bytes)."),
        setting("fetch.max.bytes", c.fetch_max_bytes.to_string(), d.fetch_max_bytes.to_string(),
            Kind::Int, "Largest Fetch answer (serve --fetch-max-bytes)."),
        setting("max.connections", c.max_connections.to_string(), d.max_connections.to_string(),
            Kind::Int, "Connections open at once (serve --max-connections)."),
        setting("max.connections.per.ip", c.max_connections_per_ip.to_string(),
            d.max_connections_per_ip.to_string(), Kind::Int,
            "Connections from one address (serve --max-connections-per-ip)."),
        setting("producer.id.expiration.ms", ms(c.producer_id_expiration),
            ms(d.producer_id_expiration), Kind::Long,
            "An idle idempotent producer is forgotten after this long (serve --producer-id-expiration)."),
        setting("group.initial.rebalance.delay.ms", ms(c.group_initial_rebalance_delay),
            ms(d.group_initial_rebalance_delay), Kind::Int,
            "A group that was empty waits this long for more members before its first rebalance completes (serve --group-initial-rebalance-delay)."),
        // The defaults of the topic configs (their synonyms).
        setting("message.max.bytes", max_batch.clone(), max_batch, Kind::Int,
            "Largest record batch: the log's largest record (set by the device's geometry)."),
        setting("log.retention.ms", "-1".into(), "-1".into(), Kind::Long,
            "Topics keep records until the ring overwrites them unless retention.ms is set."),
        setting("log.retention.bytes", "-1".into(), "-1".into(), Kind::Long,
            "Topics keep records until the ring overwrites them unless retention.bytes is set."),
        setting("log.cleanup.policy", "delete".into(), "delete".into(), Kind::List,
            "Only delete: nvmq does not compact."),
    ];
    out.extend(c.settings.iter().map(|(n, v, is_default)| Setting {
        name: n.clone(),
        value: v.clone(),
        kind: Kind::String,
        is_default: *is_default,
        doc: "An nvmq serve setting (see docs/config-reference.md).",
    }));
    out
}
