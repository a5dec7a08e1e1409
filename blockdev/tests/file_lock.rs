//! Who may open a file device at once: one writer (an exclusive lock), and any number of readers
//! that open it read-only and are refused every write and flush.

mod file_support;

use blockdev::file::{FileDevice, FileOptions};
use blockdev::{DeviceError, Op, SyncIo};
use file_support::scratch;

const SIZE: u64 = 1 << 20;

fn read_only() -> FileOptions {
    FileOptions {
        read_only: true,
        ..FileOptions::default()
    }
}

fn open_detail(r: Result<FileDevice, DeviceError>) -> String {
    match r {
        Err(DeviceError::Open { detail, .. }) => detail,
        Err(e) => panic!("expected an Open error, got {e}"),
        Ok(_) => panic!("expected an Open error, got a device"),
    }
}

#[test]
fn a_second_writer_is_refused_until_the_first_closes() {
    let dir = scratch();
    let path = dir.path().join("dev.img");
    let first =
        FileDevice::create(&path, SIZE, FileOptions::default(), |_| Ok(())).expect("create");
    let detail = open_detail(FileDevice::open(&path, FileOptions::default()));
    assert!(
        detail.contains("another process has it open for writing"),
        "{detail}"
    );
    drop(first);
    FileDevice::open(&path, FileOptions::default()).expect("reopen after the writer closed");
}

#[test]
fn a_reader_beside_the_writer_sees_flushed_data_and_cannot_write() {
    let dir = scratch();
    let path = dir.path().join("dev.img");
    let mut writer =
        FileDevice::create(&path, SIZE, FileOptions::default(), |_| Ok(())).expect("create");
    writer.write_at(8192, &[0x5a; 4096]).expect("write");
    writer.flush().expect("flush");

    let mut reader = FileDevice::open(&path, read_only()).expect("read-only open beside a writer");
    assert_eq!(reader.read_at(8192, 4096).expect("read"), vec![0x5a; 4096]);
    match reader.write_at(0, &[1; 4096]) {
        Err(DeviceError::BadRequest {
            op: Op::Write, why, ..
        }) => {
            assert!(why.contains("read-only"), "{why}")
        }
        other => panic!("a write through a read-only device: {other:?}"),
    }
    match reader.flush() {
        Err(DeviceError::BadRequest { op: Op::Flush, .. }) => {}
        other => panic!("a flush through a read-only device: {other:?}"),
    }
    // Nothing the reader tried reached the file; the writer still owns it.
    assert_eq!(writer.read_at(0, 4096).expect("read"), vec![0; 4096]);
    drop(reader);
    let detail = open_detail(FileDevice::open(&path, FileOptions::default()));
    assert!(detail.contains("open for writing"), "{detail}");
}

#[test]
fn create_refuses_read_only() {
    let dir = scratch();
    let path = dir.path().join("dev.img");
    let detail = open_detail(FileDevice::create(&path, SIZE, read_only(), |_| Ok(())));
    assert!(detail.contains("read_only"), "{detail}");
    assert!(!path.exists());
}
