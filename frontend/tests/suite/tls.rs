//! TLS on the Kafka listener, with a rustls client: produce and fetch over TLS; an untrusted CA,
//! an expired certificate, and (under mTLS) a missing or untrusted client certificate each fail;
//! a reload makes new connections see the new certificate while open ones keep theirs; a client
//! that never finishes its handshake gives its connection slot back.

use crate::common;

#[path = "../common/certs.rs"]
mod certs;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use certs::{Ca, Leaf};
use frontend::client::{record_batch, Client};
use frontend::tls::{client_config, Tls, TlsFiles};
use frontend::{Config, Server, ServerOptions};
use kafka_protocol::messages::{ApiVersionsRequest, FetchRequest, ProduceRequest};
use kafka_protocol::records::RecordBatchDecoder;
use nvmq_log::LogConfig;
use rcgen::DnType;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

fn base() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

/// Writes the server's certificate and key (and the client CA) into `dir`.
fn files(dir: &Path, server: &Leaf, client_ca: Option<&Ca>) -> TlsFiles {
    TlsFiles {
        cert: certs::write(dir, "server.pem", &server.cert_pem),
        key: certs::write(dir, "server.key", &server.key_pem),
        client_ca: client_ca.map(|ca| certs::write(dir, "client-ca.pem", &ca.pem())),
    }
}

fn serve_tls(tls: Tls, cfg: Config) -> Server {
    let dev = common::sim_device(7, 128 << 20, 200).0;
    let opts = ServerOptions {
        loops: 2,
        tls: Some(tls),
        ..ServerOptions::default()
    };
    common::serve_devices_opts(vec![dev], LogConfig::default(), cfg, opts)
}

/// A client trusting `ca`, presenting `identity` when given.
fn trusting(ca: &Ca, identity: Option<&Leaf>) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(CertificateDer::from(ca.der())).expect("root");
    let identity = identity.map(|l| {
        let key = PrivateKeyDer::from_pem_slice(l.key_pem.as_bytes()).expect("key");
        (vec![CertificateDer::from(l.der.clone())], key)
    });
    client_config(roots, identity).expect("client config")
}

async fn connect(server: &Server, config: Arc<ClientConfig>) -> std::io::Result<Client> {
    let name = ServerName::try_from("localhost").expect("name");
    Client::connect_tls(server.local_addr(), "tls-test", config, name).await
}

/// A request the broker answers from any client.
async fn api_versions(c: &mut Client) -> std::io::Result<i16> {
    c.call(3, &ApiVersionsRequest::default())
        .await
        .map(|r| r.error_code)
}

async fn produce(c: &mut Client, t: &str, value: &[u8]) -> i64 {
    let r: kafka_protocol::messages::ProduceResponse = c
        .call::<ProduceRequest>(
            7,
            &common::produce_request(t, 0, record_batch(&[value], None), -1),
        )
        .await
        .expect("produce");
    let p = &r.responses[0].partition_responses[0];
    assert_eq!(p.error_code, 0, "produce to {t}");
    p.base_offset
}

