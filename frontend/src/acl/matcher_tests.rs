use super::*;
use crate::acl::{Pattern, Wire};

fn bind(
    rt: ResourceType,
    name: &str,
    kind: PatternType,
    who: &str,
    host: &str,
    op: Operation,
    perm: Permission,
) -> Binding {
    Binding {
        pattern: Pattern {
            resource: rt,
            name: name.into(),
            kind,
        },
        entry: Entry {
            principal: Principal::parse(who).expect("principal"),
            host: Host::parse(host).expect("host"),
            op,
            permission: perm,
        },
    }
}

use Operation::*;
use PatternType::*;
use Permission::*;
use ResourceType::*;

fn alice() -> Principal {
    Principal::user("alice")
}

const HERE: Option<IpAddr> = Some(IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1)));

#[test]
fn nothing_matching_is_denied() {
    let a = Acls::default();
    assert!(!a.allows(&alice(), HERE, Read, Topic, "t"));
    let a = Acls::from_bindings([bind(
        Topic,
        "other",
        Literal,
        "User:alice",
        "*",
        Read,
        Allow,
    )]);
    assert!(!a.allows(&alice(), HERE, Read, Topic, "t"));
    assert!(a.allows(&alice(), HERE, Read, Topic, "other"));
    // Another principal, another resource type: not covered.
    assert!(!a.allows(&Principal::user("bob"), HERE, Read, Topic, "other"));
    assert!(!a.allows(&alice(), HERE, Read, Group, "other"));
}

#[test]
fn deny_wins_over_allow() {
    let a = Acls::from_bindings([
        bind(Topic, "*", Literal, "User:*", "*", All, Allow),
        bind(Topic, "secret", Literal, "User:alice", "*", Read, Deny),
    ]);
    assert!(!a.allows(&alice(), HERE, Read, Topic, "secret"));
    // The deny is for Read only: Write and (implied by nothing denied) Describe still go.
    assert!(a.allows(&alice(), HERE, Write, Topic, "secret"));
    assert!(a.allows(&alice(), HERE, Describe, Topic, "secret"));
    assert!(a.allows(&alice(), HERE, Read, Topic, "public"));
    // A Deny of All denies every operation.
    let a = Acls::from_bindings([
        bind(Topic, "t", Literal, "User:alice", "*", Write, Allow),
        bind(Topic, "t", Prefixed, "User:*", "*", All, Deny),
    ]);
    assert!(!a.allows(&alice(), HERE, Write, Topic, "t"));
}

#[test]
fn read_write_delete_alter_imply_describe_and_alter_configs_implies_describe_configs() {
    for op in [Read, Write, Delete, Alter, All] {
        let a = Acls::from_bindings([bind(Topic, "t", Literal, "User:alice", "*", op, Allow)]);
        assert!(a.allows(&alice(), HERE, Describe, Topic, "t"), "{op:?}");
    }
    for op in [Create, ClusterAction, IdempotentWrite, DescribeConfigs] {
        let a = Acls::from_bindings([bind(Topic, "t", Literal, "User:alice", "*", op, Allow)]);
        assert!(!a.allows(&alice(), HERE, Describe, Topic, "t"), "{op:?}");
    }
    let a = Acls::from_bindings([bind(
        Topic,
        "t",
        Literal,
        "User:alice",
        "*",
        AlterConfigs,
        Allow,
    )]);
    assert!(a.allows(&alice(), HERE, DescribeConfigs, Topic, "t"));
    // Implication goes one way: Describe grants neither Read nor Write.
    let a = Acls::from_bindings([bind(
        Topic,
        "t",
        Literal,
        "User:alice",
        "*",
        Describe,
        Allow,
    )]);
    assert!(!a.allows(&alice(), HERE, Read, Topic, "t"));
    assert!(!a.allows(&alice(), HERE, Write, Topic, "t"));
    // A Deny of Read does not deny the Describe that a Write allow implies.
    let a = Acls::from_bindings([
        bind(Topic, "t", Literal, "User:alice", "*", Write, Allow),
        bind(Topic, "t", Literal, "User:alice", "*", Read, Deny),
    ]);
    assert!(a.allows(&alice(), HERE, Describe, Topic, "t"));
}

