//! `nvmq kafka-bench --broker` against an `nvmq serve` in another process: the ceiling mode and a
//! durable file device. Not timed: the JSON's shape is checked, and that records flowed.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::common::*;

/// A running `nvmq serve`; killed on drop.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_nvmq"))
            .arg("serve")
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("RUST_LOG")
            .env_remove("NVMQ_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start nvmq serve");
        let out = child.stdout.take().expect("serve's stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(a) = line.strip_prefix("nvmq serving Kafka on ") {
                    let _ = tx.send(a.split(' ').next().unwrap_or_default().to_string());
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("serve printed its address");
        Server { child, addr }
    }

    fn pid(&self) -> String {
        self.child.id().to_string()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn bench(s: &Server, scenarios: &str, extra: &[&str]) -> serde_json::Value {
    let pid = s.pid();
    let mut args = vec![
        "kafka-bench",
        "--broker",
        &s.addr,
        "--scenario",
        scenarios,
        "--duration",
        "1s",
        "--server-pid",
        &pid,
        "--json",
    ];
    args.extend_from_slice(extra);
    let r = nvmq(&args);
    assert_eq!(r.code, 0, "{r}");
    r.json()
}

fn f(v: &serde_json::Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("no number {key} in {v}"))
}

/// The fields every line has, sane.
fn check_line(l: &serde_json::Value, scenario: &str, conns: u64) {
    assert_eq!(l["scenario"], scenario, "{l}");
    assert_eq!(l["connections"].as_u64(), Some(conns), "{l}");
    assert!(f(l, "ops_per_s") > 0.0, "{l}");
    assert!(l["records"].as_u64().unwrap_or(0) > 0, "{l}");
    let lat = &l["latency"];
    let (p50, p99, max) = (f(lat, "p50_us"), f(lat, "p99_us"), f(lat, "max_us"));
    assert!(0.0 <= p50 && p50 <= p99 && p99 <= max, "{l}");
}

fn check_produce_lines(v: &serde_json::Value, pid: &str) {
    let lines = v["scenarios"].as_array().expect("scenarios");
    let closed = &lines[0];
    check_line(closed, "closed:2", 2);
    assert_eq!(closed["unit"], "acks/s");
    assert_eq!(f(closed, "ops_per_s"), f(closed, "requests_per_s"));
    assert!(closed.get("memory").is_none(), "memory only for conns");

    let batched = &lines[1];
    check_line(batched, "batched:2x10", 2);
    assert_eq!(batched["unit"], "records/s");
    assert_eq!(batched["records_per_request"], 10);
    assert_eq!(
        batched["records"].as_u64().unwrap(),
        10 * batched["requests"].as_u64().unwrap(),
        "{batched}"
    );

    let conns = lines.last().expect("a conns line");
    check_line(conns, "conns:8", 8);
    let m = &conns["memory"];
    assert_eq!(m["server_pid"].to_string(), pid, "{m}");
    for k in [
        "rss_before_kib",
        "rss_after_kib",
        "hwm_before_kib",
        "hwm_after_kib",
    ] {
        assert!(f(m, k) > 0.0, "{k}: {m}");
    }
    assert!(f(m, "hwm_after_kib") >= f(m, "rss_after_kib"), "{m}");
    let per = (f(m, "rss_after_kib") - f(m, "rss_before_kib")) / 8.0;
    assert!((f(m, "rss_per_connection_kib") - per).abs() < 1e-6, "{m}");
}

