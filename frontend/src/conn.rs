//! Requests as the connections see them: frames cut from the input, headers parsed and checked,
//! and each request started, its answer a future (the event loop keeps them in order; see
//! `reactor`). Produce and tail Fetches take the loop's fast path instead (`reactor::fast`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{decode_request_header_from_buffer, Decodable, Encodable};

use crate::broker::Broker;
use crate::session::Session;
use crate::versions::{self, Support};
use crate::{
    acl, admin, config_api, epoch, fetch, group_admin_api, group_api, log_api, produce, sasl,
    scram_api, shape,
};

/// What the writer does with a request once its answer is ready.
pub enum Outcome {
    Send(Bytes),
    /// acks=0 produce: Kafka sends nothing back.
    Nothing,
    /// Something went wrong encoding: the connection cannot stay in step.
    Close,
    /// The answer, after which the connection closes (a failed SASL authentication).
    Last(Bytes),
}

pub type Reply = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// The request being answered.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub api: ApiKey,
    pub version: i16,
    pub correlation_id: i32,
    pub client_id: String,
    /// The connection's security state (its principal).
    pub session: Arc<Session>,
}

impl Ctx {
    /// Encodes an answer: length, response header (the version the API's key says; ApiVersions
    /// always v0), body.
    pub fn encode<R: Encodable>(&self, body: &R) -> Outcome {
        self.encode_at(body, self.version)
    }

    pub fn encode_at<R: Encodable>(&self, body: &R, version: i16) -> Outcome {
        let mut buf = BytesMut::with_capacity(64);
        buf.put_i32(0);
        let mut header = ResponseHeader::default();
        header.correlation_id = self.correlation_id;
        let hv = self.api.response_header_version(version);
        let r = header
            .encode(&mut buf, hv)
            .and_then(|_| body.encode(&mut buf, version));
        match r {
            Ok(()) => {
                let len = (buf.len() - 4) as i32;
                buf[..4].copy_from_slice(&len.to_be_bytes());
                Outcome::Send(buf.freeze())
            }
            Err(e) => {
                tracing::error!(api = ?self.api, version, error = %e, "could not encode a response; closing the connection");
                Outcome::Close
            }
        }
    }

    pub fn ready<R: Encodable>(&self, body: &R) -> Reply {
        let out = self.encode(body);
        Box::pin(async move { out })
    }

    /// An answer after which the connection closes.
    pub fn ready_last<R: Encodable>(&self, body: &R) -> Reply {
        let out = match self.encode(body) {
            Outcome::Send(b) => Outcome::Last(b),
            other => other,
        };
        Box::pin(async move { out })
    }

    /// Encodes an answer at the end of `out` (length, header, body); false (and `out` as it was)
    /// when the body does not encode.
    pub fn encode_into<R: Encodable>(&self, body: &R, out: &mut Vec<u8>) -> bool {
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        let mut header = ResponseHeader::default();
        header.correlation_id = self.correlation_id;
        let hv = self.api.response_header_version(self.version);
        let r = header
            .encode(out, hv)
            .and_then(|_| body.encode(out, self.version));
        match r {
            Ok(()) => {
                let len = (out.len() - at - 4) as i32;
                out[at..at + 4].copy_from_slice(&len.to_be_bytes());
                true
            }
            Err(e) => {
                out.truncate(at);
                tracing::error!(api = ?self.api, version = self.version, error = %e, "could not encode a response; closing the connection");
                false
            }
        }
    }
}

/// Why a connection is closed instead of answered.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("frame of {0} bytes is shorter than a request header")]
    Short(usize),
    #[error("frame of {len} bytes exceeds the {max}-byte limit")]
    TooLarge { len: i64, max: usize },
    #[error("unknown API key {0}")]
    UnknownApi(i16),
    #[error("{api:?} version {version} is not supported")]
    Version { api: ApiKey, version: i16 },
    #[error("malformed {what}: {why}")]
    Malformed { what: String, why: String },
    #[error("{0:?} request before SASL authentication (or after its session expired)")]
    Unauthenticated(ApiKey),
    #[error("{0:?} is not served by a node of a cluster: what it changes is not replicated yet")]
    NotReplicated(ApiKey),
}

