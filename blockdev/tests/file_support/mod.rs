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
