//! The admin and group tooling of real clients against `nvmq serve`: confluent-kafka's
//! AdminClient (list/describe/delete groups, describe cluster, list offsets), kafka-python's
//! (OffsetDelete, removing static members), static membership with confluent-kafka consumers,
//! kafkajs's admin client, and transactional producers of both refused at once. The clients come
//! from `tests/clients/setup.sh`; the scenarios are `tests/clients/admin.py` and `admin.mjs`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

/// (the venv's python, the kafkajs directory), installed once per test run.
fn clients() -> &'static (PathBuf, PathBuf) {
    static CLIENTS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    CLIENTS.get_or_init(|| {
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let venv = tmp.join("kafka-clients-venv");
        let js = tmp.join("kafkajs");
        let st = Command::new("bash")
            .arg(clients_dir().join("setup.sh"))
            .arg(&venv)
            .arg(&js)
            .status()
            .expect("running tests/clients/setup.sh");
        assert!(
            st.success(),
            "installing the Kafka clients failed (tests/clients/setup.sh)"
        );
        (venv.join("bin/python"), js)
    })
}

/// One broker and its clients at a time: on a small machine, side by side only invites
/// timeouts.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

fn broker() -> crate::common::Serving {
    crate::common::serve(&[
        "--device",
        "sim:capacity=256M,flush=200us",
        "--listen",
        "127.0.0.1:0",
        "--size",
        "256M",
    ])
}

/// Runs a client program to completion; its output must end in its last "ok:" line.
fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("running {what}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    println!("{what}:\n{text}");
    let last = text.lines().last().unwrap_or("");
    assert!(out.status.success(), "{what} failed: {last}");
    text
}

fn admin_py(addr: &str, scenario: &str) -> String {
    let (py, _) = clients();
    run(
        Command::new(py)
            .arg(clients_dir().join("admin.py"))
            .arg(addr)
            .arg(scenario),
        scenario,
    )
}

#[test]
fn confluent_kafka_admin_client_lists_describes_and_deletes_groups() {
    let _turn = one_at_a_time();
    let s = broker();
    let out = admin_py(&s.kafka, "groups");
    for step in [
        "ok: listed",
        "ok: described g-live",
        "NON_EMPTY_GROUP",
        "GROUP_SUBSCRIBED_TO_TOPIC",
        "ok: both groups deleted",
        "ok: cluster nvmq, controller 0",
        "ok: list_offsets",
    ] {
        assert!(out.contains(step), "no {step:?} in the scenario's output");
    }
}

#[test]
fn a_restarted_static_member_gets_its_partitions_back_without_a_rebalance() {
    let _turn = one_at_a_time();
    let s = broker();
    let out = admin_py(&s.kafka, "static_member");
    assert!(out.contains("without a rebalance"));
    assert!(out.contains("removed by instance id"));
}

#[test]
fn transactional_producers_are_refused_at_once() {
    let _turn = one_at_a_time();
    let s = broker();
    let out = admin_py(&s.kafka, "transactions");
    assert!(out.contains("TRANSACTIONAL_ID_AUTHORIZATION_FAILED"));
}

#[test]
fn kafkajs_admin_client_and_transactional_producer() {
    let _turn = one_at_a_time();
    let (_, js) = clients();
    let s = broker();
    let out = run(
        Command::new("node")
            .arg(clients_dir().join("admin.mjs"))
            .arg(js)
            .arg(&s.kafka),
        "kafkajs admin",
    );
    for step in [
        "ok: fetchTopicOffsets",
        "ok: listGroups",
        "ok: describeGroups",
        "ok: deleteGroups",
        "ok: describeCluster",
        "refused at its first request",
    ] {
        assert!(out.contains(step), "no {step:?} in kafkajs's output");
    }
}
