//! nvmq-cluster's integration tests, in one binary: as separate binaries each compiled
//! openraft's core again (about 75 s apiece in CI's build). One module per former file;
//! `cargo test -p nvmq-cluster --test suite <module>::` runs one.

mod common;

mod applier_snapshot;
mod bytes_behind;
mod cluster;
mod conformance;
mod log_failure;
mod power_cut;
mod refusals;
mod tcp;
mod wire;
mod wrap;
