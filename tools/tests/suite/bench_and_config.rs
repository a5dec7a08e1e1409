//! `nvmq bench`, the config file and the log format, run as a user runs them.

use std::time::Duration;

use crate::common::*;

/// Every run has one scenario per producer count, in order, each with acks and a histogram.
fn assert_scenarios(runs: &[serde_json::Value], producers: &[u64]) {
    for run in runs {
        let sc = run["scenarios"].as_array().unwrap();
        assert_eq!(sc.len(), producers.len(), "{run}");
        for (s, &p) in sc.iter().zip(producers) {
            assert_eq!(s["producers"], p);
            assert!(s["acks"].as_u64().unwrap() > 0, "{s}");
            assert!(s["p50_us"].as_f64().unwrap() <= s["p99_us"].as_f64().unwrap());
            let hist = s["latency_histogram"].as_array().unwrap();
            let counted: u64 = hist.iter().map(|b| b["count"].as_u64().unwrap()).sum();
            assert!(counted > 0, "{s}");
        }
    }
}

#[test]
fn bench_runs_every_scenario_and_writes_results_and_plots() {
    let d = temp_dir("bench");
    let out = d.join("results.json");
    let plots = d.join("plots");
    let r = nvmq(&[
        "bench",
        "--device",
        "sim:flush=1ms,write=20us",
        "--device",
        &spec(&d.join("b.img")),
        "--size",
        "64M",
        "--flush",
        "always,never",
        "--producers",
        "1,8",
        "--record-size",
        "100",
        "--duration",
        "200ms",
        "--json",
        "--out",
        out.to_str().unwrap(),
        "--plot",
        plots.to_str().unwrap(),
    ]);
    assert_eq!(r.code, 0, "{r}");
    let v = r.json();
    let from_file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(v, from_file, "--out holds what --json printed");
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4, "2 devices x 2 flush modes");
    let modes: Vec<&str> = runs
        .iter()
        .map(|r| r["flush_mode"].as_str().unwrap())
        .collect();
    assert_eq!(modes, ["always", "never", "always", "never"]);
    assert_scenarios(runs, &[1, 8]);
    let tput = std::fs::read_to_string(plots.join("throughput.svg")).unwrap();
    assert!(tput.starts_with("<svg") && tput.contains("acks/s") && tput.contains("p99"));
    assert_eq!(
        tput.matches("<polyline").count(),
        8,
        "4 runs x (acks/s, p99)"
    );
    let hist = std::fs::read_to_string(plots.join("latency-histogram.svg")).unwrap();
    assert_eq!(
        hist.matches("<polyline").count(),
        2,
        "the first run's scenarios"
    );
}

#[test]
fn bench_inline_drives_the_producers_on_the_writer_thread_and_leaves_a_sound_log() {
    let d = temp_dir("bench-inline");
    let img = d.join("b.img");
    let r = nvmq(&[
        "bench",
        "--inline",
        "--device",
        "sim:plp=true,write=10us",
        "--device",
        &spec(&img),
        "--size",
        "64M",
        "--flush",
        "always,never",
        "--producers",
        "1,16",
        "--record-size",
        "100",
        "--duration",
        "200ms",
        "--json",
    ]);
    assert_eq!(r.code, 0, "{r}");
    let v = r.json();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4, "2 devices x 2 flush modes");
    assert_scenarios(runs, &[1, 16]);
    // The writer stepped by the bench's own thread closed the log cleanly: it opens and checks.
    let r = nvmq(&["verify", "--device", &spec(&img)]);
    assert_eq!(r.code, 0, "{r}");
}

#[test]
fn bench_prints_a_table_by_default_and_refuses_bad_input() {
    let r = nvmq(&[
        "bench",
        "--device",
        "sim:flush=500us",
        "--producers",
        "4",
        "--record-size",
        "64",
        "--duration",
        "150ms",
    ]);
    assert_eq!(r.code, 0, "{r}");
    assert!(
        r.stdout.contains("producers")
            && r.stdout.contains("acks/s")
            && r.stdout.contains("flush mode always"),
        "{r}"
    );
    let r = nvmq(&["bench", "--device", "sim", "--producers", "0"]);
    assert_eq!(r.code, 1, "{r}");
    assert!(r.stderr.contains("--producers"), "{r}");
    let r = nvmq(&["bench", "--device", "sim", "--flush", "sometimes"]);
    assert_eq!(r.code, 1, "{r}");
    assert!(r.stderr.contains("sometimes"), "{r}");
    let r = nvmq(&["bench", "--device", "sim", "--duration", "forever"]);
    assert_eq!(r.code, 2, "{r}");
    let d = temp_dir("bench-bad");
    let p = formatted(&d);
    let r = nvmq(&["bench", "--device", &spec(&p), "--duration", "100ms"]);
    assert_eq!(r.code, 1, "{r}");
    assert!(r.stderr.contains("--force"), "{r}");
}

