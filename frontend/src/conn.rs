//! One client connection: frames in, requests decoded and started in order, answers written in
//! the same order. Many requests may be in flight (pipelining): the reader starts each one (its
//! appends are queued in request order) and hands the writer a future for its answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{decode_request_header_from_buffer, Decodable, Encodable};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::broker::Broker;
use crate::versions::{self, Support};
use crate::{admin, fetch, group_api, produce, shape};

/// What the writer does with a request once its answer is ready.
pub enum Outcome {
    Send(Bytes),
    /// acks=0 produce: Kafka sends nothing back.
    Nothing,
    /// Something went wrong encoding: the connection cannot stay in step.
    Close,
}

pub type Reply = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// The request being answered.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub api: ApiKey,
    pub version: i16,
    pub correlation_id: i32,
    pub client_id: String,
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
}

pub async fn serve(broker: Arc<Broker>, stream: TcpStream) {
    let peer = stream.peer_addr().ok();
    let _ = stream.set_nodelay(true);
    let (rd, wr) = stream.into_split();
    let mut rd = tokio::io::BufReader::with_capacity(64 << 10, rd);
    let (tx, mut rx) = mpsc::channel::<Reply>(broker.cfg.max_in_flight_per_connection.max(1));
    let writer = tokio::spawn(async move {
        let mut wr = BufWriter::with_capacity(64 << 10, wr);
        while let Some(reply) = rx.recv().await {
            match reply.await {
                Outcome::Send(b) => {
                    if wr.write_all(&b).await.is_err() {
                        return;
                    }
                }
                Outcome::Nothing => {}
                Outcome::Close => return,
            }
            if rx.is_empty() && wr.flush().await.is_err() {
                return;
            }
        }
        let _ = wr.flush().await;
    });
    let max = broker.cfg.max_frame;
    while let Ok(len) = rd.read_i32().await {
        let len = i64::from(len);
        if len < 8 || len as u64 > max as u64 {
            let r = if len < 8 {
                Refusal::Short(len.max(0) as usize)
            } else {
                Refusal::TooLarge { len, max }
            };
            tracing::warn!(?peer, error = %r, "closing connection");
            break;
        }
        let mut frame = BytesMut::zeroed(len as usize);
        if rd.read_exact(&mut frame).await.is_err() {
            break;
        }
        match start(&broker, frame.freeze()).await {
            Ok(reply) => {
                if tx.send(reply).await.is_err() {
                    break;
                }
            }
            Err(r) => {
                tracing::warn!(?peer, error = %r, "closing connection");
                break;
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}

/// Decodes one request and starts it; the reply future finishes it.
pub async fn start(broker: &Arc<Broker>, mut frame: Bytes) -> Result<Reply, Refusal> {
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
            };
            return Ok(admin::api_versions_unsupported(&ctx));
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
    };
    let b = broker;
    let reply = match api {
        ApiKey::ApiVersions => admin::api_versions(&ctx),
        ApiKey::Metadata => admin::metadata(b, &ctx, decode(&ctx, &mut frame)?).await,
        ApiKey::Produce => produce::produce(b, &ctx, decode(&ctx, &mut frame)?).await,
        ApiKey::Fetch => fetch::fetch(b, &ctx, decode(&ctx, &mut frame)?),
        ApiKey::ListOffsets => fetch::list_offsets(b, &ctx, decode(&ctx, &mut frame)?),
        ApiKey::CreateTopics => admin::create_topics(b, &ctx, decode(&ctx, &mut frame)?).await,
        ApiKey::DeleteTopics => admin::delete_topics(b, &ctx, decode(&ctx, &mut frame)?).await,
        ApiKey::FindCoordinator => admin::find_coordinator(b, &ctx, decode(&ctx, &mut frame)?),
        ApiKey::InitProducerId => admin::init_producer_id(b, &ctx, decode(&ctx, &mut frame)?),
        ApiKey::JoinGroup => group_api::join(b, &ctx, decode(&ctx, &mut frame)?),
        ApiKey::SyncGroup => group_api::sync(b, &ctx, decode(&ctx, &mut frame)?),
        ApiKey::Heartbeat => group_api::heartbeat(b, &ctx, decode(&ctx, &mut frame)?),
        ApiKey::LeaveGroup => group_api::leave(b, &ctx, decode(&ctx, &mut frame)?),
        ApiKey::OffsetCommit => group_api::offset_commit(b, &ctx, decode(&ctx, &mut frame)?).await,
        ApiKey::OffsetFetch => group_api::offset_fetch(b, &ctx, decode(&ctx, &mut frame)?),
        other => return Err(Refusal::UnknownApi(other as i16)),
    };
    Ok(reply)
}

fn decode<T: Decodable>(ctx: &Ctx, frame: &mut Bytes) -> Result<T, Refusal> {
    T::decode(frame, ctx.version).map_err(|e| Refusal::Malformed {
        what: format!("{:?} v{} request", ctx.api, ctx.version),
        why: e.to_string(),
    })
}
