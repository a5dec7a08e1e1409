//! The scenarios `nvmq kafka-bench --scenario` accepts, and their parsing.

use std::fmt;

use anyhow::{bail, Result};

/// Connections of `conns` when no count is given.
pub const DEFAULT_CONNS: usize = 1024;
/// Most connections or requests in flight a scenario may ask for.
const MAX_COUNT: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// N connections, one Produce of one record in flight each.
    Closed { conns: usize },
    /// C connections, W Produce requests in flight each.
    Pipelined { conns: usize, window: usize },
    /// N connections, closed loop, R records per Produce (one RecordBatch).
    Batched { conns: usize, records: usize },
    /// N closed-loop producers on one partition and one tailing consumer.
    E2e { producers: usize },
    /// Fill one partition, then read it from its start as fast as one consumer can.
    Catchup { records: Option<u64> },
    /// N connections, all closed loop, and the broker's memory.
    Conns { conns: usize },
}

impl Scenario {
    pub fn kind(&self) -> &'static str {
        match self {
            Scenario::Closed { .. } => "closed",
            Scenario::Pipelined { .. } => "pipelined",
            Scenario::Batched { .. } => "batched",
            Scenario::E2e { .. } => "e2e",
            Scenario::Catchup { .. } => "catchup",
            Scenario::Conns { .. } => "conns",
        }
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Scenario::Closed { conns } => write!(f, "closed:{conns}"),
            Scenario::Pipelined { conns, window } => write!(f, "pipelined:{conns}x{window}"),
            Scenario::Batched { conns, records } => write!(f, "batched:{conns}x{records}"),
            Scenario::E2e { producers } => write!(f, "e2e:{producers}"),
            Scenario::Catchup { records: None } => write!(f, "catchup"),
            Scenario::Catchup { records: Some(n) } => write!(f, "catchup:{n}"),
            Scenario::Conns { conns } => write!(f, "conns:{conns}"),
        }
    }
}

const FORMS: &str = "closed:<conns>, pipelined:<conns>x<in-flight>, batched:<conns>x<records>, \
e2e:<producers>, catchup[:<records>], conns[:<conns>]";

impl std::str::FromStr for Scenario {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Scenario> {
        let s = s.trim();
        let (kind, arg) = match s.split_once(':') {
            Some((k, a)) => (k, Some(a)),
            None => (s, None),
        };
        let need = |what: &str, form: &str| -> Result<&str> {
            match arg {
                Some(a) => Ok(a),
                None => bail!("scenario {s:?}: {what} missing (expected {form})"),
            }
        };
        let sc = match kind {
            "closed" => Scenario::Closed {
                conns: count(
                    s,
                    need("connection count", "closed:<conns>, e.g. closed:64")?,
                    "connection count",
                )?,
            },
            "pipelined" => {
                let (c, w) = pair(
                    s,
                    need(
                        "counts",
                        "pipelined:<conns>x<in-flight>, e.g. pipelined:4x256",
                    )?,
                    "connection count",
                    "requests in flight",
                )?;
                Scenario::Pipelined {
                    conns: c,
                    window: w,
                }
            }
            "batched" => {
                let (c, r) = pair(
                    s,
                    need("counts", "batched:<conns>x<records>, e.g. batched:64x100")?,
                    "connection count",
                    "records per request",
                )?;
                Scenario::Batched {
                    conns: c,
                    records: r,
                }
            }
            "e2e" => Scenario::E2e {
                producers: count(
                    s,
                    need("producer count", "e2e:<producers>, e.g. e2e:8")?,
                    "producer count",
                )?,
            },
            "catchup" => Scenario::Catchup {
                records: match arg {
                    None => None,
                    Some(a) => Some(big_count(s, a, "record count")?),
                },
            },
            "conns" => Scenario::Conns {
                conns: match arg {
                    None => DEFAULT_CONNS,
                    Some(a) => count(s, a, "connection count")?,
                },
            },
            "" => bail!("empty scenario (expected one of {FORMS})"),
            other => bail!("scenario {s:?}: unknown kind {other:?} (expected one of {FORMS})"),
        };
        Ok(sc)
    }
}

