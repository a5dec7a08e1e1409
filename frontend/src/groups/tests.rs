//! The coordinator's state machine, driven without a network.

use super::*;

fn req(group: &str, member: &str) -> JoinRequest {
    JoinRequest {
        group: group.into(),
        member_id: member.into(),
        instance_id: None,
        client_id: "c".into(),
        client_host: "/127.0.0.1".into(),
        session_timeout_ms: 10_000,
        rebalance_timeout_ms: 10_000,
        protocol_type: "consumer".into(),
        protocols: vec![("range".into(), Bytes::from_static(b"meta"))],
    }
}

#[test]
fn two_members_join_sync_and_rebalance_when_one_leaves() {
    let gs = Groups::new(HashMap::from([("g".to_string(), 4)]));
    let ja = gs.join(req("g", "")).try_now().unwrap();
    assert_eq!((ja.error, ja.generation), (codes::NONE, 5));
    assert_eq!(ja.leader, ja.member_id);
    // B joins: a rebalance starts; A learns through its heartbeat and rejoins.
    let Answer::Held(mut b) = gs.join(req("g", "")) else {
        panic!("B's join answered before A rejoined")
    };
    assert_eq!(
        gs.heartbeat("g", 5, &ja.member_id, None),
        codes::REBALANCE_IN_PROGRESS
    );
    let Answer::Held(mut a2) = gs.join(req("g", &ja.member_id)) else {
        panic!("A's rejoin was not held")
    };
    let (ja2, jb) = (a2.try_recv().unwrap(), b.try_recv().unwrap());
    assert_eq!((ja2.generation, jb.generation), (6, 6));
    assert_eq!(ja2.members.len(), 2);
    assert!(jb.members.is_empty());
    // B's sync waits for the leader's assignment.
    let Answer::Held(mut sb) = gs.sync("g", 6, &jb.member_id, None, vec![]) else {
        panic!("B's sync answered before the leader's")
    };
    assert!(sb.try_recv().is_err());
    let assignments = vec![
        (ja2.member_id.clone(), Bytes::from_static(b"A")),
        (jb.member_id.clone(), Bytes::from_static(b"B")),
    ];
    let sa = gs.sync("g", 6, &ja2.member_id, None, assignments);
    assert_eq!(sa.try_now().unwrap().assignment, Bytes::from_static(b"A"));
    assert_eq!(sb.try_recv().unwrap().assignment, Bytes::from_static(b"B"));
    assert_eq!(gs.may_commit("g", 6, &jb.member_id, None), codes::NONE);
    assert_eq!(
        gs.may_commit("g", 5, &jb.member_id, None),
        codes::ILLEGAL_GENERATION
    );
    // A leaves: B rejoins alone and leads generation 7.
    assert_eq!(
        gs.leave("g", &[(ja2.member_id.clone(), None)]),
        vec![codes::NONE]
    );
    assert_eq!(
        gs.heartbeat("g", 6, &ja2.member_id, None),
        codes::UNKNOWN_MEMBER_ID
    );
    assert_eq!(
        gs.heartbeat("g", 6, &jb.member_id, None),
        codes::REBALANCE_IN_PROGRESS
    );
    let jb2 = gs.join(req("g", &jb.member_id)).try_now().unwrap();
    assert_eq!(
        (jb2.generation, jb2.leader.as_str()),
        (7, jb.member_id.as_str())
    );
}

#[test]
fn silent_members_expire_and_rebalances_time_out() {
    let gs = Groups::new(HashMap::new());
    let mut r = req("g", "");
    r.session_timeout_ms = 1000;
    r.rebalance_timeout_ms = 1000;
    let ja = gs.join(r).try_now().unwrap();
    let mut r2 = req("g", "");
    r2.session_timeout_ms = 1000;
    r2.rebalance_timeout_ms = 1000;
    let Answer::Held(mut b) = gs.join(r2) else {
        panic!("B's join was not held")
    };
    // A never rejoins: after the rebalance timeout B gets a generation of its own.
    gs.tick(Instant::now() + Duration::from_secs(2));
    let jb = b.try_recv().unwrap();
    assert_eq!(jb.members.len(), 1);
    assert_ne!(jb.member_id, ja.member_id);
    assert_eq!(
        gs.heartbeat("g", jb.generation, &ja.member_id, None),
        codes::UNKNOWN_MEMBER_ID
    );
    gs.tick(Instant::now() + Duration::from_secs(5));
    assert_eq!(
        gs.heartbeat("g", jb.generation, &jb.member_id, None),
        codes::UNKNOWN_MEMBER_ID
    );
    assert_eq!(
        gs.join(req("", "")).try_now().map(|r| r.error),
        Some(codes::INVALID_GROUP_ID)
    );
}

