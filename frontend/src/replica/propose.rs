//! Group commit at the group's door: the commands a leader writes while earlier entries are in
//! flight go into the group as one entry (`Command::Many`), without a timer.
//!
//! Every entry costs each node the same work whatever it carries: a record in the group's log,
//! its checks and encoding, a place in an AppendEntries message, an apply. Kafka producers send
//! small requests (kafka-bench's closed:64 sends one 100-byte record each), so one entry per
//! request paid that for every record. Here a command waits only while `IN_FLIGHT` entries are
//! already between written and applied; then the next entry takes whatever has queued (up to
//! `--raft-merge-commands` commands and the byte cap). A command that finds room is written at
//! once, with whatever queued before it: alone when nothing did. (Measured: about 15% less CPU
//! per record at 64 producers; docs/cluster.md, "Group commit at the group's door".)
//!
//! The queue has no bound of its own: what waits in it is bounded by the front door's limits
//! (requests in flight per connection, and the bytes of requests read and not yet answered,
//! `reactor/limits.rs`), which count a Produce until it is answered; a command whose request
//! timed out (answered, and no longer counted there) is dropped when an entry would take it.
//! No command waits longer than `PERMIT_WAIT` for room: a leader cut off from its majority
//! holds its entries in flight until it heals, and its commands must still reach openraft,
//! which refuses them once its lease expired (clients then look for the new leader).
//!
//! Order: commands are queued in the order `submit` was called and an entry takes them from
//! the front, so commands submitted one after another are applied in that order, as when each
//! was written itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use nvmq_cluster::net::GroupRaft;
use nvmq_cluster::openraft::errors::ClientWriteError;
use nvmq_cluster::openraft::impls::ProgressResponder;
use nvmq_cluster::Request;
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::command::{encode_many, Answer};
use super::WriteError;

/// Where a command's answer goes.
type AnswerTx = oneshot::Sender<Result<Answer, WriteError>>;
type AnswerRx = oneshot::Receiver<Result<Answer, WriteError>>;

/// Entries written and not yet applied on this node before commands wait to be merged: one
/// being replicated while the next forms. Runs with 1, 2, 4 and 8 did not tell apart on this
/// machine (closed:64 rates of 9.4k to 19.4k acks/s, all overlapping); 2 keeps the pipeline full
/// without splitting what queued into many small entries.
const IN_FLIGHT: usize = 2;

/// The longest a command waits for an entry in flight to be applied before it is written
/// anyway: far above a healthy commit here (p99 under 25 ms at 64 producers), far below a
/// Kafka request's timeout.
const PERMIT_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// The most bytes of commands merged into one entry (a command larger alone is its own entry,
/// as it was before merging): a quarter MiB keeps an entry's record and its message small next
/// to the log's limits and the transport's.
const MAX_BYTES: usize = 256 << 10;

/// A command waiting for its entry, and where its answer goes.
struct Proposal {
    command: Vec<u8>,
    answer: AnswerTx,
}

/// The queue in front of the group (on the leader; a follower's `submit` never reaches it).
pub(crate) struct Proposer {
    queue: mpsc::UnboundedSender<Proposal>,
    counts: Arc<Counts>,
}

/// What the proposer wrote (`/metrics`).
#[derive(Default)]
struct Counts {
    entries: AtomicU64,
    commands: AtomicU64,
}

#[derive(Clone, Copy)]
struct Limits {
    commands: usize,
    bytes: usize,
}

impl Proposer {
    /// Starts the task that forms entries (on the current runtime, the group's), with at most
    /// `max_commands` commands and `max_bytes` of them in one (capped at `MAX_BYTES`).
    pub(crate) fn start(raft: GroupRaft, max_commands: usize, max_bytes: usize) -> Proposer {
        let (queue, rx) = mpsc::unbounded_channel();
        let counts = Arc::new(Counts::default());
        let limits = Limits {
            commands: max_commands.max(1),
            bytes: max_bytes.min(MAX_BYTES),
        };
        tokio::spawn(run(raft, rx, limits, counts.clone()));
        Proposer { queue, counts }
    }

    /// The entries this node wrote through the group since it started, and the commands they
    /// carried.
    pub(crate) fn proposed(&self) -> (u64, u64) {
        (
            self.counts.entries.load(Ordering::Relaxed),
            self.counts.commands.load(Ordering::Relaxed),
        )
    }

    /// Queues an encoded command; the answer comes when its entry is applied on this node.
    pub(crate) fn submit(&self, command: Vec<u8>) -> AnswerRx {
        let (answer, rx) = oneshot::channel();
        if let Err(mpsc::error::SendError(p)) = self.queue.send(Proposal { command, answer }) {
            // The task ended with the group's runtime.
            let _ = p
                .answer
                .send(Err(WriteError::Failed("the group stopped".into())));
        }
        rx
    }
}

