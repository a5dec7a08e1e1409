//! nvmq-recovery's integration tests, in one binary (a module per former file): as separate
//! binaries each compiled and linked the log and its simulator again. `cargo test -p
//! nvmq-recovery --test suite <module>::` runs one. Left as binaries of their own: tests that
//! run their own binary again (file_process_crash), that time the writer (log_threaded,
//! relaxed_idle, writer_faults), or that need an NVMe drive (nvme_*).

mod fuzz_common;
mod fuzz_images;
mod fuzz_mutations;
mod stepped;

mod checkpoint_parts;
mod crash_sim;
mod format_version;
mod fuzz_decoders;
mod fuzz_forged;
mod fuzz_random_device;
mod fuzz_recovery;
mod geometry;
mod many_partitions;
mod stale_batch;
