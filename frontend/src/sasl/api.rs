//! The SaslHandshake and SaslAuthenticate APIs. A refusal or a failed authentication is answered
//! (with the error and Kafka's message) and the connection then closes, as Kafka does.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::{
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::{exchange, HandshakeRefusal, Step};
use crate::broker::Broker;
use crate::codes;
use crate::conn::{Ctx, Reply};

pub fn handshake(b: &Arc<Broker>, ctx: &Ctx, req: SaslHandshakeRequest) -> Reply {
    let mut resp = SaslHandshakeResponse::default();
    resp.mechanisms = b
        .cfg
        .sasl
        .mechanisms
        .iter()
        .map(|m| StrBytes::from_static_str(m.name()))
        .collect();
    // v0: the tokens follow bare, outside Kafka's framing (`raw`).
    match exchange::handshake(b, &ctx.session, req.mechanism.as_str(), ctx.version == 0) {
        Ok(()) => ctx.ready(&resp),
        Err(why) => {
            resp.error_code = match why {
                HandshakeRefusal::Unsupported => codes::UNSUPPORTED_SASL_MECHANISM,
                HandshakeRefusal::IllegalState => codes::ILLEGAL_SASL_STATE,
            };
            tracing::warn!(peer = ?ctx.session.peer, mechanism = req.mechanism.as_str(), ?why, "SASL handshake refused; closing the connection");
            ctx.ready_last(&resp)
        }
    }
}

pub fn authenticate(b: &Arc<Broker>, ctx: &Ctx, req: SaslAuthenticateRequest) -> Reply {
    let step = exchange::authenticate(b, &ctx.session, &req.auth_bytes);
    let ctx = ctx.clone();
    Box::pin(async move {
        let mut resp = SaslAuthenticateResponse::default();
        match step.await {
            Step::Continue(token) => {
                resp.auth_bytes = Bytes::from(token);
                ctx.ready(&resp).await
            }
            Step::Done(done) => {
                resp.auth_bytes = Bytes::from(done.reply);
                resp.session_lifetime_ms = done.lifetime_ms;
                ctx.ready(&resp).await
            }
            Step::Failed {
                illegal_state,
                message,
            } => {
                resp.error_code = if illegal_state {
                    codes::ILLEGAL_SASL_STATE
                } else {
                    codes::SASL_AUTHENTICATION_FAILED
                };
                resp.error_message = Some(StrBytes::from_string(message));
                ctx.ready_last(&resp).await
            }
        }
    })
}