#[test]
fn prefixed_and_wildcard_patterns_cover_names() {
    let a = Acls::from_bindings([
        bind(Topic, "orders-", Prefixed, "User:alice", "*", Write, Allow),
        bind(Group, "*", Literal, "User:alice", "*", Read, Allow),
    ]);
    assert!(a.allows(&alice(), HERE, Write, Topic, "orders-eu"));
    assert!(a.allows(&alice(), HERE, Write, Topic, "orders-"));
    assert!(!a.allows(&alice(), HERE, Write, Topic, "orders"));
    assert!(!a.allows(&alice(), HERE, Write, Topic, "xorders-eu"));
    assert!(a.allows(&alice(), HERE, Read, Group, "any-group"));
    // A literal `*` is the wildcard only as a whole name; a literal "a*" is just a name.
    let a = Acls::from_bindings([bind(Topic, "a*", Literal, "User:alice", "*", Read, Allow)]);
    assert!(!a.allows(&alice(), HERE, Read, Topic, "ab"));
    assert!(a.allows(&alice(), HERE, Read, Topic, "a*"));
}

#[test]
fn principal_wildcard_and_hosts() {
    let a = Acls::from_bindings([
        bind(Topic, "t", Literal, "User:*", "10.0.0.1", Read, Allow),
        bind(
            Topic,
            "u",
            Literal,
            "User:alice",
            "::ffff:10.0.0.2",
            Read,
            Allow,
        ),
    ]);
    assert!(a.allows(&Principal::user("anyone"), HERE, Read, Topic, "t"));
    let elsewhere = Some("10.0.0.9".parse().unwrap());
    assert!(!a.allows(&alice(), elsewhere, Read, Topic, "t"));
    assert!(!a.allows(&alice(), None, Read, Topic, "t"));
    // IPv4-mapped addresses compare as the IPv4 address they carry.
    let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
    assert!(a.allows(&alice(), Some(mapped), Read, Topic, "t"));
    assert!(a.allows(
        &alice(),
        Some("10.0.0.2".parse().unwrap()),
        Read,
        Topic,
        "u"
    ));
    // The wildcard principal is `User:*`, not any principal whose name is `*` of another type.
    let a = Acls::from_bindings([bind(Topic, "t", Literal, "Group:*", "*", Read, Allow)]);
    assert!(!a.allows(&alice(), HERE, Read, Topic, "t"));
}

#[test]
fn insert_and_remove_keep_the_index_in_step() {
    let b1 = bind(Topic, "t", Literal, "User:alice", "*", Read, Allow);
    let b2 = bind(Topic, "t-", Prefixed, "User:alice", "*", Write, Allow);
    let mut a = Acls::default();
    assert!(a.insert(b1.clone()));
    assert!(!a.insert(b1.clone()));
    assert!(a.insert(b2.clone()));
    assert_eq!(a.len(), 2);
    assert!(a.allows(&alice(), HERE, Write, Topic, "t-1"));
    assert!(a.remove(&b2));
    assert!(!a.remove(&b2));
    assert!(!a.allows(&alice(), HERE, Write, Topic, "t-1"));
    assert!(a.remove(&b1));
    assert!(!a.allows(&alice(), HERE, Read, Topic, "t"));
    assert!(a.is_empty());
}

fn filter(rt: i8, name: Option<&str>, pt: i8, who: Option<&str>, op: i8, perm: i8) -> Filter {
    Filter::from_wire(FilterWire {
        resource_type: rt,
        name,
        pattern_type: pt,
        principal: who,
        host: None,
        op,
        permission: perm,
    })
    .expect("filter")
}

