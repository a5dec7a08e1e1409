//! SASL against the in-process broker: the gate before authentication, PLAIN and SCRAM logins,
//! failures answered with SASL_AUTHENTICATION_FAILED and the connection closed, sessions that
//! expire unless re-authenticated, SaslHandshake v0's bare tokens, and the SCRAM admin APIs.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use frontend::client::{record_batch, Client};
use frontend::sasl::{Mechanism, SaslConfig, ScramCredential, ScramMechanism};
use frontend::{Config, Server};
use kafka_protocol::messages::alter_user_scram_credentials_request::{
    ScramCredentialDeletion, ScramCredentialUpsertion,
};
use kafka_protocol::messages::describe_user_scram_credentials_request::UserName;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

const SHA256: ScramMechanism = ScramMechanism::Sha256;
const SHA512: ScramMechanism = ScramMechanism::Sha512;

/// A broker requiring SASL (every mechanism) with users alice (SCRAM-SHA-512, "alice-pw") and
/// bob (SCRAM-SHA-256, "bob-pw").
async fn serve(lifetime: Option<Duration>) -> (SocketAddr, Server) {
    let cfg = Config {
        sasl: SaslConfig {
            mechanisms: vec![
                Mechanism::Plain,
                Mechanism::Scram(SHA256),
                Mechanism::Scram(SHA512),
            ],
            session_lifetime: lifetime,
        },
        ..Config::default()
    };
    let (addr, s) = common::serve(cfg).await;
    let b = s.broker();
    let alice = ScramCredential::new(SHA512, b"alice-pw", 4096).unwrap();
    b.set_credential("alice", SHA512, alice).await.unwrap();
    let bob = ScramCredential::new(SHA256, b"bob-pw", 4096).unwrap();
    b.set_credential("bob", SHA256, bob).await.unwrap();
    (addr, s)
}

fn metadata() -> MetadataRequest {
    MetadataRequest::default()
}

