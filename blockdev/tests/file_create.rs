//! FileDevice::create: storage.md §3, "Creating a file device".

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use blockdev::file::{FileDevice, FileOptions};
use blockdev::{BlockDevice, DeviceError, Op, SyncIo};

fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("file-create-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("scratch dir")
}

/// Names in `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn no_init(_: &mut FileDevice) -> Result<(), DeviceError> {
    Ok(())
}

#[test]
fn created_file_is_full_size_real_zeros_and_keeps_inits_writes() {
    let dir = scratch();
    let p = dir.path().join("nvmq.dev");
    let size: u64 = 8 << 20;
    let mut init_saw = None;
    let dev = FileDevice::create(&p, size, FileOptions::default(), |dev| {
        init_saw = Some(dev.info().capacity);
        let bs = dev.info().logical_block_size as u64;
        // Two "superblocks", a flush apart, the second one left in flight on purpose: create
        // must wait for it.
        dev.write_at(0, &vec![0x5a; 4096])?;
        dev.flush()?;
        let mut b = dev.alloc_buffer(4096)?;
        b.fill(0xa5);
        dev.submit_write(7, (size - 4096) / bs, b)?;
        Ok(())
    })
    .unwrap();
    assert_eq!(init_saw, Some(size));
    assert_eq!(dev.info().capacity, size);
    let canon = std::fs::canonicalize(&p).unwrap();
    assert!(dev
        .info()
        .identity
        .starts_with(&format!("file:{} ", canon.display())));
    drop(dev);

    assert_eq!(entries(dir.path()), vec!["nvmq.dev".to_string()]);
    let meta = std::fs::metadata(&p).unwrap();
    assert_eq!(meta.len(), size);
    // Not sparse: every byte has a block behind it.
    assert!(meta.blocks() * 512 >= size, "{} blocks", meta.blocks());

    let mut dev = FileDevice::open(&p, FileOptions::default()).unwrap();
    let all = dev.read_at(0, size as usize).unwrap();
    assert!(all[..4096].iter().all(|&x| x == 0x5a));
    assert!(all[4096..(size - 4096) as usize].iter().all(|&x| x == 0));
    assert!(all[(size - 4096) as usize..].iter().all(|&x| x == 0xa5));
}

#[test]
fn create_refuses_an_existing_path_and_leaves_it_alone() {
    let dir = scratch();
    let p = dir.path().join("taken");
    std::fs::write(&p, b"precious").unwrap();
    let mut called = false;
    let r = FileDevice::create(&p, 1 << 20, FileOptions::default(), |_| {
        called = true;
        Ok(())
    });
    match r {
        Err(DeviceError::Open {
            op: Op::Open,
            detail,
            ..
        }) => {
            assert!(detail.contains("already exists"), "{detail}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(!called);
    assert_eq!(std::fs::read(&p).unwrap(), b"precious");
    assert_eq!(entries(dir.path()), vec!["taken".to_string()]);
}

#[test]
fn an_init_error_leaves_nothing_behind() {
    let dir = scratch();
    let p = dir.path().join("dev");
    let r = FileDevice::create(&p, 1 << 20, FileOptions::default(), |dev| {
        dev.write_at(0, &[1u8; 4096])?;
        Err(DeviceError::Io {
            op: Op::Write,
            lba: 0,
            detail: "init failed on purpose".into(),
        })
    });
    match r {
        Err(DeviceError::Io { detail, .. }) => assert_eq!(detail, "init failed on purpose"),
        other => panic!("expected init's error, got {other:?}"),
    }
    assert!(entries(dir.path()).is_empty(), "{:?}", entries(dir.path()));
}

#[test]
fn a_failed_io_left_by_init_fails_the_create() {
    let dir = scratch();
    let p = dir.path().join("dev");
    let r = FileDevice::create(&p, 1 << 20, FileOptions::default(), |dev| {
        // The read completes with an error (past the end is refused at submit, so instead make the
        // temporary file shorter than the device thinks).
        let tmp = dir.path().join(".dev.creating");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&tmp)
            .unwrap()
            .set_len(4096)
            .unwrap();
        let b = dev.alloc_buffer(4096)?;
        let bs = u64::from(dev.info().logical_block_size);
        dev.submit_read(1, ((1 << 20) - 4096) / bs, b)?;
        Ok(())
    });
    match r {
        Err(DeviceError::Io { op: Op::Read, .. }) => {}
        other => panic!("expected the read's error, got {other:?}"),
    }
    assert!(entries(dir.path()).is_empty(), "{:?}", entries(dir.path()));
}

#[test]
fn create_refuses_bad_sizes() {
    let dir = scratch();
    let p = dir.path().join("dev");
    for size in [0, 4095, 4096 + 512] {
        let r = FileDevice::create(&p, size, FileOptions::default(), no_init);
        assert!(
            matches!(r, Err(DeviceError::Open { .. })),
            "size {size}: {r:?}"
        );
    }
    assert!(entries(dir.path()).is_empty());
}

#[test]
fn a_temporary_file_left_by_a_crashed_create_is_reused() {
    let dir = scratch();
    let p = dir.path().join("dev");
    std::fs::write(dir.path().join(".dev.creating"), vec![9u8; 12345]).unwrap();
    let mut dev = FileDevice::create(&p, 1 << 20, FileOptions::default(), no_init).unwrap();
    assert_eq!(entries(dir.path()), vec!["dev".to_string()]);
    assert_eq!(dev.info().capacity, 1 << 20);
    assert!(dev.read_at(0, 1 << 20).unwrap().iter().all(|&x| x == 0));
}

#[test]
fn a_create_in_progress_blocks_a_second_one() {
    let dir = scratch();
    let p = dir.path().join("dev");
    let p2 = p.clone();
    let dev = FileDevice::create(&p, 1 << 20, FileOptions::default(), move |_| {
        let second = FileDevice::create(&p2, 1 << 20, FileOptions::default(), no_init);
        match second {
            Err(DeviceError::Open { detail, .. }) => {
                assert!(detail.contains("in progress"), "{detail}")
            }
            other => panic!("expected the second create to be refused, got {other:?}"),
        }
        Ok(())
    })
    .unwrap();
    drop(dev);
    assert_eq!(entries(dir.path()), vec!["dev".to_string()]);
}

#[test]
fn create_in_a_missing_directory_fails_cleanly() {
    let dir = scratch();
    let p = dir.path().join("no/such/dir/dev");
    let r = FileDevice::create(&p, 1 << 20, FileOptions::default(), no_init);
    assert!(matches!(r, Err(DeviceError::Open { .. })), "{r:?}");
}
