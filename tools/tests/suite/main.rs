//! The tools' integration tests, in one binary (a module per former file): as separate binaries
//! each compiled and linked the test helpers and the broker's crates again (about 230 s of build
//! between them). `cargo test -p nvmq-tools --test suite <module>::` runs one. Most of these tests
//! run the `nvmq` binary as a child, so a test that measures a process measures that child.

#[path = "../common/mod.rs"]
mod common;

#[path = "../../../frontend/tests/common/certs.rs"]
mod certs;

mod acl_offline;
mod admin_clients;
mod bench_and_config;
mod check_storage;
mod cluster_serve;
mod config_reference;
mod format_inspect_verify;
mod geometry_refusal;
mod kafka_bench;
mod kafka_clients;
mod kafka_security;
mod many_partitions;
mod serve_metrics;
mod serve_signals;
mod serve_tls;
mod serve_writer_stop;
mod systemd_unit;