/// Whether the connection was closed: the next read ends (within 10 s) without an answer.
async fn closed(c: &mut Client) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(10), c.recv_raw()).await,
        Ok(Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_api_versions_and_sasl_pass_before_authentication() {
    let (addr, _s) = serve(None).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    let v = c.call(3, &ApiVersionsRequest::default()).await.unwrap();
    assert_eq!(v.error_code, 0);
    let has = |k: ApiKey| v.api_keys.iter().any(|a| a.api_key == k as i16);
    assert!(has(ApiKey::SaslHandshake) && has(ApiKey::SaslAuthenticate));
    c.send(1, &metadata()).await.unwrap();
    assert!(
        closed(&mut c).await,
        "Metadata before authenticating was served"
    );
    // Produce takes the fast path: gated as well.
    let mut c = Client::connect(addr, "t").await.unwrap();
    let batch = record_batch(&[b"x"], None);
    c.send(7, &common::produce_request("t", 0, batch, -1))
        .await
        .unwrap();
    assert!(
        closed(&mut c).await,
        "Produce before authenticating was served"
    );
}

/// A new connection logged in with PLAIN (`m` None) or SCRAM, and the last SASL answer.
async fn login(
    addr: SocketAddr,
    m: Option<ScramMechanism>,
    user: &str,
    password: &str,
) -> (Client, SaslAuthenticateResponse) {
    let mut c = Client::connect(addr, "t").await.unwrap();
    let r = match m {
        None => c.login_plain(user, password).await,
        Some(m) => c.login_scram(m, user, password).await,
    };
    (c, r.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_scram_log_in_and_are_then_served() {
    let (addr, _s) = serve(None).await;
    for (m, user, pw) in [
        (None, "alice", "alice-pw"),
        (None, "bob", "bob-pw"),
        (Some(SHA512), "alice", "alice-pw"),
        (Some(SHA256), "bob", "bob-pw"),
    ] {
        let (mut c, r) = login(addr, m, user, pw).await;
        let how = format!("{m:?} {user}");
        assert_eq!(
            (r.error_code, r.session_lifetime_ms),
            (0, 0),
            "{how}: {r:?}"
        );
        let md = c.call(1, &metadata()).await.unwrap();
        assert_eq!(md.brokers.len(), 1, "{how}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_passwords_and_unknown_users_fail_and_close_the_connection() {
    let (addr, _s) = serve(None).await;
    for (m, user, pw) in [
        (None, "alice", "bob-pw"),
        (None, "mallory", "alice-pw"),
        (Some(SHA512), "alice", "alice-pw2"),
        (Some(SHA512), "mallory", "x"),
        // alice has no SCRAM-SHA-256 credential.
        (Some(SHA256), "alice", "alice-pw"),
    ] {
        let (mut c, r) = login(addr, m, user, pw).await;
        let how = format!("{m:?} {user} {pw}");
        assert_eq!(r.error_code, 58, "{how}: {r:?}");
        let msg = r.error_message.map(|m| m.to_string()).unwrap_or_default();
        assert!(msg.contains("invalid credentials"), "{how}: {msg}");
        assert!(closed(&mut c).await, "{how}: the connection stayed open");
    }
    // A mechanism not offered: refused with the list, then closed.
    let mut c = Client::connect(addr, "t").await.unwrap();
    let mut h = SaslHandshakeRequest::default();
    h.mechanism = StrBytes::from_static_str("GSSAPI");
    let r = c.call(1, &h).await.unwrap();
    assert_eq!(r.error_code, 33);
    let offered: Vec<String> = r.mechanisms.iter().map(|m| m.to_string()).collect();
    assert_eq!(offered, ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]);
    assert!(closed(&mut c).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_sessions_close_unless_the_client_re_authenticated() {
    let (addr, _s) = serve(Some(Duration::from_secs(3))).await;
    let mut c = Client::connect(addr, "t").await.unwrap();
    let r = c.login_scram(SHA512, "alice", "alice-pw").await.unwrap();
    assert_eq!((r.error_code, r.session_lifetime_ms), (0, 3000));
    // Re-authenticated 2 s in, so 4 s in (past the first session) it is still served.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let r = c.login_plain("alice", "alice-pw").await.unwrap();
    assert_eq!(r.error_code, 0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.call(1, &metadata()).await.unwrap();
    // Re-authenticating as someone else is refused.
    let mut other = Client::connect(addr, "t").await.unwrap();
    other.login_plain("alice", "alice-pw").await.unwrap();
    let r = other.login_plain("bob", "bob-pw").await.unwrap();
    assert_eq!(r.error_code, 58);
    assert!(closed(&mut other).await);
    // Past the second session's end: closed at the next request.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    c.send(1, &metadata()).await.unwrap();
    assert!(
        closed(&mut c).await,
        "a request after the session expired was served"
    );
}

/// SaslHandshake v0: the tokens follow bare, framed by their length only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_v0_takes_bare_tokens() {
    let (addr, _s) = serve(None).await;
    for (password, ok) in [("alice-pw", true), ("nope", false)] {
        let mut c = Client::connect(addr, "t").await.unwrap();
        let mut h = SaslHandshakeRequest::default();
        h.mechanism = StrBytes::from_static_str("PLAIN");
        assert_eq!(c.call(0, &h).await.unwrap().error_code, 0);
        let token = format!("\0alice\0{password}");
        let mut frame = (token.len() as i32).to_be_bytes().to_vec();
        frame.extend(token.as_bytes());
        c.send_raw(&frame).await.unwrap();
        if ok {
            assert!(
                c.recv_raw().await.unwrap().is_empty(),
                "PLAIN's empty answer"
            );
            c.call(1, &metadata()).await.unwrap();
        } else {
            assert!(
                closed(&mut c).await,
                "a wrong bare PLAIN token was not refused"
            );
        }
    }
}

fn upsert(
    user: &str,
    m: ScramMechanism,
    password: &str,
    iterations: i32,
) -> ScramCredentialUpsertion {
    let salt = b"0123456789abcdef".to_vec();
    let mut u = ScramCredentialUpsertion::default();
    u.name = StrBytes::from_string(user.into());
    u.mechanism = m.code();
    u.iterations = iterations;
    u.salted_password = m
        .salted_password(password.as_bytes(), &salt, iterations.max(1) as u32)
        .into();
    u.salt = salt.into();
    u
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_users_are_managed_with_the_admin_apis() {
    let (addr, _s) = serve(None).await;
    let mut admin = Client::connect(addr, "t").await.unwrap();
    admin
        .login_scram(SHA512, "alice", "alice-pw")
        .await
        .unwrap();
    let mut alter = AlterUserScramCredentialsRequest::default();
    alter.upsertions = vec![
        upsert("carol", SHA256, "carol-pw", 8192),
        upsert("dan", SHA512, "x", 10),
        upsert("eve", SHA512, "x", 4096),
        upsert("eve", SHA256, "x", 4096),
    ];
    let r = admin.call(0, &alter).await.unwrap();
    let codes: Vec<(String, i16)> = r
        .results
        .iter()
        .map(|r| (r.user.to_string(), r.error_code))
        .collect();
    // dan: too few iterations; eve named twice.
    assert_eq!(
        codes,
        [
            ("carol".into(), 0),
            ("dan".into(), 93),
            ("eve".into(), 92),
            ("eve".into(), 92)
        ]
    );
    let mut d = DescribeUserScramCredentialsRequest::default();
    d.users = None;
    let all = admin.call(0, &d).await.unwrap();
    let listed: Vec<(String, i8, i32)> = all
        .results
        .iter()
        .flat_map(|r| {
            r.credential_infos
                .iter()
                .map(|i| (r.user.to_string(), i.mechanism, i.iterations))
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("alice".into(), 2, 4096),
            ("bob".into(), 1, 4096),
            ("carol".into(), 1, 8192)
        ]
    );
    // The new user logs in.
    let mut c = Client::connect(addr, "t").await.unwrap();
    assert_eq!(
        c.login_scram(SHA256, "carol", "carol-pw")
            .await
            .unwrap()
            .error_code,
        0
    );
    // Deleted, then unknown to Describe and to logins.
    let mut del = ScramCredentialDeletion::default();
    del.name = StrBytes::from_static_str("carol");
    del.mechanism = SHA256.code();
    let mut alter = AlterUserScramCredentialsRequest::default();
    alter.deletions = vec![del.clone()];
    assert_eq!(
        admin.call(0, &alter).await.unwrap().results[0].error_code,
        0
    );
    let r = admin.call(0, &alter).await.unwrap();
    assert_eq!(r.results[0].error_code, 91, "deleting what is not there");
    let mut u = UserName::default();
    u.name = StrBytes::from_static_str("carol");
    d.users = Some(vec![u]);
    assert_eq!(admin.call(0, &d).await.unwrap().results[0].error_code, 91);
    let mut c = Client::connect(addr, "t").await.unwrap();
    assert_eq!(
        c.login_scram(SHA256, "carol", "carol-pw")
            .await
            .unwrap()
            .error_code,
        58
    );
}
