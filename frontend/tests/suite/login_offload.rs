//! A PLAIN login's password derivation (PBKDF2) runs on the check pool, not on the event loop:
//! while logins are held at the pool's gate, another connection of the same (only) loop is
//! served, and the held logins are answered once released.

use crate::common;

use common::{until, within};

use frontend::client::Client;
use frontend::codes::{NONE, SASL_AUTHENTICATION_FAILED};
use frontend::sasl::{Mechanism, SaslConfig, ScramCredential, ScramMechanism};
use frontend::{CheckGate, Config, ServerOptions};
use kafka_protocol::messages::{
    ApiVersionsRequest, MetadataRequest, SaslAuthenticateRequest, SaslHandshakeRequest,
};
use kafka_protocol::protocol::StrBytes;

/// Releases the gate when the test ends, passing or not: the pool's threads must not stay held.
struct Released(CheckGate);

impl Drop for Released {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// A connection that chose PLAIN and sent its token (user `user`, password `pw`), not yet
/// answered: (the client, the SaslAuthenticate's correlation id).
async fn plain_sent(addr: std::net::SocketAddr, user: &str, pw: &str) -> (Client, i32) {
    let mut c = Client::connect(addr, "login").await.unwrap();
    let mut h = SaslHandshakeRequest::default();
    h.mechanism = StrBytes::from_static_str("PLAIN");
    assert_eq!(c.call(1, &h).await.unwrap().error_code, NONE);
    let mut a = SaslAuthenticateRequest::default();
    a.auth_bytes = format!("\0{user}\0{pw}").into_bytes().into();
    let id = c.send(2, &a).await.unwrap();
    (c, id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_connections_are_served_while_plain_logins_are_checked() {
    let gate = CheckGate::default();
    let _released = Released(gate.clone());
    let (dev, _) = common::sim_device(23, 64 << 20, 200);
    let cfg = Config {
        sasl: SaslConfig {
            mechanisms: vec![Mechanism::Plain],
            session_lifetime: None,
        },
        ..Config::default()
    };
    let opts = ServerOptions {
        loops: 1,
        check_gate: Some(gate.clone()),
        ..ServerOptions::default()
    };
    let s = common::serve_devices_opts(vec![dev], Default::default(), cfg, opts);
    let m = ScramMechanism::Sha512;
    let cred = ScramCredential::new(m, b"alice-pw", 4096).unwrap();
    s.broker().set_credential("alice", m, cred).await.unwrap();
    let addr = s.local_addr();

    gate.hold();
    let (mut good, good_id) = plain_sent(addr, "alice", "alice-pw").await;
    let (mut bad, bad_id) = plain_sent(addr, "alice", "wrong").await;
    until("the PLAIN checks never reached the pool's gate", || {
        gate.waiting() == 2
    })
    .await;

    // The loop serves another connection meanwhile (it would not if it were deriving).
    let mut other = Client::connect(addr, "other").await.unwrap();
    let v = within(
        "another connection got no answer while logins were checked: the loop is blocked",
        other.call(3, &ApiVersionsRequest::default()),
    )
    .await
    .unwrap();
    assert_eq!(v.error_code, NONE);
    // Neither login was decided: both checks are still held.
    assert_eq!(gate.waiting(), 2);

    gate.release();
    let (id, r) = within(
        "no answer to the held login",
        good.recv::<SaslAuthenticateRequest>(2),
    )
    .await
    .unwrap();
    assert_eq!((id, r.error_code), (good_id, NONE), "{:?}", r.error_message);
    let (id, r) = within(
        "no answer to the wrong password",
        bad.recv::<SaslAuthenticateRequest>(2),
    )
    .await
    .unwrap();
    assert_eq!((id, r.error_code), (bad_id, SASL_AUTHENTICATION_FAILED));
    // The good login is admitted: it is served what needs authentication.
    let md = within(
        "no Metadata answer after logging in",
        good.call(12, &MetadataRequest::default()),
    )
    .await
    .unwrap();
    assert!(md.brokers.len() == 1);
}