#[test]
fn config_file_supplies_flags_and_typed_flags_win() {
    let d = temp_dir("config");
    let img = d.join("c.img");
    let cfg = d.join("nvmq.toml");
    std::fs::write(
        &cfg,
        format!(
            "log_level = \"warn\"\n[format]\ndevice = \"{}\"\nsize = \"32M\"\njson = true\n[inspect]\ndevice = \"file:/nonexistent/x.img\"\n[check_storage]\nduration = \"100ms\"\n[bench]\ndevice = [\"sim:flush=1ms\", \"sim:flush=2ms\"]\nproducers = [1, 2]\nrecord_size = [64]\nduration = \"100ms\"\njson = true\n",
            spec(&img)
        ),
    )
    .unwrap();
    let c = cfg.to_str().unwrap();
    let r = nvmq(&["--config", c, "format"]);
    assert_eq!(r.code, 0, "{r}");
    assert_eq!(
        r.json()["device"]["capacity"],
        32u64 << 20,
        "size and json came from the file"
    );
    // The file names a missing device for inspect; the typed flag wins.
    let r = nvmq(&["--config", c, "inspect"]);
    assert_eq!(r.code, 1, "{r}");
    assert!(r.stderr.contains("/nonexistent/x.img"), "{r}");
    let r = nvmq(&["inspect", "--config", c, "--device", &spec(&img)]);
    assert_eq!(r.code, 0, "{r}");
    // Lists: a repeatable flag takes each element, a comma-list flag takes them joined.
    let r = nvmq(&["--config", c, "bench"]);
    assert_eq!(r.code, 0, "{r}");
    let runs: Vec<(String, Vec<u64>)> = r.json()["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|run| {
            let producers = run["scenarios"].as_array().unwrap().iter();
            (
                run["device"].as_str().unwrap().to_string(),
                producers
                    .map(|s| s["producers"].as_u64().unwrap())
                    .collect(),
            )
        })
        .collect();
    assert_eq!(
        runs,
        [
            ("sim:flush=1ms".to_string(), vec![1, 2]),
            ("sim:flush=2ms".to_string(), vec![1, 2])
        ]
    );
    let r = nvmq(&[
        "--config",
        c,
        "bench",
        "--device",
        "sim",
        "--producers",
        "3",
    ]);
    assert_eq!(r.code, 0, "{r}");
    let v = r.json();
    assert_eq!(
        v["runs"].as_array().unwrap().len(),
        1,
        "typed --device replaces the file's list"
    );
    assert_eq!(v["runs"][0]["scenarios"][0]["producers"], 3);
}

#[test]
fn config_errors_name_the_key_and_the_value() {
    let d = temp_dir("config-bad");
    let write = |name: &str, text: &str| {
        let p = d.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let cases: [(&str, &str, &str, &[&str]); 6] = [
        (
            "typo.toml",
            "[format]\nsise = \"1G\"\n",
            "format",
            &["unknown key `format.sise`", "size"],
        ),
        (
            "bad.toml",
            "[format]\nsize = \"12 parsecs\"\n",
            "format",
            &["`format.size`", "12 parsecs"],
        ),
        (
            "section.toml",
            "[formatt]\ndevice = \"sim\"\n",
            "format",
            &["unknown section [formatt]"],
        ),
        (
            "switch.toml",
            "[verify]\njson = \"yes\"\n",
            "verify",
            &["`verify.json`", "true or false"],
        ),
        ("syntax.toml", "[format\n", "format", &["syntax.toml"]),
        (
            "expiry.toml",
            "[serve]\nproducer_id_expiration = \"3 weeks\"\n",
            "serve",
            &["`serve.producer_id_expiration`", "3 weeks"],
        ),
    ];
    for (name, text, cmd, wants) in cases {
        let file = write(name, text);
        let r = nvmq(&["--config", &file, cmd, "--device", "sim"]);
        assert_eq!(r.code, 1, "{name}: {r}");
        for w in wants {
            assert!(r.stderr.contains(w), "{name}: missing {w:?}: {r}");
        }
    }

    let r = nvmq(&[
        "--config",
        d.join("missing.toml").to_str().unwrap(),
        "format",
        "--device",
        "sim",
    ]);
    assert_eq!(r.code, 1, "{r}");
    assert!(r.stderr.contains("missing.toml"), "{r}");
}

#[test]
fn logs_go_to_stderr_as_json_lines_when_asked() {
    let r = nvmq(&[
        "--log-format",
        "json",
        "--log-level",
        "info",
        "check-storage",
        "--device",
        "sim:flush=100us",
        "--duration",
        "100ms",
        "--json",
    ]);
    assert_eq!(r.code, 0, "{r}");
    let line = r
        .stderr
        .lines()
        .find(|l| l.contains("storage checked"))
        .unwrap_or_else(|| panic!("no log line: {r}"));
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["level"], "INFO");
    let report = r.json();
    assert_eq!(
        v["fields"]["verdict"], report["verdict"],
        "the log line carries the verdict"
    );
    let text = nvmq(&[
        "--log-level",
        "info",
        "check-storage",
        "--device",
        "sim:flush=100us",
        "--duration",
        "100ms",
    ]);
    assert!(
        text.stderr.contains("INFO") && text.stderr.contains("storage checked"),
        "{text}"
    );
    assert!(
        serde_json::from_str::<serde_json::Value>(text.stderr.lines().next().unwrap_or(""))
            .is_err()
    );
    let bad = nvmq(&["--log-format", "xml", "verify", "--device", "sim"]);
    assert_eq!(bad.code, 2, "{bad}");
}

