//! The request decoder under fuzzing: any frame body, for any served (key, version) and for
//! unserved ones, is answered or refused; never a panic, never an unbounded allocation.

use crate::common;

use std::sync::OnceLock;

use bytes::Bytes;
use frontend::versions::TABLE;
use proptest::prelude::*;

fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    })
}

fn broker() -> &'static std::sync::Arc<frontend::Broker> {
    static B: OnceLock<std::sync::Arc<frontend::Broker>> = OnceLock::new();
    B.get_or_init(|| {
        let _g = rt().enter();
        common::broker(frontend::Config {
            // No topic creation from fuzz input: keeps each case cheap.
            auto_create_topics: false,
            ..Default::default()
        })
    })
}

fn frame(key: i16, version: i16, body: &[u8]) -> Bytes {
    let mut f = Vec::new();
    f.extend(key.to_be_bytes());
    f.extend(version.to_be_bytes());
    f.extend(1i32.to_be_bytes());
    f.extend((-1i16).to_be_bytes());
    f.extend(body);
    Bytes::from(f)
}

/// Bodies that are mostly well-formed counts and lengths: small or huge big-endian integers and
/// varints.
fn body() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![
            any::<u8>().prop_map(|b| vec![b]),
            (0i32..4).prop_map(|n| n.to_be_bytes().to_vec()),
            any::<i32>().prop_map(|n| n.to_be_bytes().to_vec()),
            (0i16..8).prop_map(|n| n.to_be_bytes().to_vec()),
            Just((-1i16).to_be_bytes().to_vec()),
            Just(0x7fff_ffffi32.to_be_bytes().to_vec()),
            // Flexible versions' compact counts: a varint of u32::MAX, and of about 2^28.
            Just(vec![0xff, 0xff, 0xff, 0xff, 0x0f]),
            Just(vec![0xff, 0xff, 0xff, 0x7f]),
        ],
        0..40,
    )
    .prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn any_body_for_any_served_version_is_answered_or_refused(
        which in 0..TABLE.len(),
        vsel in any::<u8>(),
        body in body(),
    ) {
        let a = TABLE[which];
        let span = (a.max - a.min + 3) as u8;
        let version = a.min - 1 + (vsel % span) as i16;
        let b = broker().clone();
        let f = frame(a.key as i16, version, &body);
        rt().block_on(async move {
            if let Ok(reply) = frontend::conn::start(&b, &frontend::session::Session::new(None), f).await {
                // Held answers (joins, long polls) are not awaited: starting them is the test.
                drop(reply);
            }
        });
    }

    #[test]
    fn any_bytes_at_all_are_answered_or_refused(raw in prop::collection::vec(any::<u8>(), 0..200)) {
        let b = broker().clone();
        rt().block_on(async move {
            let _ = frontend::conn::start(&b, &frontend::session::Session::new(None), Bytes::from(raw)).await;
        });
    }
}