fn static_req(group: &str, member: &str, instance: &str) -> JoinRequest {
    let mut r = req(group, member);
    r.instance_id = Some(instance.into());
    r
}

/// A group of static members A and B, stable at generation 1 with assignments "A" and "B".
fn stable_static_pair(gs: &Groups) -> (String, String, i32) {
    let ja = gs.join(static_req("g", "", "ia")).try_now().unwrap();
    let Answer::Held(mut b) = gs.join(static_req("g", "", "ib")) else {
        panic!("B's join answered before A rejoined")
    };
    let Answer::Held(mut a) = gs.join(static_req("g", &ja.member_id, "ia")) else {
        panic!("A's rejoin was not held")
    };
    let (ja, jb) = (a.try_recv().unwrap(), b.try_recv().unwrap());
    let leader = if ja.leader == ja.member_id { &ja } else { &jb };
    let g = leader.generation;
    let assignments = vec![
        (ja.member_id.clone(), Bytes::from_static(b"A")),
        (jb.member_id.clone(), Bytes::from_static(b"B")),
    ];
    let other = if leader.member_id == ja.member_id {
        &jb
    } else {
        &ja
    };
    let Answer::Held(mut os) = gs.sync("g", g, &other.member_id, None, vec![]) else {
        panic!("the follower's sync answered before the leader's")
    };
    gs.sync("g", g, &leader.member_id, None, assignments)
        .try_now()
        .unwrap();
    os.try_recv().unwrap();
    assert_eq!(gs.describe("g").unwrap().state, "Stable");
    (ja.member_id, jb.member_id, g)
}

#[test]
fn a_restarted_static_member_gets_its_assignment_back_without_a_rebalance() {
    let gs = Groups::new(HashMap::new());
    let (a, b, generation) = stable_static_pair(&gs);
    // A restarts: it joins again with no member id and the same instance id.
    let ja2 = gs.join(static_req("g", "", "ia")).try_now().unwrap();
    assert_eq!((ja2.error, ja2.generation), (codes::NONE, generation));
    assert_ne!(ja2.member_id, a, "a restarted member gets a new member id");
    assert!(ja2.members.is_empty());
    assert_ne!(
        ja2.leader, ja2.member_id,
        "it must not reassign a stable group"
    );
    // No rebalance: B's heartbeat at the same generation is fine, the group stays Stable.
    assert_eq!(
        gs.heartbeat("g", ja2.generation, &b, Some("ib")),
        codes::NONE
    );
    assert_eq!(gs.describe("g").unwrap().state, "Stable");
    let sa = gs
        .sync("g", ja2.generation, &ja2.member_id, Some("ia"), vec![])
        .try_now()
        .unwrap();
    assert_eq!(
        (sa.error, sa.assignment),
        (codes::NONE, Bytes::from_static(b"A"))
    );
    // The old process, still running with the old member id, is fenced everywhere.
    assert_eq!(
        gs.heartbeat("g", ja2.generation, &a, Some("ia")),
        codes::FENCED_INSTANCE_ID
    );
    assert_eq!(
        gs.may_commit("g", ja2.generation, &a, Some("ia")),
        codes::FENCED_INSTANCE_ID
    );
    assert_eq!(
        gs.join(static_req("g", &a, "ia")).try_now().unwrap().error,
        codes::FENCED_INSTANCE_ID
    );
    assert_eq!(
        gs.leave("g", &[(a.clone(), Some("ia".into()))]),
        vec![codes::FENCED_INSTANCE_ID]
    );
    let members: Vec<_> = gs
        .describe("g")
        .unwrap()
        .members
        .into_iter()
        .map(|m| (m.member_id, m.instance_id))
        .collect();
    assert!(members.contains(&(ja2.member_id.clone(), Some("ia".into()))));
    assert!(members.contains(&(b.clone(), Some("ib".into()))));
    assert_eq!(members.len(), 2);
}

