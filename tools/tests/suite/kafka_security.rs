//! TLS, SASL and ACLs with real Kafka clients (Debian's kcat, confluent-kafka, kafka-python)
//! against `nvmq serve`: encrypted and mutually authenticated listeners, PLAIN and SCRAM logins,
//! the authorizer's refusals as the clients report them, and certificates they must refuse. The
//! helpers are shared with `kafka_clients.rs` through `common::clients`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::common::clients::{
    kcat_consume, kcat_produce, kcat_settings, librdkafka_suite, one_at_a_time, scenario, tmp,
    Server,
};

/// ACLs from confluent-kafka's AdminClient (create, describe with ANY and MATCH filters,
/// delete) as a super user; then, on the same device restarted without super users, the ACL
/// they created lets User:ANONYMOUS produce to topic a only: a message to b fails with
/// TOPIC_AUTHORIZATION_FAILED in the delivery report, an idempotent producer is served on Write
/// to a alone (KIP-679), and AdminClient's describe_topics / describe_consumer_groups /
/// describe_cluster with include_authorized_operations report exactly what the ACLs give
/// (KIP-430; the super user is told every cluster operation).
#[test]
fn confluent_kafka_manages_acls_and_a_denied_produce_fails_in_its_delivery_report() {
    let _turn = one_at_a_time();
    let dir = tmp("kafka-acls");
    let dev = format!("file:{}", dir.join("nvmq.img").display());
    let s = Server::start_with(&dev, &["--authorizer", "--super-users", "User:ANONYMOUS"]);
    scenario(&s.addr, "acl_admin", &[]);
    scenario(&s.addr, "acl_setup", &[]);
    s.sigterm();
    let s = Server::start_with(&dev, &["--authorizer"]);
    let out = scenario(&s.addr, "acl_denied", &[]);
    assert!(out.contains("TOPIC_AUTHORIZATION_FAILED"), "{out}");
    scenario(&s.addr, "acl_operations", &[]);
}

/// A CA, a broker certificate it signed (written as files in `dir`), and the serve flags for it.
fn tls_files(dir: &Path) -> (crate::certs::Ca, Vec<String>) {
    let ca = crate::certs::Ca::new("nvmq test CA");
    let flags = tls_flags(dir, "server", &ca.server(false));
    (ca, flags)
}

/// Writes `cert` to `<name>.pem` and `<name>.key` in `dir`: serve's flags for it.
fn tls_flags(dir: &Path, name: &str, cert: &crate::certs::Leaf) -> Vec<String> {
    let pem = crate::certs::write(dir, &format!("{name}.pem"), &cert.cert_pem);
    let key = crate::certs::write(dir, &format!("{name}.key"), &cert.key_pem);
    vec![
        "--tls-cert".to_string(),
        pem.display().to_string(),
        "--tls-key".to_string(),
        key.display().to_string(),
    ]
}

/// kcat's flags to log in as `user` with SASL `mechanism`: over SASL_SSL trusting `ca` when
/// there is one, else over SASL_PLAINTEXT.
fn sasl_flags(mechanism: &str, user: &str, password: &str, ca: Option<&str>) -> Vec<String> {
    let protocol = if ca.is_some() {
        "SASL_SSL"
    } else {
        "SASL_PLAINTEXT"
    };
    let mut settings = vec![format!("security.protocol={protocol}")];
    settings.extend(ca.map(|ca| format!("ssl.ca.location={ca}")));
    settings.extend([
        format!("sasl.mechanism={mechanism}"),
        format!("sasl.username={user}"),
        format!("sasl.password={password}"),
    ]);
    kcat_settings(&settings)
}

