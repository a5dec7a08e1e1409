//! Real Kafka clients nobody here wrote (Debian's kcat on librdkafka 2.0.2, confluent-kafka on
//! librdkafka 2.x, kafka-python 3) against `nvmq serve`. The clients are installed by
//! `tests/clients/setup.sh` (kcat via apt, the Python ones into a venv under target/); the
//! scenarios live in `tests/clients/scenarios.py`.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

fn tmp(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("creating a test directory");
    d
}

/// The tests take turns: each runs a broker and real clients (the librdkafka one builds a C
/// library too), and on a small machine running them side by side only invites timeouts.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// The venv's python, after installing the clients once per test run.
fn python() -> &'static Path {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kafka-clients-venv");
        let st = Command::new("bash")
            .arg(clients_dir().join("setup.sh"))
            .arg(&venv)
            .status()
            .expect("running tests/clients/setup.sh");
        assert!(
            st.success(),
            "installing the Kafka clients failed (tests/clients/setup.sh)"
        );
        venv.join("bin/python")
    })
}

/// A running `nvmq serve`; killed on drop.
struct Server {
    child: Child,
    addr: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    fn start(device: &str) -> Server {
        Server::start_with(device, &[])
    }

    fn start_with(device: &str, extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_nvmq"))
            .args([
                "serve",
                "--device",
                device,
                "--listen",
                "127.0.0.1:0",
                "--size",
                "256M",
            ])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting nvmq serve");
        let out = child.stdout.take().expect("serve's stdout");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if let Some(a) = line.strip_prefix("nvmq serving Kafka on ") {
                        let _ = tx.send(a.split(' ').next().unwrap_or("").to_string());
                    }
                    log.lock().unwrap().push(line);
                }
            });
        }
        let addr = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("nvmq serve did not start: {:?}", log.lock().unwrap()));
        Server { child, addr, log }
    }

    fn sigkill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn sigterm(mut self) {
        // SAFETY-free: signalling our own child by its pid through the kill command.
        let st = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill -TERM");
        assert!(st.success());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                assert!(s.success(), "nvmq serve exited with {s} after SIGTERM");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "nvmq serve did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = self.log.lock().unwrap().clone();
        assert!(
            log.iter().any(|l| l == "nvmq stopped"),
            "no clean stop: {log:?}"
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a scenario to completion; returns its stdout (printed too).
fn scenario(addr: &str, what: &str, args: &[&str]) -> String {
    let text = scenario_quiet(addr, what, args);
    println!("{what}: {text}");
    text
}

fn scenario_quiet(addr: &str, what: &str, args: &[&str]) -> String {
    let out = Command::new(python())
        .arg(clients_dir().join("scenarios.py"))
        .arg(addr)
        .arg(what)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .expect("running scenarios.py");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let last = text.lines().last().unwrap_or("");
    assert!(out.status.success(), "scenario {what} failed: {last}");
    text
}

fn kcat(args: &[&str], input: &[u8]) -> String {
    python(); // kcat comes with the same setup
    let mut child = Command::new("kcat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting kcat");
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().expect("kcat");
    assert!(out.status.success(), "kcat {args:?} failed");
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[test]
fn kcat_produces_with_acks_all_and_consumes_by_offset() {
    let _turn = one_at_a_time();
    let s = Server::start("sim:capacity=256M,flush=500us");
    let input: String = (0..200).map(|i| format!("line-{i}\n")).collect();
    kcat(
        &["-P", "-b", &s.addr, "-t", "kc", "-X", "acks=all"],
        input.as_bytes(),
    );
    let out = kcat(
        &[
            "-C",
            "-b",
            &s.addr,
            "-t",
            "kc",
            "-p",
            "0",
            "-o",
            "beginning",
            "-e",
            "-f",
            "%o %s\n",
        ],
        b"",
    );
    let want: String = (0..200).map(|i| format!("{i} line-{i}\n")).collect();
    assert_eq!(out, want);
    // From an offset in the middle, and the last two by logical offset.
    let out = kcat(
        &[
            "-C", "-b", &s.addr, "-t", "kc", "-p", "0", "-o", "150", "-e", "-f", "%o\n",
        ],
        b"",
    );
    assert_eq!(out.lines().count(), 50);
    assert_eq!(out.lines().next(), Some("150"));
    let out = kcat(
        &[
            "-C", "-b", &s.addr, "-t", "kc", "-p", "0", "-o", "-2", "-e", "-f", "%s\n",
        ],
        b"",
    );
    assert_eq!(out, "line-198\nline-199\n");
}

#[test]
fn confluent_kafka_and_kafka_python_produce_and_consume() {
    let _turn = one_at_a_time();
    let s = Server::start("sim:capacity=256M,flush=500us");
    scenario(&s.addr, "produce_consume", &[]);
    scenario(&s.addr, "kafka_python", &[]);
    scenario(&s.addr, "idempotent", &[]);
    scenario(&s.addr, "compressed", &[]);
}

/// confluent-kafka's AdminClient on topic configs (create with configs, describe, alter,
/// incremental alter, a refused compact), broker configs, delete_records; kafka-python's
/// describe_log_dirs (confluent-kafka has none).
#[test]
fn admin_clients_manage_configs_delete_records_and_describe_log_dirs() {
    let _turn = one_at_a_time();
    let s = Server::start("sim:capacity=256M,flush=500us");
    let out = scenario(&s.addr, "admin_configs", &[]);
    assert!(out.contains("refused: INVALID_CONFIG"), "{out}");
    scenario(&s.addr, "kp_log_dirs", &[]);
}

/// The compression codec (batch attributes' low bits) of the first batch stored in partition 0.
fn stored_codec(addr: &str, topic: &str) -> i16 {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::{BrokerId, FetchRequest, TopicName};
    use kafka_protocol::protocol::StrBytes;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = frontend::client::Client::connect(addr, "check")
            .await
            .unwrap();
        let mut p = FetchPartition::default();
        p.partition_max_bytes = 1 << 20;
        let mut t = FetchTopic::default();
        t.topic = TopicName(StrBytes::from_string(topic.to_string()));
        t.partitions = vec![p];
        let mut r = FetchRequest::default();
        r.replica_id = BrokerId(-1);
        r.max_bytes = 1 << 20;
        r.topics = vec![t];
        let f = c.call(4, &r).await.unwrap();
        let recs = f.responses[0].partitions[0].records.clone().unwrap();
        frontend::batch::header(&recs).unwrap().attributes & 0x07
    })
}

/// Debian's kcat (librdkafka 2.0.2) compresses only when Produce v0 is advertised; its
/// compressed batches are decompressed and checked by the broker like any other.
#[test]
fn kcat_compresses_and_its_batches_pass_the_checks() {
    let _turn = one_at_a_time();
    let s = Server::start("sim:capacity=256M,flush=500us");
    let input: String = (0..300).map(|i| format!("zline-{i}\n")).collect();
    for (codec, id) in [("gzip", 1), ("snappy", 2), ("lz4", 3)] {
        let t = format!("kz-{codec}");
        kcat(
            &["-P", "-b", &s.addr, "-t", &t, "-z", codec, "-X", "acks=all"],
            input.as_bytes(),
        );
        let out = kcat(
            &[
                "-C",
                "-b",
                &s.addr,
                "-t",
                &t,
                "-p",
                "0",
                "-o",
                "beginning",
                "-e",
                "-f",
                "%o %s\n",
            ],
            b"",
        );
        let want: String = (0..300).map(|i| format!("{i} zline-{i}\n")).collect();
        assert_eq!(out, want, "{codec}");
        assert_eq!(
            stored_codec(&s.addr, &t),
            id,
            "kcat did not compress with {codec}"
        );
    }
}

#[test]
fn group_rebalances_when_a_member_leaves_and_offsets_survive_a_restart() {
    let _turn = one_at_a_time();
    let dir = tmp("kafka-group");
    let dev = format!("file:{}", dir.join("nvmq.img").display());
    let s = Server::start(&dev);
    let out = scenario(&s.addr, "group_rebalance", &["grp", "g1"]);
    let committed = out.lines().last().unwrap_or("").to_string();
    assert!(committed.starts_with('{'), "no commits printed: {out}");
    s.sigkill();
    let s = Server::start(&dev);
    let after = scenario(&s.addr, "committed", &["grp", "g1", "4"]);
    assert_eq!(
        after.trim(),
        committed.trim(),
        "committed offsets changed across a SIGKILL"
    );
    s.sigterm();
    let s = Server::start(&dev);
    let again = scenario(&s.addr, "committed", &["grp", "g1", "4"]);
    assert_eq!(
        again.trim(),
        committed.trim(),
        "committed offsets changed across a clean restart"
    );
}

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

/// confluent-kafka negotiates the new maxima: with librdkafka's protocol debug log on, a
/// producer and a group consumer send Produce, Fetch and Metadata at the highest version both
/// sides have (librdkafka 2.16 stops at Produce 10, Fetch 16 and Metadata 13; nvmq serves 13,
/// 18 and 13), flexible ones all, and Fetch by topic id.
#[test]
fn confluent_kafka_negotiates_the_newest_versions() {
    let _turn = one_at_a_time();
    let s = Server::start("sim:capacity=256M,flush=500us");
    let out = scenario(&s.addr, "negotiated", &[]);
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("versions "))
        .expect("the scenario prints the versions it sent");
    let versions = |api: &str| -> i64 {
        let key = format!("\"{api}\": ");
        line.split(&key)
            .nth(1)
            .and_then(|r| r.split([',', '}']).next())
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {api} request in {line}"))
    };
    // Before: Produce 8, Fetch 11, Metadata 8 (nvmq's old maxima).
    assert!(versions("Produce") >= 10, "{line}");
    assert!(versions("Fetch") >= 16, "{line}");
    assert!(versions("Metadata") >= 13, "{line}");
    // Flexible group and offset APIs too (librdkafka's caps: OffsetCommit 9, OffsetFetch 9).
    assert!(versions("OffsetCommit") >= 9, "{line}");
    assert!(versions("OffsetFetch") >= 9, "{line}");
}

