//! Applies the group's committed commands to this node's broker: record batches to their
//! partitions, new topics to its registry.
//!
//! Offsets are assigned here, in the group's order, the same on every node. After a restart
//! openraft applies again every entry after the newest snapshot (from the group's start when
//! there is none), starting from the snapshot's bookkeeping: each partition's next offset. The
//! node's partitions already hold a prefix of those batches (the device's log keeps a prefix,
//! storage.md §5): a batch that ends at or before where the partition ended when first touched
//! is recognised as stored and only counted; one that starts there or later is appended.
//! Anything else means the partition does not follow the group: the group stops rather than
//! serve offsets that differ from the other nodes'.
//!
//! A snapshot carries that bookkeeping only, never the batches: it is written once every batch
//! it counts is durable on this node's devices (`settle`), and restoring one refuses a node
//! whose devices hold less than it counts.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use nvmq_cluster::{Applier, ApplyResult, Capture, Restore};
use serde::{Deserialize, Serialize};

use super::command::{Answer, Command};
use super::settle::Settle;
use crate::broker::{lock, Broker};
use crate::codes;
use crate::part::PartRef;
use crate::topic_config::TopicConfigs;

#[derive(Default)]
struct Offsets {
    /// The next offset the group gives in each partition it ever wrote to (restored from the
    /// snapshot, then counted on), with the partition's name (what a snapshot records).
    next: HashMap<PartRef, (u64, (String, u32))>,
    /// Where each partition ended on the device when first touched since the node started (or
    /// since a snapshot was installed).
    found: HashMap<PartRef, u64>,
}

/// What a snapshot of the applier carries: each partition's next offset, by name (device-local
/// partition ids are not the snapshot's business).
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
struct Bookkeeping {
    next: Vec<(String, u32, u64)>,
    /// The highest `Compact` applied: a node restarting from the snapshot purges up to it
    /// without waiting for the leader's next one.
    compact_to: u64,
}

pub(crate) struct BrokerApplier {
    /// Weak: the broker holds the replica, which holds the group, which holds this.
    broker: Weak<Broker>,
    offsets: Arc<Mutex<Offsets>>,
    /// The batches queued to the devices and which are durable yet.
    settle: Settle,
    /// The highest `Compact` applied: entries up to it may be purged (`compact`).
    compact_to: Arc<AtomicU64>,
}

impl BrokerApplier {
    pub(crate) fn new(broker: Weak<Broker>) -> BrokerApplier {
        BrokerApplier {
            broker,
            offsets: Arc::default(),
            settle: Settle::default(),
            compact_to: Arc::default(),
        }
    }

    /// The highest index every voter held when the leader last said so (0: never).
    pub(crate) fn compact_to(&self) -> Arc<AtomicU64> {
        self.compact_to.clone()
    }

    async fn produce(
        &self,
        b: &Broker,
        index: u64,
        topic: String,
        partition: u32,
        span: u32,
        batch: Vec<u8>,
    ) -> Result<Answer, String> {
        let Some(pid) = i32::try_from(partition)
            .ok()
            .and_then(|p| b.topics().partition(&topic, p))
        else {
            return Ok(Answer::Refused {
                code: codes::UNKNOWN_TOPIC_OR_PARTITION,
                why: format!("no partition {topic}/{partition}"),
            });
        };
        let (base, found) = {
            let mut o = lock(&self.offsets);
            let found = *o
                .found
                .entry(pid)
                .or_insert_with(|| b.bounds(pid).map_or(0, |(_, end)| end));
            let next = o
                .next
                .entry(pid)
                .or_insert_with(|| (0, (topic.clone(), partition)));
            let base = next.0;
            next.0 += u64::from(span);
            (base, found)
        };
        let end = base + u64::from(span);
        if end <= found {
            return Ok(Answer::Produced { base });
        }
        if base < found {
            return Err(format!(
                "partition {topic}/{partition}: entry {index} takes offsets {base}..{end}, but \
                 the device held the partition up to {found} at start"
            ));
        }
        let (t, p) = (topic.clone(), partition);
        let pending = self.settle.queued(pid.dev);
        let appended = b
            .append_with(pid, batch, span, move |r| match r {
                Ok(a) if a.offset == base => pending.finish(None),
                Ok(a) => {
                    let why = format!(
                        "{t}/{p}: a replicated batch landed at offset {} instead of {base}",
                        a.offset
                    );
                    tracing::error!(topic = %t, partition = p, expected = base, got = a.offset,
                    "a replicated batch landed at another offset than the group gave it");
                    pending.finish(Some(why));
                }
                Err(e) => {
                    tracing::error!(topic = %t, partition = p, error = %e,
                        "storing a replicated batch failed");
                    pending.finish(Some(format!("{t}/{p} at offset {base}: {e}")));
                }
            })
            .await;
        // Not waited for: the batch is committed (durable on a majority) already, and a
        // restart applies it again if this node's copy did not become durable.
        match appended {
            Ok(_) => Ok(Answer::Produced { base }),
            Err(e) => Err(format!(
                "partition {topic}/{partition}: storing entry {index} at offset {base}: {e}"
            )),
        }
    }