/// `file:<path>,engine=...` picks the file backend's engine; format and bench say which one ran,
/// and a bad engine name is refused with the accepted ones. Without io_uring this fails, naming
/// the reason, unless NVMQ_NO_IO_URING=1 says that is expected (then it checks only the threads).
#[test]
fn the_file_engine_is_chosen_in_the_device_spec_and_reported() {
    let uring = match blockdev::file::io_uring_support() {
        Ok(()) => true,
        Err(why) if std::env::var("NVMQ_NO_IO_URING").as_deref() == Ok("1") => {
            eprintln!(
                "!!! io_uring unavailable ({why}), NVMQ_NO_IO_URING=1: checking threads only"
            );
            false
        }
        Err(why) => panic!("io_uring is unavailable: {why} (set NVMQ_NO_IO_URING=1 if expected)"),
    };
    let d = temp_dir("engine");
    let p = d.join("e.img");
    let dev = |engine: &str| format!("{},engine={engine}", spec(&p));
    let r = nvmq(&["format", "--device", &dev("threads"), "--size", "32M"]);
    assert_eq!(r.code, 0, "{r}");
    assert!(
        r.stdout
            .contains("I/O engine           threads (4 I/O threads, 1 flush description)"),
        "{r}"
    );
    let mut engines = vec![(
        "threads",
        "threads (4 I/O threads, 1 flush description)".to_string(),
    )];
    if uring {
        let words = |n: &str| format!("io_uring (ring of 256, {n})");
        engines.push(("uring", words("1 flush description")));
        engines.push(("auto", words("1 flush description")));
        engines.push(("uring,flush_fds=1", words("1 flush description")));
        engines.push(("auto,flush_fds=16", words("16 flush descriptions")));
        let r = nvmq(&["format", "--device", &spec(&p), "--force", "--json"]);
        assert_eq!(r.code, 0, "{r}");
        assert_eq!(
            r.json()["device"]["engine"],
            words("1 flush description"),
            "the default is auto"
        );
    }
    for (engine, words) in engines {
        let r = nvmq(&[
            "bench",
            "--device",
            &dev(engine),
            "--force",
            "--producers",
            "2",
            "--record-size",
            "100",
            "--duration",
            "100ms",
            "--json",
        ]);
        assert_eq!(r.code, 0, "{r}");
        let run = &r.json()["runs"][0];
        assert_eq!(run["engine"], words, "{engine}");
        assert!(
            run["scenarios"][0]["acks"].as_u64().unwrap() > 0,
            "{engine}"
        );
    }
    let r = nvmq(&["inspect", "--device", &dev("threads")]);
    assert_eq!(r.code, 0, "{r}");
    assert!(
        r.stdout.contains("; I/O engine threads (4 I/O threads))"),
        "{r}"
    );
    let r = nvmq(&["format", "--device", &dev("fast"), "--force"]);
    assert_eq!(r.code, 1, "{r}");
    assert!(
        r.stderr.contains("engine=\"fast\"") && r.stderr.contains("uring, threads, auto"),
        "{r}"
    );
    let r = nvmq(&["format", "--device", &dev("threads,flush_fds=0"), "--force"]);
    assert_eq!(r.code, 1, "{r}");
    assert!(
        r.stderr.contains("flush_fds=\"0\"") && r.stderr.contains("from 1 to 64"),
        "{r}"
    );
}

