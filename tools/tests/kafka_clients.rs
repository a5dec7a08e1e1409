//! Real Kafka clients nobody here wrote (Debian's kcat on librdkafka 2.0.2, confluent-kafka on
//! librdkafka 2.x, kafka-python 3) against `nvmq serve`. The clients are installed by
//! `tests/clients/setup.sh` (kcat via apt, the Python ones into a venv under target/); the
//! scenarios live in `tests/clients/scenarios.py`.

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
