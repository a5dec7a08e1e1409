//! CreateAcls, DescribeAcls and DeleteAcls. Managing ACLs takes Alter on the cluster (listing
//! them, Describe), unless the principal is a super user; with the authorizer off they answer
//! SECURITY_DISABLED, as Kafka does without one.

use std::sync::Arc;

use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::{
    DeleteAclsFilterResult, DeleteAclsMatchingAcl,
};
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::{
    CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse,
    DescribeAclsRequest, DescribeAclsResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::matcher::FilterWire;
use super::{check, Binding, Filter, Operation, Wire};
use crate::broker::Broker;
use crate::codes;
use crate::conn::{Ctx, Reply};

fn s(v: impl Into<String>) -> StrBytes {
    StrBytes::from_string(v.into())
}

/// Why a principal may not manage ACLs, if it may not: (code, message).
fn refusal(b: &Broker, ctx: &Ctx, op: Operation) -> Option<(i16, String)> {
    if !b.acl().enabled() {
        return Some((
            codes::SECURITY_DISABLED,
            "the authorizer is off (start nvmq serve with --authorizer)".into(),
        ));
    }
    (!check::cluster(b, ctx, op)).then(|| {
        (
            codes::CLUSTER_AUTHORIZATION_FAILED,
            format!("{} may not {op:?} the cluster", ctx.session.principal()),
        )
    })
}

pub async fn create(b: &Arc<Broker>, ctx: &Ctx, req: CreateAclsRequest) -> Reply {
    let mut results: Vec<(i16, Option<String>)> = Vec::with_capacity(req.creations.len());
    let mut todo: Vec<(usize, Binding)> = Vec::new();
    let refused = refusal(b, ctx, Operation::Alter);
    for (i, c) in req.creations.iter().enumerate() {
        if let Some((code, msg)) = &refused {
            results.push((*code, Some(msg.clone())));
            continue;
        }
        let w = Wire {
            resource_type: c.resource_type,
            name: c.resource_name.as_str(),
            pattern_type: c.resource_pattern_type,
            principal: c.principal.as_str(),
            host: c.host.as_str(),
            op: c.operation,
            permission: c.permission_type,
        };
        match Binding::from_wire(w) {
            Ok(binding) => {
                results.push((codes::NONE, None));
                todo.push((i, binding));
            }
            Err(e) => results.push((codes::INVALID_REQUEST, Some(e.to_string()))),
        }
    }
    let (at, bindings): (Vec<usize>, Vec<Binding>) = todo.into_iter().unzip();
    for binding in &bindings {
        tracing::info!(principal = %ctx.session.principal(), acl = %binding, "creating an ACL");
    }
    for (i, r) in at.into_iter().zip(b.acl().add(b, bindings).await) {
        if let Err(e) = r {
            tracing::warn!(error = %e, "recording an ACL failed");
            results[i] = (codes::KAFKA_STORAGE_ERROR, Some(e.to_string()));
        }
    }
    let mut resp = CreateAclsResponse::default();
    resp.results = results
        .into_iter()
        .map(|(code, msg)| {
            let mut r = AclCreationResult::default();
            r.error_code = code;
            r.error_message = msg.map(s);
            r
        })
        .collect();
    ctx.ready(&resp)
}

fn filter(w: FilterWire<'_>) -> Result<Filter, (i16, String)> {
    Filter::from_wire(w).map_err(|e| (codes::INVALID_REQUEST, e.to_string()))
}

pub fn describe(b: &Arc<Broker>, ctx: &Ctx, req: DescribeAclsRequest) -> Reply {
    let mut resp = DescribeAclsResponse::default();
    let f = refusal(b, ctx, Operation::Describe).map_or_else(
        || {
            filter(FilterWire {
                resource_type: req.resource_type_filter,
                name: req.resource_name_filter.as_ref().map(|n| n.as_str()),
                pattern_type: req.pattern_type_filter,
                principal: req.principal_filter.as_ref().map(|n| n.as_str()),
                host: req.host_filter.as_ref().map(|n| n.as_str()),
                op: req.operation,
                permission: req.permission_type,
            })
        },
        Err,
    );
    match f {
        Err((code, msg)) => {
            resp.error_code = code;
            resp.error_message = Some(s(msg));
        }
        Ok(f) => {
            // Bindings come sorted by pattern: each run of one pattern is one resource.
            for binding in b.acl().matching(&f) {
                let p = &binding.pattern;
                let same = resp
                    .resources
                    .last()
                    .is_some_and(|r: &DescribeAclsResource| {
                        r.resource_type == p.resource.code()
                            && r.resource_name.as_str() == p.name
                            && r.pattern_type == p.kind.code()
                    });
                if !same {
                    let mut r = DescribeAclsResource::default();
                    r.resource_type = p.resource.code();
                    r.resource_name = s(p.name.clone());
                    r.pattern_type = p.kind.code();
                    resp.resources.push(r);
                }
                let e = &binding.entry;
                let mut d = AclDescription::default();
                d.principal = s(e.principal.to_string());
                d.host = s(e.host.to_string());
                d.operation = e.op.code();
                d.permission_type = e.permission.code();
                if let Some(r) = resp.resources.last_mut() {
                    r.acls.push(d);
                }
            }
        }
    }
    ctx.ready(&resp)
}

pub async fn delete(b: &Arc<Broker>, ctx: &Ctx, req: DeleteAclsRequest) -> Reply {
    let refused = refusal(b, ctx, Operation::Alter);
    let parsed: Vec<Result<Filter, (i16, String)>> = req
        .filters
        .iter()
        .map(|f| match &refused {
            Some(r) => Err(r.clone()),
            None => filter(FilterWire {
                resource_type: f.resource_type_filter,
                name: f.resource_name_filter.as_ref().map(|n| n.as_str()),
                pattern_type: f.pattern_type_filter,
                principal: f.principal_filter.as_ref().map(|n| n.as_str()),
                host: f.host_filter.as_ref().map(|n| n.as_str()),
                op: f.operation,
                permission: f.permission_type,
            }),
        })
        .collect();
    let valid: Vec<Filter> = parsed
        .iter()
        .filter_map(|f| f.as_ref().ok().cloned())
        .collect();
    let mut removed = b.acl().remove(b, &valid).await.into_iter();
    let mut resp = DeleteAclsResponse::default();
    for f in parsed {
        let mut r = DeleteAclsFilterResult::default();
        match f {
            Err((code, msg)) => {
                r.error_code = code;
                r.error_message = Some(s(msg));
            }
            Ok(_) => {
                for (binding, outcome) in removed.next().unwrap_or_default() {
                    tracing::info!(principal = %ctx.session.principal(), acl = %binding, "deleting an ACL");
                    let mut m = DeleteAclsMatchingAcl::default();
                    if let Err(e) = outcome {
                        m.error_code = codes::KAFKA_STORAGE_ERROR;
                        m.error_message = Some(s(e.to_string()));
                    }
                    m.resource_type = binding.pattern.resource.code();
                    m.resource_name = s(binding.pattern.name.clone());
                    m.pattern_type = binding.pattern.kind.code();
                    m.principal = s(binding.entry.principal.to_string());
                    m.host = s(binding.entry.host.to_string());
                    m.operation = binding.entry.op.code();
                    m.permission_type = binding.entry.permission.code();
                    r.matching_acls.push(m);
                }
            }
        }
        resp.filter_results.push(r);
    }
    ctx.ready(&resp)
}
