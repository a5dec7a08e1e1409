//! Running host programs with errors that carry the command line and its stderr.
use std::process::{Command, Output};

use super::error::{Result, RigError};

pub(crate) fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd` to completion; a non-zero exit is an error carrying its stderr.
pub(crate) fn run(cmd: &mut Command) -> Result<Output> {
    let out = cmd.output().map_err(|source| RigError::Spawn {
        command: describe(cmd),
        source,
    })?;
    if !out.status.success() {
        return Err(RigError::CommandFailed {
            command: describe(cmd),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(out)
}

pub(crate) fn stdout_of(cmd: &mut Command) -> Result<String> {
    Ok(String::from_utf8_lossy(&run(cmd)?.stdout).into_owned())
}
