//! docs/config-reference.md is generated from the `nvmq` command's own flag definitions
//! (`nvmq config-reference`), so that it cannot drift from them. These tests fail when the
//! committed file is out of date, and check the generated text against what the binary accepts:
//! every flag its `--help` lists, with its default, and every config-file key it names.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::common::*;

const REGENERATE: &str =
    "NVMQ_UPDATE_DOCS=1 cargo test -p nvmq-tools --test suite config_reference::";

fn committed_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/config-reference.md")
}

fn generated() -> String {
    let r = nvmq(&["config-reference"]);
    assert_eq!(r.code, 0, "{r}");
    assert!(r.stdout.starts_with("# Configuration reference"), "{r}");
    r.stdout
}

#[test]
fn the_committed_reference_is_what_the_flags_generate() {
    let now = generated();
    let path = committed_path();
    if std::env::var_os("NVMQ_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &now).expect("writing docs/config-reference.md");
        eprintln!("wrote {}", path.display());
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != now {
        let first = committed
            .lines()
            .zip(now.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(now.lines().count()));
        panic!(
            "docs/config-reference.md is out of date with the flags (first difference at line {}:\n  \
             committed: {:?}\n  generated: {:?})\nRegenerate it with:\n  {REGENERATE}",
            first + 1,
            committed.lines().nth(first).unwrap_or("<end of file>"),
            now.lines().nth(first).unwrap_or("<end of file>"),
        );
    }
}

/// The commands `nvmq --help` lists (without `help`).
fn commands() -> Vec<String> {
    let r = nvmq(&["--help"]);
    assert_eq!(r.code, 0, "{r}");
    let list = r
        .stdout
        .split("Commands:\n")
        .nth(1)
        .expect("a command list")
        .split("\n\n")
        .next()
        .unwrap_or("");
    let names: Vec<String> = list
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(str::to_string)
        .collect();
    assert!(names.iter().any(|n| n == "serve"), "{names:?}");
    names
}

/// `--flag` -> its default (if `--help` shows one), as `nvmq <command> --help` lists them.
fn help_flags(command: &str) -> BTreeMap<String, Option<String>> {
    let r = nvmq(&[command, "--help"]);
    assert_eq!(r.code, 0, "{r}");
    let mut flags = BTreeMap::new();
    let mut last: Option<String> = None;
    for line in r.stdout.lines() {
        let t = line.trim_start();
        let flag = t
            .strip_prefix("-h, ")
            .or_else(|| t.strip_prefix("-V, "))
            .unwrap_or(t);
        if line.starts_with("  ") && flag.starts_with("--") {
            let name = flag.split_whitespace().next().unwrap_or("").to_string();
            flags.insert(name.clone(), None);
            last = Some(name);
        }
        if let (Some(name), Some(d)) = (&last, line.split("[default: ").nth(1)) {
            let d = d.split(']').next().unwrap_or("").to_string();
            flags.insert(name.clone(), Some(d));
        }
    }
    flags
}

/// The table rows of one command's section of the reference: (flag cell, key, default).
fn reference_rows(reference: &str, command: &str) -> Vec<(String, String, String)> {
    let heading = if command.is_empty() {
        "## Global flags".to_string()
    } else {
        format!("## `nvmq {command}`")
    };
    let section = reference
        .split(&format!("\n{heading}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("the reference has no section {heading:?}"))
        .split("\n## ")
        .next()
        .unwrap_or("");
    section
        .lines()
        .filter(|l| l.starts_with("| `-"))
        .map(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            let unquote = |s: &str| s.trim().trim_matches('`').replace("\\|", "|");
            (
                cells[0].trim_start_matches("| ").to_string(),
                unquote(cells[1]),
                unquote(cells[2]),
            )
        })
        .collect()
}

#[test]
fn the_reference_lists_every_flag_of_every_command_with_its_default() {
    let reference = generated();
    for command in commands() {
        let rows = reference_rows(&reference, &command);
        for (flag, default) in help_flags(&command) {
            if flag == "--help" || flag == "--version" {
                continue;
            }
            let global = ["--config", "--log-format", "--log-level"].contains(&flag.as_str());
            let rows = if global {
                reference_rows(&reference, "")
            } else {
                rows.clone()
            };
            let row = rows
                .iter()
                .find(|(cell, _, _)| {
                    cell.contains(&format!("`{flag}`")) || cell.contains(&format!("`{flag} "))
                })
                .unwrap_or_else(|| {
                    panic!("`nvmq {command} --help` lists {flag}, the reference does not")
                });
            assert_eq!(
                Some(row.2.clone()).filter(|d| !d.is_empty()),
                default,
                "default of {flag} of `nvmq {command}`"
            );
        }
    }
}

/// `nvmq --config <file holding toml> <command> --help`: the file is read and every key and
/// value checked before `--help` stops the command.
fn help_with_config(name: &str, toml: &str, command: &str) -> Run {
    let file = temp_dir(name).join("nvmq.toml");
    std::fs::write(&file, toml).expect("config file");
    nvmq(&[
        "--config",
        file.to_str().expect("utf-8 path"),
        command,
        "--help",
    ])
}

#[test]
fn every_key_the_reference_names_is_accepted_in_a_config_file() {
    let reference = generated();
    for command in commands() {
        let rows = reference_rows(&reference, &command);
        assert!(!rows.is_empty(), "no flags listed for {command}");
        let mut toml = format!("[{}]\n", command.replace('-', "_"));
        for (flag, key, default) in &rows {
            if flag.contains('<') {
                if !default.is_empty() {
                    toml.push_str(&format!("{key} = {default:?}\n"));
                }
            } else {
                toml.push_str(&format!("{key} = false\n"));
            }
        }
        let r = help_with_config("config-reference", &toml, &command);
        assert_eq!(r.code, 0, "config file\n{toml}\n{r}");
    }
}

#[test]
fn the_hidden_reference_command_is_no_config_file_section() {
    let r = help_with_config(
        "config-hidden",
        "[config_reference]\njson = true\n",
        "verify",
    );
    assert_eq!(r.code, 1, "{r}");
    assert!(
        r.stderr.contains("unknown section [config_reference]")
            && r.stderr.contains("kafka-bench")
            && !r.stderr.contains("config-reference"),
        "{r}"
    );
}
