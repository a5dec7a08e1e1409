//! The file backend's own behaviour: opening and its refusals, geometry, direct and buffered I/O.
//! What every backend shares (I/O, flush, refusals at submit, queue depth) is the contract suite's,
//! run on the file device in tests/contract.rs.

mod file_support;

use std::path::Path;

use blockdev::file::{FileDevice, FileOptions};
use blockdev::{BlockDevice, DeviceError, Op};
use file_support::{plain_file, scratch};

fn open_err_detail(r: Result<FileDevice, DeviceError>) -> String {
    match r {
        Err(DeviceError::Open { op, detail, .. }) => {
            assert_eq!(op, Op::Open);
            detail
        }
        Err(e) => panic!("expected an Open error, got {e}"),
        Ok(_) => panic!("expected an Open error, got a device"),
    }
}

/// What the file backend reports beyond what the contract suite checks (tests/contract.rs).
#[test]
fn geometry_of_a_regular_file() {
    let dir = scratch();
    let size = 8 << 20;
    let p = plain_file(dir.path(), "dev", size);
    let dev = FileDevice::open(&p, FileOptions::default()).unwrap();
    let info = dev.info();
    assert!(dev.is_direct());
    assert_eq!(info.physical_block_size, info.logical_block_size);
    assert_eq!(info.capacity, size);
    assert_eq!(info.max_transfer, 1 << 20);
    assert!(info.fs_block_size >= 512, "{info:?}");
    assert!(info.volatile_write_cache);
    assert_eq!(info.atomic_write_unit, 0);
    assert_eq!(info.preferred_write, 0);
    assert_eq!(info.model, "");
    let canon = std::fs::canonicalize(&p).unwrap();
    assert!(
        info.identity
            .starts_with(&format!("file:{} dev=", canon.display())),
        "{}",
        info.identity
    );
    assert!(info.identity.contains(" ino="), "{}", info.identity);
    assert_eq!(dev.queue_depth(), 256);
}

#[test]
fn open_never_creates() {
    let dir = scratch();
    let p = dir.path().join("missing");
    let detail = open_err_detail(FileDevice::open(&p, FileOptions::default()));
    assert!(detail.contains("does not exist"), "{detail}");
    assert!(!p.exists());
}

#[test]
fn open_refuses_what_is_not_a_file_or_block_device() {
    let dir = scratch();
    let detail = open_err_detail(FileDevice::open(dir.path(), FileOptions::default()));
    assert!(detail.contains("directory"), "{detail}");
    let detail = open_err_detail(FileDevice::open(
        Path::new("/dev/null"),
        FileOptions::default(),
    ));
    assert!(detail.contains("character device"), "{detail}");
}

#[test]
fn open_refuses_a_size_that_is_not_a_whole_number_of_blocks() {
    let dir = scratch();
    let p = plain_file(dir.path(), "odd", (1 << 20) + 100);
    let detail = open_err_detail(FileDevice::open(&p, FileOptions::default()));
    assert!(detail.contains("not a multiple"), "{detail}");
    let p = plain_file(dir.path(), "empty", 0);
    let detail = open_err_detail(FileDevice::open(&p, FileOptions::default()));
    assert!(detail.contains("empty"), "{detail}");
}

#[test]
fn open_refuses_bad_options() {
    let dir = scratch();
    let p = plain_file(dir.path(), "dev", 1 << 20);
    for opts in [
        FileOptions {
            io_threads: 0,
            ..FileOptions::default()
        },
        FileOptions {
            queue_depth: 0,
            ..FileOptions::default()
        },
    ] {
        open_err_detail(FileDevice::open(&p, opts));
    }
}

/// The contract suite covers the refusals every backend shares (tests/contract.rs); this one is the
/// file backend's own.
#[test]
fn a_buffer_not_aligned_for_direct_io_is_refused() {
    let dir = scratch();
    let p = plain_file(dir.path(), "dev", 1 << 20);
    let mut dev = FileDevice::open(&p, FileOptions::default()).unwrap();
    let bs = dev.info().logical_block_size as usize;
    let b = blockdev::IoBuffer::new_heap(bs, 8).unwrap();
    if !(b.as_ptr() as usize).is_multiple_of(512) {
        assert!(matches!(
            dev.submit_write(6, 0, b),
            Err(DeviceError::BadRequest { op: Op::Write, .. })
        ));
    }
    assert_eq!(dev.in_flight(), 0);
}

#[test]
fn buffered_mode_says_so() {
    let dir = scratch();
    let p = plain_file(dir.path(), "dev", 1 << 20);
    let opts = FileOptions {
        direct: false,
        ..FileOptions::default()
    };
    let dev = FileDevice::open(&p, opts).unwrap();
    // The contract suite runs on a buffered device too (tests/contract.rs).
    assert!(!dev.is_direct());
    assert!(dev.info().volatile_write_cache);
}
