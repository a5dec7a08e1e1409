//! The control socket: one text command per line, one reply line per command, so a shell
//! (`echo 'cut 7' | socat - UNIX-CONNECT:nbd.sock.ctl`, or `nvmq-nbd --control-cmd`) and Rust
//! ([`command`], [`cut`]) drive it alike.
//!
//! - `cut <seed>` / `cut`: the power cut (with the server's next seed when none is given). Reply:
//!   `ok cut seed=<s> unflushed=<n> bytes=<b> survived=<a> lost=<l> torn=<t> connections=<c>`.
//! - `stats`: `ok reads=.. writes=.. fua_writes=.. flushes=.. destaged=.. cuts=.. cached_writes=..
//!   cached_bytes=..`.
//! - `ping`: `ok`.
//!
//! Anything else gets `error <reason>`.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use super::error::NbdError;
use super::server::Shared;
use super::store::CutOutcome;

/// Longest command line read; a longer one ends the control connection.
const MAX_LINE: u64 = 256;

fn execute(shared: &Shared, line: &str) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["ping"] => "ok".into(),
        ["cut"] | ["cut", _] => {
            let seed = match words.get(1).map(|s| s.parse::<u64>()) {
                None => None,
                Some(Ok(s)) => Some(s),
                Some(Err(_)) => return format!("error cut: seed {:?} is not a u64", words[1]),
            };
            match shared.cut(seed) {
                Ok((out, conns)) => format!("ok cut {out} connections={conns}"),
                Err(e) => format!("error cut: {e}"),
            }
        }
        ["stats"] => {
            let s = shared.stats();
            format!(
                "ok reads={} writes={} fua_writes={} flushes={} destaged={} cuts={} cached_writes={} cached_bytes={}",
                s.reads, s.writes, s.fua_writes, s.flushes, s.destaged, s.cuts, s.cached_writes, s.cached_bytes
            )
        }
        _ => format!("error unknown command {line:?} (cut [seed], stats, ping)"),
    }
}

pub(crate) fn serve(shared: &Shared, stream: UnixStream) {
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let mut lines = BufReader::new(stream);
    loop {
        let mut line = String::new();
        let n = match (&mut lines).take(MAX_LINE).read_line(&mut line) {
            Ok(n) => n,
            Err(e) => {
                shared.log(&format!("control connection: {e}"));
                return;
            }
        };
        if n == 0 {
            return;
        }
        if !line.ends_with('\n') && n as u64 >= MAX_LINE {
            let _ = writeln!(out, "error command longer than {MAX_LINE} bytes");
            return;
        }
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let reply = execute(shared, line);
        shared.log(&format!("control {line:?} -> {reply}"));
        if writeln!(out, "{reply}").is_err() {
            return;
        }
    }
}

/// Sends one command to the control socket at `path` and returns its `ok ...` reply line;
/// an `error ...` reply becomes [`NbdError::Control`].
pub fn command(path: &Path, line: &str) -> Result<String, NbdError> {
    let sock = |op: &'static str| {
        let addr = path.display().to_string();
        move |source| NbdError::Socket { op, addr, source }
    };
    let mut s = UnixStream::connect(path).map_err(sock("connecting to"))?;
    writeln!(s, "{line}").map_err(sock("writing to"))?;
    let mut reply = String::new();
    BufReader::new(&s)
        .read_line(&mut reply)
        .map_err(sock("reading from"))?;
    let reply = reply.trim_end().to_string();
    if reply.starts_with("ok") {
        Ok(reply)
    } else {
        Err(NbdError::Control {
            command: line.into(),
            reason: if reply.is_empty() {
                "the server closed the connection without a reply".into()
            } else {
                reply
            },
        })
    }
}

/// Cuts the power of the server whose control socket is `path` (see [`command`]).
pub fn cut(path: &Path, seed: Option<u64>) -> Result<CutOutcome, NbdError> {
    let line = match seed {
        Some(s) => format!("cut {s}"),
        None => "cut".to_string(),
    };
    let reply = command(path, &line)?;
    parse_cut(&reply).ok_or_else(|| NbdError::Control {
        command: line,
        reason: format!("unparsable reply {reply:?}"),
    })
}

fn parse_cut(reply: &str) -> Option<CutOutcome> {
    let field = |key: &str| -> Option<u64> {
        reply
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))?
            .parse()
            .ok()
    };
    Some(CutOutcome {
        seed: field("seed")?,
        unflushed: field("unflushed")?,
        unflushed_bytes: field("bytes")?,
        survived: field("survived")?,
        lost: field("lost")?,
        torn: field("torn")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_reply_parses_back_into_its_outcome() {
        let out = CutOutcome {
            seed: 9,
            unflushed: 4,
            unflushed_bytes: 16384,
            survived: 1,
            lost: 2,
            torn: 1,
        };
        let reply = format!("ok cut {out} connections=1");
        assert_eq!(parse_cut(&reply), Some(out));
        assert_eq!(parse_cut("ok cut seed=x"), None);
    }
}
