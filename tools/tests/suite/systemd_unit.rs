//! dist/nvmq.service runs `nvmq serve` under systemd with dist/nvmq.toml as its config file. These
//! check what can drift: the flags its ExecStart passes and the keys of the config file must be
//! accepted by the binary, the limits must cover what serve is configured to hold, and the unit
//! must parse (with `systemd-analyze verify`, where it is installed).

use std::path::{Path, PathBuf};

use crate::common::*;

fn dist(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../dist")
        .join(file)
}

fn unit() -> String {
    std::fs::read_to_string(dist("nvmq.service")).expect("dist/nvmq.service")
}

/// The value of `key=` in the unit's `[section]` (the last one set, as systemd takes it).
fn setting(unit: &str, section: &str, key: &str) -> Option<String> {
    let mut current = "";
    let mut found = None;
    for line in unit.lines().map(str::trim) {
        if line.starts_with('[') {
            current = line;
        } else if current == format!("[{section}]") && !line.starts_with('#') {
            if let Some((k, v)) = line.split_once('=') {
                if k.trim() == key {
                    found = Some(v.trim().to_string());
                }
            }
        }
    }
    found
}

/// ExecStart's words, its binary and the `--config` file it names.
fn exec_start() -> (Vec<String>, String) {
    let line = setting(&unit(), "Service", "ExecStart").expect("ExecStart in [Service]");
    // Plain words only: the test would otherwise need systemd's quoting rules.
    assert!(
        !line.contains(['"', '\'', '\\', '$', '%']),
        "ExecStart uses quoting or specifiers: {line}"
    );
    let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
    let config = words
        .iter()
        .position(|w| w == "--config")
        .and_then(|i| words.get(i + 1))
        .expect("ExecStart passes --config <file>")
        .clone();
    (words, config)
}

#[test]
fn exec_start_runs_serve_with_flags_and_a_config_file_the_binary_accepts() {
    let (words, config) = exec_start();
    assert!(
        words[0].ends_with("/nvmq") && words[0].starts_with('/'),
        "ExecStart runs an absolute path to nvmq: {words:?}"
    );
    assert!(words.iter().any(|w| w == "serve"), "{words:?}");
    assert_eq!(config, "/etc/nvmq/nvmq.toml");
    // The same command line, with the repository's config file in place of the installed one:
    // `--help` stops serve after every flag and every config key and value has been checked.
    let repo_config = dist("nvmq.toml");
    let args: Vec<String> = words[1..]
        .iter()
        .map(|w| {
            if *w == config {
                repo_config.display().to_string()
            } else {
                w.clone()
            }
        })
        .chain(["--help".to_string()])
        .collect();
    let r = nvmq(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(r.code, 0, "nvmq {args:?}\n{r}");
    assert!(r.stdout.contains("Usage: nvmq serve"), "{r}");
}

#[test]
fn the_unit_restarts_on_failure_and_sets_the_limits_serve_needs() {
    let unit = unit();
    let service = |key: &str| setting(&unit, "Service", key);
    // Exit status 5 (a writer stopped) must bring the broker back so that recovery runs.
    assert_eq!(service("Restart").as_deref(), Some("on-failure"));
    let prevented = service("RestartPreventExitStatus").unwrap_or_default();
    assert!(
        !prevented.split_whitespace().any(|s| s == "5" || s == "1"),
        "{prevented}"
    );
    // VFIO pins the NVMe driver's DMA buffers.
    assert_eq!(service("LimitMEMLOCK").as_deref(), Some("infinity"));

    // One descriptor per connection, plus the devices' and loops' own.
    let toml: toml::Table =
        toml::from_str(&std::fs::read_to_string(dist("nvmq.toml")).expect("dist/nvmq.toml"))
            .expect("dist/nvmq.toml is TOML");
    let configured = toml
        .get("serve")
        .and_then(|s| s.get("max_connections"))
        .and_then(|v| v.as_integer());
    let help = nvmq(&["serve", "--help"]).stdout;
    let default = help
        .split("--max-connections <MAX_CONNECTIONS>")
        .nth(1)
        .and_then(|s| s.split("[default: ").nth(1))
        .and_then(|s| s.split(']').next())
        .and_then(|s| s.parse::<i64>().ok())
        .expect("serve --help shows the default of --max-connections");
    let connections = configured.unwrap_or(default).max(default);
    let nofile: i64 = service("LimitNOFILE")
        .and_then(|v| v.split(':').next_back().map(str::to_string))
        .and_then(|v| v.parse().ok())
        .expect("LimitNOFILE=<number>");
    assert!(
        nofile >= connections + 1024,
        "LimitNOFILE={nofile} leaves too few descriptors beside {connections} connections"
    );
}

#[test]
fn systemd_analyze_verifies_the_unit() {
    let version = std::process::Command::new("systemd-analyze")
        .arg("--version")
        .output();
    if !version.is_ok_and(|o| o.status.success()) {
        eprintln!("SKIPPED: systemd-analyze is not installed; the unit was not verified");
        return;
    }
    // verify checks that ExecStart's binary exists: point it at the one just built.
    let (words, _) = exec_start();
    let d = temp_dir("systemd-unit");
    let copy = d.join("nvmq.service");
    let text = unit().replace(&words[0], env!("CARGO_BIN_EXE_nvmq"));
    std::fs::write(&copy, text).expect("unit copy");
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .expect("systemd-analyze runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Lines about the unit itself (others can be about the host's own units).
    let ours: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("nvmq.service"))
        .collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify: {}\n{said}",
        out.status
    );
}