#[test]
fn kafka_bench_measures_a_ceiling_and_a_durable_broker_in_another_process() {
    let ceiling = Server::start(&["--ceiling", "--device", "sim:capacity=64M"]);
    let v = bench(&ceiling, "closed:2,batched:2x10,conns:8", &[]);
    assert_eq!(v["broker"], ceiling.addr.as_str());
    assert_eq!(v["record_size"], 100);
    assert_eq!(v["scenarios"].as_array().map(Vec::len), Some(3), "{v}");
    check_produce_lines(&v, &ceiling.pid());
    // A ceiling broker stores nothing: a consumer has nothing to read, and the bench says why.
    let r = nvmq(&[
        "kafka-bench",
        "--broker",
        &ceiling.addr,
        "--scenario",
        "e2e:1",
        "--duration",
        "300ms",
    ]);
    assert_eq!(r.code, 1, "{r}");
    assert!(r.stderr.contains("--ceiling"), "{r}");
    drop(ceiling);

    let d = temp_dir("kafka-bench");
    let img = d.join("serve.img");
    let durable = Server::start(&["--device", &spec(&img), "--size", "128M"]);
    let v = bench(
        &durable,
        "closed:2,batched:2x10,e2e:1,catchup:20000,conns:8",
        &["--client-threads", "2"],
    );
    let lines = v["scenarios"].as_array().expect("scenarios");
    assert_eq!(lines.len(), 5, "{v}");
    check_produce_lines(&v, &durable.pid());

    let e2e = &lines[2];
    check_line(e2e, "e2e:1", 2);
    let e = &e2e["e2e"];
    let matched = e["matched"].as_u64().unwrap_or(0);
    assert!(
        matched > 0,
        "the consumer received acknowledged records: {e2e}"
    );
    assert!(e["early"].as_u64().unwrap_or(u64::MAX) <= matched, "{e}");
    // Every record was sent before it was acknowledged.
    assert!(
        f(&e["send_to_receive"], "p50_us") >= f(&e["ack_to_receive"], "p50_us"),
        "{e}"
    );
    assert!(
        f(e, "producer_acks_per_s") > 0.0 && f(e, "fetches") > 0.0,
        "{e}"
    );

    let c = &lines[3];
    check_line(c, "catchup:20000", 1);
    let cf = &c["catchup"];
    assert!(cf["records"].as_u64().unwrap_or(0) >= 20_000, "{c}");
    assert!(cf["fill_records"].as_u64().unwrap_or(0) >= 20_000, "{c}");
    assert!(
        f(cf, "mb_per_s") > 0.0 && f(cf, "bytes") > 100.0 * 20_000.0,
        "{c}"
    );
}

#[test]
fn kafka_bench_refuses_bad_scenarios_naming_the_bad_part() {
    let r = nvmq(&["kafka-bench", "--scenario", "closed:1,batched:64xten"]);
    assert_eq!(r.code, 1, "{r}");
    assert!(
        r.stderr.contains("batched:64xten") && r.stderr.contains("\"ten\""),
        "{r}"
    );
    let r = nvmq(&["kafka-bench", "--scenario", "warp:9"]);
    assert_eq!(r.code, 1, "{r}");
    assert!(r.stderr.contains("unknown kind \"warp\""), "{r}");
    let r = nvmq(&[
        "kafka-bench",
        "--broker",
        "127.0.0.1:1",
        "--scenario",
        "closed:1",
    ]);
    assert_eq!(r.code, 1, "{r}");
    assert!(r.stderr.contains("127.0.0.1:1"), "{r}");
}

#[test]
fn kafka_bench_runs_over_tls_and_mtls() {
    let dir = temp_dir("kafka-bench-tls");
    let ca = crate::certs::Ca::new("nvmq test CA");
    let clients = crate::certs::Ca::new("client CA");
    let server = ca.server(false);
    let alice = clients.client(&[(rcgen::DnType::CommonName, "bench")]);
    let p = |name: &str, text: &str| crate::certs::write(&dir, name, text).display().to_string();
    let (cert, key) = (p("s.pem", &server.cert_pem), p("s.key", &server.key_pem));
    let (ca_file, client_ca) = (p("ca.pem", &ca.pem()), p("client-ca.pem", &clients.pem()));
    let (acert, akey) = (p("a.pem", &alice.cert_pem), p("a.key", &alice.key_pem));
    let s = Server::start(&[
        "--device",
        "sim:capacity=256M",
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--tls-client-ca",
        &client_ca,
    ]);
    let mtls = [
        "--tls-ca",
        &ca_file,
        "--tls-cert",
        &acert,
        "--tls-key",
        &akey,
    ];
    let v = bench(&s, "closed:2,catchup:2000", &mtls);
    let sc = v["scenarios"].as_array().expect("scenarios");
    check_line(&sc[0], "closed:2", 2);
    check_line(&sc[1], "catchup:2000", 1);
    assert!(
        sc[1]["catchup"]["records"].as_u64().unwrap_or(0) >= 2000,
        "{v}"
    );

    // Without a client certificate the broker refuses the bench; without the CA it does not
    // trust the broker.
    let r = nvmq(&[
        "kafka-bench",
        "--broker",
        &s.addr,
        "--scenario",
        "closed:1",
        "--duration",
        "1s",
        "--tls-ca",
        &ca_file,
    ]);
    assert_ne!(r.code, 0, "{r}");
    let r = nvmq(&[
        "kafka-bench",
        "--broker",
        &s.addr,
        "--scenario",
        "closed:1",
        "--duration",
        "1s",
        "--tls-ca",
        &client_ca,
        "--tls-cert",
        &acert,
        "--tls-key",
        &akey,
    ]);
    assert_ne!(r.code, 0, "{r}");
    assert!(r.stderr.contains("UnknownIssuer"), "{r}");
}