    /// Applies one command of entry `index` (a `Many` is taken apart by `apply`).
    async fn apply_one(&self, b: &Broker, index: u64, command: Command) -> Result<Answer, String> {
        // A batch of an earlier command was not stored: this node's partitions no longer follow
        // the group, and the group stops here rather than at the next snapshot.
        if let Some(why) = self.settle.failed() {
            return Err(format!("a replicated batch was not stored: {why}"));
        }
        Ok(match command {
            Command::Produce {
                topic,
                partition,
                span,
                batch,
            } => {
                self.produce(b, index, topic, partition, span, batch)
                    .await?
            }
            Command::CreateTopic {
                name,
                partitions,
                configs,
            } => {
                let configs = TopicConfigs {
                    set: configs.into_iter().collect(),
                };
                match b.create_topic_here(&name, partitions, configs).await {
                    Ok(created) => Answer::Created { created },
                    Err(e) => return Err(format!("creating topic {name}: {e}")),
                }
            }
            Command::Compact { upto } => {
                self.compact_to.fetch_max(upto, Ordering::Relaxed);
                Answer::Noted
            }
            Command::Many(_) => {
                return Err(format!(
                    "entry {index} holds a Many inside a Many, which no node writes"
                ))
            }
        })
    }
}

impl Applier for BrokerApplier {
    fn apply<'a>(
        &'a self,
        index: u64,
        data: &'a [u8],
    ) -> Pin<Box<dyn Future<Output = ApplyResult> + Send + 'a>> {
        Box::pin(async move {
            let b = self.broker.upgrade().ok_or("the broker stopped")?;
            let answer = match Command::decode(data).map_err(|e| e.to_string())? {
                Command::Many(commands) => {
                    let mut answers = Vec::with_capacity(commands.len());
                    for c in commands {
                        answers.push(self.apply_one(&b, index, c).await?);
                    }
                    Answer::Many(answers)
                }
                c => self.apply_one(&b, index, c).await?,
            };
            Ok(answer.encode())
        })
    }

    /// Each partition's next offset, and a wait for every batch queued so far: the
    /// partitions a snapshot counts are then on the devices up to those offsets. (A created
    /// topic is durable before its entry's apply returns.)
    fn capture(&self) -> Result<Capture, String> {
        let mark = self.settle.mark();
        let mut next: Vec<(String, u32, u64)> = lock(&self.offsets)
            .next
            .values()
            .map(|(n, (t, p))| (t.clone(), *p, *n))
            .collect();
        next.sort_unstable();
        let book = Bookkeeping {
            next,
            compact_to: self.compact_to.load(Ordering::Relaxed),
        };
        let data = postcard::to_allocvec(&book).map_err(|e| e.to_string())?;
        Ok(Capture {
            data,
            durable: self.settle.until(mark),
        })
    }

    /// Takes a snapshot's offsets, once every partition it names is on this node's devices at
    /// least up to its offset; refuses, changing nothing, otherwise.
    fn restore(&self, data: &[u8]) -> Result<Restore, String> {
        let b = self.broker.upgrade().ok_or("the broker stopped")?;
        let book: Bookkeeping = match postcard::take_from_bytes(data) {
            Ok((book, [])) => book,
            Ok((_, rest)) => {
                return Err(format!(
                    "the snapshot's bookkeeping has {} bytes after its end",
                    rest.len()
                ))
            }
            Err(e) => return Err(format!("the snapshot's bookkeeping does not decode: {e}")),
        };
        let mut next = HashMap::with_capacity(book.next.len());
        for (topic, partition, n) in book.next {
            let pid = i32::try_from(partition)
                .ok()
                .and_then(|p| b.topics().partition(&topic, p));
            let Some(pid) = pid else {
                return Err(format!(
                    "the snapshot counts {n} offsets in {topic}/{partition}, a partition this \
                     node does not have: it does not hold what the snapshot covers (a node that \
                     is new or lost its drive needs the partitions themselves, not supported yet)"
                ));
            };
            let end = b.bounds(pid).map_or(0, |(_, end)| end);
            if end < n {
                return Err(format!(
                    "the snapshot counts {n} offsets in {topic}/{partition}, but this node's \
                     device holds it only up to {end}: the batches between are not here (a \
                     device that lost data, or a node that never received them)"
                ));
            }
            next.insert(pid, (n, (topic, partition)));
        }
        let (offsets, compact_to) = (self.offsets.clone(), self.compact_to.clone());
        Ok(Box::new(move || {
            let mut o = lock(&offsets);
            o.next = next;
            // Where each partition ends is read again at its next touch.
            o.found.clear();
            compact_to.fetch_max(book.compact_to, Ordering::Relaxed);
        }))
    }
}
