//! A decompression bomb costs the batch checker a bounded amount of work and next to no memory:
//! the records are parsed from the decompressor through a small buffer, never held whole. The
//! allocations of the checking thread are counted by a global allocator (zstd's own, made in C,
//! are not seen here: its window is capped by `window_log_max`, see `records::zstd_reader`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write;
use std::time::{Duration, Instant};

use frontend::batch;
use frontend::codes;
use frontend::records::Checks;

struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn note(delta: isize) {
    // try_with: allocations made while the thread's locals are being torn down go uncounted.
    let _ = LIVE.try_with(|l| {
        let now = l.get() + delta;
        l.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
}

// SAFETY: every call is passed on to the system allocator unchanged; the counting touches only
// const-initialised thread-locals (no allocation, no destructor).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size() as isize);
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note(l.size() as isize);
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        note(-(l.size() as isize));
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        note(new as isize - l.size() as isize);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Bytes allocated at most (above what was live before) while `f` ran on this thread.
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(|l| l.get());
    PEAK.with(|p| p.set(base));
    let r = f();
    let peak = PEAK.with(|p| p.get());
    (r, (peak - base).max(0) as usize)
}

fn varint(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

/// The records of one record whose value is `n` zero bytes, written through `sink` in pieces.
fn one_big_record(n: usize, sink: &mut dyn Write) {
    let mut len = Vec::new();
    varint(&mut len, n as i64);
    let mut head = Vec::new();
    varint(&mut head, (4 + len.len() + n + 1) as i64);
    head.extend([0, 0, 0, 1]);
    head.extend(len);
    sink.write_all(&head).unwrap();
    let zeros = vec![0u8; 1 << 20];
    let mut left = n;
    while left > 0 {
        let k = left.min(zeros.len());
        sink.write_all(&zeros[..k]).unwrap();
        left -= k;
    }
    sink.write_all(&[0]).unwrap();
}

fn batch_over(records: &[u8], codec: i16) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend(0i64.to_be_bytes());
    b.extend(((49 + records.len()) as i32).to_be_bytes());
    b.extend((-1i32).to_be_bytes());
    b.push(2);
    b.extend(0u32.to_be_bytes());
    b.extend(codec.to_be_bytes());
    b.extend(0i32.to_be_bytes());
    b.extend(0i64.to_be_bytes());
    b.extend(0i64.to_be_bytes());
    b.extend((-1i64).to_be_bytes());
    b.extend((-1i16).to_be_bytes());
    b.extend((-1i32).to_be_bytes());
    b.extend(1i32.to_be_bytes());
    b.extend(records);
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

#[test]
fn bombs_are_refused_in_bounded_time_and_memory() {
    const BOMB: usize = 256 << 20;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    one_big_record(BOMB, &mut gz);
    let gzip = gz.finish().unwrap();
    let mut lz = lz4_flex::frame::FrameEncoder::new(Vec::new());
    one_big_record(BOMB, &mut lz);
    let lz4 = lz.finish().unwrap();
    // Raw snappy cannot expand more than ~21 times: a block claiming 256 MiB needs ~12 MiB.
    let mut raw = Vec::new();
    one_big_record(BOMB, &mut raw);
    let snappy = snap::raw::Encoder::new().compress_vec(&raw).unwrap();
    drop(raw);
    let checks = Checks::default();
    for (name, codec, data) in [("gzip", 1, gzip), ("lz4", 3, lz4), ("snappy", 2, snappy)] {
        let b = batch_over(&data, codec);
        let t = Instant::now();
        let (r, peak) = peak_during(|| batch::split(&b, &checks));
        let took = t.elapsed();
        let f = r.expect_err(name);
        assert_eq!(f.code, codes::MESSAGE_TOO_LARGE, "{name}: {f}");
        // The decoder's own state is counted (the allocator sees this thread's allocations).
        assert!(peak > 1024, "{name}: allocations not counted");
        assert!(
            peak < 2 << 20,
            "{name}: checking a {}-byte bomb allocated {peak} bytes",
            b.len()
        );
        // The bound on decompressed bytes bounds the work: 16 MiB of decompression, not 256.
        assert!(took < Duration::from_secs(2), "{name}: {took:?}");
    }
}
