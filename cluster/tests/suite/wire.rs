//! The transport's decoder against mutated and garbage frames (seeded): it never panics, a frame
//! it accepts re-encodes to bytes that decode to the same thing, and each way a frame is wrong
//! (length, kind, body) is the error that names it. Seeds 1-4 by default; NVMQ_WIRE_SEED=<n>
//! replays one, and a failure prints its seed.

use nvmq_cluster::net::wire::{self, Chunk, Frame, Hello, Message, WireError, HEADER, MAX_FRAME};
use nvmq_cluster::{Entry, LogId, Request, Vote};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest, VoteResponse};
use openraft::EntryPayload;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ROUNDS: usize = 3000;

struct SeedGuard(u64);

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "wire test failed with seed {0} (NVMQ_WIRE_SEED={0})",
                self.0
            );
        }
    }
}

fn seeds() -> Vec<u64> {
    match std::env::var("NVMQ_WIRE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(s) => vec![s],
        None => vec![1, 2, 3, 4],
    }
}

fn entry(rng: &mut StdRng, index: u64) -> Entry {
    let len = rng.gen_range(0..64);
    Entry {
        log_id: LogId::new_term_index(rng.gen_range(1..4), index),
        payload: EntryPayload::Normal(Request::from(
            (0..len).map(|_| rng.gen()).collect::<Vec<u8>>(),
        )),
    }
}

/// A valid message of a random kind.
fn message(rng: &mut StdRng) -> Message {
    let vote = Vote::new(rng.gen_range(0..10), rng.gen_range(0..5));
    let log_id = Some(LogId::new_term_index(
        rng.gen_range(1..4),
        rng.gen_range(0..100),
    ));
    match rng.gen_range(0..9) {
        0 => Message::Hello(Hello {
            version: wire::VERSION,
            from: rng.gen(),
            to: rng.gen(),
        }),
        1 => Message::HelloAck(rng.gen()),
        2 => {
            let first = rng.gen_range(1..50);
            let n = rng.gen_range(0..5);
            Message::AppendEntries(AppendEntriesRequest {
                vote,
                prev_log_id: log_id,
                entries: (first..first + n).map(|i| entry(rng, i)).collect(),
                leader_commit: log_id,
            })
        }
        3 => Message::Vote(VoteRequest::new(vote, log_id)),
        4 => Message::PreVote(VoteRequest::new(vote, log_id)),
        5 => Message::SnapshotChunk(Chunk {
            transfer: rng.gen(),
            offset: rng.gen_range(0..1 << 20),
            data: (0..rng.gen_range(0..40)).map(|_| rng.gen()).collect(),
            done: None,
        }),
        6 => Message::AppendEntriesReply(match rng.gen_range(0..4) {
            0 => AppendEntriesResponse::Success,
            1 => AppendEntriesResponse::PartialSuccess(log_id),
            2 => AppendEntriesResponse::Conflict,
            _ => AppendEntriesResponse::HigherVote(vote),
        }),
        7 => Message::VoteReply(VoteResponse::new(vote, log_id, rng.gen())),
        _ => Message::Refused("a reason".into()),
    }
}

fn frame_bytes(rng: &mut StdRng) -> Vec<u8> {
    let msg = message(rng);
    let bytes = wire::encode(rng.gen(), rng.gen(), &msg);
    bytes.unwrap_or_else(|e| panic!("encode {}: {e}", msg.name()))
}

/// What was done to a valid frame, and so which error (if any) it must give.
#[derive(Debug, Clone, Copy)]
enum Mutation {
    /// A few body bytes changed: any result but a panic.
    FlipBody,
    /// Cut short: more bytes are needed.
    Truncate,
    /// A length below the header.
    ShortLength,
    /// A length above the cap.
    HugeLength,
    /// A kind byte no message has.
    UnknownKind,
    /// Bytes added after the body inside the frame.
    Trailing,
    /// Nothing of a frame at all.
    Garbage,
}

const MUTATIONS: [Mutation; 7] = [
    Mutation::FlipBody,
    Mutation::Truncate,
    Mutation::ShortLength,
    Mutation::HugeLength,
    Mutation::UnknownKind,
    Mutation::Trailing,
    Mutation::Garbage,
];

const KNOWN_KINDS: [u8; 12] = [
    0x01, 0x02, 0x03, 0x04, 0x05, 0x81, 0x82, 0x83, 0x85, 0x86, 0xE0, 0xEF,
];

fn set_len(buf: &mut [u8], len: u32) {
    buf[..4].copy_from_slice(&len.to_be_bytes());
}

