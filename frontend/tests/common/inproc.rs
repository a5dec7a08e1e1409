//! Requests started in process on a broker as a given principal (the seam TLS and SASL fill in
//! on a real connection), and ACL bindings made without the API.

use std::sync::Arc;

use bytes::{Buf, Bytes};
use frontend::acl::{Binding, Wire};
use frontend::conn::{self, Outcome};
use frontend::session::{Identity, Principal, Session};
use frontend::Broker;
use kafka_protocol::messages::{ApiKey, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Request};

/// A broker config with the authorizer on and `User:admin` its super user.
pub fn authorizing() -> frontend::Config {
    frontend::Config {
        authorizer: true,
        super_users: vec![Principal::user("admin")],
        ..frontend::Config::default()
    }
}

/// A connection of `User:<name>` from 10.0.0.1.
pub fn session(name: &str) -> Arc<Session> {
    let s = Session::new(Some("10.0.0.1:40000".parse().expect("addr")));
    *s.identity() = Identity {
        principal: Principal::user(name),
        authenticated: true,
    };
    s
}

/// Serves `req` at `version` as `s`'s connection would and decodes the answer.
pub async fn call<R: Request>(b: &Arc<Broker>, s: &Arc<Session>, v: i16, req: &R) -> R::Response {
    let f = frontend::client::request_frame(v, req, 1, "inproc").expect("frame");
    let reply = conn::start(b, s, Bytes::from(f).slice(4..))
        .await
        .expect("request started");
    let Outcome::Send(mut out) = reply.await else {
        panic!("no answer to {} v{v}", R::KEY);
    };
    out.advance(4);
    let key = ApiKey::try_from(R::KEY).expect("key");
    ResponseHeader::decode(&mut out, key.response_header_version(v)).expect("header");
    let r = R::Response::decode(&mut out, v).expect("body");
    assert!(!out.has_remaining(), "bytes left after the answer");
    r
}

/// A binding: `who` (`User:x`) from any host, `perm` "allow"/"deny".
pub fn binding(rt: i8, name: &str, pattern: i8, who: &str, op: i8, perm: &str) -> Binding {
    Binding::from_wire(Wire {
        resource_type: rt,
        name,
        pattern_type: pattern,
        principal: who,
        host: "*",
        op,
        permission: if perm == "deny" { 2 } else { 3 },
    })
    .expect("binding")
}

/// Read and Write on topic `t` for `who`.
pub fn read_write(t: &str, who: &str) -> Vec<Binding> {
    vec![
        binding(TOPIC, t, LITERAL, who, WRITE, "allow"),
        binding(TOPIC, t, LITERAL, who, READ, "allow"),
    ]
}

/// Adds bindings durably straight through the authorizer.
pub async fn grant(b: &Arc<Broker>, bindings: Vec<Binding>) {
    for r in b.acl().add(b, bindings).await {
        r.expect("recorded");
    }
}

// Kafka's codes.
pub const TOPIC: i8 = 2;
pub const GROUP: i8 = 3;
pub const CLUSTER: i8 = 4;
pub const LITERAL: i8 = 3;
pub const PREFIXED: i8 = 4;
pub const ALL: i8 = 2;
pub const READ: i8 = 3;
pub const WRITE: i8 = 4;
pub const CREATE: i8 = 5;
pub const ALTER: i8 = 7;
pub const DESCRIBE: i8 = 8;
pub const IDEMPOTENT_WRITE: i8 = 12;