async fn run(
    raft: GroupRaft,
    mut rx: mpsc::UnboundedReceiver<Proposal>,
    limits: Limits,
    counts: Arc<Counts>,
) {
    let room = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut next: Option<Proposal> = None;
    loop {
        let first = match next.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        // Commands queue behind `first` while the entries in flight run. Unmerged, every
        // command is written at once, however many are in flight (as before merging).
        let permit = match limits.commands {
            1 => None,
            _ => match tokio::time::timeout(PERMIT_WAIT, room.clone().acquire_owned()).await {
                Ok(Ok(p)) => Some(p),
                Ok(Err(_)) => return,
                // The entries in flight are stuck (a leader cut off from its majority keeps
                // them until it heals, and openraft does not step it down): write anyway, so
                // that openraft refuses at once once its lease expired and clients look for
                // the new leader, rather than wait here.
                Err(_) => None,
            },
        };
        let mut bytes = first.command.len();
        let mut taken = vec![first];
        while taken.len() < limits.commands {
            let Ok(p) = rx.try_recv() else { break };
            if bytes + p.command.len() > limits.bytes {
                next = Some(p);
                break;
            }
            bytes += p.command.len();
            taken.push(p);
        }
        // A caller that gave up waiting (its request timed out, and was answered so) no longer
        // holds its request's bytes against the front door's limits: its command is dropped
        // here rather than written for nobody, so the queue does not outgrow those limits.
        taken.retain(|p| !p.answer.is_closed());
        if taken.is_empty() {
            continue;
        }
        let (commands, answers): (Vec<Vec<u8>>, Vec<_>) =
            taken.into_iter().map(|p| (p.command, p.answer)).unzip();
        let entry = match <[Vec<u8>; 1]>::try_from(commands) {
            Ok([one]) => one,
            Err(commands) => encode_many(&commands),
        };
        let (responder, done) = ProgressResponder::complete_only();
        let merged = answers.len() as u64;
        if let Err(e) = raft
            .client_write_ff(Request::from(entry), Some(responder))
            .await
        {
            hand_out(answers, Err(WriteError::Failed(e.to_string())));
            continue;
        }
        counts.entries.fetch_add(1, Ordering::Relaxed);
        counts.commands.fetch_add(merged, Ordering::Relaxed);
        tokio::spawn(async move {
            let outcome = match done.await {
                Ok(Ok(r)) => {
                    Answer::decode(&r.data.answer).map_err(|e| WriteError::Failed(e.to_string()))
                }
                Ok(Err(ClientWriteError::ForwardToLeader(f))) => Err(WriteError::NotLeader {
                    leader: f.leader_id,
                }),
                Ok(Err(e)) => Err(WriteError::Failed(e.to_string())),
                Err(_) => Err(WriteError::Failed(
                    "the group stopped before answering".into(),
                )),
            };
            hand_out(answers, outcome);
            drop(permit);
        });
    }
}

/// Gives each command its answer: a `Many`'s answers in order, or the entry's failure to all.
fn hand_out(answers: Vec<AnswerTx>, outcome: Result<Answer, WriteError>) {
    // A caller that stopped waiting dropped its receiver: nothing to tell it.
    match (answers.len(), outcome) {
        (1, outcome) => {
            if let Some(a) = answers.into_iter().next() {
                let _ = a.send(outcome);
            }
        }
        (n, Ok(Answer::Many(each))) if each.len() == n => {
            for (a, r) in answers.into_iter().zip(each) {
                let _ = a.send(Ok(r));
            }
        }
        (n, Ok(other)) => {
            let why = format!("an entry of {n} commands was answered {other:?}");
            for a in answers {
                let _ = a.send(Err(WriteError::Failed(why.clone())));
            }
        }
        (_, Err(e)) => {
            for a in answers {
                let _ = a.send(Err(e.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(n: usize) -> (Vec<AnswerTx>, Vec<AnswerRx>) {
        (0..n).map(|_| oneshot::channel()).unzip()
    }

    fn got(rxs: Vec<AnswerRx>) -> Vec<Result<Answer, WriteError>> {
        rxs.into_iter()
            .map(|mut rx| rx.try_recv().expect("every command is answered"))
            .collect()
    }

    #[test]
    fn each_merged_command_gets_its_own_answer_in_order_or_the_entrys_failure() {
        let (tx, rx) = waiting(3);
        let each = vec![
            Answer::Produced { base: 0 },
            Answer::Refused {
                code: 3,
                why: "no such partition".into(),
            },
            Answer::Produced { base: 1 },
        ];
        hand_out(tx, Ok(Answer::Many(each.clone())));
        assert_eq!(got(rx), each.into_iter().map(Ok).collect::<Vec<_>>());

        // A lone command's entry is the command itself.
        let (tx, rx) = waiting(1);
        hand_out(tx, Ok(Answer::Produced { base: 9 }));
        assert_eq!(got(rx), vec![Ok(Answer::Produced { base: 9 })]);

        // Answers that do not match the commands fail them all rather than misdeliver one.
        let (tx, rx) = waiting(3);
        hand_out(tx, Ok(Answer::Many(vec![Answer::Noted; 2])));
        for r in got(rx) {
            let e = r.expect_err("a short Many");
            assert!(e.to_string().contains("an entry of 3 commands"), "{e}");
        }

        let (tx, rx) = waiting(2);
        hand_out(tx, Err(WriteError::NotLeader { leader: Some(2) }));
        assert_eq!(
            got(rx),
            vec![Err(WriteError::NotLeader { leader: Some(2) }); 2]
        );
    }
}
