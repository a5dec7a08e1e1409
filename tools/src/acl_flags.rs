//! `nvmq acl`'s flags, as Kafka's `kafka-acls.sh` spells them, and what they select: the
//! bindings an `add` creates (every principal x resource x operation x host named), the filters a
//! `remove` or `list` matches with. Each value goes through its flag's own parser, so a bad one
//! is refused naming the flag, before the device is opened.

use anyhow::{bail, Result};
use frontend::acl::matcher::KindFilter;
use frontend::acl::operations::supported;
use frontend::acl::{
    Binding, Entry, Filter, Host, Operation, Pattern, PatternFilter, PatternType, Permission,
    ResourceType, CLUSTER_NAME,
};
use frontend::session::Principal;

/// `--resource-pattern-type`: Kafka's names; `any` and `match` only select (remove, list).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatternArg {
    Literal,
    Prefixed,
    /// Any pattern type (remove, list).
    Any,
    /// Every pattern that covers the name: the literal name, `*`, and its prefixes (remove,
    /// list).
    Match,
}

/// Who, what and on which resources.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Selection {
    /// A principal the binding allows (Type:name, e.g. User:alice; User:* is everyone). May be
    /// repeated.
    #[arg(long = "allow-principal", value_name = "PRINCIPAL", value_parser = principal)]
    pub allow: Vec<Principal>,
    /// A principal the binding denies (a Deny wins over any Allow). May be repeated.
    #[arg(long = "deny-principal", value_name = "PRINCIPAL", value_parser = principal)]
    pub deny: Vec<Principal>,
    /// A principal whose bindings remove or list select, allowed or denied (add takes
    /// --allow-principal or --deny-principal). May be repeated.
    #[arg(long = "principal", value_name = "PRINCIPAL", value_parser = principal)]
    pub principal: Vec<Principal>,
    /// An operation: All, Read, Write, Create, Delete, Alter, Describe, ClusterAction,
    /// DescribeConfigs, AlterConfigs, IdempotentWrite (any case). May be repeated.
    #[arg(long = "operation", value_name = "OPERATION", value_parser = operation)]
    pub operations: Vec<Operation>,
    /// A topic (with `literal` patterns, `*` is every topic). May be repeated.
    #[arg(long = "topic", value_name = "TOPIC", value_parser = resource_name)]
    pub topics: Vec<String>,
    /// A consumer group. May be repeated.
    #[arg(long = "group", value_name = "GROUP", value_parser = resource_name)]
    pub groups: Vec<String>,
    /// A transactional id. May be repeated.
    #[arg(long = "transactional-id", value_name = "ID", value_parser = resource_name)]
    pub transactional_ids: Vec<String>,
    /// The cluster (creating topics, IdempotentWrite, managing ACLs).
    #[arg(long)]
    pub cluster: bool,
    /// How the resource names match: literal or prefixed (add, remove: default literal), or
    /// any or match (remove, list; list's default is any).
    #[arg(long = "resource-pattern-type", value_enum)]
    pub pattern: Option<PatternArg>,
    /// The host the principals connect from: `*` (add's default) or an IP address. May be
    /// repeated.
    #[arg(long = "host", value_name = "HOST", value_parser = host)]
    pub hosts: Vec<Host>,
}

fn principal(s: &str) -> Result<Principal, String> {
    Principal::parse(s).ok_or_else(|| format!("{s:?} is not of the form Type:name (User:alice)"))
}

/// An operation by its name, in any case, `_` and `-` ignored (`idempotent_write` too).
fn operation(s: &str) -> Result<Operation, String> {
    let plain = |x: &str| x.replace(['_', '-'], "").to_ascii_lowercase();
    Operation::EVERY
        .iter()
        .find(|o| plain(&format!("{o:?}")) == plain(s))
        .copied()
        .ok_or_else(|| {
            format!(
                "{s:?} is not an operation (one of {})",
                names(Operation::EVERY)
            )
        })
}

fn names(ops: &[Operation]) -> String {
    let v: Vec<String> = ops.iter().map(|o| format!("{o:?}")).collect();
    v.join(", ")
}

fn resource_name(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("a resource name may not be empty".into());
    }
    Ok(s.to_string())
}

fn host(s: &str) -> Result<Host, String> {
    Host::parse(s).map_err(|e| e.to_string())
}

/// The operations a binding on `rt` may name: `All` and the ones the resource type has (the
/// same list authorized operations report, so `acl add` and KIP-430 never disagree); Kafka's
/// `kafka-acls.sh` refuses the rest, as they would never grant anything.
fn applies(rt: ResourceType, op: Operation) -> bool {
    op == Operation::All || supported(rt).contains(&op)
}

