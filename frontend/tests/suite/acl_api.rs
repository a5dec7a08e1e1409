//! CreateAcls, DescribeAcls and DeleteAcls at every served version (v1 plain, v2–3 flexible):
//! managing ACLs needs Alter (listing, Describe) on the cluster or a super user; filters select
//! as Kafka's do (ANY, MATCH); the bindings are durable, through a ring wrap and a power cut.

use crate::common;

use common::inproc::*;
use frontend::client::Client;
use frontend::codes::*;
use frontend::meta::META_TOPIC;
use frontend::session::Principal;
use frontend::Config;
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn creation(rt: i8, name: &str, pattern: i8, who: &str, op: i8, perm: i8) -> AclCreation {
    let mut c = AclCreation::default();
    c.resource_type = rt;
    c.resource_name = s(name);
    c.resource_pattern_type = pattern;
    c.principal = s(who);
    c.host = s("*");
    c.operation = op;
    c.permission_type = perm;
    c
}

fn describe(rt: i8, name: Option<&str>, pattern: i8, who: Option<&str>) -> DescribeAclsRequest {
    let mut d = DescribeAclsRequest::default();
    d.resource_type_filter = rt;
    d.resource_name_filter = name.map(s);
    d.pattern_type_filter = pattern;
    d.principal_filter = who.map(s);
    d.host_filter = None;
    d.operation = 1;
    d.permission_type = 1;
    d
}

fn delete_filter(rt: i8, name: Option<&str>, pattern: i8, who: Option<&str>) -> DeleteAclsFilter {
    let d = describe(rt, name, pattern, who);
    let mut f = DeleteAclsFilter::default();
    f.resource_type_filter = d.resource_type_filter;
    f.resource_name_filter = d.resource_name_filter;
    f.pattern_type_filter = d.pattern_type_filter;
    f.principal_filter = d.principal_filter;
    f.host_filter = None;
    f.operation = 1;
    f.permission_type = 1;
    f
}

