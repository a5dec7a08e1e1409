//! The file backend as a BlockDevice: opening, geometry, I/O, flush, and refusals.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use blockdev::file::{FileDevice, FileOptions};
use blockdev::{BlockDevice, Completion, DeviceError, Op, SyncIo};

/// A scratch directory under the target directory, which is on a real file system (O_DIRECT
/// works) even where /tmp is a tmpfs.
fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("file-device-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("scratch dir")
}

/// A plain file of `size` zero bytes made without the backend.
fn plain_file(dir: &Path, name: &str, size: u64) -> PathBuf {
    let p = dir.join(name);
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&p)
        .expect("create plain file");
    f.set_len(size).expect("set_len");
    p
}

fn drain(dev: &mut FileDevice, want: usize) -> Vec<Completion> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut out = Vec::new();
    while out.len() < want {
        assert!(Instant::now() < deadline, "completions did not arrive");
        dev.wait(&mut out, Duration::from_millis(100)).unwrap();
    }
    out
}

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

#[test]
fn geometry_of_a_regular_file_is_sane() {
    let dir = scratch();
    let size = 8 << 20;
    let p = plain_file(dir.path(), "dev", size);
    let dev = FileDevice::open(&p, FileOptions::default()).unwrap();
    let info = dev.info();
    assert!(dev.is_direct());
    assert!(info.logical_block_size >= 512);
    assert!(info.logical_block_size.is_power_of_two());
    assert_eq!(info.physical_block_size, info.logical_block_size);
    assert_eq!(info.capacity, size);
    assert_eq!(info.max_transfer, 1 << 20);
    assert!(info.fs_block_size >= 512, "{info:?}");
    assert!(info.write_unit() >= info.logical_block_size);
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
    assert_eq!(dev.in_flight(), 0);
}

