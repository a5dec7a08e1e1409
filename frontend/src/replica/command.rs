//! What a node writes through the cluster's Raft group, and what applying it answers. Encoded
//! with postcard (the transport's format); an entry that does not decode is a fault of the node
//! that reads it, never a panic.

use serde::{Deserialize, Serialize};

/// A replicated change to the brokers' state, applied in the group's order on every node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// One record batch of a partition, checked on the leader before it was written; `span`
    /// is the offsets it takes.
    Produce {
        topic: String,
        partition: u32,
        span: u32,
        #[serde(with = "serde_bytes")]
        batch: Vec<u8>,
    },
    /// A new topic and its configs (name → value, validated on the leader).
    CreateTopic {
        name: String,
        partitions: u32,
        configs: Vec<(String, String)>,
    },
    /// Every voter's log held the entries up to `upto` when the leader wrote this: each node may
    /// purge them once a snapshot of its own covers them (`compact`), and no voter, whichever
    /// leads later, will need them again.
    Compact { upto: u64 },
    /// Commands written as one entry (`propose`: those that arrived while earlier entries were
    /// in flight), applied in order as if each were an entry of its own. Never nested.
    Many(Vec<Command>),
}

/// What applying a command answered (to the node that wrote it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answer {
    /// The batch's first offset.
    Produced { base: u64 },
    /// Whether the topic was created (false: it existed already).
    Created { created: bool },
    /// A Kafka error code and why: the command applied to nothing, on every node alike.
    Refused { code: i16, why: String },
    /// Taken note of (a `Compact`).
    Noted,
    /// A `Many`'s answers, one per command, in order.
    Many(Vec<Answer>),
}

#[derive(Debug, thiserror::Error)]
#[error("{what} of {len} bytes does not decode: {why}")]
pub struct DecodeError {
    what: &'static str,
    len: usize,
    why: String,
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    encode_into(v, Vec::new())
}

/// `encode` into `out` (sized by the caller, so that a batch is not copied again as the
/// buffer grows).
fn encode_into<T: Serialize>(v: &T, out: Vec<u8>) -> Vec<u8> {
    // postcard fails only for types it cannot represent (none here) or a full buffer (a Vec
    // grows); an empty entry would then fail to decode loudly on every node.
    postcard::to_extend(v, out).unwrap_or_default()
}

fn decode<'a, T: Deserialize<'a>>(what: &'static str, bytes: &'a [u8]) -> Result<T, DecodeError> {
    match postcard::take_from_bytes::<T>(bytes) {
        Ok((v, [])) => Ok(v),
        Ok((_, rest)) => Err(DecodeError {
            what,
            len: bytes.len(),
            why: format!("{} bytes after its end", rest.len()),
        }),
        Err(e) => Err(DecodeError {
            what,
            len: bytes.len(),
            why: e.to_string(),
        }),
    }
}

/// `Command::Produce` as borrowed parts: serialized to the same bytes (the same variant
/// index, fields in the same order), so the leader need not copy a batch before encoding it.
#[derive(Serialize)]
enum ProduceRef<'a> {
    Produce {
        topic: &'a str,
        partition: u32,
        span: u32,
        #[serde(with = "serde_bytes")]
        batch: &'a [u8],
    },
}

/// The bytes of `Command::Produce { topic, partition, span, batch }`.
pub fn encode_produce(topic: &str, partition: u32, span: u32, batch: &[u8]) -> Vec<u8> {
    // As varints: the variant and two u32s at most 5 bytes each, two lengths at most 10.
    let size = topic.len() + batch.len() + 35;
    encode_into(
        &ProduceRef::Produce {
            topic,
            partition,
            span,
            batch,
        },
        Vec::with_capacity(size),
    )
}

/// Postcard's variant index of `Command::Many`.
const MANY: u32 = 3;

/// The bytes of `Command::Many` of commands already encoded: a variant index and a sequence's
/// length are varints in postcard, as the same two integers in a tuple are, and the sequence's
/// elements follow as their own bytes, so the commands are not decoded to be written as one.
pub fn encode_many<B: AsRef<[u8]>>(commands: &[B]) -> Vec<u8> {
    let len = commands.iter().map(|c| c.as_ref().len()).sum::<usize>();
    let mut out = encode_into(&(MANY, commands.len()), Vec::with_capacity(len + 16));
    for c in commands {
        out.extend_from_slice(c.as_ref());
    }
    out
}

impl Command {
    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }

    pub fn decode(bytes: &[u8]) -> Result<Command, DecodeError> {
        decode("a replicated command", bytes)
    }
}

impl Answer {
    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }

    pub fn decode(bytes: &[u8]) -> Result<Answer, DecodeError> {
        decode("an applied command's answer", bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_and_answers_round_trip_and_bad_bytes_are_named() {
        let c = Command::Produce {
            topic: "t".into(),
            partition: 3,
            span: 2,
            batch: vec![1, 2, 3],
        };
        assert_eq!(Command::decode(&c.encode()).expect("decode"), c);
        assert_eq!(encode_produce("t", 3, 2, &[1, 2, 3]), c.encode());
        let a = Answer::Refused {
            code: 3,
            why: "no such partition".into(),
        };
        assert_eq!(Answer::decode(&a.encode()).expect("decode"), a);
        let k = Command::Compact { upto: 1 << 40 };
        assert_eq!(Command::decode(&k.encode()).expect("decode"), k);
        let mut long = c.encode();
        long.push(0);
        let e = Command::decode(&long).expect_err("a byte after the end");
        assert!(e.to_string().contains("1 bytes after its end"), "{e}");
        let many = Command::Many(vec![c.clone(), k.clone()]);
        assert_eq!(encode_many(&[c.encode(), k.encode()]), many.encode());
        assert_eq!(Command::decode(&many.encode()).expect("decode"), many);
        // 200 commands: the count takes two bytes.
        let lots = Command::Many(vec![k.clone(); 200]);
        assert_eq!(encode_many(&vec![k.encode(); 200]), lots.encode());
        let answers = Answer::Many(vec![Answer::Produced { base: 7 }, Answer::Noted]);
        assert_eq!(Answer::decode(&answers.encode()).expect("decode"), answers);
        let e = Command::decode(&[9, 9]).expect_err("an unknown variant");
        assert!(
            e.to_string().contains("a replicated command of 2 bytes"),
            "{e}"
        );
    }
}