/// `nvmq serve` of `device` on an ephemeral port, taking SASL `mechanisms`, with `extra` flags.
fn serve_sasl(device: &str, mechanisms: &str, extra: &[&str]) -> crate::common::Serving {
    let mut flags = vec![
        "--device",
        device,
        "--listen",
        "127.0.0.1:0",
        "--sasl-mechanisms",
        mechanisms,
    ];
    flags.extend(extra);
    crate::common::serve(&flags)
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn kcat_and_confluent_kafka_over_tls_and_an_untrusting_client_fails() {
    let _turn = one_at_a_time();
    let dir = tmp("kafka-tls");
    let (ca, flags) = tls_files(&dir);
    let ca_file = crate::certs::write(&dir, "ca.pem", &ca.pem())
        .display()
        .to_string();
    let s = Server::start_with("sim:capacity=256M,flush=500us", &strs(&flags));
    let ssl = kcat_settings(&[
        "security.protocol=SSL".to_string(),
        format!("ssl.ca.location={ca_file}"),
    ]);
    let input: String = (0..100).map(|i| format!("secret-{i}\n")).collect();
    kcat_produce(&s.addr, "ktls", &ssl, input.as_bytes());
    let want: String = (0..100).map(|i| format!("{i} secret-{i}\n")).collect();
    assert_eq!(
        kcat_consume(&s.addr, "ktls", "beginning", "%o %s\n", &ssl),
        want
    );

    scenario(&s.addr, "tls", &[&ca_file]);
    let other = crate::certs::write(
        &dir,
        "other-ca.pem",
        &crate::certs::Ca::new("other CA").pem(),
    );
    scenario(&s.addr, "tls_untrusted", &[&other.display().to_string()]);
}

#[test]
fn confluent_kafka_presents_a_client_certificate_under_mtls() {
    let _turn = one_at_a_time();
    let dir = tmp("kafka-mtls");
    let (ca, mut flags) = tls_files(&dir);
    let clients = crate::certs::Ca::new("client CA");
    let client_ca = crate::certs::write(&dir, "client-ca.pem", &clients.pem());
    flags.extend([
        "--tls-client-ca".to_string(),
        client_ca.display().to_string(),
    ]);
    let s = Server::start_with("sim:capacity=256M,flush=500us", &strs(&flags));
    let alice = clients.client(&[(rcgen::DnType::CommonName, "alice")]);
    let ca_file = crate::certs::write(&dir, "ca.pem", &ca.pem());
    let cert = crate::certs::write(&dir, "alice.pem", &alice.cert_pem);
    let key = crate::certs::write(&dir, "alice.key", &alice.key_pem);
    let paths: Vec<String> = [ca_file, cert, key]
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    scenario(&s.addr, "tls", &strs(&paths));
}

/// Whether kcat, with these `-X` settings, gets the broker's metadata (its errors go unseen).
/// Runs `kcat -L` that must fail, and gives what it said: the caller checks the reason, so a
/// failure for another cause (a bad flag, no broker) does not pass as the refusal under test.
fn kcat_metadata_refused(addr: &str, settings: &[String]) -> String {
    let run = Command::new("kcat")
        .args(["-L", "-b", addr, "-m", "5"])
        .args(settings)
        .output()
        .expect("running kcat");
    let said = String::from_utf8_lossy(&run.stderr).into_owned();
    assert!(!run.status.success(), "kcat listed metadata: {said}");
    said
}

/// A file device formatted in `dir` with these SASL users (user, mechanism, password) added
/// offline.
fn formatted_with_users(dir: &Path, users: &[(&str, &str, &str)]) -> String {
    let dev = format!("file:{}", dir.join("log.img").display());
    let run = crate::common::nvmq(&["format", "--device", &dev, "--size", "256M"]);
    assert_eq!(run.code, 0, "{run}");
    for (user, mechanism, password) in users {
        user_add(&dev, user, mechanism, password);
    }
    dev
}

/// Adds a SASL user offline with `nvmq user add`, the password on stdin.
fn user_add(device: &str, user: &str, mechanism: &str, password: &str) {
    let mut child = crate::common::command(&[
        "user",
        "add",
        user,
        "--device",
        device,
        "--mechanism",
        mechanism,
    ])
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .spawn()
    .expect("nvmq user add");
    writeln!(child.stdin.take().unwrap(), "{password}").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "nvmq user add {user} failed");
}

