//! A minimal Kafka client over the same codec: for `nvmq kafka-bench` and the frontend's tests.
//! One connection; requests may be pipelined (send several, then receive in order).

use std::io;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, RequestHeader, ResponseHeader, SaslAuthenticateRequest, SaslAuthenticateResponse,
    SaslHandshakeRequest,
};
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpStream, ToSocketAddrs};
use tokio_rustls::TlsConnector;

use crate::sasl::scram_client::ScramClient;
use crate::sasl::ScramMechanism;

/// Largest response frame the client reads.
const MAX_RESPONSE: usize = 256 << 20;

/// Either half of a plain or TLS connection.
type Reader = Box<dyn AsyncRead + Send + Unpin>;
type Writer = Box<dyn AsyncWrite + Send + Unpin>;

pub struct Client {
    rd: BufReader<Reader>,
    wr: Writer,
    next_correlation: i32,
    client_id: String,
}

fn bad(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl Client {
    pub async fn connect(addr: impl ToSocketAddrs, client_id: &str) -> io::Result<Client> {
        let s = TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        let (rd, wr) = s.into_split();
        Ok(Client::over(Box::new(rd), Box::new(wr), client_id))
    }

    /// Connects over TLS, checking the server's certificate for `server_name`. Under TLS 1.3 a
    /// server that refuses the client's certificate says so after the handshake: the first
    /// request then fails.
    pub async fn connect_tls(
        addr: impl ToSocketAddrs,
        client_id: &str,
        config: std::sync::Arc<rustls::ClientConfig>,
        server_name: ServerName<'static>,
    ) -> io::Result<Client> {
        let s = TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        let tls = TlsConnector::from(config).connect(server_name, s).await?;
        let (rd, wr) = tokio::io::split(tls);
        Ok(Client::over(Box::new(rd), Box::new(wr), client_id))
    }

    fn over(rd: Reader, wr: Writer, client_id: &str) -> Client {
        Client {
            rd: BufReader::with_capacity(64 << 10, rd),
            wr,
            next_correlation: 1,
            client_id: client_id.to_string(),
        }
    }

    /// Encodes a request frame (length, header, body) without sending it.
    pub fn frame<R: Request>(&mut self, version: i16, req: &R) -> io::Result<(i32, Bytes)> {
        let correlation_id = self.next_correlation;
        self.next_correlation = self.next_correlation.wrapping_add(1);
        let mut h = RequestHeader::default();
        h.request_api_key = R::KEY;
        h.request_api_version = version;
        h.correlation_id = correlation_id;
        h.client_id = Some(StrBytes::from_string(self.client_id.clone()));
        let key = ApiKey::try_from(R::KEY).map_err(|_| bad(format!("api key {}", R::KEY)))?;
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&[0; 4]);
        h.encode(&mut buf, key.request_header_version(version))
            .and_then(|_| req.encode(&mut buf, version))
            .map_err(|e| bad(format!("encoding {key:?} v{version}: {e}")))?;
        let len = (buf.len() - 4) as i32;
        buf[..4].copy_from_slice(&len.to_be_bytes());
        Ok((correlation_id, buf.freeze()))
    }

    /// Sends a request; returns its correlation id.
    pub async fn send<R: Request>(&mut self, version: i16, req: &R) -> io::Result<i32> {
        let (id, f) = self.frame(version, req)?;
        self.send_raw(&f).await?;
        Ok(id)
    }

    pub async fn send_raw(&mut self, frame: &[u8]) -> io::Result<()> {
        self.wr.write_all(frame).await?;
        // A TLS stream holds what it was given until flushed (a no-op on TCP).
        self.wr.flush().await
    }

    /// Reads one response frame (without its length).
    pub async fn recv_raw(&mut self) -> io::Result<Bytes> {
        let len = self.rd.read_i32().await?;
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l <= MAX_RESPONSE)
            .ok_or_else(|| bad(format!("response frame length {len}")))?;
        let mut b = BytesMut::zeroed(len);
        self.rd.read_exact(&mut b).await?;
        Ok(b.freeze())
    }

    /// Reads the next response, as the answer to a request of type R at `version`; returns its
    /// correlation id too.
    pub async fn recv<R: Request>(&mut self, version: i16) -> io::Result<(i32, R::Response)> {
        let mut b = self.recv_raw().await?;
        let key = ApiKey::try_from(R::KEY).map_err(|_| bad(format!("api key {}", R::KEY)))?;
        let h = ResponseHeader::decode(&mut b, key.response_header_version(version))
            .map_err(|e| bad(format!("response header: {e}")))?;
        let body = R::Response::decode(&mut b, version)
            .map_err(|e| bad(format!("{key:?} v{version} response: {e}")))?;
        Ok((h.correlation_id, body))
    }

    /// Sends a request and waits for its answer.
    pub async fn call<R: Request>(&mut self, version: i16, req: &R) -> io::Result<R::Response> {
        let id = self.send(version, req).await?;
        let (got, resp) = self.recv::<R>(version).await?;
        if got != id {
            return Err(bad(format!(
                "answer to request {got} while waiting for {id}"
            )));
        }
        Ok(resp)
    }

    /// SaslHandshake v1 for `mechanism`, then one SaslAuthenticate v1 per token `next` makes of
    /// the server's last one (None for the first), until the server answers an error or `next`
    /// has no more. Returns the last answer (its error code says whether it worked).
    pub async fn login(
        &mut self,
        mechanism: &str,
        mut next: impl FnMut(Option<&[u8]>) -> Option<Vec<u8>>,
    ) -> io::Result<SaslAuthenticateResponse> {
        let mut h = SaslHandshakeRequest::default();
        h.mechanism = StrBytes::from_string(mechanism.to_string());
        let hr = self.call(1, &h).await?;
        if hr.error_code != 0 {
            return Err(bad(format!(
                "SaslHandshake for {mechanism}: error {}",
                hr.error_code
            )));
        }
        let mut last: Option<SaslAuthenticateResponse> = None;
        while let Some(token) = next(last.as_ref().map(|r| &r.auth_bytes[..])) {
            let mut a = SaslAuthenticateRequest::default();
            a.auth_bytes = Bytes::from(token);
            let r = self.call(1, &a).await?;
            let failed = r.error_code != 0;
            last = Some(r);
            if failed {
                break;
            }
        }
        last.ok_or_else(|| bad("no SASL token to send".into()))
    }

    /// Logs in with SASL PLAIN.
    pub async fn login_plain(
        &mut self,
        user: &str,
        password: &str,
    ) -> io::Result<SaslAuthenticateResponse> {
        let token = format!("\0{user}\0{password}").into_bytes();
        let mut once = Some(token);
        self.login("PLAIN", |_| once.take()).await
    }

    /// Logs in with SCRAM; an error when the server's final message does not prove it knew the
    /// credential.
    pub async fn login_scram(
        &mut self,
        m: ScramMechanism,
        user: &str,
        password: &str,
    ) -> io::Result<SaslAuthenticateResponse> {
        let mut c = ScramClient::new(m, user, password.as_bytes())
            .map_err(|e| bad(format!("SCRAM: {e}")))?;
        let mut step = 0;
        let mut failed = None;
        let r = self
            .login(m.name(), |server| {
                step += 1;
                match (step, server) {
                    (1, _) => Some(c.first()),
                    (2, Some(sf)) => match c.respond(sf) {
                        Ok(t) => Some(t),
                        Err(e) => {
                            failed = Some(e.to_string());
                            None
                        }
                    },
                    (_, Some(fin)) => {
                        if !c.verify(fin) {
                            failed = Some("the server's signature does not match".into());
                        }
                        None
                    }
                    _ => None,
                }
            })
            .await?;
        match failed {
            Some(why) if r.error_code == 0 => Err(bad(format!("SCRAM: {why}"))),
            _ => Ok(r),
        }
    }
}

