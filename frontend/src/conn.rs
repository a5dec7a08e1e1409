//! One client connection: frames in, requests decoded and started in order, answers written in
//! the same order. Many requests may be in flight (pipelining): the reader starts each one (its
//! appends are queued in request order) and hands the writer a future for its answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{decode_request_header_from_buffer, Decodable, Encodable};
use std::collections::VecDeque;
use std::task::Poll;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;

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

/// What the connection's task waits for next.
enum Event {
    /// The oldest request's answer is ready.
    Answer(Outcome),
    /// Bytes arrived (0: the client closed its side).
    Input(std::io::Result<usize>),
    /// Nothing is ready: time to push buffered answers out.
    Idle,
}

/// One task per connection: it reads and starts requests, and writes answers in request order as
/// they complete. The oldest answer and new input are awaited together, so an ack wakes this task
/// once and its answer goes out at once.
pub async fn serve(broker: Arc<Broker>, stream: TcpStream) {
    let peer = stream.peer_addr().ok();
    let _ = stream.set_nodelay(true);
    let (mut rd, wr) = stream.into_split();
    let mut wr = BufWriter::with_capacity(64 << 10, wr);
    let mut input = BytesMut::with_capacity(64 << 10);
    let mut pending: VecDeque<Reply> = VecDeque::new();
    let max_in_flight = broker.cfg.max_in_flight_per_connection.max(1);
    let max = broker.cfg.max_frame;
    let mut eof = false;
    let mut unflushed = false;
    loop {
        while !eof && pending.len() < max_in_flight {
            let frame = match next_frame(&mut input, max) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(r) => {
                    tracing::warn!(?peer, error = %r, "closing connection");
                    eof = true;
                    break;
                }
            };
            match start(&broker, frame).await {
                Ok(reply) => pending.push_back(reply),
                Err(r) => {
                    tracing::warn!(?peer, error = %r, "closing connection");
                    eof = true;
                }
            }
        }
        if eof && pending.is_empty() {
            let _ = wr.flush().await;
            return;
        }
        let reading = !eof && pending.len() < max_in_flight;
        let idle = pending.is_empty() && !unflushed;
        let next = std::future::poll_fn(|cx| {
            if let Some(front) = pending.front_mut() {
                if let Poll::Ready(o) = front.as_mut().poll(cx) {
                    return Poll::Ready(Event::Answer(o));
                }
            }
            if reading {
                input.reserve(64 << 10);
                let read = rd.read_buf(&mut input);
                tokio::pin!(read);
                if let Poll::Ready(r) = read.poll(cx) {
                    return Poll::Ready(Event::Input(r));
                }
            }
            if unflushed {
                return Poll::Ready(Event::Idle);
            }
            Poll::Pending
        });
        let event = if idle {
            match tokio::time::timeout(broker.cfg.idle_timeout, next).await {
                Ok(e) => e,
                Err(_) => {
                    tracing::info!(?peer, "closing an idle connection");
                    return;
                }
            }
        } else {
            next.await
        };
        match event {
            Event::Answer(o) => {
                pending.pop_front();
                match o {
                    Outcome::Send(b) => {
                        if wr.write_all(&b).await.is_err() {
                            return;
                        }
                        unflushed = true;
                    }
                    Outcome::Nothing => {}
                    Outcome::Close => return,
                }
            }
            Event::Input(Ok(0)) | Event::Input(Err(_)) => eof = true,
            Event::Input(Ok(_)) => {}
            Event::Idle => {
                if wr.flush().await.is_err() {
                    return;
                }
                unflushed = false;
            }
        }
    }
}

/// Takes one whole request frame (without its length) off the front of `input`, if there.
fn next_frame(input: &mut BytesMut, max: usize) -> Result<Option<Bytes>, Refusal> {
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