#[test]
fn static_members_leave_in_a_batch_by_instance_id() {
    let gs = Groups::new(HashMap::new());
    let (_a, b, _) = stable_static_pair(&gs);
    assert_eq!(
        gs.leave(
            "g",
            &[
                (String::new(), Some("ia".into())),
                (b.clone(), Some("ib".into())),
                (String::new(), Some("nobody".into())),
            ]
        ),
        vec![codes::NONE, codes::NONE, codes::UNKNOWN_MEMBER_ID]
    );
    let v = gs.describe("g").unwrap();
    assert_eq!((v.state, v.members.len()), ("Empty", 0));
    // The instance ids are free again: a new static member under "ia" is a fresh join.
    let j = gs.join(static_req("g", "", "ia")).try_now().unwrap();
    assert_eq!((j.error, j.leader == j.member_id), (codes::NONE, true));
}

#[test]
fn a_restarted_static_member_with_a_new_subscription_rebalances() {
    let gs = Groups::new(HashMap::new());
    let (_a, b, generation) = stable_static_pair(&gs);
    let mut r = static_req("g", "", "ia");
    r.protocols = vec![("range".into(), Bytes::from_static(b"other-topics"))];
    let Answer::Held(_a2) = gs.join(r) else {
        panic!("a changed subscription must wait for a rebalance")
    };
    assert_eq!(
        gs.heartbeat("g", generation, &b, None),
        codes::REBALANCE_IN_PROGRESS
    );
    assert_eq!(gs.describe("g").unwrap().state, "PreparingRebalance");
}

/// Kafka's group.initial.rebalance.delay.ms: the first rebalance of an empty group waits for
/// more members, so members starting together get one generation, not one each.
#[test]
fn an_empty_group_holds_its_first_rebalance_for_members_arriving_together() {
    let delay = Duration::from_millis(300);
    let gs = Groups::with_initial_delay(HashMap::new(), delay);
    let start = Instant::now();
    let Answer::Held(mut a) = gs.join(req("g", "")) else {
        panic!("the first join was answered at once despite the initial delay")
    };
    // Still held while the delay runs, even on a tick.
    gs.tick(start + Duration::from_millis(100));
    assert!(a.try_recv().is_err(), "answered inside the initial delay");
    // A second member arrives within the delay: both wait for it and share the generation.
    std::thread::sleep(Duration::from_millis(150));
    let Answer::Held(mut b) = gs.join(req("g", "")) else {
        panic!("the second join was answered at once")
    };
    assert!(a.try_recv().is_err() && b.try_recv().is_err());
    // The hold moved: the first delay's end alone does not complete the rebalance.
    gs.tick(start + delay + Duration::from_millis(10));
    assert!(a.try_recv().is_err(), "the arrival did not extend the hold");
    gs.tick(Instant::now() + delay + Duration::from_millis(10));
    let (ja, jb) = (a.try_recv().unwrap(), b.try_recv().unwrap());
    assert_eq!((ja.error, jb.error), (codes::NONE, codes::NONE));
    assert_eq!(
        (ja.generation, jb.generation),
        (1, 1),
        "one generation for both"
    );
    let leader = if ja.leader == ja.member_id { &ja } else { &jb };
    assert_eq!(leader.members.len(), 2, "the leader assigns both at once");
}

/// The hold never outlasts the rebalance timeout, and a group that was not empty does not
/// wait: a member joining a stable group rebalances as soon as everyone has rejoined.
#[test]
fn the_initial_hold_is_bounded_and_only_for_an_empty_group() {
    let gs = Groups::with_initial_delay(HashMap::new(), Duration::from_secs(3600));
    let mut r = req("g", "");
    r.rebalance_timeout_ms = 1_000;
    r.session_timeout_ms = 1_000;
    let Answer::Held(mut a) = gs.join(r) else {
        panic!("answered at once")
    };
    gs.tick(Instant::now() + Duration::from_millis(1_100));
    let ja = a
        .try_recv()
        .expect("the hold outlasted the rebalance timeout");
    assert_eq!((ja.error, ja.generation), (codes::NONE, 1));
    let assignment = vec![(ja.member_id.clone(), Bytes::from_static(b"all"))];
    let sa = gs.sync("g", 1, &ja.member_id, None, assignment).try_now();
    assert_eq!(sa.map(|s| s.error), Some(codes::NONE));
    // B joins the stable group; A rejoins at once: no initial hold now.
    let Answer::Held(mut b) = gs.join(req("g", "")) else {
        panic!("B's join was answered before A rejoined")
    };
    let Answer::Held(mut a2) = gs.join(req("g", &ja.member_id)) else {
        panic!("A's rejoin was not held")
    };
    let (ja2, jb) = (a2.try_recv().unwrap(), b.try_recv().unwrap());
    assert_eq!((ja2.generation, jb.generation), (2, 2));
}
