//! The topic configs nvmq knows: which it honours, which it takes as no-ops (they change nothing
//! on one broker over a shared ring), and the checks a value must pass. Anything else is refused
//! with INVALID_CONFIG, never stored and ignored (docs/kafka-compatibility.md lists each).

use std::collections::BTreeMap;

/// Kafka's config types (DescribeConfigs v3+ `config_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Boolean = 1,
    String = 2,
    Int = 3,
    Long = 5,
    List = 7,
}

/// What nvmq does with a config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    Honoured,
    /// Accepted and stored; nothing behaves differently (the docs say why for each).
    NoOp,
}

/// One known topic config.
#[derive(Debug, Clone, Copy)]
pub struct Known {
    pub name: &'static str,
    pub kind: Kind,
    pub effect: Effect,
    /// The default nvmq applies (as Kafka spells it); `max.message.bytes` takes the log's.
    pub default: &'static str,
    pub doc: &'static str,
}

const fn known(
    name: &'static str,
    kind: Kind,
    effect: Effect,
    default: &'static str,
    doc: &'static str,
) -> Known {
    Known {
        name,
        kind,
        effect,
        default,
        doc,
    }
}

pub const CLEANUP_POLICY: &str = "cleanup.policy";
pub const RETENTION_MS: &str = "retention.ms";
pub const RETENTION_BYTES: &str = "retention.bytes";
pub const MAX_MESSAGE_BYTES: &str = "max.message.bytes";

use Effect::{Honoured, NoOp};

/// Every topic config nvmq takes, in the order DescribeConfigs lists them.
pub const KNOWN: &[Known] = &[
    known(CLEANUP_POLICY, Kind::List, Honoured, "delete",
        "Only delete: old records become unreadable by retention or DeleteRecords. compact is refused (nvmq does not compact)."),
    known(RETENTION_MS, Kind::Long, Honoured, "-1",
        "Records older than this (by timestamp) become unreadable: the partition's log start offset moves past them. -1: kept until the device's ring overwrites them."),
    known(RETENTION_BYTES, Kind::Long, Honoured, "-1",
        "Per partition: the oldest log batches become unreadable while at least this many bytes remain. -1: no limit but the ring's."),
    known(MAX_MESSAGE_BYTES, Kind::Int, Honoured, "",
        "Largest record batch a Produce may carry for this topic (MESSAGE_TOO_LARGE past it); at most the log's largest record."),
    known("min.insync.replicas", Kind::Int, NoOp, "1",
        "One broker holds the one replica: only 1 is accepted (a larger value could never be met)."),
    known("segment.bytes", Kind::Int, NoOp, "1073741824",
        "nvmq has no segments (one ring per device); accepted and stored, changes nothing."),
    known("segment.ms", Kind::Long, NoOp, "604800000",
        "nvmq has no segments (one ring per device); accepted and stored, changes nothing."),
    known("message.timestamp.type", Kind::String, NoOp, "CreateTime",
        "Only CreateTime (the producer's timestamps are kept, as nvmq always does); LogAppendTime is refused."),
    known("compression.type", Kind::String, NoOp, "producer",
        "Only producer (batches are stored as produced); a broker-side codec is refused."),
    known("unclean.leader.election.enable", Kind::Boolean, NoOp, "false",
        "One broker, one replica: there is no other leader to elect."),
    known("flush.messages", Kind::Long, NoOp, "9223372036854775807",
        "nvmq acknowledges only after the flush covering a record (the serve --flush mode decides); accepted, changes nothing."),
    known("flush.ms", Kind::Long, NoOp, "9223372036854775807",
        "nvmq acknowledges only after the flush covering a record (the serve --flush mode decides); accepted, changes nothing."),
];

pub fn lookup(name: &str) -> Option<&'static Known> {
    KNOWN.iter().find(|k| k.name == name)
}

/// Why a config was refused: INVALID_CONFIG with this message.
pub type Refused = String;

fn number(name: &str, value: &str, min: i64, max: i64) -> Result<i64, Refused> {
    let n: i64 = value
        .trim()
        .parse()
        .map_err(|_| format!("{name}={value:?}: not a whole number"))?;
    if n < min || n > max {
        return Err(format!("{name}={n}: must be between {min} and {max}"));
    }
    Ok(n)
}