/// librdkafka's own integration suite (from the rdkafka-sys crate source), the allow-listed tests
/// in tests/clients/librdkafka.allow. Topics auto-create with 4 partitions, as the suite assumes.
#[test]
fn librdkafka_test_suite_allow_list_passes() {
    let _turn = one_at_a_time();
    python(); // the same setup installs kcat's librdkafka; the suite builds its own
    let s = Server::start_with(
        "sim:capacity=1G,flush=500us",
        &["--default-partitions", "4"],
    );
    let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join("librdkafka");
    let st = Command::new("bash")
        .arg(clients_dir().join("librdkafka.sh"))
        .arg(&work)
        .arg(&s.addr)
        .status()
        .expect("running tests/clients/librdkafka.sh");
    assert!(
        st.success(),
        "librdkafka tests failed (logs under {})",
        work.display()
    );
}

/// xorshift64*: the seed replays the kill moments.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed >> 12;
    *seed ^= *seed << 25;
    *seed ^= *seed >> 27;
    seed.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

#[test]
fn every_acknowledged_message_survives_sigkill_of_the_broker() {
    let _turn = one_at_a_time();
    let seed: u64 = std::env::var("NVMQ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                | 1
        });
    println!("seed {seed} (NVMQ_SEED={seed} replays the kill moments)");
    let mut rng = seed;
    let rounds: usize = std::env::var("NVMQ_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let dir = tmp("kafka-kill");
    let dev = format!("file:{}", dir.join("nvmq.img").display());
    let mut acked: Vec<(String, u64)> = Vec::new();
    for round in 0..rounds {
        let s = Server::start(&dev);
        let mut producer = Command::new(python())
            .arg(clients_dir().join("scenarios.py"))
            .args([s.addr.as_str(), "produce_log", "dur"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting the producer");
        let out = producer.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let reader = {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for l in BufReader::new(out).lines().map_while(Result::ok) {
                    lines.lock().unwrap().push(l);
                }
            })
        };
        let wait = Duration::from_millis(500 + next(&mut rng) % 2500);
        std::thread::sleep(wait);
        s.sigkill();
        // Acks already on their way out of the broker's socket may still arrive: give them a
        // moment, then stop the producer.
        std::thread::sleep(Duration::from_millis(300));
        let _ = producer.kill();
        let _ = producer.wait();
        let _ = reader.join();
        let before = acked.len();
        for l in lines.lock().unwrap().iter() {
            let mut w = l.split(' ');
            if let (Some("ack"), Some(v), Some(o)) = (w.next(), w.next(), w.next()) {
                acked.push((v.to_string(), o.parse().expect("offset")));
            }
        }
        println!(
            "round {round}: killed after {wait:?}, {} acks",
            acked.len() - before
        );
        // The next start recovers; everything acknowledged in any round must be there.
        let s = Server::start(&dev);
        let out = scenario_quiet(&s.addr, "read_values", &["dur"]);
        let mut stored = std::collections::HashMap::new();
        for l in out.lines() {
            let mut w = l.split(' ');
            if let (Some("val"), Some(v), Some(o)) = (w.next(), w.next(), w.next()) {
                stored.insert(o.parse::<u64>().expect("offset"), v.to_string());
            }
        }
        for (v, o) in &acked {
            assert_eq!(
                stored.get(o),
                Some(v),
                "seed {seed}: acknowledged {v} at offset {o} is missing after the kill in round {round}"
            );
        }
        drop(s);
    }
    assert!(
        !acked.is_empty(),
        "seed {seed}: the producer never got an ack"
    );
}

