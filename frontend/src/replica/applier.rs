//! Applies the group's committed commands to this node's broker: record batches to their
//! partitions, new topics to its registry.
//!
//! Offsets are assigned here, in the group's order, the same on every node. After a restart
//! openraft applies every entry again from the group's start (the group takes no snapshots
//! yet), and the node's partitions already hold a prefix of those batches (the device's log
//! keeps a prefix, storage.md §5): a batch that ends at or before where the partition ended
//! when the node started is recognised as stored and only counted; one that starts there or
//! later is appended. Anything else means the partition does not follow the group: the
//! group stops rather than serve offsets that differ from the other nodes'.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, Weak};

use nvmq_cluster::{Applier, ApplyResult};

use super::command::{Answer, Command};
use crate::broker::Broker;
use crate::codes;
use crate::part::PartRef;
use crate::topic_config::TopicConfigs;

#[derive(Default)]
struct Offsets {
    /// The next offset the group gives in each partition touched since the node started.
    next: HashMap<PartRef, u64>,
    /// Where each of those partitions ended on the device when first touched.
    found: HashMap<PartRef, u64>,
}

pub(crate) struct BrokerApplier {
    /// Weak: the broker holds the replica, which holds the group, which holds this.
    broker: Weak<Broker>,
    offsets: Mutex<Offsets>,
}

impl BrokerApplier {
    pub(crate) fn new(broker: Weak<Broker>) -> BrokerApplier {
        BrokerApplier {
            broker,
            offsets: Mutex::default(),
        }
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
            let mut o = self.offsets.lock().unwrap_or_else(|p| p.into_inner());
            let found = *o
                .found
                .entry(pid)
                .or_insert_with(|| b.bounds(pid).map_or(0, |(_, end)| end));
            let next = o.next.entry(pid).or_insert(0);
            let base = *next;
            *next += u64::from(span);
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
        let appended = b
            .append_with(pid, batch, span, move |r| match r {
                Ok(a) if a.offset == base => {}
                Ok(a) => {
                    tracing::error!(topic = %t, partition = p, expected = base, got = a.offset,
                    "a replicated batch landed at another offset than the group gave it")
                }
                Err(e) => tracing::error!(topic = %t, partition = p, error = %e,
                    "storing a replicated batch failed"),
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
                Command::Produce {
                    topic,
                    partition,
                    span,
                    batch,
                } => {
                    self.produce(&b, index, topic, partition, span, batch)
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
            };
            Ok(answer.encode())
        })
    }
}