impl Selection {
    /// The resources named, with their flag (for messages).
    fn resources(&self) -> Vec<(ResourceType, String)> {
        let named = |rt, v: &[String]| v.iter().map(move |n| (rt, n.clone())).collect::<Vec<_>>();
        let mut out = named(ResourceType::Topic, &self.topics);
        out.extend(named(ResourceType::Group, &self.groups));
        out.extend(named(
            ResourceType::TransactionalId,
            &self.transactional_ids,
        ));
        if self.cluster {
            out.push((ResourceType::Cluster, CLUSTER_NAME.to_string()));
        }
        out
    }

    /// The principals named, each with the permission its flag gives.
    fn principals(&self) -> Vec<(Principal, Permission)> {
        let allow = self.allow.iter().map(|x| (x.clone(), Permission::Allow));
        let deny = self.deny.iter().map(|x| (x.clone(), Permission::Deny));
        allow.chain(deny).collect()
    }

    fn needs_resource(&self) -> Result<Vec<(ResourceType, String)>> {
        let rs = self.resources();
        if rs.is_empty() {
            bail!("name a resource: --topic, --group, --transactional-id or --cluster");
        }
        Ok(rs)
    }

    /// The bindings `add` creates: every principal x resource x operation x host.
    pub fn bindings(&self) -> Result<Vec<Binding>> {
        let resources = self.needs_resource()?;
        let principals = self.principals();
        if !self.principal.is_empty() {
            bail!("--principal selects (remove, list): a binding is made with --allow-principal or --deny-principal");
        }
        if principals.is_empty() {
            bail!("name who the binding is for: --allow-principal or --deny-principal");
        }
        if self.operations.is_empty() {
            bail!("name an --operation ({})", names(Operation::EVERY));
        }
        let kind = match self.pattern.unwrap_or(PatternArg::Literal) {
            PatternArg::Literal => PatternType::Literal,
            PatternArg::Prefixed => PatternType::Prefixed,
            PatternArg::Any | PatternArg::Match => bail!(
                "--resource-pattern-type any or match only select: a binding is literal or prefixed (any and match are for remove and list)"
            ),
        };
        let hosts = if self.hosts.is_empty() {
            vec![Host::Any]
        } else {
            self.hosts.clone()
        };
        let mut out = Vec::new();
        for (rt, name) in &resources {
            for op in &self.operations {
                if !applies(*rt, *op) {
                    bail!(
                        "--operation {op:?} does not apply to a {rt:?} (it takes All, {})",
                        names(supported(*rt))
                    );
                }
            }
            for (principal, permission) in &principals {
                for op in &self.operations {
                    for host in &hosts {
                        out.push(Binding {
                            pattern: Pattern {
                                resource: *rt,
                                name: name.clone(),
                                kind,
                            },
                            entry: Entry {
                                principal: principal.clone(),
                                host: host.clone(),
                                op: *op,
                                permission: *permission,
                            },
                        });
                    }
                }
            }
        }
        Ok(out)
    }

    /// The filters `remove` (which needs a resource) or `list` (`None`: everything) matches
    /// with; a field not given matches anything.
    pub fn filters(&self, need_resource: bool, default: PatternArg) -> Result<Vec<Filter>> {
        let kind = match self.pattern.unwrap_or(default) {
            PatternArg::Literal => KindFilter::Is(PatternType::Literal),
            PatternArg::Prefixed => KindFilter::Is(PatternType::Prefixed),
            PatternArg::Any => KindFilter::Any,
            PatternArg::Match => KindFilter::Match,
        };
        let resources: Vec<Option<(ResourceType, String)>> = if need_resource {
            self.needs_resource()?.into_iter().map(Some).collect()
        } else {
            let rs = self.resources();
            if rs.is_empty() {
                vec![None]
            } else {
                rs.into_iter().map(Some).collect()
            }
        };
        // (principal, permission): a field None matches anything.
        let mut principals: Vec<(Option<Principal>, Option<Permission>)> = self
            .principals()
            .into_iter()
            .map(|(x, perm)| (Some(x), Some(perm)))
            .chain(self.principal.iter().map(|x| (Some(x.clone()), None)))
            .collect();
        if principals.is_empty() {
            principals.push((None, None));
        }
        let ops: Vec<Option<Operation>> = match &self.operations {
            ops if ops.is_empty() => vec![None],
            ops => ops.iter().copied().map(Some).collect(),
        };
        let hosts: Vec<Option<String>> = match &self.hosts {
            hs if hs.is_empty() => vec![None],
            hs => hs.iter().map(|h| Some(h.to_string())).collect(),
        };
        let mut out = Vec::new();
        for r in &resources {
            for p in &principals {
                for op in &ops {
                    for host in &hosts {
                        out.push(Filter {
                            pattern: PatternFilter {
                                resource: r.as_ref().map(|(rt, _)| *rt),
                                name: r.as_ref().map(|(_, n)| n.clone()),
                                kind,
                            },
                            principal: p.0.clone(),
                            host: host.clone(),
                            op: *op,
                            permission: p.1,
                        });
                    }
                }
            }
        }
        Ok(out)
    }
}
