//! `nvmq user add|remove|list`: SCRAM users, kept in the log's `__nvmq_meta` on the broker's
//! first device. The commands open the log themselves (exclusively, as `serve` does): stop the
//! broker first, or manage users of a running broker with a Kafka admin client
//! (AlterUserScramCredentials).

use std::io::{BufRead, IsTerminal};

use anyhow::{anyhow, bail, Context, Result};
use frontend::sasl::scram::{MAX_ITERATIONS, MIN_ITERATIONS};
use frontend::sasl::{ScramCredential, ScramMechanism};

use crate::{offline, Status};

#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "Examples:\n  \
echo \"$PASSWORD\" | nvmq user add alice --device file:/var/lib/nvmq/log.img\n  \
nvmq user list --device file:/var/lib/nvmq/log.img\n\n\
The password is read from stdin (one line), or asked for twice on a terminal; never a flag. \
Only salt, iterations and the SCRAM keys derived from it are stored. The device must not be \
in use: stop `nvmq serve` first (a running broker's users are managed with a Kafka admin \
client's AlterUserScramCredentials).")]
pub struct UserArgs {
    /// The broker's first device (the one holding its own state), as given to serve.
    #[arg(long, global = true, default_value = crate::serve::DEFAULT_DEVICE)]
    pub device: String,
    #[command(subcommand)]
    pub action: UserAction,
}

#[derive(clap::Subcommand, Debug, Clone)]
pub enum UserAction {
    /// Add a user, or set a new password for one (for one SCRAM mechanism; PLAIN logins are
    /// checked against SCRAM-SHA-512's credential, else SCRAM-SHA-256's).
    Add {
        name: String,
        #[arg(long, default_value = "SCRAM-SHA-512", value_parser = ["SCRAM-SHA-256", "SCRAM-SHA-512"])]
        mechanism: String,
        /// PBKDF2 iterations (4096 to 16384, Kafka's bounds).
        #[arg(long, default_value_t = MIN_ITERATIONS)]
        iterations: u32,
    },
    /// Remove a user's credential (every mechanism's unless --mechanism).
    Remove {
        name: String,
        #[arg(long, value_parser = ["SCRAM-SHA-256", "SCRAM-SHA-512"])]
        mechanism: Option<String>,
    },
    /// List users, their mechanisms and iterations (never a secret).
    List,
}

pub fn run(args: UserArgs) -> Result<Status> {
    if let UserAction::Add { iterations, .. } = &args.action {
        if !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(iterations) {
            bail!("--iterations {iterations}: SCRAM credentials take {MIN_ITERATIONS} to {MAX_ITERATIONS}");
        }
    }
    // The password first: a refusal to read it must not cost a log open.
    let password = match &args.action {
        UserAction::Add { name, .. } => Some(read_password(name)?),
        _ => None,
    };
    let broker = offline::open(&args.device)?;
    let rt = offline::runtime()?;
    match args.action {
        UserAction::Add {
            name,
            mechanism,
            iterations,
        } => {
            let m = mechanism_named(&mechanism)?;
            let password = password.unwrap_or_default();
            let cred = ScramCredential::new(m, password.as_bytes(), iterations)
                .map_err(|e| anyhow!("making the credential: {e}"))?;
            rt.block_on(broker.set_credential(&name, m, cred))
                .with_context(|| format!("adding user {name:?}"))?;
            println!(
                "user {name}: {} credential set ({iterations} iterations)",
                m.name()
            );
        }
        UserAction::Remove { name, mechanism } => {
            let ms: Vec<ScramMechanism> = match mechanism {
                Some(m) => vec![mechanism_named(&m)?],
                None => ScramMechanism::ALL
                    .into_iter()
                    .filter(|&m| broker.credentials().get(&name, m).is_some())
                    .collect(),
            };
            if ms.is_empty() {
                bail!("no user {name:?}");
            }
            for m in ms {
                rt.block_on(broker.remove_credential(&name, m))
                    .with_context(|| format!("removing user {name:?}"))?;
                println!("user {name}: {} credential removed", m.name());
            }
        }
        UserAction::List => {
            let all = broker.credentials().list();
            if all.is_empty() {
                println!("no users");
            }
            for c in all {
                println!(
                    "{}\t{}\t{} iterations",
                    c.user,
                    c.mechanism.name(),
                    c.iterations
                );
            }
        }
    }
    broker.close_logs();
    Ok(Status::Ok)
}

fn mechanism_named(s: &str) -> Result<ScramMechanism> {
    ScramMechanism::from_name(s).ok_or_else(|| anyhow!("unknown SCRAM mechanism {s:?}"))
}

/// The password: one line of stdin, or typed twice on a terminal (not echoed).
fn read_password(user: &str) -> Result<String> {
    let password = if std::io::stdin().is_terminal() {
        let p = rpassword::prompt_password(format!("password for {user}: "))
            .context("reading the password")?;
        let again = rpassword::prompt_password("again: ").context("reading the password")?;
        if p != again {
            bail!("the passwords differ");
        }
        p
    } else {
        let mut line = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut line)
            .context("reading the password from stdin")?;
        line.trim_end_matches(['\n', '\r']).to_string()
    };
    if password.is_empty() {
        bail!("the password is empty");
    }
    Ok(password)
}