/// Takes one whole request frame (without its length) off the front of `input`, if there.
pub fn next_frame(input: &mut BytesMut, max: usize) -> Result<Option<Bytes>, Refusal> {
    if input.len() < 4 {
        return Ok(None);
    }
    let len = i64::from(i32::from_be_bytes([input[0], input[1], input[2], input[3]]));
    if len < 8 {
        return Err(Refusal::Short(len.max(0) as usize));
    }
    if len as u64 > max as u64 {
        return Err(Refusal::TooLarge { len, max });
    }
    let total = 4 + len as usize;
    if input.len() < total {
        return Ok(None);
    }
    let mut frame = input.split_to(total);
    let _ = frame.split_to(4);
    Ok(Some(frame.freeze()))
}

/// A request whose header was read and checked.
pub enum Parsed {
    /// Its body (after the header), to be started.
    Request(Ctx, Bytes),
    /// Answered already (an ApiVersions version nvmq does not serve).
    Answered(Reply),
}

/// Reads and checks a request's header and the shape of its body.
pub fn parse(mut frame: Bytes, session: &Arc<Session>) -> Result<Parsed, Refusal> {
    if frame.len() < 8 {
        return Err(Refusal::Short(frame.len()));
    }
    let key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let api = ApiKey::try_from(key).map_err(|_| Refusal::UnknownApi(key))?;
    match versions::support(key, version) {
        Support::UnknownApi => return Err(Refusal::UnknownApi(key)),
        Support::Unsupported if api == ApiKey::ApiVersions => {
            // KIP-511: answer with a v0 body listing what is supported; the client retries lower.
            let ctx = Ctx {
                api,
                version: 0,
                correlation_id,
                client_id: String::new(),
                session: session.clone(),
            };
            return Ok(Parsed::Answered(admin::api_versions_unsupported(&ctx)));
        }
        Support::Unsupported => return Err(Refusal::Version { api, version }),
        Support::Served => {}
    }
    let header: RequestHeader =
        decode_request_header_from_buffer(&mut frame).map_err(|e| Refusal::Malformed {
            what: "request header".into(),
            why: e.to_string(),
        })?;
    shape::check(api, version, &frame).map_err(|why| Refusal::Malformed {
        what: format!("{api:?} v{version} request"),
        why,
    })?;
    let ctx = Ctx {
        api,
        version,
        correlation_id,
        client_id: header
            .client_id
            .as_ref()
            .map(|s| s.as_str().to_string())
            .unwrap_or_default(),
        session: session.clone(),
    };
    Ok(Parsed::Request(ctx, frame))
}

/// SASL's gate (`required`: the broker offers SASL): a connection not admitted, or whose session
/// expired, may send only ApiVersions, SaslHandshake and SaslAuthenticate; anything else closes
/// it, as Kafka does.
pub fn admit(p: Parsed, required: bool) -> Result<Parsed, Refusal> {
    if required {
        if let Parsed::Request(c, _) = &p {
            if !sasl::admits_unauthenticated(c.api) && !c.session.admitted() {
                return Err(Refusal::Unauthenticated(c.api));
            }
        }
    }
    Ok(p)
}

/// Decodes one request of `session`'s connection and starts it; the reply future finishes it.
pub async fn start(
    broker: &Arc<Broker>,
    session: &Arc<Session>,
    frame: Bytes,
) -> Result<Reply, Refusal> {
    match admit(parse(frame, session)?, broker.cfg.sasl.required())? {
        Parsed::Answered(r) => Ok(r),
        Parsed::Request(ctx, body) => dispatch(broker, &ctx, body).await,
    }
}

