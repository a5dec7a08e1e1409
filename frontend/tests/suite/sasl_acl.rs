//! SASL names the principal the ACLs are checked against: a user who logged in with SCRAM is
//! served what its ACLs allow and refused the rest, on the fast path (Produce) and the admin
//! APIs alike; managing SCRAM users needs Alter on the cluster.

use crate::common;

use common::inproc::*;
use frontend::client::{record_batch, Client};
use frontend::codes::*;
use frontend::sasl::{Mechanism, SaslConfig, ScramCredential, ScramMechanism};
use frontend::session::Principal;
use frontend::Config;
use kafka_protocol::messages::alter_user_scram_credentials_request::ScramCredentialDeletion;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

const SHA512: ScramMechanism = ScramMechanism::Sha512;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scram_user_is_held_to_its_acls() {
    let cfg = Config {
        sasl: SaslConfig {
            mechanisms: vec![Mechanism::Scram(SHA512)],
            session_lifetime: None,
        },
        authorizer: true,
        super_users: vec![Principal::user("admin")],
        ..Config::default()
    };
    let (addr, server) = common::serve(cfg).await;
    let b = server.broker().clone();
    for (user, pw) in [("alice", "alice-pw"), ("admin", "admin-pw")] {
        let c = ScramCredential::new(SHA512, pw.as_bytes(), 4096).unwrap();
        b.set_credential(user, SHA512, c).await.unwrap();
    }
    assert!(b.create_topic("a", 1).await.unwrap());
    assert!(b.create_topic("b", 1).await.unwrap());
    grant(&b, read_write("a", "User:alice")).await;

    let mut alice = Client::connect(addr, "t").await.unwrap();
    let r = alice
        .login_scram(SHA512, "alice", "alice-pw")
        .await
        .unwrap();
    assert_eq!(r.error_code, NONE);
    let produce = |t: &str| common::produce_request(t, 0, record_batch(&[b"v"], None), -1);
    let r = alice.call(8, &produce("a")).await.unwrap();
    assert_eq!(r.responses[0].partition_responses[0].error_code, NONE);
    let r = alice.call(8, &produce("b")).await.unwrap();
    let p = &r.responses[0].partition_responses[0];
    assert_eq!(p.error_code, TOPIC_AUTHORIZATION_FAILED);
    let why = p
        .error_message
        .as_ref()
        .map(|m| m.to_string())
        .unwrap_or_default();
    assert!(why.contains("User:alice"), "{why}");

    // Alice may not manage users; the super user may.
    let mut del = ScramCredentialDeletion::default();
    del.name = StrBytes::from_static_str("alice");
    del.mechanism = SHA512.code();
    let mut alter = AlterUserScramCredentialsRequest::default();
    alter.deletions = vec![del];
    let r = alice.call(0, &alter).await.unwrap();
    assert_eq!(r.results[0].error_code, CLUSTER_AUTHORIZATION_FAILED);
    let r = alice
        .call(0, &DescribeUserScramCredentialsRequest::default())
        .await
        .unwrap();
    assert_eq!(r.error_code, CLUSTER_AUTHORIZATION_FAILED);
    assert!(b.credentials().get("alice", SHA512).is_some());

    let mut admin = Client::connect(addr, "t").await.unwrap();
    admin
        .login_scram(SHA512, "admin", "admin-pw")
        .await
        .unwrap();
    let r = admin.call(8, &produce("b")).await.unwrap();
    assert_eq!(r.responses[0].partition_responses[0].error_code, NONE);
    let r = admin.call(0, &alter).await.unwrap();
    assert_eq!(r.results[0].error_code, NONE);
    assert!(b.credentials().get("alice", SHA512).is_none());
}
