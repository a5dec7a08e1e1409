//! The frontend's integration tests, in one binary (a module per former file): as separate
//! binaries each compiled and linked the broker again (about 20 s apiece in CI's build).
//! `cargo test -p nvmq-frontend --test suite <module>::` runs one. Tests that measure the
//! process (its allocator, its RSS) stay binaries of their own: bomb_memory, limits,
//! many_partitions.

#[path = "../common/mod.rs"]
mod common;

mod acl_api;
mod acl_checks;
mod advertised;
mod authorized_ops;
mod check_offload;
mod cluster_apis;
mod config_durability;
mod devices;
mod flexible;
mod fuzz_requests;
mod group_admin;
mod list_offsets;
mod login_offload;
mod newest_versions;
mod produce_checks;
mod producer_state;
mod retention;
mod sasl;
mod sasl_acl;
mod tls;
mod topic_configs;
mod wire;