#[test]
fn filters_select_as_kafka_does() {
    let lit = bind(Topic, "orders-eu", Literal, "User:alice", "*", Read, Allow);
    let star = bind(Topic, "*", Literal, "User:bob", "*", Write, Allow);
    let pre = bind(Topic, "orders-", Prefixed, "User:alice", "*", Read, Deny);
    let other = bind(Topic, "x-", Prefixed, "User:alice", "*", Read, Allow);
    let grp = bind(Group, "orders-eu", Literal, "User:alice", "*", Read, Allow);
    let a = Acls::from_bindings([
        lit.clone(),
        star.clone(),
        pre.clone(),
        other.clone(),
        grp.clone(),
    ]);
    // ANY everything: all of them.
    assert_eq!(a.matching(&filter(ANY, None, ANY, None, ANY, ANY)).len(), 5);
    // MATCH: every pattern covering the name (literal, `*`, prefixes), not other prefixes.
    let m = a.matching(&filter(2, Some("orders-eu"), MATCH, None, ANY, ANY));
    assert_eq!(m.len(), 3);
    assert!(m.contains(&lit) && m.contains(&star) && m.contains(&pre));
    // ANY pattern type with a name: exact name only (of either type).
    let m = a.matching(&filter(ANY, Some("orders-eu"), ANY, None, ANY, ANY));
    assert_eq!(m, {
        let mut v = vec![lit.clone(), grp.clone()];
        v.sort();
        v
    });
    // A given pattern type and name: exactly that pattern.
    assert_eq!(
        a.matching(&filter(2, Some("orders-"), 4, None, ANY, ANY)),
        vec![pre.clone()]
    );
    assert!(a
        .matching(&filter(2, Some("orders-eu"), 4, None, ANY, ANY))
        .is_empty());
    // Principal, operation and permission narrow it.
    assert_eq!(
        a.matching(&filter(ANY, None, ANY, Some("User:bob"), ANY, ANY)),
        vec![star.clone()]
    );
    assert_eq!(a.matching(&filter(ANY, None, ANY, None, ANY, 2)), vec![pre]);
    assert_eq!(
        a.matching(&filter(ANY, None, ANY, None, 4, ANY)),
        vec![star]
    );
    // UNKNOWN (0) and out-of-range codes are refused.
    let bad = FilterWire {
        resource_type: 0,
        name: None,
        pattern_type: ANY,
        principal: None,
        host: None,
        op: ANY,
        permission: ANY,
    };
    assert!(Filter::from_wire(bad).is_err());
    assert!(Filter::from_wire(FilterWire {
        op: 99,
        resource_type: ANY,
        ..bad
    })
    .is_err());
}

#[test]
fn creations_are_checked_as_kafka_checks_them() {
    let w = Wire {
        resource_type: 2,
        name: "t",
        pattern_type: 3,
        principal: "User:alice",
        host: "*",
        op: 3,
        permission: 3,
    };
    assert!(Binding::from_wire(w).is_ok());
    for bad in [
        Wire {
            resource_type: 1,
            ..w
        },
        Wire {
            pattern_type: 2,
            ..w
        },
        Wire {
            pattern_type: 1,
            ..w
        },
        Wire { op: 1, ..w },
        Wire { permission: 1, ..w },
        Wire {
            principal: "alice",
            ..w
        },
        Wire {
            host: "example.com",
            ..w
        },
        Wire { name: "", ..w },
        Wire {
            resource_type: 4,
            name: "c",
            ..w
        },
    ] {
        assert!(Binding::from_wire(bad).is_err(), "{bad:?}");
    }
    assert!(Binding::from_wire(Wire {
        resource_type: 4,
        name: "kafka-cluster",
        ..w
    })
    .is_ok());
}

/// KIP-679's "Write on any topic": Kafka's `authorizeByResourceType` cases.
#[test]
fn some_topic_writable_is_decided_as_kafka_decides_it() {
    let allow = |name: &str, kind| bind(Topic, name, kind, "User:alice", "*", Write, Allow);
    let deny = |name: &str, kind| bind(Topic, name, kind, "User:alice", "*", Write, Deny);
    let some = |bs: Vec<Binding>| Acls::from_bindings(bs).allows_some(&alice(), HERE, Write, Topic);
    assert!(!some(vec![]), "no binding: denied");
    assert!(some(vec![allow("orders", Literal)]));
    assert!(some(vec![allow("ord", Prefixed)]));
    assert!(some(vec![allow("*", Literal)]));
    // One Allow of literal topic "orders": only Write and All count (Read implies nothing
    // about Write); another principal's, resource type's or host's does not.
    for (rt, who, host, op, want) in [
        (Topic, "User:alice", "*", All, true),
        (Topic, "User:*", "*", Write, true),
        (Topic, "User:alice", "*", Read, false),
        (Topic, "User:bob", "*", Write, false),
        (Group, "User:alice", "*", Write, false),
        (Topic, "User:alice", "10.9.9.9", Write, false),
    ] {
        let b = bind(rt, "orders", Literal, who, host, op, Allow);
        assert_eq!(some(vec![b]), want, "{rt:?} {who} {host} {op:?}");
    }
    // Denies that cover every allowed name win; one that leaves some name allowed does not.
    assert!(!some(vec![
        allow("orders", Literal),
        deny("orders", Literal)
    ]));
    assert!(!some(vec![allow("orders", Literal), deny("ord", Prefixed)]));
    assert!(!some(vec![
        allow("orders-eu", Prefixed),
        deny("orders", Prefixed)
    ]));
    assert!(!some(vec![allow("*", Literal), deny("*", Literal)]));
    assert!(some(vec![allow("ord", Prefixed), deny("orders", Literal)]));
    assert!(some(vec![
        allow("orders", Literal),
        deny("payments", Prefixed)
    ]));
}
