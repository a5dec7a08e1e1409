//! DescribeUserScramCredentials and AlterUserScramCredentials: the Kafka APIs admin clients
//! manage SCRAM users with (confluent-kafka's `describe_user_scram_credentials`,
//! `alter_user_scram_credentials`). An upsertion carries the salted password, never the
//! password; each change is durable before it is answered.

use std::collections::HashMap;
use std::sync::Arc;

use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse,
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
};
use kafka_protocol::protocol::StrBytes;

use crate::acl::{self, Operation};
use crate::broker::Broker;
use crate::codes;
use crate::conn::{Ctx, Reply};
use crate::credentials::CredentialError;
use crate::sasl::{ScramCredential, ScramMechanism};

fn text(s: impl Into<String>) -> Option<StrBytes> {
    Some(StrBytes::from_string(s.into()))
}

pub fn describe(b: &Arc<Broker>, ctx: &Ctx, req: DescribeUserScramCredentialsRequest) -> Reply {
    // Kafka's: Describe on the cluster.
    if !acl::check::cluster(b, ctx, Operation::Describe) {
        let mut resp = DescribeUserScramCredentialsResponse::default();
        resp.error_code = codes::CLUSTER_AUTHORIZATION_FAILED;
        resp.error_message = text("describing SCRAM users needs Describe on the cluster");
        return ctx.ready(&resp);
    }
    let all = b.credentials().list();
    let mut by_user: std::collections::BTreeMap<String, Vec<CredentialInfo>> = Default::default();
    for c in all {
        let mut i = CredentialInfo::default();
        i.mechanism = c.mechanism.code();
        i.iterations = i32::try_from(c.iterations).unwrap_or(i32::MAX);
        by_user.entry(c.user).or_default().push(i);
    }
    let mut resp = DescribeUserScramCredentialsResponse::default();
    let result = |user: &str, infos: Vec<CredentialInfo>, error: i16, message: Option<&str>| {
        let mut r = DescribeUserScramCredentialsResult::default();
        r.user = StrBytes::from_string(user.to_string());
        r.credential_infos = infos;
        r.error_code = error;
        r.error_message = message.and_then(text);
        r
    };
    match req.users.filter(|u| !u.is_empty()) {
        // Every user.
        None => {
            resp.results = by_user
                .into_iter()
                .map(|(u, infos)| result(&u, infos, codes::NONE, None))
                .collect();
        }
        Some(users) => {
            let mut seen: HashMap<String, usize> = HashMap::new();
            for u in &users {
                *seen.entry(u.name.as_str().to_string()).or_default() += 1;
            }
            for u in users {
                let name = u.name.as_str();
                let r = if seen.get(name).copied().unwrap_or(0) > 1 {
                    result(
                        name,
                        vec![],
                        codes::DUPLICATE_RESOURCE,
                        Some("user named more than once"),
                    )
                } else {
                    match by_user.get(name) {
                        Some(infos) => result(name, infos.clone(), codes::NONE, None),
                        None => result(
                            name,
                            vec![],
                            codes::RESOURCE_NOT_FOUND,
                            Some("attempt to describe a user credential that does not exist"),
                        ),
                    }
                };
                resp.results.push(r);
            }
        }
    }
    ctx.ready(&resp)
}

/// An error code and its message.
type Refused = (i16, String);

/// One change of an Alter request, checked.
enum Change {
    Set(ScramMechanism, ScramCredential),
    Remove(ScramMechanism),
}

pub async fn alter(b: &Arc<Broker>, ctx: &Ctx, req: AlterUserScramCredentialsRequest) -> Reply {
    // Kafka's rule: a user named more than once in one request gets DUPLICATE_RESOURCE for all
    // of its entries, and none of them is applied.
    let mut count: HashMap<String, usize> = HashMap::new();
    let names = req
        .deletions
        .iter()
        .map(|d| &d.name)
        .chain(req.upsertions.iter().map(|u| &u.name));
    for n in names {
        *count.entry(n.as_str().to_string()).or_default() += 1;
    }
    let mut changes: Vec<(String, Result<Change, Refused>)> = Vec::new();
    for d in req.deletions {
        let change = match ScramMechanism::from_code(d.mechanism) {
            Some(m) => Ok(Change::Remove(m)),
            None => Err(unknown_mechanism(d.mechanism)),
        };
        changes.push((d.name.as_str().to_string(), change));
    }
    for u in req.upsertions {
        let change = match ScramMechanism::from_code(u.mechanism) {
            None => Err(unknown_mechanism(u.mechanism)),
            Some(_) if u.salt.is_empty() || u.salted_password.is_empty() => Err((
                codes::UNACCEPTABLE_CREDENTIAL,
                "salt and salted password must not be empty".to_string(),
            )),
            Some(m) => match u32::try_from(u.iterations) {
                Ok(i) => Ok(Change::Set(
                    m,
                    ScramCredential::from_salted(m, u.salt.to_vec(), i, &u.salted_password),
                )),
                Err(_) => Err((
                    codes::UNACCEPTABLE_CREDENTIAL,
                    format!("{} iterations", u.iterations),
                )),
            },
        };
        changes.push((u.name.as_str().to_string(), change));
    }
    // Kafka's: Alter on the cluster, or every change is refused.
    let allowed = acl::check::cluster(b, ctx, Operation::Alter);
    let mut resp = AlterUserScramCredentialsResponse::default();
    for (user, change) in changes {
        let outcome = match change {
            _ if !allowed => Err((
                codes::CLUSTER_AUTHORIZATION_FAILED,
                "changing SCRAM users needs Alter on the cluster".to_string(),
            )),
            _ if count.get(&user).copied().unwrap_or(0) > 1 => Err((
                codes::DUPLICATE_RESOURCE,
                "a user may appear only once in a request".to_string(),
            )),
            Err(e) => Err(e),
            Ok(Change::Set(m, cred)) => b.set_credential(&user, m, cred).await.map_err(refusal),
            Ok(Change::Remove(m)) => b.remove_credential(&user, m).await.map_err(refusal),
        };
        let mut r = AlterUserScramCredentialsResult::default();
        r.user = StrBytes::from_string(user.clone());
        match outcome {
            Ok(()) => {
                tracing::info!(peer = ?ctx.session.peer, principal = %ctx.session.principal(), user, "SCRAM credential changed");
            }
            Err((code, message)) => {
                r.error_code = code;
                r.error_message = text(message);
            }
        }
        resp.results.push(r);
    }
    ctx.ready(&resp)
}

fn unknown_mechanism(code: i8) -> Refused {
    (
        codes::UNSUPPORTED_SASL_MECHANISM,
        format!("unknown SCRAM mechanism {code}"),
    )
}

fn refusal(e: CredentialError) -> Refused {
    let code = match &e {
        CredentialError::BadName | CredentialError::Iterations { .. } => {
            codes::UNACCEPTABLE_CREDENTIAL
        }
        CredentialError::NotFound { .. } => codes::RESOURCE_NOT_FOUND,
        CredentialError::Log(_) => codes::KAFKA_STORAGE_ERROR,
    };
    (code, e.to_string())
}