#[test]
fn buffers_are_aligned_for_direct_io() {
    let dir = scratch();
    let p = plain_file(dir.path(), "dev", 1 << 20);
    let mut dev = FileDevice::open(&p, FileOptions::default()).unwrap();
    let align = (dev.info().logical_block_size as usize).max(4096);
    let b = dev.alloc_buffer(3 * 4096).unwrap();
    assert_eq!(b.as_ptr() as usize % align, 0);
    assert_eq!(b.len(), 3 * 4096);
    assert!(b.iter().all(|&x| x == 0));
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

#[test]
fn writes_and_reads_round_trip_with_many_in_flight() {
    let dir = scratch();
    let blocks_total = 4096u64;
    let mut dev = {
        let p = plain_file(dir.path(), "dev", blocks_total * 4096);
        FileDevice::open(&p, FileOptions::default()).unwrap()
    };
    let bs = u64::from(dev.info().logical_block_size);
    let cap_blocks = dev.info().capacity / bs;
    // I/Os of 1..=16 blocks at scattered, non-overlapping addresses.
    let mut plan = Vec::new();
    let mut lba = 0u64;
    let mut i = 0u64;
    while plan.len() < 64 {
        let blocks = 1 + (i * 7) % 16;
        if lba + blocks > cap_blocks {
            break;
        }
        plan.push((i, lba, blocks));
        lba += blocks + (i * 13) % 29;
        i += 1;
    }
    assert!(plan.len() >= 32);
    let pattern = |tag: u64, lba: u64, k: usize| (tag as usize * 31 + lba as usize * 7 + k) as u8;
    for &(tag, lba, blocks) in &plan {
        let mut b = dev.alloc_buffer((blocks * bs) as usize).unwrap();
        for (k, x) in b.iter_mut().enumerate() {
            *x = pattern(tag, lba, k);
        }
        dev.submit_write(tag, lba, b).unwrap();
    }
    assert_eq!(dev.in_flight(), plan.len());
    let done = drain(&mut dev, plan.len());
    assert_eq!(dev.in_flight(), 0);
    let by_tag: HashMap<u64, (u64, u64)> = plan.iter().map(|&(t, l, n)| (t, (l, n))).collect();
    for c in &done {
        c.result.as_ref().unwrap();
        assert_eq!(c.op, Op::Write);
        assert_eq!(c.lba, by_tag[&c.tag].0);
        assert!(c.buffer.is_some());
    }

    dev.submit_flush(1000).unwrap();
    let f = drain(&mut dev, 1);
    assert_eq!((f[0].tag, f[0].op), (1000, Op::Flush));
    f[0].result.as_ref().unwrap();
    assert!(f[0].buffer.is_none());

    for &(tag, lba, blocks) in &plan {
        let b = dev.alloc_buffer((blocks * bs) as usize).unwrap();
        dev.submit_read(tag + 10_000, lba, b).unwrap();
    }
    let done = drain(&mut dev, plan.len());
    let mut seen = 0;
    for c in done {
        c.result.unwrap();
        assert_eq!(c.op, Op::Read);
        let tag = c.tag - 10_000;
        let (lba, blocks) = by_tag[&tag];
        assert_eq!(c.lba, lba);
        let b = c.buffer.unwrap();
        assert_eq!(b.len() as u64, blocks * bs);
        assert!(
            b.iter()
                .enumerate()
                .all(|(k, &x)| x == pattern(tag, lba, k)),
            "read back differs for tag {tag} at lba {lba}"
        );
        seen += 1;
    }
    assert_eq!(seen, plan.len());
}

#[test]
fn data_survives_reopen_and_the_last_block_is_addressable() {
    let dir = scratch();
    let p = plain_file(dir.path(), "dev", 1 << 20);
    let last;
    {
        let mut dev = FileDevice::open(&p, FileOptions::default()).unwrap();
        let bs = dev.info().logical_block_size as usize;
        last = dev.info().capacity / bs as u64 - 1;
        dev.write_at(last * bs as u64, &vec![0xab; bs]).unwrap();
        dev.write_at(0, &vec![0xcd; 2 * bs]).unwrap();
        SyncIo::flush(&mut dev).unwrap();
    }
    let mut dev = FileDevice::open(&p, FileOptions::default()).unwrap();
    let bs = dev.info().logical_block_size as usize;
    assert!(dev
        .read_at(last * bs as u64, bs)
        .unwrap()
        .iter()
        .all(|&x| x == 0xab));
    let head = dev.read_at(0, 3 * bs).unwrap();
    assert!(head[..2 * bs].iter().all(|&x| x == 0xcd));
    assert!(head[2 * bs..].iter().all(|&x| x == 0));
}

#[test]
fn malformed_io_is_refused_at_submit() {
    let dir = scratch();
    let p = plain_file(dir.path(), "dev", 1 << 20);
    let mut dev = FileDevice::open(&p, FileOptions::default()).unwrap();
    let bs = dev.info().logical_block_size as usize;
    let cap_blocks = dev.info().capacity / bs as u64;

    // Length not a multiple of the block size.
    let mut b = dev.alloc_buffer(bs).unwrap();
    b.set_len(bs - 1);
    assert!(matches!(
        dev.submit_write(1, 0, b),
        Err(DeviceError::BadRequest { op: Op::Write, .. })
    ));
    // Past the end, and straddling the end.
    let b = dev.alloc_buffer(bs).unwrap();
    assert!(matches!(
        dev.submit_read(2, cap_blocks, b),
        Err(DeviceError::OutOfRange { op: Op::Read, .. })
    ));
    let b = dev.alloc_buffer(2 * bs).unwrap();
    assert!(matches!(
        dev.submit_write(3, cap_blocks - 1, b),
        Err(DeviceError::OutOfRange { op: Op::Write, .. })
    ));
    // Address overflow.
    let b = dev.alloc_buffer(bs).unwrap();
    assert!(dev.submit_write(4, u64::MAX, b).is_err());
    // Larger than the maximum transfer.
    let b = dev.alloc_buffer(2 << 20).unwrap();
    assert!(matches!(
        dev.submit_write(5, 0, b),
        Err(DeviceError::BadRequest { op: Op::Write, .. })
    ));
    // A buffer that is not aligned for O_DIRECT.
    let b = blockdev::IoBuffer::new_heap(bs, 8).unwrap();
    if !(b.as_ptr() as usize).is_multiple_of(512) {
        assert!(matches!(
            dev.submit_write(6, 0, b),
            Err(DeviceError::BadRequest { op: Op::Write, .. })
        ));
    }
    assert_eq!(dev.in_flight(), 0);
    let mut out = Vec::new();
    assert_eq!(dev.poll(&mut out).unwrap(), 0);
}

#[test]
fn the_queue_depth_is_enforced_until_completions_are_collected() {
    let dir = scratch();
    let p = plain_file(dir.path(), "dev", 1 << 20);
    let opts = FileOptions {
        queue_depth: 2,
        io_threads: 2,
        ..FileOptions::default()
    };
    let mut dev = FileDevice::open(&p, opts).unwrap();
    let bs = dev.info().logical_block_size as usize;
    for tag in 0..2 {
        let b = dev.alloc_buffer(bs).unwrap();
        dev.submit_write(tag, tag, b).unwrap();
    }
    let b = dev.alloc_buffer(bs).unwrap();
    assert!(matches!(
        dev.submit_write(2, 2, b),
        Err(DeviceError::QueueFull { depth: 2, .. })
    ));
    assert!(matches!(
        dev.submit_flush(3),
        Err(DeviceError::QueueFull { op: Op::Flush, .. })
    ));
    // Completed but not collected still counts.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(dev.in_flight(), 2);
    let done = drain(&mut dev, 2);
    assert!(done.iter().all(|c| c.result.is_ok()));
    dev.submit_flush(3).unwrap();
    drain(&mut dev, 1)[0].result.as_ref().unwrap();
}

#[test]
fn wait_times_out_with_nothing_in_flight() {
    let dir = scratch();
    let p = plain_file(dir.path(), "dev", 1 << 20);
    let mut dev = FileDevice::open(&p, FileOptions::default()).unwrap();
    let mut out = Vec::new();
    let t = Instant::now();
    assert_eq!(dev.wait(&mut out, Duration::from_millis(20)).unwrap(), 0);
    assert!(t.elapsed() >= Duration::from_millis(15));
    assert!(out.is_empty());
}

#[test]
fn flush_completes_and_covers_delivered_writes() {
    let dir = scratch();
    let p = plain_file(dir.path(), "dev", 1 << 20);
    let mut dev = FileDevice::open(&p, FileOptions::default()).unwrap();
    let bs = dev.info().logical_block_size as usize;
    for round in 0..20u64 {
        let mut b = dev.alloc_buffer(bs).unwrap();
        b.fill(round as u8);
        dev.submit_write(round, round, b).unwrap();
        assert!(drain(&mut dev, 1)[0].result.is_ok());
        dev.submit_flush(100 + round).unwrap();
        let c = drain(&mut dev, 1);
        assert_eq!(c[0].tag, 100 + round);
        c[0].result.as_ref().unwrap();
    }
}

#[test]
fn dropping_with_io_in_flight_neither_hangs_nor_panics() {
    let dir = scratch();
    let p = plain_file(dir.path(), "dev", 4 << 20);
    let mut dev = FileDevice::open(&p, FileOptions::default()).unwrap();
    let bs = dev.info().logical_block_size as u64;
    for tag in 0..32u64 {
        let b = dev.alloc_buffer(64 * 1024).unwrap();
        dev.submit_write(tag, tag * (64 * 1024 / bs), b).unwrap();
    }
    dev.submit_flush(99).unwrap();
    drop(dev);
    // The file is still a usable device afterwards.
    FileDevice::open(&p, FileOptions::default()).unwrap();
}

#[test]
fn buffered_mode_works_and_says_so() {
    let dir = scratch();
    let p = plain_file(dir.path(), "dev", 1 << 20);
    let opts = FileOptions {
        direct: false,
        ..FileOptions::default()
    };
    let mut dev = FileDevice::open(&p, opts).unwrap();
    assert!(!dev.is_direct());
    assert!(dev.info().volatile_write_cache);
    let bs = dev.info().logical_block_size as usize;
    dev.write_at(bs as u64, &vec![7u8; bs]).unwrap();
    SyncIo::flush(&mut dev).unwrap();
    assert!(dev.read_at(bs as u64, bs).unwrap().iter().all(|&x| x == 7));
}

#[test]
fn the_device_is_send_and_boxable() {
    fn is_send<T: Send>() {}
    is_send::<FileDevice>();
    let dir = scratch();
    let p = plain_file(dir.path(), "dev", 1 << 20);
    let mut dev: Box<dyn BlockDevice> =
        Box::new(FileDevice::open(&p, FileOptions::default()).unwrap());
    let bs = dev.info().logical_block_size as usize;
    dev.write_at(0, &vec![1u8; bs]).unwrap();
    assert_eq!(dev.read_at(0, bs).unwrap(), vec![1u8; bs]);
}