/// An uncompressed RecordBatch (magic 2) of `values`, each a record without key or headers.
pub fn record_batch(values: &[&[u8]], producer: Option<(i64, i16, i32)>) -> Vec<u8> {
    fn varint(out: &mut Vec<u8>, v: i64) {
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        while z >= 0x80 {
            out.push((z as u8) | 0x80);
            z >>= 7;
        }
        out.push(z as u8);
    }
    let (pid, epoch, seq) = producer.unwrap_or((-1, -1, -1));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let mut records = Vec::new();
    for (i, v) in values.iter().enumerate() {
        let mut r = vec![0u8];
        varint(&mut r, 0);
        varint(&mut r, i as i64);
        varint(&mut r, -1);
        varint(&mut r, v.len() as i64);
        r.extend_from_slice(v);
        varint(&mut r, 0);
        varint(&mut records, r.len() as i64);
        records.extend(r);
    }
    let n = values.len() as i32;
    let mut b = Vec::with_capacity(61 + records.len());
    b.extend(0i64.to_be_bytes());
    b.extend(0i32.to_be_bytes());
    b.extend((-1i32).to_be_bytes());
    b.push(2);
    b.extend(0u32.to_be_bytes());
    b.extend(0i16.to_be_bytes());
    b.extend((n - 1).to_be_bytes());
    b.extend(now.to_be_bytes());
    b.extend(now.to_be_bytes());
    b.extend(pid.to_be_bytes());
    b.extend(epoch.to_be_bytes());
    b.extend(seq.to_be_bytes());
    b.extend(n.to_be_bytes());
    b.extend(records);
    let len = (b.len() - 12) as i32;
    b[8..12].copy_from_slice(&len.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

/// A Produce, acks=all with a 30 s timeout, of one record holding `value` to each of partitions
/// 0..`partitions` of `topic` (one batch, shared by all of them).
pub fn produce_one_each(
    topic: &str,
    partitions: i32,
    value: &[u8],
) -> kafka_protocol::messages::ProduceRequest {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    let records = Bytes::from(record_batch(&[value], None));
    let mut td = TopicProduceData::default();
    td.name = kafka_protocol::messages::TopicName(StrBytes::from_string(topic.to_string()));
    td.partition_data = (0..partitions)
        .map(|i| {
            let mut p = PartitionProduceData::default();
            p.index = i;
            p.records = Some(records.clone());
            p
        })
        .collect();
    let mut req = kafka_protocol::messages::ProduceRequest::default();
    req.acks = -1;
    req.timeout_ms = 30_000;
    req.topic_data = vec![td];
    req
}

/// Where a request frame (length, then header v1/v2) holds its correlation id: after the frame
/// length, the API key and the API version.
pub const CORRELATION_ID_AT: usize = 8;

/// Encodes a request frame (length, header, body) with the given correlation id, for a caller
/// that re-sends it many times (patching the id with [`set_correlation_id`]) without a `Client`.
pub fn request_frame<R: Request>(
    version: i16,
    req: &R,
    correlation_id: i32,
    client_id: &str,
) -> io::Result<Vec<u8>> {
    let mut h = RequestHeader::default();
    h.request_api_key = R::KEY;
    h.request_api_version = version;
    h.correlation_id = correlation_id;
    h.client_id = Some(StrBytes::from_string(client_id.to_string()));
    let key = ApiKey::try_from(R::KEY).map_err(|_| bad(format!("api key {}", R::KEY)))?;
    let mut buf = BytesMut::new();
    buf.extend_from_slice(&[0; 4]);
    h.encode(&mut buf, key.request_header_version(version))
        .and_then(|_| req.encode(&mut buf, version))
        .map_err(|e| bad(format!("encoding {key:?} v{version}: {e}")))?;
    let len = (buf.len() - 4) as i32;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    Ok(buf.to_vec())
}

/// Rewrites the correlation id of a frame made by [`request_frame`] (or [`Client::frame`]).
/// A frame too short to hold one is left as it is.
pub fn set_correlation_id(frame: &mut [u8], id: i32) {
    if let Some(slot) = frame.get_mut(CORRELATION_ID_AT..CORRELATION_ID_AT + 4) {
        slot.copy_from_slice(&id.to_be_bytes());
    }
}
