//! `nvmq acl add|remove|list` on a stopped broker's device: the bindings they write are the ones
//! `serve --authorizer` enforces at its next start (no `--super-users` needed to bootstrap), a
//! removal lifts them, `list` shows what is there, and bad flags are refused naming the flag
//! without touching the device.

use std::time::Duration;

use crate::common::kafka::{auto_create, connect, produce};
use crate::common::*;

/// TOPIC_AUTHORIZATION_FAILED.
const TOPIC_DENIED: i16 = 29;

/// `nvmq acl <args> --device <dev>`, which must succeed: its stdout.
fn acl(dev: &str, args: &[&str]) -> String {
    let r = nvmq(&[&["acl"], args, &["--device", dev]].concat());
    assert_eq!(r.code, 0, "nvmq acl {args:?}: {r}");
    r.stdout
}

/// Starts `serve --authorizer` on `dev` (no super users), has User:ANONYMOUS produce one record
/// to each of `topics` (created through Metadata first), and stops it: per topic, the error
/// codes of the Produce (empty: stored).
fn produce_as_anonymous(dev: &str, topics: &[&str]) -> Vec<Vec<i16>> {
    let mut s = serve(&["--device", dev, "--listen", "127.0.0.1:0", "--authorizer"]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let out = rt.block_on(async {
        let mut c = connect(&s.kafka, "acl-offline").await;
        let mut out = Vec::new();
        for t in topics {
            auto_create(&mut c, t).await;
            let (_, errors) = produce(&mut c, t, 1, b"v").await.expect("a Produce answer");
            out.push(errors);
        }
        out
    });
    assert_eq!(s.terminate(Duration::from_secs(60)), Some(0), "serve stops");
    out
}

#[test]
fn offline_bindings_are_enforced_at_the_next_start_and_removals_lift_them() {
    let dir = temp_dir("acl-offline");
    let dev = spec(&formatted(&dir));
    // Bootstrap: the cluster lets ANONYMOUS create topics, topic a lets it write; b nothing.
    let added = acl(
        &dev,
        &[
            "add",
            "--allow-principal",
            "User:ANONYMOUS",
            "--operation",
            "Create",
            "--cluster",
        ],
    );
    assert!(
        added.contains("added: Allow User:ANONYMOUS Cluster:kafka-cluster"),
        "{added}"
    );
    acl(
        &dev,
        &[
            "add",
            "--allow-principal",
            "User:ANONYMOUS",
            "--operation",
            "write",
            "--topic",
            "a",
        ],
    );
    let table = acl(&dev, &["list"]);
    let rows: Vec<&str> = table.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert!(
        table
            .lines()
            .next()
            .is_some_and(|h| h.starts_with("PERMISSION")),
        "{table}"
    );
    assert!(
        rows.iter().any(|r| r.split_whitespace().collect::<Vec<_>>()
            == [
                "Allow",
                "User:ANONYMOUS",
                "*",
                "Write",
                "Topic",
                "Literal",
                "a"
            ]),
        "{table}"
    );

    let codes = produce_as_anonymous(&dev, &["a", "b"]);
    assert_eq!(codes[0], Vec::<i16>::new(), "topic a is allowed: {codes:?}");
    assert_eq!(
        codes[1],
        vec![TOPIC_DENIED],
        "topic b has no binding: {codes:?}"
    );

    // A Deny for a wins over its Allow.
    let added = acl(
        &dev,
        &[
            "add",
            "--deny-principal",
            "User:ANONYMOUS",
            "--operation",
            "Write",
            "--topic",
            "a",
        ],
    );
    assert!(
        added.contains("added: Deny User:ANONYMOUS Topic:a"),
        "{added}"
    );
    assert_eq!(produce_as_anonymous(&dev, &["a"]), vec![vec![TOPIC_DENIED]]);

    // Removing the Deny (by its principal and resource) lifts it, and leaves the Allow.
    let removed = acl(
        &dev,
        &[
            "remove",
            "--deny-principal",
            "User:ANONYMOUS",
            "--topic",
            "a",
        ],
    );
    assert_eq!(removed.lines().count(), 1, "{removed}");
    assert!(
        removed.contains("removed: Deny User:ANONYMOUS Topic:a"),
        "{removed}"
    );
    assert_eq!(produce_as_anonymous(&dev, &["a"]), vec![Vec::<i16>::new()]);

    // list --json, filtered by topic: the Allow alone.
    let r = nvmq(&["acl", "list", "--json", "--topic", "a", "--device", &dev]);
    assert_eq!(r.code, 0, "{r}");
    let v = r.json();
    let all = v.as_array().expect("a JSON array");
    assert_eq!(all.len(), 1, "{v}");
    assert_eq!(all[0]["permission"], "Allow", "{v}");
    assert_eq!(all[0]["principal"], "User:ANONYMOUS", "{v}");
    assert_eq!(all[0]["operation"], "Write", "{v}");
    assert_eq!(all[0]["resource_type"], "Topic", "{v}");
    assert_eq!(all[0]["pattern_type"], "Literal", "{v}");
    assert_eq!(all[0]["name"], "a", "{v}");
    assert_eq!(all[0]["host"], "*", "{v}");

    // Removing every binding on a: then a is refused like b.
    acl(&dev, &["remove", "--topic", "a"]);
    assert_eq!(produce_as_anonymous(&dev, &["a"]), vec![vec![TOPIC_DENIED]]);
}

#[test]
fn prefixed_and_host_bindings_are_listed_as_made() {
    let dir = temp_dir("acl-offline-prefixed");
    let dev = spec(&formatted(&dir));
    acl(
        &dev,
        &[
            "add",
            "--allow-principal",
            "User:app",
            "--allow-principal",
            "User:ops",
            "--operation",
            "Read",
            "--operation",
            "Describe",
            "--topic",
            "orders-",
            "--group",
            "billing",
            "--resource-pattern-type",
            "prefixed",
            "--host",
            "10.0.0.7",
        ],
    );
    let r = nvmq(&["acl", "list", "--json", "--device", &dev]);
    assert_eq!(r.code, 0, "{r}");
    let v = r.json();
    let all = v.as_array().expect("a JSON array");
    // 2 principals x 2 resources x 2 operations x 1 host.
    assert_eq!(all.len(), 8, "{v}");
    assert!(
        all.iter()
            .all(|b| b["pattern_type"] == "Prefixed" && b["host"] == "10.0.0.7"),
        "{v}"
    );
    let app_on_billing = all
        .iter()
        .filter(|b| b["principal"] == "User:app" && b["name"] == "billing")
        .count();
    assert_eq!(app_on_billing, 2, "{v}");
    // MATCH selects every pattern covering a name; a literal filter does not see prefixes.
    let r = nvmq(&[
        "acl",
        "list",
        "--json",
        "--topic",
        "orders-eu",
        "--resource-pattern-type",
        "match",
        "--principal",
        "User:ops",
        "--device",
        &dev,
    ]);
    assert_eq!(r.json().as_array().map(Vec::len), Some(2), "{r}");
    let r = nvmq(&["acl", "list", "--topic", "orders-eu", "--device", &dev]);
    assert_eq!(r.stdout, "no ACL bindings\n", "{r}");
}

#[test]
fn bad_flags_are_refused_naming_the_flag_and_the_device_is_left_alone() {
    let dir = temp_dir("acl-offline-bad");
    let dev = spec(&formatted(&dir));
    let base = [
        "--allow-principal",
        "User:x",
        "--operation",
        "Read",
        "--topic",
        "t",
    ];
    let cases: [(&[&str], &str); 10] = [
        (&["--operation", "Reed"], "--operation"),
        (&["--allow-principal", "alice"], "--allow-principal"),
        (&["--deny-principal", ":x"], "--deny-principal"),
        (&["--host", "example.com"], "--host"),
        (&["--topic", ""], "--topic"),
        (
            &["--resource-pattern-type", "fuzzy"],
            "--resource-pattern-type",
        ),
        (
            &["--resource-pattern-type", "match"],
            "--resource-pattern-type",
        ),
        (
            &["--transactional-id", "tx"],
            "--operation Read does not apply",
        ),
        (&["--cluster"], "--operation Read does not apply"),
        (&["--principal", "User:y"], "--principal"),
    ];
    for (extra, names) in cases {
        let r = nvmq(&[&["acl", "add"], &base[..], extra, &["--device", &dev]].concat());
        assert_ne!(r.code, 0, "acl add {extra:?} was taken: {r}");
        assert!(r.stderr.contains(names), "acl add {extra:?}: {r}");
    }
    let missing: [(&[&str], &str); 3] = [
        (
            &["--operation", "Read", "--topic", "t"],
            "--allow-principal",
        ),
        (
            &["--allow-principal", "User:x", "--topic", "t"],
            "--operation",
        ),
        (
            &["--allow-principal", "User:x", "--operation", "Read"],
            "--topic",
        ),
    ];
    for (args, names) in missing {
        let r = nvmq(&[&["acl", "add"], args, &["--device", &dev]].concat());
        assert_eq!(r.code, 1, "acl add {args:?}: {r}");
        assert!(r.stderr.contains(names), "acl add {args:?}: {r}");
    }
    let r = nvmq(&[
        "acl",
        "remove",
        "--allow-principal",
        "User:x",
        "--device",
        &dev,
    ]);
    assert_eq!(r.code, 1, "{r}");
    assert!(r.stderr.contains("name a resource"), "{r}");
    let r = nvmq(&["acl", "remove", "--topic", "t", "--device", &dev]);
    assert_eq!(r.code, 1, "{r}");
    assert!(r.stderr.contains("no binding matched"), "{r}");
    let r = nvmq(&["acl", "list", "--device", "sim:"]);
    assert_eq!(r.code, 1, "{r}");
    assert!(r.stderr.contains("--device sim:"), "{r}");
    // Nothing of the above reached the device.
    assert_eq!(acl(&dev, &["list"]), "no ACL bindings\n");
}
