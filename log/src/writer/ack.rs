//! How an append hears its outcome: a callback run on the writer's owner, or a token the owner
//! collects after a step. Tokens cost no allocation and no hand-off: an owner that steps the
//! writer on its own event loop routes them to its connections itself.

use super::*;

/// Called once with the outcome of an append.
pub type AckFn = Box<dyn FnOnce(Result<Appended, LogError>) + Send>;

/// How one append is answered.
pub enum Ack {
    /// Run on the thread that steps the writer, in log order.
    Call(AckFn),
    /// Queued, in log order, for the owner to take with [`Writer::drain_acks`].
    Token(u64),
}

impl From<AckFn> for Ack {
    fn from(f: AckFn) -> Ack {
        Ack::Call(f)
    }
}

/// A token's outcome as the owner collects it.
pub type TokenAck = (u64, Result<Appended, LogError>);

impl<D: BlockDevice> Writer<D> {
    /// Answers one append now: a callback runs, a token is queued for `drain_acks`.
    pub(super) fn answer(&mut self, ack: Ack, result: Result<Appended, LogError>) {
        answer_into(&mut self.token_acks, ack, result);
    }

    /// Moves the token acks answered so far into `out`, in the order they were answered (log
    /// order for successes).
    pub fn drain_acks(&mut self, out: &mut Vec<TokenAck>) {
        out.append(&mut self.token_acks);
    }

    /// Token acks answered and not yet drained.
    pub fn acks_waiting(&self) -> usize {
        self.token_acks.len()
    }
}

pub(super) fn answer_into(
    tokens: &mut Vec<TokenAck>,
    ack: Ack,
    result: Result<Appended, LogError>,
) {
    match ack {
        Ack::Call(f) => f(result),
        Ack::Token(t) => tokens.push((t, result)),
    }
}

/// Acknowledges a batch's appends unless that was done (in a relaxed mode, at write completion).
pub(super) fn ack_once(shared: &Shared, tokens: &mut Vec<TokenAck>, b: &mut InFlight) {
    if !b.acked {
        b.acked = true;
        ack_all(shared, tokens, &mut b.acks, b.payload_bytes);
    }
}

/// Acknowledges a batch's appends, in order, and counts them.
fn ack_all(
    shared: &Shared,
    tokens: &mut Vec<TokenAck>,
    acks: &mut Vec<AckEntry>,
    payload_bytes: u64,
) {
    if acks.is_empty() {
        return;
    }
    {
        // One clock read per batch, not per record: they are all acknowledged at this moment
        // (a clock read costs 100-150 ns on a virtual machine's TSC).
        let now = Instant::now();
        let mut s = shared.lock();
        s.stats.appends_acked += acks.len() as u64;
        s.stats.payload_bytes_acked += payload_bytes;
        for (_, _, since) in acks.iter() {
            s.stats
                .ack_latency_us
                .record(now.saturating_duration_since(*since).as_micros() as u64);
        }
    }
    for (ack, a, _) in acks.drain(..) {
        answer_into(tokens, ack, Ok(a));
    }
}