fn big_count(s: &str, a: &str, what: &str) -> Result<u64> {
    match a.trim().parse::<u64>() {
        Ok(0) => bail!("scenario {s:?}: the {what} must be at least 1, not {a:?}"),
        Ok(n) => Ok(n),
        Err(_) => bail!("scenario {s:?}: {a:?} is not a {what}"),
    }
}

fn count(s: &str, a: &str, what: &str) -> Result<usize> {
    let n = big_count(s, a, what)?;
    if n > MAX_COUNT as u64 {
        bail!("scenario {s:?}: the {what} {n} is above the limit of {MAX_COUNT}");
    }
    Ok(n as usize)
}

fn pair(s: &str, a: &str, first: &str, second: &str) -> Result<(usize, usize)> {
    let Some((x, y)) = a.split_once('x') else {
        bail!("scenario {s:?}: {a:?} is not <{first}>x<{second}> (e.g. 64x100)");
    };
    Ok((count(s, x, first)?, count(s, y, second)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(s: &str) -> String {
        format!("{:#}", s.parse::<Scenario>().unwrap_err())
    }

    #[test]
    fn every_form_parses_and_prints_back() {
        let cases = [
            ("closed:64", Scenario::Closed { conns: 64 }),
            (
                "pipelined:4x256",
                Scenario::Pipelined {
                    conns: 4,
                    window: 256,
                },
            ),
            (
                "batched:64x100",
                Scenario::Batched {
                    conns: 64,
                    records: 100,
                },
            ),
            ("e2e:8", Scenario::E2e { producers: 8 }),
            ("catchup", Scenario::Catchup { records: None }),
            (
                "catchup:5000",
                Scenario::Catchup {
                    records: Some(5000),
                },
            ),
            ("conns:8", Scenario::Conns { conns: 8 }),
        ];
        for (text, want) in cases {
            let got: Scenario = text.parse().unwrap();
            assert_eq!(got, want, "{text}");
            assert_eq!(got.to_string(), text);
        }
        assert_eq!(
            "conns".parse::<Scenario>().unwrap(),
            Scenario::Conns {
                conns: DEFAULT_CONNS
            }
        );
        assert_eq!(
            " closed:1 ".parse::<Scenario>().unwrap(),
            Scenario::Closed { conns: 1 }
        );
    }

    #[test]
    fn bad_strings_name_the_bad_part() {
        let e = err("closed:abc");
        assert!(e.contains("\"abc\" is not a connection count"), "{e}");
        let e = err("closed");
        assert!(e.contains("connection count missing"), "{e}");
        let e = err("closed:0");
        assert!(e.contains("at least 1") && e.contains("\"0\""), "{e}");
        let e = err("pipelined:4");
        assert!(
            e.contains("\"4\" is not <connection count>x<requests in flight>"),
            "{e}"
        );
        let e = err("pipelined:4xq");
        assert!(e.contains("\"q\" is not a requests in flight"), "{e}");
        let e = err("batched:x100");
        assert!(e.contains("\"\" is not a connection count"), "{e}");
        let e = err("batched:64x0");
        assert!(e.contains("records per request must be at least 1"), "{e}");
        let e = err("e2e:-1");
        assert!(e.contains("\"-1\" is not a producer count"), "{e}");
        let e = err("catchup:lots");
        assert!(e.contains("\"lots\" is not a record count"), "{e}");
        let e = err("conns:1000000");
        assert!(e.contains("above the limit"), "{e}");
        let e = err("open:3");
        assert!(
            e.contains("unknown kind \"open\"") && e.contains("closed:<conns>"),
            "{e}"
        );
        let e = err("");
        assert!(e.contains("empty scenario"), "{e}");
    }
}