/// (type, name, pattern, principal, op) of every ACL described.
fn listed(r: &DescribeAclsResponse) -> Vec<(i8, String, i8, String, i8)> {
    let mut out = Vec::new();
    for res in &r.resources {
        for a in &res.acls {
            out.push((
                res.resource_type,
                res.resource_name.to_string(),
                res.pattern_type,
                a.principal.to_string(),
                a.operation,
            ));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acls_are_created_described_and_deleted_with_kafkas_filters() {
    for v in 1..=3i16 {
        let b = common::broker(authorizing());
        let admin = session("admin");
        let mut create = CreateAclsRequest::default();
        create.creations = vec![
            creation(TOPIC, "orders-eu", LITERAL, "User:alice", READ, 3),
            creation(TOPIC, "orders-", PREFIXED, "User:bob", WRITE, 3),
            creation(TOPIC, "*", LITERAL, "User:carol", DESCRIBE, 3),
            creation(GROUP, "g", LITERAL, "User:alice", READ, 3),
            // Invalid: a MATCH pattern cannot be created; a principal needs its type.
            creation(TOPIC, "x", 2, "User:alice", READ, 3),
            creation(TOPIC, "x", LITERAL, "alice", READ, 3),
        ];
        let r = call(&b, &admin, v, &create).await;
        let got: Vec<i16> = r.results.iter().map(|x| x.error_code).collect();
        assert_eq!(
            got,
            vec![0, 0, 0, 0, INVALID_REQUEST, INVALID_REQUEST],
            "v{v}"
        );
        assert!(r.results[5]
            .error_message
            .as_ref()
            .unwrap()
            .contains("alice"));
        assert_eq!(b.acl().bindings().len(), 4);

        let all = call(&b, &admin, v, &describe(1, None, 1, None)).await;
        assert_eq!((all.error_code, listed(&all).len()), (NONE, 4), "v{v}");
        // MATCH on a name: the literal, the wildcard and the covering prefix.
        let m = call(&b, &admin, v, &describe(TOPIC, Some("orders-eu"), 2, None)).await;
        let mut names: Vec<String> = listed(&m).into_iter().map(|x| x.1).collect();
        names.sort();
        assert_eq!(names, vec!["*", "orders-", "orders-eu"], "v{v}");
        // LITERAL on that name: that binding only; by principal: alice's two.
        let l = call(
            &b,
            &admin,
            v,
            &describe(TOPIC, Some("orders-eu"), LITERAL, None),
        )
        .await;
        assert_eq!(listed(&l).len(), 1);
        let a = call(&b, &admin, v, &describe(1, None, 1, Some("User:alice"))).await;
        assert_eq!(listed(&a).len(), 2);
        assert_eq!(
            call(&b, &admin, v, &describe(0, None, 1, None))
                .await
                .error_code,
            INVALID_REQUEST
        );

        // Alice (no ACL on the cluster) manages nothing.
        let alice = session("alice");
        let r = call(&b, &alice, v, &create).await;
        assert!(r
            .results
            .iter()
            .all(|x| x.error_code == CLUSTER_AUTHORIZATION_FAILED));
        assert_eq!(
            call(&b, &alice, v, &describe(1, None, 1, None))
                .await
                .error_code,
            CLUSTER_AUTHORIZATION_FAILED
        );
        let mut del = DeleteAclsRequest::default();
        del.filters = vec![delete_filter(1, None, 1, None)];
        let r = call(&b, &alice, v, &del).await;
        assert_eq!(r.filter_results[0].error_code, CLUSTER_AUTHORIZATION_FAILED);
        assert_eq!(b.acl().bindings().len(), 4);

        // Delete: what each filter matches (a binding in two filters' results in both).
        del.filters = vec![
            delete_filter(TOPIC, Some("orders-eu"), 2, None),
            delete_filter(1, None, 1, Some("User:bob")),
        ];
        let r = call(&b, &admin, v, &del).await;
        assert_eq!(r.filter_results[0].matching_acls.len(), 3);
        assert_eq!(r.filter_results[1].matching_acls.len(), 1);
        assert!(r.filter_results[1].matching_acls[0].principal.as_str() == "User:bob");
        let left = call(&b, &admin, v, &describe(1, None, 1, None)).await;
        assert_eq!(
            listed(&left),
            vec![(GROUP, "g".into(), LITERAL, "User:alice".into(), READ)]
        );

        // Alice given Alter on the cluster manages them; Describe on it lists them.
        b.acl()
            .add(
                &b,
                vec![binding(
                    CLUSTER,
                    "kafka-cluster",
                    LITERAL,
                    "User:alice",
                    ALTER,
                    "allow",
                )],
            )
            .await;
        create.creations.truncate(1);
        assert_eq!(
            call(&b, &alice, v, &create).await.results[0].error_code,
            NONE
        );
        assert_eq!(
            call(&b, &alice, v, &describe(1, None, 1, None))
                .await
                .error_code,
            NONE
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_authorizer_the_acl_apis_answer_security_disabled() {
    let b = common::broker(Config::default());
    let me = session("anyone");
    let mut create = CreateAclsRequest::default();
    create.creations = vec![creation(TOPIC, "t", LITERAL, "User:a", READ, 3)];
    let r = call(&b, &me, 3, &create).await;
    assert_eq!(r.results[0].error_code, SECURITY_DISABLED);
    assert_eq!(
        call(&b, &me, 3, &describe(1, None, 1, None))
            .await
            .error_code,
        SECURITY_DISABLED
    );
    assert!(b.acl().bindings().is_empty());
}

/// Bindings live in `__nvmq_meta` of the same ring as the data: when the ring wraps over their
/// records, the snapshots keep them; after laps and a power cut the set is exactly what it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acls_survive_the_ring_wrapping_over_them_and_a_power_cut() {
    let (dev, handle) = common::small_ring(5);
    let cfg = Config {
        super_users: vec![Principal::anonymous()],
        ..authorizing()
    };
    let server = common::server_on(dev, cfg);
    let b = server.broker().clone();
    let kept = binding(TOPIC, "data", LITERAL, "User:alice", WRITE, "allow");
    let gone = binding(GROUP, "g-", PREFIXED, "User:bob", READ, "deny");
    let also = binding(
        CLUSTER,
        "kafka-cluster",
        LITERAL,
        "User:*",
        DESCRIBE,
        "allow",
    );
    grant(&b, vec![kept.clone(), gone.clone(), also.clone()]).await;
    let mut f = frontend::acl::Filter::from_wire(frontend::acl::matcher::FilterWire {
        resource_type: GROUP,
        name: None,
        pattern_type: 1,
        principal: None,
        host: None,
        op: 1,
        permission: 1,
    })
    .unwrap();
    let removed = b.acl().remove(&b, std::slice::from_ref(&f)).await;
    assert_eq!(removed[0].len(), 1);
    f.principal = Some(Principal::user("nobody"));
    assert!(b.acl().remove(&b, &[f]).await[0].is_empty());

    let mut cl = Client::connect(server.local_addr(), "t").await.unwrap();
    common::create_topic(&mut cl, "data").await;
    common::lap_the_ring(&mut cl, "data").await;
    let meta_start = common::internal_start(&b, META_TOPIC);
    assert!(
        meta_start > 0,
        "the ring never freed the first ACL records: the test proves nothing"
    );

    handle.power_cut();
    server.kill();
    let b2 = common::reopen(handle.power_on(), authorizing());
    let mut want = vec![kept, also];
    want.sort();
    assert_eq!(b2.acl().bindings(), want);
}