/// SASL over plaintext with real clients: kcat and confluent-kafka log in with PLAIN,
/// SCRAM-SHA-256 and SCRAM-SHA-512 and produce and consume; a wrong password and an unknown user
/// fail with an authentication error; confluent-kafka's AdminClient adds a SCRAM user who then
/// logs in. No password ever reaches serve's log.
#[test]
fn sasl_with_kcat_and_confluent_kafka_and_no_secret_in_the_log() {
    let _turn = one_at_a_time();
    let dev = formatted_with_users(
        &tmp("kafka-sasl"),
        &[
            ("alice", "SCRAM-SHA-512", "Alice-Secret-1"),
            ("bob", "SCRAM-SHA-256", "Bob-Secret-2"),
        ],
    );
    let s = serve_sasl(
        &dev,
        "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        &["--log-level", "info"],
    );
    let logins = [
        ("PLAIN", "alice", "Alice-Secret-1"),
        ("SCRAM-SHA-256", "bob", "Bob-Secret-2"),
        ("SCRAM-SHA-512", "alice", "Alice-Secret-1"),
    ];
    for (mech, user, pw) in logins {
        let topic = format!("kc-{}", mech.to_lowercase());
        let auth = sasl_flags(mech, user, pw, None);
        kcat_produce(&s.kafka, &topic, &auth, b"one\ntwo\nthree\n");
        assert_eq!(
            kcat_consume(&s.kafka, &topic, "beginning", "%s\n", &auth),
            "one\ntwo\nthree\n",
            "{mech}"
        );
        scenario(
            &s.kafka,
            "sasl_ok",
            &[mech, user, pw, &format!("ck-{topic}")],
        );
    }
    // kcat with a wrong password: no metadata, a failed run.
    let auth = sasl_flags("SCRAM-SHA-512", "alice", "Wrong-Secret-3", None);
    let said = kcat_metadata_refused(&s.kafka, &auth);
    assert!(said.contains("Authentication failed"), "kcat said: {said}");
    for (mech, user, pw) in [
        ("SCRAM-SHA-512", "alice", "Wrong-Secret-3"),
        ("PLAIN", "bob", "Wrong-Secret-3"),
        ("SCRAM-SHA-256", "nobody", "Bob-Secret-2"),
    ] {
        scenario(&s.kafka, "sasl_refused", &[mech, user, pw]);
    }
    scenario(&s.kafka, "scram_admin", &["alice", "Alice-Secret-1"]);
    assert!(s.stderr_shows(&[
        "SASL authentication failed",
        "SASL authentication succeeded"
    ]));
    let log = s.stderr();
    for secret in [
        "Alice-Secret-1",
        "Bob-Secret-2",
        "Wrong-Secret-3",
        "carol-pw-4",
    ] {
        assert!(!log.contains(secret), "serve logged a password: {secret}");
    }
}

/// A formatted device with SCRAM-SHA-512 users, and a CA-signed broker certificate, for a
/// SASL_SSL broker.
struct SaslSsl {
    dir: PathBuf,
    dev: String,
    ca: crate::certs::Ca,
    ca_file: String,
    tls: Vec<String>,
}

impl SaslSsl {
    /// In target/tmp/`name`, with these (user, password) pairs.
    fn new(name: &str, users: &[(&str, &str)]) -> SaslSsl {
        let dir = tmp(name);
        let users: Vec<(&str, &str, &str)> = users
            .iter()
            .map(|&(user, password)| (user, "SCRAM-SHA-512", password))
            .collect();
        let dev = formatted_with_users(&dir, &users);
        let (ca, tls) = tls_files(&dir);
        let ca_file = crate::certs::write(&dir, "ca.pem", &ca.pem())
            .display()
            .to_string();
        SaslSsl {
            dir,
            dev,
            ca,
            ca_file,
            tls,
        }
    }

    /// `nvmq serve` on it over TLS with SCRAM-SHA-512, and `extra` flags.
    fn serve(&self, extra: &[&str]) -> crate::common::Serving {
        serve_sasl(
            &self.dev,
            "SCRAM-SHA-512",
            &[strs(&self.tls), extra.to_vec()].concat(),
        )
    }
}

