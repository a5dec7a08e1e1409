//! `nvmq acl add|remove|list`: ACL bindings on a stopped broker's first device, written as the
//! same durable `__nvmq_meta` records CreateAcls and DeleteAcls write, so a new deployment gets
//! its first bindings without `--super-users` and a restart. A running broker's ACLs are managed
//! with a Kafka admin client.

use anyhow::{bail, Context, Result};
use frontend::acl::Binding;

use crate::acl_flags::{PatternArg, Selection};
use crate::{offline, Status};

#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "Examples:\n  \
nvmq acl add --allow-principal User:alice --operation Read --operation Write --topic orders --device file:/var/lib/nvmq/log.img\n  \
nvmq acl add --allow-principal User:app --operation Write --topic orders- --resource-pattern-type prefixed --device file:/var/lib/nvmq/log.img\n  \
nvmq acl add --allow-principal User:admin --operation All --cluster --device file:/var/lib/nvmq/log.img\n  \
nvmq acl remove --allow-principal User:alice --topic orders --device file:/var/lib/nvmq/log.img\n  \
nvmq acl list --json --device file:/var/lib/nvmq/log.img\n\n\
The flags are kafka-acls.sh's: add makes one binding per principal x resource x operation x host \
named; remove deletes the bindings on the named resources that match the rest (a flag left out \
matches anything); list prints those that match. The device must not be in use: stop `nvmq \
serve` first (a running broker's ACLs are managed with a Kafka admin client's CreateAcls, \
DescribeAcls and DeleteAcls).")]
pub struct AclArgs {
    /// The broker's first device (the one holding its own state), as given to serve.
    #[arg(long, global = true, default_value = crate::serve::DEFAULT_DEVICE)]
    pub device: String,
    #[command(subcommand)]
    pub action: AclAction,
}

#[derive(clap::Subcommand, Debug, Clone)]
pub enum AclAction {
    /// Add bindings (one already there is left as it is).
    Add(Selection),
    /// Remove the bindings on the named resources that match the other flags given.
    Remove(Selection),
    /// List the bindings that match the flags given (all, without any).
    List {
        #[command(flatten)]
        select: Selection,
        /// One JSON array of bindings instead of a table.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(args: AclArgs) -> Result<Status> {
    // Every flag is checked before the device is opened.
    let plan = match &args.action {
        AclAction::Add(s) => Plan::Add(s.bindings()?),
        AclAction::Remove(s) => Plan::Remove(s.filters(true, PatternArg::Literal)?),
        AclAction::List { select, json } => {
            Plan::List(select.filters(false, PatternArg::Any)?, *json)
        }
    };
    let broker = offline::open(&args.device)?;
    let rt = offline::runtime()?;
    let acl = broker.acl();
    let result = match plan {
        Plan::Add(bindings) => {
            let before = acl.bindings();
            let results = rt.block_on(acl.add(&broker, bindings.clone()));
            bindings
                .into_iter()
                .zip(results)
                .try_for_each(|(b, r)| -> Result<()> {
                    r.with_context(|| format!("adding {b}"))?;
                    let what = if before.contains(&b) {
                        "already there"
                    } else {
                        "added"
                    };
                    println!("{what}: {b}");
                    Ok(())
                })
        }
        Plan::Remove(filters) => {
            let per_filter = rt.block_on(acl.remove(&broker, &filters));
            let mut removed: Vec<(Binding, _)> = per_filter.into_iter().flatten().collect();
            removed.sort_by(|a, b| a.0.cmp(&b.0));
            removed.dedup_by(|a, b| a.0 == b.0);
            if removed.is_empty() {
                bail!("no binding matched: nothing removed (`nvmq acl list` shows them)");
            }
            removed.into_iter().try_for_each(|(b, r)| -> Result<()> {
                r.with_context(|| format!("removing {b}"))?;
                println!("removed: {b}");
                Ok(())
            })
        }
        Plan::List(filters, json) => {
            let shown: Vec<Binding> = acl
                .bindings()
                .into_iter()
                .filter(|b| filters.iter().any(|f| f.matches(b)))
                .collect();
            print!("{}", if json { as_json(&shown) } else { table(&shown) });
            Ok(())
        }
    };
    broker.close_logs();
    result.map(|()| Status::Ok)
}

/// What a command will do, decided from its flags alone.
enum Plan {
    Add(Vec<Binding>),
    Remove(Vec<frontend::acl::Filter>),
    List(Vec<frontend::acl::Filter>, bool),
}

/// A binding's fields as printed, in the table's column order.
fn fields(b: &Binding) -> [String; 7] {
    [
        format!("{:?}", b.entry.permission),
        b.entry.principal.to_string(),
        b.entry.host.to_string(),
        format!("{:?}", b.entry.op),
        format!("{:?}", b.pattern.resource),
        format!("{:?}", b.pattern.kind),
        b.pattern.name.clone(),
    ]
}

const COLUMNS: [&str; 7] = [
    "PERMISSION",
    "PRINCIPAL",
    "HOST",
    "OPERATION",
    "RESOURCE",
    "PATTERN",
    "NAME",
];

/// Aligned columns with a header, or a line saying there are none.
fn table(bindings: &[Binding]) -> String {
    if bindings.is_empty() {
        return "no ACL bindings\n".to_string();
    }
    let rows: Vec<[String; 7]> = bindings.iter().map(fields).collect();
    let mut width = COLUMNS.map(str::len);
    for r in &rows {
        for (w, f) in width.iter_mut().zip(r) {
            *w = (*w).max(f.chars().count());
        }
    }
    let header = COLUMNS.map(str::to_string);
    let mut out = String::new();
    for r in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = r
            .iter()
            .zip(width)
            .map(|(f, w)| format!("{f:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn as_json(bindings: &[Binding]) -> String {
    let keys = [
        "permission",
        "principal",
        "host",
        "operation",
        "resource_type",
        "pattern_type",
        "name",
    ];
    let v: Vec<serde_json::Value> = bindings
        .iter()
        .map(|b| {
            let m: serde_json::Map<String, serde_json::Value> = keys
                .iter()
                .zip(fields(b))
                .map(|(k, f)| (k.to_string(), f.into()))
                .collect();
            m.into()
        })
        .collect();
    format!("{}\n", serde_json::Value::from(v))
}
