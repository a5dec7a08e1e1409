//! `--config <file>`: a TOML file whose keys mirror the flags. Top-level keys are the global
//! flags (`log_format`, `log_level`); a table per command holds that command's flags, e.g.
//!
//! ```toml
//! log_format = "json"
//! [verify]
//! device = "file:/var/lib/nvmq/log.img"
//! [bench]
//! producers = [1, 64, 1024]
//! ```
//!
//! The file's keys become flags placed before the ones typed on the command line, and a key whose
//! flag is also typed is left out, so flags always win. Every key is checked against the command's
//! flags, and every value through the flag's own parser, so an error names the key and the value.

use std::ffi::{OsStr, OsString};
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use clap::{ArgAction, Command};

/// Returns `argv` with the config file's flags merged in (unchanged without `--config`).
pub fn merge(argv: Vec<OsString>, cmd: &Command) -> Result<Vec<OsString>> {
    let Some(path) = config_path(&argv) else {
        return Ok(argv);
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    let table: toml::Table =
        toml::from_str(&text).map_err(|e| anyhow!("config file {}: {e}", path.display()))?;
    let file = path.display().to_string();
    let sub_at = argv
        .iter()
        .enumerate()
        .skip(1)
        .find(|(_, a)| a.to_str().is_some_and(|s| cmd.find_subcommand(s).is_some()))
        .map(|(i, _)| i);

    let mut global_tokens = Vec::new();
    let mut sub_tokens = Vec::new();
    for (key, value) in &table {
        match value {
            toml::Value::Table(section) => {
                let name = key.replace('_', "-");
                // Hidden commands (`config-reference`) take no settings.
                let sub = cmd.find_subcommand(&name).filter(|s| !s.is_hide_set());
                let sub = sub.ok_or_else(|| {
                    anyhow!(
                        "config file {file}: unknown section [{key}] (sections are the commands: {})",
                        cmd.get_subcommands()
                            .filter(|c| !c.is_hide_set())
                            .map(|c| c.get_name().to_string())
                            .filter(|n| n != "help")
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })?;
                let typed = sub_at.map_or(&argv[0..0], |i| &argv[i + 1..]);
                let chosen = sub_at.is_some_and(|i| argv[i] == *name.as_str());
                for (k, v) in section {
                    let tokens = key_tokens(cmd, Some(sub), &file, &format!("{key}.{k}"), k, v)?;
                    if chosen && !typed_flag(typed, k) {
                        sub_tokens.extend(tokens);
                    }
                }
            }
            v => {
                let tokens = key_tokens(cmd, None, &file, key, key, v)?;
                if !typed_flag(&argv[1..], key) {
                    global_tokens.extend(tokens);
                }
            }
        }
    }
    let mut out = Vec::with_capacity(argv.len() + global_tokens.len() + sub_tokens.len());
    match sub_at {
        Some(i) => {
            out.extend_from_slice(&argv[..1]);
            out.extend(global_tokens);
            out.extend_from_slice(&argv[1..=i]);
            out.extend(sub_tokens);
            out.extend_from_slice(&argv[i + 1..]);
        }
        None => {
            out.extend_from_slice(&argv[..1]);
            out.extend(global_tokens);
            out.extend_from_slice(&argv[1..]);
        }
    }
    Ok(out)
}

fn config_path(argv: &[OsString]) -> Option<std::path::PathBuf> {
    let mut it = argv.iter().skip(1);
    while let Some(a) = it.next() {
        if a == "--config" {
            return it.next().map(|p| Path::new(p).to_path_buf());
        }
        if let Some(p) = a.to_str().and_then(|s| s.strip_prefix("--config=")) {
            return Some(Path::new(p).to_path_buf());
        }
    }
    None
}

/// Whether `--<key>` (with `_` or `-`) was typed among `args`.
fn typed_flag(args: &[OsString], key: &str) -> bool {
    let flag = format!("--{}", key.replace('_', "-"));
    args.iter().any(|a| {
        a.to_str()
            .is_some_and(|s| s == flag || s.starts_with(&format!("{flag}=")))
    })
}

/// The flag tokens for one key, checked: the key must name a flag of `sub` (or a global flag when
/// `sub` is None), and its value must pass the flag's parser.
fn key_tokens(
    root: &Command,
    sub: Option<&Command>,
    file: &str,
    shown: &str,
    key: &str,
    value: &toml::Value,
) -> Result<Vec<OsString>> {
    let long = key.replace('_', "-");
    let owner = sub.unwrap_or(root);
    let arg = owner
        .get_arguments()
        .find(|a| a.get_long() == Some(long.as_str()) && long != "config" && long != "help")
        .ok_or_else(|| {
            let known: Vec<String> = owner
                .get_arguments()
                .filter_map(|a| a.get_long())
                .filter(|l| *l != "help" && *l != "config" && *l != "version")
                .map(|l| l.replace('-', "_"))
                .collect();
            anyhow!(
                "config file {file}: unknown key `{shown}` (known keys{}: {})",
                sub.map_or(String::new(), |s| format!(" of [{}]", s.get_name())),
                known.join(", ")
            )
        })?;
    let flag = OsString::from(format!("--{long}"));
    let is_switch = matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
    let tokens = match value {
        toml::Value::Boolean(b) if is_switch => {
            if *b {
                vec![flag]
            } else {
                Vec::new()
            }
        }
        _ if is_switch => {
            bail!("config file {file}: key `{shown}` = {value}: expected true or false")
        }
        toml::Value::Array(items) => {
            let parts = items
                .iter()
                .map(scalar)
                .collect::<Option<Vec<String>>>()
                .ok_or_else(|| {
                    anyhow!("config file {file}: key `{shown}` = {value}: expected a list of plain values")
                })?;
            if matches!(arg.get_action(), ArgAction::Append) && arg.get_value_delimiter().is_none()
            {
                parts
                    .into_iter()
                    .flat_map(|p| [flag.clone(), OsString::from(p)])
                    .collect()
            } else {
                vec![flag, OsString::from(parts.join(","))]
            }
        }
        v => {
            let s = scalar(v).ok_or_else(|| {
                anyhow!("config file {file}: key `{shown}` = {value}: expected a plain value")
            })?;
            vec![flag, OsString::from(s)]
        }
    };
    check_value(root, sub, &tokens)
        .map_err(|e| anyhow!("config file {file}: key `{shown}` = {value}: {e}"))?;
    Ok(tokens)
}

fn scalar(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Parses just these tokens with every flag made optional, so clap's own value parsers judge the
/// value.
fn check_value(root: &Command, sub: Option<&Command>, tokens: &[OsString]) -> Result<(), String> {
    if tokens.is_empty() {
        return Ok(());
    }
    let relaxed = root
        .clone()
        .subcommand_required(false)
        .arg_required_else_help(false)
        // A command with subcommands of its own (`user`) takes its flags without one here.
        .mut_subcommands(|s| s.subcommand_required(false).mut_args(|a| a.required(false)));
    let mut argv: Vec<&OsStr> = vec![OsStr::new("nvmq")];
    if let Some(s) = sub {
        argv.push(OsStr::new(s.get_name()));
    }
    argv.extend(tokens.iter().map(|t| t.as_os_str()));
    match relaxed.try_get_matches_from(argv) {
        Ok(_) => Ok(()),
        // Flags required only together with others (e.g. --device unless --dir) are judged
        // when the whole command line is parsed.
        Err(e) if e.kind() == clap::error::ErrorKind::MissingRequiredArgument => Ok(()),
        Err(e) => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("").trim();
            Err(first.strip_prefix("error: ").unwrap_or(first).to_string())
        }
    }
}