/// Size flags are typed: a value that is not a size, zero, or too large is refused when the
/// flags are read, naming the flag (before, `--max-frame 0` was taken and no request could ever
/// be read); a grace after a writer stop longer than ten minutes is refused, naming the limit.
#[test]
fn serve_refuses_bad_sizes_and_an_endless_writer_stop_grace_naming_the_flag() {
    let cases: [(&[&str], &[&str]); 6] = [
        (&["--max-frame", "0"], &["--max-frame", "must be positive"]),
        (
            &["--group-initial-rebalance-delay", "30d"],
            &["--group-initial-rebalance-delay", "at most"],
        ),
        (
            &["--max-connection-bytes", "12 parsecs"],
            &["--max-connection-bytes", "12 parsecs"],
        ),
        (
            &["--fetch-max-bytes", "0"],
            &["--fetch-max-bytes", "must be positive"],
        ),
        (
            &["--max-uncompressed-batch", "99999999999T"],
            &["--max-uncompressed-batch"],
        ),
        (
            &["--writer-stop-grace", "1d"],
            &["--writer-stop-grace", "10 min"],
        ),
    ];
    for (flags, wants) in cases {
        let mut args = vec!["serve", "--device", "sim", "--listen", "127.0.0.1:0"];
        args.extend_from_slice(flags);
        let r = nvmq_with(&args, &[], Duration::from_secs(30));
        assert!(r.code > 0, "{flags:?} was accepted: {r}");
        for w in wants {
            assert!(r.stderr.contains(w), "{flags:?}: missing {w:?}: {r}");
        }
    }
}

/// Safe by default: without TLS a non-loopback --listen is refused, naming the flags that allow
/// it (`serve_tls.rs` starts one with TLS); with that flag the broker starts on the address.
#[test]
fn serve_listens_beyond_loopback_only_when_told_the_network_is_trusted() {
    let r = nvmq_with(
        &["serve", "--device", "sim", "--listen", "0.0.0.0:0"],
        &[],
        Duration::from_secs(30),
    );
    assert!(r.code > 0, "a non-loopback listen was accepted: {r}");
    for w in ["0.0.0.0:0", "not a loopback address", "--insecure-network"] {
        assert!(r.stderr.contains(w), "missing {w:?}: {r}");
    }
    // Told so, it serves (and is stopped by the time limit).
    let r = nvmq_with(
        &[
            "serve",
            "--device",
            "sim",
            "--listen",
            "0.0.0.0:0",
            "--insecure-network",
        ],
        &[],
        Duration::from_secs(5),
    );
    assert_eq!(r.code, -1, "serve ended by itself: {r}");
    assert!(
        format!("{}{}", r.stdout, r.stderr).contains("serving Kafka on 0.0.0.0:"),
        "{r}"
    );
}

/// `--spin auto` (the default) polls for completions only when no device has a volatile write
/// cache, where an I/O completes sooner than a sleeping loop wakes; a given duration wins; a bad
/// value is refused naming the flag.
#[test]
fn serve_polls_for_completions_by_default_only_on_devices_without_a_volatile_cache() {
    let cases: [(&[&str], Option<&str>); 4] = [
        (
            &["--device", "sim:plp=true,write=10us"],
            Some("polling 50 us"),
        ),
        (&["--device", "sim"], None),
        (&["--device", "sim:plp=true", "--spin", "0"], None),
        (
            &["--device", "sim", "--spin", "20us"],
            Some("polling 20 us"),
        ),
    ];
    let runs: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = cases
            .iter()
            .map(|(flags, _)| {
                s.spawn(move || {
                    let mut args = vec!["serve", "--listen", "127.0.0.1:0"];
                    args.extend_from_slice(flags);
                    nvmq_with(&args, &[], Duration::from_secs(5))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((flags, wants), r) in cases.iter().zip(runs) {
        let out = format!("{}{}", r.stdout, r.stderr);
        let line = out
            .lines()
            .find(|l| l.contains("serving Kafka on"))
            .unwrap_or_else(|| panic!("{flags:?}: no serving line: {r}"));
        match wants {
            Some(w) => assert!(line.contains(w), "{flags:?}: {line}"),
            None => assert!(!line.contains("polling"), "{flags:?}: {line}"),
        }
    }
    let r = nvmq(&["serve", "--device", "sim", "--spin", "sometimes"]);
    assert!(r.code > 0, "{r}");
    assert!(
        r.stderr.contains("--spin") && r.stderr.contains("or auto"),
        "{r}"
    );
}