fn mutate(rng: &mut StdRng, m: Mutation, mut buf: Vec<u8>) -> Vec<u8> {
    match m {
        Mutation::FlipBody => {
            if buf.len() > 4 + HEADER {
                for _ in 0..rng.gen_range(1..6) {
                    let at = rng.gen_range(4 + HEADER..buf.len());
                    buf[at] = rng.gen();
                }
            }
            buf
        }
        Mutation::Truncate => {
            let keep = rng.gen_range(0..buf.len());
            buf.truncate(keep);
            buf
        }
        Mutation::ShortLength => {
            set_len(&mut buf, rng.gen_range(0..HEADER as u32));
            buf
        }
        Mutation::HugeLength => {
            set_len(&mut buf, rng.gen_range(MAX_FRAME as u32 + 1..=u32::MAX));
            buf
        }
        Mutation::UnknownKind => {
            let mut k: u8 = rng.gen();
            while KNOWN_KINDS.contains(&k) {
                k = rng.gen();
            }
            buf[4 + 12] = k;
            buf
        }
        Mutation::Trailing => {
            let extra = rng.gen_range(1..8);
            buf.extend((0..extra).map(|_| rng.gen::<u8>()));
            let len = (buf.len() - 4) as u32;
            set_len(&mut buf, len);
            buf
        }
        Mutation::Garbage => (0..rng.gen_range(0..64)).map(|_| rng.gen()).collect(),
    }
}

/// A frame the decoder accepted re-encodes to bytes that decode and re-encode identically.
fn check_roundtrip(frame: &Frame, msg: &Message) {
    let again = wire::encode(frame.id, frame.group, msg).expect("re-encode a decoded message");
    let (f2, used) = wire::decode(&again)
        .expect("decode a re-encoded frame")
        .expect("a whole frame");
    assert_eq!(used, again.len());
    assert_eq!(
        (f2.id, f2.group, f2.kind),
        (frame.id, frame.group, frame.kind)
    );
    let m2 = f2.message().expect("decode a re-encoded body");
    let third = wire::encode(f2.id, f2.group, &m2).expect("re-encode again");
    assert_eq!(again, third, "{} does not round-trip", msg.name());
}

fn check(m: Mutation, buf: &[u8]) {
    let decoded = wire::decode(buf);
    match (m, &decoded) {
        (Mutation::ShortLength, r) => assert!(
            matches!(r, Err(WireError::Short { .. })),
            "short length gave {r:?}"
        ),
        (Mutation::HugeLength, r) => assert!(
            matches!(r, Err(WireError::TooLarge { .. })),
            "huge length gave {r:?}"
        ),
        (Mutation::Truncate, r) => assert!(
            matches!(r, Ok(None)),
            "a truncated frame gave {r:?}, not a call for more bytes"
        ),
        _ => {}
    }
    let Ok(Some((frame, used))) = decoded else {
        return;
    };
    assert!(
        used <= buf.len(),
        "decode used {used} of {} bytes",
        buf.len()
    );
    let msg = frame.message();
    match (m, &msg) {
        (Mutation::UnknownKind, r) => assert!(
            matches!(r, Err(WireError::UnknownKind { kind, .. }) if *kind == frame.kind),
            "unknown kind {:#x} gave {r:?}",
            frame.kind
        ),
        // Every body ends where its type says: nothing may follow it.
        (Mutation::Trailing, r) => assert!(
            matches!(r, Err(WireError::Trailing { .. })),
            "trailing bytes after a {:#x} body gave {r:?}",
            frame.kind
        ),
        _ => {}
    }
    match msg {
        Ok(msg) => check_roundtrip(&frame, &msg),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

/// The async reader agrees with `decode` on the same bytes.
async fn check_reader(buf: &[u8]) {
    let mut r = buf;
    let read = wire::read_frame(&mut r).await;
    match (wire::decode(buf), read) {
        (Ok(Some((a, _))), Ok(Some(b))) => assert_eq!(a, b),
        (Ok(None), Ok(None)) => assert!(buf.is_empty()),
        (Ok(None), Err(WireError::Truncated { .. })) => assert!(!buf.is_empty()),
        (Err(WireError::Short { .. }), Err(WireError::Short { .. })) => {}
        (Err(WireError::TooLarge { .. }), Err(WireError::TooLarge { .. })) => {}
        (d, r) => panic!("decode gave {d:?}, read_frame {r:?}"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn mutated_frames_give_named_errors_never_panics() {
    for seed in seeds() {
        let _guard = SeedGuard(seed);
        let mut rng = StdRng::seed_from_u64(seed);
        let mut counts = [0usize; MUTATIONS.len()];
        for _ in 0..ROUNDS {
            let valid = frame_bytes(&mut rng);
            let (frame, used) = wire::decode(&valid)
                .expect("decode a valid frame")
                .expect("a whole frame");
            assert_eq!(used, valid.len());
            let msg = frame.message().expect("decode a valid body");
            check_roundtrip(&frame, &msg);
            let k = rng.gen_range(0..MUTATIONS.len());
            counts[k] += 1;
            let bad = mutate(&mut rng, MUTATIONS[k], valid);
            check(MUTATIONS[k], &bad);
            check_reader(&bad).await;
        }
        assert!(
            counts.iter().all(|&c| c > 0),
            "some mutation never ran: {counts:?}"
        );
    }
}

#[test]
fn a_frame_over_the_cap_is_refused_at_encode() {
    let msg = Message::SnapshotChunk(Chunk {
        transfer: 1,
        offset: 0,
        data: vec![0; MAX_FRAME],
        done: None,
    });
    match wire::encode(1, 1, &msg) {
        Err(WireError::TooLarge { len, cap }) => assert!(len > cap && cap == MAX_FRAME),
        other => panic!("an oversized frame encoded: {:?}", other.map(|b| b.len())),
    }
}
