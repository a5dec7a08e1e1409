//! Real Kafka clients nobody here wrote (Debian's kcat on librdkafka 2.0.2, confluent-kafka on
//! librdkafka 2.x, kafka-python 3) against `nvmq serve`: produce, consume, groups, admin, and
//! librdkafka's own test suite. The clients are installed by `tests/clients/setup.sh` (kcat via
//! apt, the Python ones into a venv under target/); the scenarios live in
//! `tests/clients/scenarios.py`. TLS, SASL and ACLs are in `kafka_security.rs`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::clients::{
    clients_dir, kcat_consume, kcat_produce, librdkafka_suite, one_at_a_time, python, scenario,
    scenario_quiet, tmp, Server,
};

#[test]
fn kcat_produces_with_acks_all_and_consumes_by_offset() {
    let _turn = one_at_a_time();
    let s = Server::start("sim:capacity=256M,flush=500us");
    let input: String = (0..200).map(|i| format!("line-{i}\n")).collect();
    kcat_produce(&s.addr, "kc", &[], input.as_bytes());
    let out = kcat_consume(&s.addr, "kc", "beginning", "%o %s\n", &[]);
    let want: String = (0..200).map(|i| format!("{i} line-{i}\n")).collect();
    assert_eq!(out, want);
    // From an offset in the middle, and the last two by logical offset.
    let out = kcat_consume(&s.addr, "kc", "150", "%o\n", &[]);
    assert_eq!(out.lines().count(), 50);
    assert_eq!(out.lines().next(), Some("150"));
    let out = kcat_consume(&s.addr, "kc", "-2", "%s\n", &[]);
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
        let z = ["-z".to_string(), codec.to_string()];
        kcat_produce(&s.addr, &t, &z, input.as_bytes());
        let out = kcat_consume(&s.addr, &t, "beginning", "%o %s\n", &[]);
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
/// in tests/clients/librdkafka.allow: the quick ones, those that do something only in full mode,
/// and those that put librdkafka's socket emulator between client and broker. Topics
/// auto-create with 4 partitions, as the suite assumes.
#[test]
fn librdkafka_test_suite_allow_list_passes() {
    let _turn = one_at_a_time();
    let s = Server::start_with(
        "sim:capacity=1G,flush=500us",
        &["--default-partitions", "4"],
    );
    librdkafka_suite(&s.addr, &[]);
    librdkafka_suite(&s.addr, &["--broker", "full"]);
    librdkafka_suite(&s.addr, &["--broker", "sockem"]);
}

/// The allow-list's "delayed" tests against a broker that holds a new group's first rebalance
/// for Kafka's default 3 s (`--group-initial-rebalance-delay`): 0102's two static members join
/// a new group a few ms apart and expect one rebalance between them.
#[test]
fn librdkafka_group_tests_with_an_initial_rebalance_delay() {
    let _turn = one_at_a_time();
    let s = Server::start_with(
        "sim:capacity=1G,flush=500us",
        &[
            "--default-partitions",
            "4",
            "--group-initial-rebalance-delay",
            "3s",
        ],
    );
    librdkafka_suite(&s.addr, &["--broker", "delayed"]);
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
