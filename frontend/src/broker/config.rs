//! The broker's configuration: how it presents itself, its limits, and its security settings.

use std::time::Duration;

/// How the broker presents itself and what it allows.
#[derive(Debug, Clone)]
pub struct Config {
    /// Host and port written into Metadata and FindCoordinator answers: clients reconnect there.
    pub advertise_host: String,
    pub advertise_port: i32,
    /// Create unknown topics named in Metadata requests (when the client allows it).
    pub auto_create_topics: bool,
    /// Partitions of an auto-created topic, or of CreateTopics asking for the default.
    pub default_partitions: u32,
    /// Largest request frame read; a larger one closes the connection.
    pub max_frame: usize,
    /// Requests one connection may have decoded but not yet answered.
    pub max_in_flight_per_connection: usize,
    /// A connection with nothing in flight that sends nothing for this long is closed (Kafka's
    /// connections.max.idle.ms); it also bounds a client that stops halfway through a frame.
    pub idle_timeout: std::time::Duration,
    /// Bytes one connection may hold: requests read and not yet answered plus answers not yet
    /// sent. Past it the connection reads nothing more until its client takes its answers (a
    /// connection holding nothing may always start one request, so a frame up to `max_frame`
    /// still goes through).
    pub max_connection_bytes: usize,
    /// The same bytes over all connections (Kafka's queued.max.request.bytes): past it only a
    /// connection holding nothing starts a request (one that does not read cannot stall the
    /// others), past twice it none, until some are answered and sent.
    pub max_queued_bytes: usize,
    /// Largest Fetch answer, whatever the request's max_bytes (Kafka's broker fetch.max.bytes).
    pub fetch_max_bytes: usize,
    /// Connections open at once, in total and from one client address; one more is closed at
    /// once (Kafka's max.connections and max.connections.per.ip).
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
    /// A connection whose answers have waited this long for its client to read them is closed.
    pub write_timeout: std::time::Duration,
    /// An idempotent producer not seen for this long is forgotten (Kafka's
    /// producer.id.expiration.ms); a later batch of it is taken as from a new producer.
    pub producer_id_expiration: Duration,
    /// A group with no members that commits nothing for this long is deleted with its offsets
    /// (Kafka's offsets.retention.minutes).
    pub offsets_retention: Duration,
    /// How long a consumer group that was empty waits for more members before its first
    /// rebalance completes (Kafka's group.initial.rebalance.delay.ms; Kafka defaults to 3 s).
    pub group_initial_rebalance_delay: Duration,
    /// Benchmark ceiling: Produce is decoded and its batches checked as always, then answered at
    /// once without touching the log (nothing is stored). What the request/response path alone
    /// allows on this machine; never for real use.
    pub ceiling: bool,
    /// Largest number of bytes the records of one compressed batch may decompress to (they are
    /// decompressed to be checked); a batch yielding more is refused with MESSAGE_TOO_LARGE.
    pub max_uncompressed_batch: usize,
    /// Check every request against the ACLs (`acl`); off, everything is allowed and the ACL
    /// APIs answer SECURITY_DISABLED.
    pub authorizer: bool,
    /// Principals the authorizer lets do anything.
    pub super_users: Vec<crate::session::Principal>,
    /// SASL: the mechanisms offered (none: no authentication) and the session lifetime.
    pub sasl: crate::sasl::SaslConfig,
    /// What each device is called (its spec) in DescribeLogDirs; "device-<i>" when missing.
    pub log_dirs: Vec<String>,
    /// Settings of the process around the broker (serve's flags) that DescribeConfigs lists
    /// for the broker, read-only: (name, value, whether it is the default).
    pub settings: Vec<(String, String, bool)>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            advertise_host: "127.0.0.1".into(),
            advertise_port: 9092,
            auto_create_topics: true,
            default_partitions: 1,
            max_frame: 64 << 20,
            max_in_flight_per_connection: 1024,
            idle_timeout: Duration::from_secs(600),
            max_connection_bytes: 64 << 20,
            max_queued_bytes: 256 << 20,
            fetch_max_bytes: 32 << 20,
            max_connections: 16_384,
            max_connections_per_ip: 4_096,
            write_timeout: Duration::from_secs(60),
            producer_id_expiration: crate::producers::DEFAULT_EXPIRATION,
            offsets_retention: Duration::from_secs(7 * 24 * 3600),
            group_initial_rebalance_delay: Duration::ZERO,
            ceiling: false,
            max_uncompressed_batch: crate::records::DEFAULT_MAX_UNCOMPRESSED,
            authorizer: false,
            super_users: Vec::new(),
            sasl: crate::sasl::SaslConfig::default(),
            log_dirs: Vec::new(),
            settings: Vec::new(),
        }
    }
}