/// The proof, all layers at once: over SASL_SSL (TLS on the listener, SCRAM-SHA-512
/// inside it) with the authorizer on, kcat and confluent-kafka log in as alice, whose ACLs let her
/// write and read topic a: both produce and read it back; her produce to b fails with
/// TOPIC_AUTHORIZATION_FAILED; a wrong password fails authentication; a client that does not
/// trust the broker's CA fails its handshake. The ACLs are made by the super user through the
/// same listener. Restarted with an expired certificate, the broker is refused by kcat and by
/// kafka-python, which says the certificate expired.
#[test]
fn sasl_ssl_with_scram_and_acls_for_kcat_and_confluent_kafka() {
    let _turn = one_at_a_time();
    let b = SaslSsl::new(
        "kafka-sasl-ssl",
        &[("alice", "Alice-Secret-1"), ("admin", "Admin-Secret-2")],
    );
    let (dir, dev, ca, ca_file) = (b.dir.as_path(), b.dev.as_str(), &b.ca, b.ca_file.as_str());
    let s = b.serve(&["--authorizer", "--super-users", "User:admin"]);
    scenario(
        &s.kafka,
        "sasl_ssl_setup",
        &["admin", "Admin-Secret-2", ca_file],
    );
    let auth = |pw: &str, ca: &str| sasl_flags("SCRAM-SHA-512", "alice", pw, Some(ca));
    scenario(
        &s.kafka,
        "sasl_ssl_denied",
        &["alice", "Alice-Secret-1", ca_file],
    );
    let ok = auth("Alice-Secret-1", ca_file);
    kcat_produce(&s.kafka, "a", &ok, b"one\ntwo\n");
    // After the scenario's 20 records (offsets 0-19).
    assert_eq!(kcat_consume(&s.kafka, "a", "20", "%s\n", &ok), "one\ntwo\n");
    scenario(
        &s.kafka,
        "sasl_refused",
        &["SCRAM-SHA-512", "alice", "Wrong-Secret-3", ca_file],
    );
    // A CA that did not sign the broker's certificate: kcat cannot even list metadata.
    let other = crate::certs::write(
        dir,
        "other-ca.pem",
        &crate::certs::Ca::new("another CA").pem(),
    )
    .display()
    .to_string();
    let untrusted = auth("Alice-Secret-1", &other);
    let said = kcat_metadata_refused(&s.kafka, &untrusted);
    assert!(
        said.contains("certificate verify failed"),
        "kcat said: {said}"
    );
    let log = s.stderr();
    for secret in ["Alice-Secret-1", "Admin-Secret-2", "Wrong-Secret-3"] {
        assert!(!log.contains(secret), "serve logged a password: {secret}");
    }
    drop(s);
    // The same broker with a certificate that expired (signed by the CA the client trusts):
    // both clients refuse it in the handshake. kcat's librdkafka reports only "certificate
    // verify failed", as for an untrusted one; kafka-python's ssl module names the reason.
    let expired = tls_flags(dir, "expired", &ca.server(true));
    let s = serve_sasl(dev, "SCRAM-SHA-512", &strs(&expired));
    let err = kcat_metadata_refused(&s.kafka, &ok);
    assert!(
        err.contains("certificate verify failed"),
        "kcat said: {err}"
    );
    let said = scenario(
        &s.kafka,
        "kp_expired",
        &["alice", "Alice-Secret-1", ca_file],
    );
    assert!(said.contains("expired"), "kafka-python said: {said}");
}

/// librdkafka's own test suite over SASL_SSL: the allow-listed tests marked `sasl_ssl` run with
/// the suite's clients logging in with SCRAM-SHA-512 over TLS (trusting the test CA), against a
/// broker that serves only that, with topics auto-created with 4 partitions as the suite assumes.
/// The clients also get a key and certificate, which the suite's SSL test loads in every
/// encoding; the broker asks for none (SASL authenticates), as Kafka's SASL_SSL listeners.
#[test]
fn librdkafka_test_suite_over_sasl_ssl() {
    let _turn = one_at_a_time();
    let b = SaslSsl::new("kafka-rdk-sasl-ssl", &[("suite", "Suite-Secret-1")]);
    let (dir, ca, ca_file) = (b.dir.as_path(), &b.ca, b.ca_file.as_str());
    let s = b.serve(&["--default-partitions", "4"]);
    let client = ca.client(&[(rcgen::DnType::CommonName, "suite")]);
    let cert = crate::certs::write(dir, "client.pem", &client.cert_pem);
    let key = crate::certs::write(dir, "client.key", &client.key_pem);
    let conf = [
        "security.protocol=SASL_SSL".to_string(),
        format!("ssl.ca.location={ca_file}"),
        format!("ssl.certificate.location={}", cert.display()),
        format!("ssl.key.location={}", key.display()),
        "sasl.mechanism=SCRAM-SHA-512".to_string(),
        "sasl.username=suite".to_string(),
        "sasl.password=Suite-Secret-1".to_string(),
    ];
    let mut args = vec!["--broker", "sasl_ssl"];
    for c in &conf {
        args.extend(["--conf", c.as_str()]);
    }
    librdkafka_suite(&s.kafka, &args);
}
