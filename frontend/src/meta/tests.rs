use super::*;
use crate::sasl::{ScramCredential, ScramMechanism};

#[test]
fn commits_are_cut_into_records_by_their_encoded_size() {
    // 300 commits with 4 KiB of metadata each: 1.2 MB, more than one record of 1 MiB takes.
    let commits: Vec<Commit> = (0..300)
        .map(|i| Commit {
            topic: format!("topic-{}", i % 7),
            partition: i,
            offset: i64::from(i) * 10,
            leader_epoch: -1,
            metadata: Some("m".repeat(4096)),
        })
        .collect();
    let max = 1 << 20;
    let recs = commits_records("a-group", commits.clone(), max);
    assert!(recs.len() >= 2, "{} records", recs.len());
    let mut back = Vec::new();
    for r in recs {
        let e = r.encode();
        assert!(e.len() <= max, "a record of {} B", e.len());
        match MetaRecord::decode(&e).unwrap() {
            MetaRecord::Commits { group, commits } => {
                assert_eq!(group, "a-group");
                back.extend(commits);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(back, commits);
    for c in &back {
        assert_eq!(
            c.encoded_len() + 7 + 7,
            MetaRecord::Commits {
                group: "a-group".into(),
                commits: vec![c.clone()]
            }
            .encode()
            .len()
        );
    }
    assert!(commits_records("g", Vec::new(), max).is_empty());
}

#[test]
fn records_round_trip_and_damage_is_refused() {
    let recs = [
        MetaRecord::DeleteTopic {
            name: "t".into(),
            incarnation: 2,
        },
        MetaRecord::ProducerId { id: 42 },
        MetaRecord::Generation {
            group: "g".into(),
            generation: 7,
        },
        MetaRecord::Commits {
            group: "g".into(),
            commits: vec![
                Commit {
                    topic: "a".into(),
                    partition: 1,
                    offset: 99,
                    leader_epoch: -1,
                    metadata: Some("m".into()),
                },
                Commit {
                    topic: "b".into(),
                    partition: 0,
                    offset: 5,
                    leader_epoch: 3,
                    metadata: None,
                },
            ],
        },
        MetaRecord::ProducerState(ProducerStatePart {
            partition: 3,
            through: 100,
            part: 1,
            parts: 2,
            producers: vec![
                ProducerSnap {
                    id: 7,
                    epoch: 2,
                    last_seen_ms: 1_700_000_000_000,
                    batches: vec![
                        StoredBatch {
                            first_seq: 0,
                            last_seq: 4,
                            offset: 10,
                        },
                        StoredBatch {
                            first_seq: 5,
                            last_seq: 5,
                            offset: 99,
                        },
                    ],
                },
                ProducerSnap {
                    id: 8,
                    epoch: 0,
                    last_seen_ms: 0,
                    batches: vec![],
                },
            ],
        }),
        MetaRecord::TimeIndex(TimeIndexPart {
            partition: 3,
            head: TimesHead {
                from: 10,
                to: 900,
                running: 1_700_000_000_000,
                max: Some((1_700_000_000_000, 850)),
                since_sample: 4096,
            },
            part: 1,
            parts: 2,
            samples: vec![(10, i64::MIN), (400, 1_600_000_000_000)],
        }),
        MetaRecord::TimeIndex(TimeIndexPart {
            partition: 3,
            head: TimesHead {
                from: 0,
                to: 0,
                running: i64::MIN,
                max: None,
                since_sample: 0,
            },
            part: 0,
            parts: 1,
            samples: vec![],
        }),
        MetaRecord::Credential(CredentialRecord {
            user: "alice".into(),
            mechanism: ScramMechanism::Sha512,
            credential: ScramCredential {
                salt: vec![1; 32],
                iterations: 4096,
                stored_key: vec![2; 64],
                server_key: vec![3; 64],
            },
        }),
        MetaRecord::CredentialRemoved {
            user: "bob".into(),
            mechanism: ScramMechanism::Sha256,
        },
        MetaRecord::TopicConfig {
            name: "t".into(),
            incarnation: 1,
            configs: vec![
                ("retention.ms".into(), "60000".into()),
                ("cleanup.policy".into(), "delete".into()),
            ],
        },
        MetaRecord::TopicConfig {
            name: "u".into(),
            incarnation: 0,
            configs: vec![],
        },
        MetaRecord::LogStart {
            partition: 4,
            start: 1234,
        },
        MetaRecord::GroupDeleted { group: "g".into() },
        MetaRecord::OffsetsDeleted {
            group: "g".into(),
            partitions: vec![("a".into(), 1), ("b".into(), 0)],
        },
    ];
    let acl = crate::acl::Binding::from_wire(crate::acl::Wire {
        resource_type: 2,
        name: "orders-",
        pattern_type: 4,
        principal: "User:alice",
        host: "10.0.0.1",
        op: 4,
        permission: 3,
    })
    .unwrap();
    let recs = recs.into_iter().chain([
        MetaRecord::AclAdded(acl.clone()),
        MetaRecord::AclRemoved(acl),
    ]);
    for r in recs {
        let e = r.encode();
        assert_eq!(MetaRecord::decode(&e).unwrap(), r);
        assert!(MetaRecord::decode(&e[..e.len() - 1]).is_err());
    }
    assert!(MetaRecord::decode(&[9]).is_err());
    // A binding record whose operation code is not one: refused by name.
    let mut bad = vec![12u8, 2, 3, 0, 1, b't'];
    bad.extend([0, 6]);
    bad.extend(b"User:a");
    bad.extend([0, 1, b'*', 99, 3]);
    let e = MetaRecord::decode(&bad).unwrap_err();
    assert!(e.contains("operation code 99"), "{e}");
    // A credential of an unknown mechanism is refused, by name.
    let e = MetaRecord::decode(&[11, 0, 1, b'u', 7]).unwrap_err();
    assert!(e.contains("mechanism 7"), "{e}");
    // A batch at or past the snapshot's `through`, more than five batches, a part past the
    // count: each refused.
    let snap = |batches: Vec<StoredBatch>, part: u32| {
        MetaRecord::ProducerState(ProducerStatePart {
            partition: 0,
            through: 10,
            part,
            parts: 1,
            producers: vec![ProducerSnap {
                id: 1,
                epoch: 0,
                last_seen_ms: 0,
                batches,
            }],
        })
    };
    let at = |offset| StoredBatch {
        first_seq: 0,
        last_seq: 0,
        offset,
    };
    assert!(MetaRecord::decode(&snap(vec![at(9)], 0).encode()).is_ok());
    assert!(MetaRecord::decode(&snap(vec![at(10)], 0).encode()).is_err());
    assert!(MetaRecord::decode(&snap(vec![at(1)], 1).encode()).is_err());
    let mut six = snap(vec![at(1)], 0).encode();
    let n_at = PRODUCER_STATE_HEADER_LEN + 18;
    assert_eq!(six[n_at], 1);
    six[n_at] = 6;
    six.extend([0u8; 80]);
    assert!(MetaRecord::decode(&six).is_err());
    assert!(MetaRecord::decode(&[4, 0, 1, b'g', 0xff, 0xff, 0xff, 0xff]).is_err());
}
