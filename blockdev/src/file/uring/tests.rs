//! The completion eventfd across the poll/reap race, with the kernel posting a CQE in between.

use super::*;
use crate::file::notify::fd_readable;

/// A ring over /dev/null, or `None` (after a loud notice) when io_uring is missing and
/// `NVMQ_NO_IO_URING=1` says that is expected.
fn ring_or_skip(test: &str) -> Option<Ring> {
    let file = File::open("/dev/null").expect("/dev/null");
    match Ring::start(file, Vec::new(), 512, 8) {
        Ok(r) => Some(r),
        Err(why) if std::env::var("NVMQ_NO_IO_URING").as_deref() == Ok("1") => {
            eprintln!("!!! {test}: SKIPPED, io_uring is unavailable ({why})");
            None
        }
        Err(why) => panic!("{test}: io_uring is unavailable: {why}"),
    }
}

/// Queues a NOP (no I/O of ours) and waits in the kernel until its CQE is posted, without reaping.
fn post_a_cqe(ring: &mut IoUring) {
    let nop = opcode::Nop::new().build().user_data(AUX);
    // SAFETY: a NOP references no memory.
    unsafe { ring.submission().push(&nop) }.expect("room for a NOP");
    ring.submit_and_wait(1).expect("the NOP completes");
}

fn readable(ring: &Ring) -> bool {
    fd_readable(ring.notify_fd(), Some(Duration::ZERO)).expect("poll(2)")
}

#[test]
fn a_cqe_posted_between_the_reset_and_the_reap_leaves_the_eventfd_readable() {
    let Some(mut ring) = ring_or_skip("a_cqe_posted_between_the_reset_and_the_reap") else {
        return;
    };
    let (mut out, mut events) = (Vec::new(), Vec::new());
    ring.poll_with(&mut out, &mut events, post_a_cqe).unwrap();
    // The reap took the CQE (a NOP, skipped) ...
    assert!(ring.ring.completion().is_empty());
    assert!(out.is_empty() && events.is_empty());
    // ... and the kernel's signal, which came after the reset, is still there: an owner sleeping
    // on the eventfd wakes, polls, finds nothing, and sleeps again. Had the reset come after the
    // reap, a CQE posted between the two would have been left unreaped with the eventfd quiet.
    assert!(readable(&ring));
    ring.poll(&mut out, &mut events).unwrap();
    assert!(!readable(&ring), "nothing in flight, nothing to wake for");
}

#[test]
fn a_cqe_posted_after_a_poll_makes_the_eventfd_readable_until_the_next_poll() {
    let Some(mut ring) = ring_or_skip("a_cqe_posted_after_a_poll") else {
        return;
    };
    let (mut out, mut events) = (Vec::new(), Vec::new());
    ring.poll(&mut out, &mut events).unwrap();
    assert!(!readable(&ring));
    post_a_cqe(&mut ring.ring);
    assert!(readable(&ring));
    ring.poll(&mut out, &mut events).unwrap();
    assert!(ring.ring.completion().is_empty());
    assert!(!readable(&ring));
}