/// Starts a parsed request.
pub async fn dispatch(broker: &Arc<Broker>, ctx: &Ctx, mut frame: Bytes) -> Result<Reply, Refusal> {
    let b = broker;
    let ctx = ctx.clone();
    if b.replica().is_some() && !crate::replica::served(ctx.api) {
        return Err(Refusal::NotReplicated(ctx.api));
    }
    let reply = match ctx.api {
        ApiKey::ApiVersions => admin::api_versions(b, &ctx),
        ApiKey::Metadata => admin::metadata(b, &ctx, decode(&ctx, &mut frame)?).await,
        ApiKey::Produce => produce::produce(b, &ctx, produce::decode_request(&ctx, frame)?).await,
        ApiKey::Fetch => fetch::fetch(b, &ctx, decode(&ctx, &mut frame)?),
        ApiKey::ListOffsets => fetch::list_offsets(b, &ctx, decode(&ctx, &mut frame)?),
        ApiKey::CreateTopics => admin::create_topics(b, &ctx, decode(&ctx, &mut frame)?).await,
        ApiKey::DeleteTopics => admin::delete_topics(b, &ctx, decode(&ctx, &mut frame)?).await,
        ApiKey::CreatePartitions => {
            admin::create_partitions(b, &ctx, decode(&ctx, &mut frame)?).await
        }
        ApiKey::FindCoordinator => admin::find_coordinator(b, &ctx, decode(&ctx, &mut frame)?),
        ApiKey::InitProducerId => admin::init_producer_id(b, &ctx, decode(&ctx, &mut frame)?),
        ApiKey::JoinGroup => group_api::join(b, &ctx, decode(&ctx, &mut frame)?),
        ApiKey::SyncGroup => group_api::sync(b, &ctx, decode(&ctx, &mut frame)?),
        ApiKey::Heartbeat => group_api::heartbeat(b, &ctx, decode(&ctx, &mut frame)?),
        ApiKey::LeaveGroup => group_api::leave(b, &ctx, decode(&ctx, &mut frame)?),
        ApiKey::OffsetCommit => group_api::offset_commit(b, &ctx, decode(&ctx, &mut frame)?).await,
        ApiKey::OffsetFetch => group_api::offset_fetch(b, &ctx, decode(&ctx, &mut frame)?),
        ApiKey::CreateAcls => acl::api::create(b, &ctx, decode(&ctx, &mut frame)?).await,
        ApiKey::DescribeAcls => acl::api::describe(b, &ctx, decode(&ctx, &mut frame)?),
        ApiKey::DeleteAcls => acl::api::delete(b, &ctx, decode(&ctx, &mut frame)?).await,
        ApiKey::SaslHandshake => sasl::api::handshake(b, &ctx, decode(&ctx, &mut frame)?),
        ApiKey::SaslAuthenticate => sasl::api::authenticate(b, &ctx, decode(&ctx, &mut frame)?),
        ApiKey::DescribeUserScramCredentials => {
            scram_api::describe(b, &ctx, decode(&ctx, &mut frame)?)
        }
        ApiKey::AlterUserScramCredentials => {
            scram_api::alter(b, &ctx, decode(&ctx, &mut frame)?).await
        }
        ApiKey::DescribeConfigs => config_api::describe(b, &ctx, decode(&ctx, &mut frame)?),
        ApiKey::AlterConfigs => config_api::alter(b, &ctx, decode(&ctx, &mut frame)?).await,
        ApiKey::IncrementalAlterConfigs => {
            config_api::incremental_alter(b, &ctx, decode(&ctx, &mut frame)?).await
        }
        ApiKey::DeleteRecords => log_api::delete_records(b, &ctx, decode(&ctx, &mut frame)?).await,
        ApiKey::DescribeLogDirs => log_api::describe_log_dirs(b, &ctx, decode(&ctx, &mut frame)?),
        ApiKey::ListGroups => group_admin_api::list_groups(b, &ctx, decode(&ctx, &mut frame)?),
        ApiKey::DescribeGroups => {
            group_admin_api::describe_groups(b, &ctx, decode(&ctx, &mut frame)?)
        }
        ApiKey::DeleteGroups => {
            group_admin_api::delete_groups(b, &ctx, decode(&ctx, &mut frame)?).await
        }
        ApiKey::OffsetDelete => {
            group_admin_api::offset_delete(b, &ctx, decode(&ctx, &mut frame)?).await
        }
        ApiKey::DescribeCluster => admin::describe_cluster(b, &ctx, decode(&ctx, &mut frame)?),
        ApiKey::OffsetForLeaderEpoch => {
            epoch::offset_for_leader_epoch(b, &ctx, decode(&ctx, &mut frame)?)
        }
        ApiKey::DescribeQuorum => {
            crate::quorum_api::describe_quorum(b, &ctx, decode(&ctx, &mut frame)?)
        }
        other => return Err(Refusal::UnknownApi(other as i16)),
    };
    Ok(reply)
}

pub fn decode<T: Decodable>(ctx: &Ctx, frame: &mut Bytes) -> Result<T, Refusal> {
    T::decode(frame, ctx.version).map_err(|e| Refusal::Malformed {
        what: format!("{:?} v{} request", ctx.api, ctx.version),
        why: e.to_string(),
    })
}
