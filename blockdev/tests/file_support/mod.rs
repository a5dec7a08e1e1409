//! Helpers shared by the file device tests (a directory module, so cargo does not build it as a
//! test).
#![allow(dead_code)]

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};

/// A scratch directory under the target directory, which is on a real file system (O_DIRECT
/// works) even where /tmp is a tmpfs.
pub fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("file-device-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("scratch dir")
}

/// A plain file of `size` zero bytes made without the backend.
pub fn plain_file(dir: &Path, name: &str, size: u64) -> PathBuf {
    let p = dir.join(name);
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&p)
        .expect("create plain file");
    f.set_len(size).expect("set_len");
    p
}

/// Whether the io_uring tests can run. io_uring must be available: when it is not, this panics
/// with the reason, unless `NVMQ_NO_IO_URING=1` says that is expected here, in which case it prints
/// a loud notice and returns false so the caller skips. A skipped test never passes silently.
pub fn io_uring_or_skip(test: &str) -> bool {
    match blockdev::file::io_uring_support() {
        Ok(()) => true,
        Err(why) if std::env::var("NVMQ_NO_IO_URING").as_deref() == Ok("1") => {
            eprintln!(
                "!!! {test}: SKIPPED, io_uring is unavailable ({why}) and NVMQ_NO_IO_URING=1 \
                 says that is expected"
            );
            false
        }
        Err(why) => panic!(
            "{test}: io_uring is unavailable: {why}. Set NVMQ_NO_IO_URING=1 if this machine is \
             expected to lack it"
        ),
    }
}