/// The record values of partition 0 of `t` from offset 0.
async fn values(c: &mut Client, t: &str) -> Vec<Vec<u8>> {
    let f = c
        .call::<FetchRequest>(11, &common::fetch_request(t, 0))
        .await
        .expect("fetch");
    let p = &f.responses[0].partitions[0];
    assert_eq!(p.error_code, 0);
    let mut recs = p.records.clone().unwrap_or_default();
    RecordBatchDecoder::decode_all(&mut recs)
        .expect("batches")
        .into_iter()
        .flat_map(|set| set.records)
        .map(|r| r.value.map(|v| v.to_vec()).unwrap_or_default())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_and_fetch_over_tls() {
    let dir = certs::dir(&base(), "roundtrip");
    let ca = Ca::new("nvmq test CA");
    let tls = Tls::load(files(&dir, &ca.server(false), None)).expect("load");
    let server = serve_tls(tls, Config::default());
    let mut c = connect(&server, trusting(&ca, None))
        .await
        .expect("connect");
    common::create_topic(&mut c, "secure").await;
    // Larger than one TLS record (16 KiB) and than rustls's buffer, both ways.
    let big = vec![0x5au8; 200 << 10];
    assert_eq!(produce(&mut c, "secure", b"first").await, 0);
    assert_eq!(produce(&mut c, "secure", &big).await, 1);
    assert_eq!(values(&mut c, "secure").await, vec![b"first".to_vec(), big]);

    // Plain Kafka to the TLS port gets no answer: the connection closes.
    let mut plain = Client::connect(server.local_addr(), "plain")
        .await
        .expect("tcp");
    assert!(api_versions(&mut plain).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_and_expired_certificates_fail_the_handshake() {
    let dir = certs::dir(&base(), "untrusted");
    let ca = Ca::new("nvmq test CA");
    let tls = Tls::load(files(&dir, &ca.server(false), None)).expect("load");
    let server = serve_tls(tls, Config::default());
    let other = Ca::new("someone else");
    let e = connect(&server, trusting(&other, None))
        .await
        .err()
        .expect("a client not trusting the server's CA connected");
    assert!(e.to_string().contains("UnknownIssuer"), "{e}");
    // The broker serves the next client as before.
    let mut c = connect(&server, trusting(&ca, None))
        .await
        .expect("connect");
    assert_eq!(api_versions(&mut c).await.expect("api versions"), 0);

    let dir = certs::dir(&base(), "expired");
    let tls = Tls::load(files(&dir, &ca.server(true), None)).expect("load");
    let expired = serve_tls(tls, Config::default());
    let e = connect(&expired, trusting(&ca, None))
        .await
        .err()
        .expect("a client accepted an expired certificate");
    assert!(e.to_string().contains("certificate expired"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_refuses_clients_without_a_trusted_certificate() {
    let dir = certs::dir(&base(), "mtls");
    let ca = Ca::new("nvmq test CA");
    let clients = Ca::new("client CA");
    let tls = Tls::load(files(&dir, &ca.server(false), Some(&clients))).expect("load");
    assert!(tls.requires_client_cert());
    let server = serve_tls(tls, Config::default());

    // Under TLS 1.3 the client finishes first; the server's refusal comes as an alert.
    let refused = |r: std::io::Result<i16>| match r {
        Ok(code) => panic!("answered ({code}) without a trusted client certificate"),
        Err(e) => e.to_string(),
    };
    let anonymous = async {
        let mut c = connect(&server, trusting(&ca, None)).await?;
        api_versions(&mut c).await
    };
    let e = refused(anonymous.await);
    assert!(e.contains("CertificateRequired"), "{e}");

    let stranger = Ca::new("stranger CA").client(&[(DnType::CommonName, "mallory")]);
    let untrusted = async {
        let mut c = connect(&server, trusting(&ca, Some(&stranger))).await?;
        api_versions(&mut c).await
    };
    let e = refused(untrusted.await);
    assert!(
        e.contains("UnknownCA") || e.contains("BadCertificate"),
        "{e}"
    );

    let alice = clients.client(&[(DnType::CommonName, "alice")]);
    let mut c = connect(&server, trusting(&ca, Some(&alice)))
        .await
        .expect("connect");
    common::create_topic(&mut c, "mtls").await;
    assert_eq!(produce(&mut c, "mtls", b"from alice").await, 0);
    assert_eq!(values(&mut c, "mtls").await, vec![b"from alice".to_vec()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_serves_new_connections_the_new_certificate() {
    let dir = certs::dir(&base(), "reload");
    let old_ca = Ca::new("old CA");
    let new_ca = Ca::new("new CA");
    let files = files(&dir, &old_ca.server(false), None);
    let tls = Tls::load(files.clone()).expect("load");
    let server = serve_tls(tls.clone(), Config::default());
    let mut before = connect(&server, trusting(&old_ca, None))
        .await
        .expect("old");
    assert!(connect(&server, trusting(&new_ca, None)).await.is_err());

    let renewed = new_ca.server(false);
    std::fs::write(&files.cert, &renewed.cert_pem).expect("write");
    std::fs::write(&files.key, &renewed.key_pem).expect("write");
    tls.reload().expect("reload");
    let mut after = connect(&server, trusting(&new_ca, None))
        .await
        .expect("new");
    assert_eq!(api_versions(&mut after).await.expect("new conn"), 0);
    assert!(connect(&server, trusting(&old_ca, None)).await.is_err());
    // The connection opened before keeps its session.
    assert_eq!(api_versions(&mut before).await.expect("old conn"), 0);

    // A reload that fails (a key that is not the certificate's) names the file and keeps the
    // settings in use.
    let stray = rcgen::KeyPair::generate().expect("key").serialize_pem();
    std::fs::write(&files.key, stray).expect("write");
    let e = tls
        .reload()
        .expect_err("a mismatched key was taken")
        .to_string();
    assert!(e.contains(&files.key.display().to_string()), "{e}");
    let mut still = connect(&server, trusting(&new_ca, None))
        .await
        .expect("kept");
    assert_eq!(api_versions(&mut still).await.expect("kept conn"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_its_handshake_gives_its_slot_back() {
    let dir = certs::dir(&base(), "stall");
    let ca = Ca::new("nvmq test CA");
    let timeout = Duration::from_secs(2);
    let tls = Tls::load_with_timeout(files(&dir, &ca.server(false), None), timeout).expect("load");
    let cfg = Config {
        max_connections: 1,
        ..Config::default()
    };
    let server = serve_tls(tls, cfg);
    // Connects and sends nothing: it holds the one slot while it handshakes.
    let silent = tokio::net::TcpStream::connect(server.local_addr())
        .await
        .expect("tcp");
    wait_for(
        || server.connections().0 == 1,
        "the silent connection to count",
    )
    .await;
    // Once its handshake times out the slot is free again, while it still has its socket open.
    wait_for(
        || server.connections().0 == 0,
        "the silent connection to be closed",
    )
    .await;
    let mut c = connect(&server, trusting(&ca, None))
        .await
        .expect("connect");
    assert_eq!(api_versions(&mut c).await.expect("api versions"), 0);
    drop(silent);
}

/// Waits (up to a minute: the machine may be busy) for `cond`.
async fn wait_for(cond: impl Fn() -> bool, what: &str) {
    let until = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < until, "waited a minute for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
