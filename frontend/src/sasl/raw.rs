//! SaslHandshake v0: the client then sends its SASL tokens bare, each framed by its length only
//! (no Kafka request header), and gets the server's tokens back the same way; a failure closes
//! the connection without an answer (Kafka's behaviour for these old clients).

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};

use super::{exchange, Step};
use crate::broker::{lock, Broker};
use crate::conn::{Outcome, Parsed, Refusal};
use crate::session::Session;

/// Whether the connection's next frame is a bare token.
pub fn expected(session: &Session) -> bool {
    let st = lock(&session.sasl);
    st.raw && !matches!(st.step, exchange::Stage::Idle | exchange::Stage::Failed)
}

/// Takes one length-framed token off the front of `input`, if all there.
pub fn next_token(input: &mut BytesMut, max: usize) -> Result<Option<Bytes>, Refusal> {
    let Some(head) = input.get(..4) else {
        return Ok(None);
    };
    let len = i64::from(i32::from_be_bytes([head[0], head[1], head[2], head[3]]));
    if len < 0 || len as u64 > max as u64 {
        return Err(Refusal::TooLarge { len, max });
    }
    let total = 4 + len as usize;
    if input.len() < total {
        return Ok(None);
    }
    let mut token = input.split_to(total);
    let _ = token.split_to(4);
    Ok(Some(token.freeze()))
}

/// Answers one bare token (as a request answered once its check is done).
pub fn answer(b: &Arc<Broker>, session: &Arc<Session>, token: &[u8]) -> Parsed {
    let step = exchange::authenticate(b, session, token);
    Parsed::Answered(Box::pin(async move {
        match step.await {
            Step::Continue(t) => framed(&t),
            Step::Done(d) => framed(&d.reply),
            Step::Failed { .. } => Outcome::Close,
        }
    }))
}

fn framed(token: &[u8]) -> Outcome {
    let mut out = BytesMut::with_capacity(4 + token.len());
    out.put_i32(token.len() as i32);
    out.extend_from_slice(token);
    Outcome::Send(out.freeze())
}