/// Checks one value (`max_batch`: the largest record batch the logs take).
pub fn validate(name: &str, value: &str, max_batch: usize) -> Result<(), Refused> {
    let Some(k) = lookup(name) else {
        return Err(format!(
            "unknown topic config {name:?}: nvmq takes {}",
            KNOWN.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
        ));
    };
    let one_of = |allowed: &[&str], why: &str| {
        if allowed.contains(&value.trim()) {
            Ok(())
        } else {
            Err(format!("{name}={value:?}: {why}"))
        }
    };
    match name {
        CLEANUP_POLICY => {
            for p in value.split(',').map(str::trim) {
                match p {
                    "delete" => {}
                    "compact" => {
                        return Err(format!(
                        "{name}={value:?}: nvmq does not compact topics (only delete is supported)"
                    ))
                    }
                    other => return Err(format!("{name}: unknown policy {other:?}")),
                }
            }
            Ok(())
        }
        RETENTION_MS | RETENTION_BYTES => number(name, value, -1, i64::MAX).map(drop),
        MAX_MESSAGE_BYTES => {
            let max = i64::try_from(max_batch).unwrap_or(i64::MAX);
            number(name, value, 0, max).map(drop)
        }
        "min.insync.replicas" => {
            number(name, value, 1, 1).map_err(|e| format!("{e}: one broker holds one replica"))?;
            Ok(())
        }
        "message.timestamp.type" => one_of(
            &["CreateTime"],
            "only CreateTime (nvmq keeps the producer's timestamps)",
        ),
        "compression.type" => one_of(
            &["producer"],
            "only producer (nvmq stores batches as produced, it does not recompress)",
        ),
        _ => match k.kind {
            Kind::Boolean => one_of(&["true", "false"], "expected true or false"),
            Kind::Int => number(name, value, 0, i64::from(i32::MAX)).map(drop),
            Kind::Long => number(name, value, 0, i64::MAX).map(drop),
            Kind::String | Kind::List => Ok(()),
        },
    }
}

/// A topic's configs: the ones set (each validated), by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicConfigs {
    pub set: BTreeMap<String, String>,
}

impl TopicConfigs {
    fn long(&self, name: &str) -> Option<i64> {
        self.set.get(name).and_then(|v| v.trim().parse().ok())
    }

    /// retention.ms when set to a limit (not -1).
    pub fn retention_ms(&self) -> Option<i64> {
        self.long(RETENTION_MS).filter(|&v| v >= 0)
    }

    /// retention.bytes when set to a limit (not -1).
    pub fn retention_bytes(&self) -> Option<u64> {
        self.long(RETENTION_BYTES)
            .and_then(|v| u64::try_from(v).ok())
    }

    /// max.message.bytes when set.
    pub fn max_message_bytes(&self) -> Option<usize> {
        self.long(MAX_MESSAGE_BYTES)
            .and_then(|v| usize::try_from(v).ok())
    }

    /// Every set config validated; the first refusal.
    pub fn validate(&self, max_batch: usize) -> Result<(), Refused> {
        self.set
            .iter()
            .try_for_each(|(n, v)| validate(n, v, max_batch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn honoured_and_no_op_configs_pass_and_the_rest_is_refused_with_a_reason() {
        let max = 1 << 20;
        for (n, v) in [
            (CLEANUP_POLICY, "delete"),
            (RETENTION_MS, "-1"),
            (RETENTION_MS, "60000"),
            (RETENTION_BYTES, "1048576"),
            (MAX_MESSAGE_BYTES, "1048576"),
            ("min.insync.replicas", "1"),
            ("segment.bytes", "104857600"),
            ("message.timestamp.type", "CreateTime"),
            ("compression.type", "producer"),
            ("unclean.leader.election.enable", "false"),
        ] {
            assert_eq!(validate(n, v, max), Ok(()), "{n}={v}");
        }
        for (n, v, says) in [
            (CLEANUP_POLICY, "compact", "does not compact"),
            (CLEANUP_POLICY, "delete,compact", "does not compact"),
            (CLEANUP_POLICY, "shred", "unknown policy"),
            (RETENTION_MS, "-2", "between"),
            (RETENTION_BYTES, "lots", "not a whole number"),
            (MAX_MESSAGE_BYTES, "2097152", "between"),
            (MAX_MESSAGE_BYTES, "-1", "between"),
            ("min.insync.replicas", "2", "one replica"),
            ("message.timestamp.type", "LogAppendTime", "CreateTime"),
            ("compression.type", "zstd", "producer"),
            ("unclean.leader.election.enable", "maybe", "true or false"),
            ("segment.bytes", "-5", "between"),
            ("no.such.config", "1", "unknown topic config"),
        ] {
            let e = validate(n, v, max).expect_err(n);
            assert!(e.contains(says), "{n}={v}: {e}");
        }
    }

    #[test]
    fn limits_read_from_the_set_configs() {
        let mut c = TopicConfigs::default();
        assert_eq!((c.retention_ms(), c.retention_bytes()), (None, None));
        c.set.insert(RETENTION_MS.into(), "-1".into());
        c.set.insert(RETENTION_BYTES.into(), "4096".into());
        c.set.insert(MAX_MESSAGE_BYTES.into(), "1000".into());
        assert_eq!(c.retention_ms(), None);
        assert_eq!(c.retention_bytes(), Some(4096));
        assert_eq!(c.max_message_bytes(), Some(1000));
    }
}