#[path = "../../frontend/tests/common/certs.rs"]
mod certs;

/// A CA, a broker certificate it signed (written as files in `dir`), and the serve flags for it.
fn tls_files(dir: &Path) -> (certs::Ca, Vec<String>) {
    let ca = certs::Ca::new("nvmq test CA");
    let server = ca.server(false);
    let cert = certs::write(dir, "server.pem", &server.cert_pem);
    let key = certs::write(dir, "server.key", &server.key_pem);
    let flags = vec![
        "--tls-cert".to_string(),
        cert.display().to_string(),
        "--tls-key".to_string(),
        key.display().to_string(),
    ];
    (ca, flags)
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn kcat_and_confluent_kafka_over_tls_and_an_untrusting_client_fails() {
    let _turn = one_at_a_time();
    let dir = tmp("kafka-tls");
    let (ca, flags) = tls_files(&dir);
    let ca_file = certs::write(&dir, "ca.pem", &ca.pem())
        .display()
        .to_string();
    let s = Server::start_with("sim:capacity=256M,flush=500us", &strs(&flags));
    let ssl = [
        "-X",
        "security.protocol=SSL",
        "-X",
        &format!("ssl.ca.location={ca_file}"),
    ];
    let input: String = (0..100).map(|i| format!("secret-{i}\n")).collect();
    let produce = [
        &["-P", "-b", &s.addr, "-t", "ktls", "-X", "acks=all"][..],
        &ssl,
    ]
    .concat();
    kcat(&produce, input.as_bytes());
    let consume = [
        &[
            "-C",
            "-b",
            &s.addr,
            "-t",
            "ktls",
            "-p",
            "0",
            "-o",
            "beginning",
            "-e",
            "-f",
            "%o %s\n",
        ][..],
        &ssl,
    ]
    .concat();
    let want: String = (0..100).map(|i| format!("{i} secret-{i}\n")).collect();
    assert_eq!(kcat(&consume, b""), want);

    scenario(&s.addr, "tls", &[&ca_file]);
    let other = certs::write(&dir, "other-ca.pem", &certs::Ca::new("other CA").pem());
    scenario(&s.addr, "tls_untrusted", &[&other.display().to_string()]);
}

#[test]
fn confluent_kafka_presents_a_client_certificate_under_mtls() {
    let _turn = one_at_a_time();
    let dir = tmp("kafka-mtls");
    let (ca, mut flags) = tls_files(&dir);
    let clients = certs::Ca::new("client CA");
    let client_ca = certs::write(&dir, "client-ca.pem", &clients.pem());
    flags.extend([
        "--tls-client-ca".to_string(),
        client_ca.display().to_string(),
    ]);
    let s = Server::start_with("sim:capacity=256M,flush=500us", &strs(&flags));
    let alice = clients.client(&[(rcgen::DnType::CommonName, "alice")]);
    let ca_file = certs::write(&dir, "ca.pem", &ca.pem());
    let cert = certs::write(&dir, "alice.pem", &alice.cert_pem);
    let key = certs::write(&dir, "alice.key", &alice.key_pem);
    let paths: Vec<String> = [ca_file, cert, key]
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    scenario(&s.addr, "tls", &strs(&paths));
}

/// Adds a SASL user offline with `nvmq user add`, the password on stdin.
fn user_add(device: &str, user: &str, mechanism: &str, password: &str) {
    let mut child = common::command(&[
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
    let dir = tmp("kafka-sasl");
    let dev = format!("file:{}", dir.join("log.img").display());
    let run = common::nvmq(&["format", "--device", &dev, "--size", "256M"]);
    assert_eq!(run.code, 0, "{run}");
    user_add(&dev, "alice", "SCRAM-SHA-512", "Alice-Secret-1");
    user_add(&dev, "bob", "SCRAM-SHA-256", "Bob-Secret-2");
    let s = common::serve(&[
        "--device",
        &dev,
        "--listen",
        "127.0.0.1:0",
        "--sasl-mechanisms",
        "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "--log-level",
        "info",
    ]);
    let logins = [
        ("PLAIN", "alice", "Alice-Secret-1"),
        ("SCRAM-SHA-256", "bob", "Bob-Secret-2"),
        ("SCRAM-SHA-512", "alice", "Alice-Secret-1"),
    ];
    let x = |mech: &str, user: &str, pw: &str| {
        [
            "security.protocol=SASL_PLAINTEXT".to_string(),
            format!("sasl.mechanism={mech}"),
            format!("sasl.username={user}"),
            format!("sasl.password={pw}"),
        ]
        .into_iter()
        .flat_map(|v| ["-X".to_string(), v])
        .collect::<Vec<String>>()
    };
    for (mech, user, pw) in logins {
        let topic = format!("kc-{}", mech.to_lowercase());
        let auth = x(mech, user, pw);
        let mut p: Vec<&str> = vec!["-P", "-b", &s.kafka, "-t", &topic, "-X", "acks=all"];
        p.extend(auth.iter().map(String::as_str));
        kcat(&p, b"one\ntwo\nthree\n");
        let mut c: Vec<&str> = vec!["-C", "-b", &s.kafka, "-t", &topic, "-o", "beginning", "-e"];
        c.extend(auth.iter().map(String::as_str));
        assert_eq!(kcat(&c, b""), "one\ntwo\nthree\n", "{mech}");
        scenario(
            &s.kafka,
            "sasl_ok",
            &[mech, user, pw, &format!("ck-{topic}")],
        );
    }
    // kcat with a wrong password: no metadata, a failed run.
    let auth = x("SCRAM-SHA-512", "alice", "Wrong-Secret-3");
    let mut l: Vec<&str> = vec!["-L", "-b", &s.kafka, "-m", "5"];
    l.extend(auth.iter().map(String::as_str));
    let st = Command::new("kcat")
        .args(&l)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(!st.success(), "kcat listed metadata with a wrong password");
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

/// The proof, all layers at once: over SASL_SSL (TLS on the listener, SCRAM-SHA-512
/// inside it) with the authorizer on, kcat and confluent-kafka log in as alice, whose ACLs let her
/// write and read topic a: both produce and read it back; her produce to b fails with
/// TOPIC_AUTHORIZATION_FAILED; a wrong password fails authentication; a client that does not
/// trust the broker's CA fails its handshake. The ACLs are made by the super user through the
/// same listener. Restarted with an expired certificate, the broker is refused by the client.
#[test]
fn sasl_ssl_with_scram_and_acls_for_kcat_and_confluent_kafka() {
    let _turn = one_at_a_time();
    let dir = tmp("kafka-sasl-ssl");
    let dev = format!("file:{}", dir.join("log.img").display());
    let run = common::nvmq(&["format", "--device", &dev, "--size", "256M"]);
    assert_eq!(run.code, 0, "{run}");
    user_add(&dev, "alice", "SCRAM-SHA-512", "Alice-Secret-1");
    user_add(&dev, "admin", "SCRAM-SHA-512", "Admin-Secret-2");
    let (ca, tls) = tls_files(&dir);
    let ca_file = certs::write(&dir, "ca.pem", &ca.pem())
        .display()
        .to_string();
    let mut flags = vec![
        "--device",
        &dev,
        "--listen",
        "127.0.0.1:0",
        "--sasl-mechanisms",
        "SCRAM-SHA-512",
        "--authorizer",
        "--super-users",
        "User:admin",
    ];
    flags.extend(strs(&tls));
    let s = common::serve(&flags);
    scenario(
        &s.kafka,
        "sasl_ssl_setup",
        &["admin", "Admin-Secret-2", &ca_file],
    );
    let auth = |pw: &str, ca: &str| -> Vec<String> {
        [
            "security.protocol=SASL_SSL".to_string(),
            format!("ssl.ca.location={ca}"),
            "sasl.mechanism=SCRAM-SHA-512".to_string(),
            "sasl.username=alice".to_string(),
            format!("sasl.password={pw}"),
        ]
        .into_iter()
        .flat_map(|v| ["-X".to_string(), v])
        .collect()
    };
    scenario(
        &s.kafka,
        "sasl_ssl_denied",
        &["alice", "Alice-Secret-1", &ca_file],
    );
    let ok = auth("Alice-Secret-1", &ca_file);
    let mut p: Vec<&str> = vec!["-P", "-b", &s.kafka, "-t", "a", "-X", "acks=all"];
    p.extend(ok.iter().map(String::as_str));
    kcat(&p, b"one\ntwo\n");
    // After the scenario's 20 records (offsets 0-19).
    let mut c: Vec<&str> = vec!["-C", "-b", &s.kafka, "-t", "a", "-o", "20", "-e"];
    c.extend(ok.iter().map(String::as_str));
    assert_eq!(kcat(&c, b""), "one\ntwo\n");
    scenario(
        &s.kafka,
        "sasl_refused",
        &["SCRAM-SHA-512", "alice", "Wrong-Secret-3", &ca_file],
    );
    // A CA that did not sign the broker's certificate: kcat cannot even list metadata.
    let other = certs::write(&dir, "other-ca.pem", &certs::Ca::new("another CA").pem())
        .display()
        .to_string();
    let untrusted = auth("Alice-Secret-1", &other);
    let mut l: Vec<&str> = vec!["-L", "-b", &s.kafka, "-m", "5"];
    l.extend(untrusted.iter().map(String::as_str));
    let st = Command::new("kcat")
        .args(&l)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(!st.success(), "kcat listed metadata trusting another CA");
    let log = s.stderr();
    for secret in ["Alice-Secret-1", "Admin-Secret-2", "Wrong-Secret-3"] {
        assert!(!log.contains(secret), "serve logged a password: {secret}");
    }
    drop(s);
    // The same broker with a certificate that expired (signed by the CA the client trusts):
    // librdkafka refuses it in the handshake (kcat's OpenSSL reports "certificate verify
    // failed", as for an untrusted one).
    let expired = ca.server(true);
    let cert = certs::write(&dir, "expired.pem", &expired.cert_pem);
    let key = certs::write(&dir, "expired.key", &expired.key_pem);
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let s = common::serve(&[
        "--device",
        &dev,
        "--listen",
        "127.0.0.1:0",
        "--sasl-mechanisms",
        "SCRAM-SHA-512",
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
    ]);
    let mut l: Vec<&str> = vec!["-L", "-b", &s.kafka, "-m", "5"];
    l.extend(ok.iter().map(String::as_str));
    let run = Command::new("kcat").args(&l).output().unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        !run.status.success(),
        "kcat listed metadata from an expired certificate"
    );
    assert!(
        err.contains("certificate verify failed"),
        "kcat said: {err}"
    );
}
