use std::fmt;

use crate::{DeviceError, Op, Tag};

/// Why a contract check failed: the check, what it was doing, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ContractFailure {
    /// The check's name, as in [`super::CHECKS`].
    pub check: &'static str,
    /// What the check was doing, e.g. "reading back the round-trip writes".
    pub step: String,
    pub op: Option<Op>,
    pub lba: Option<u64>,
    pub tag: Option<Tag>,
    /// What was found, and what was expected.
    pub detail: String,
}

impl ContractFailure {
    pub fn new(check: &'static str, step: impl Into<String>) -> ContractFailure {
        ContractFailure {
            check,
            step: step.into(),
            op: None,
            lba: None,
            tag: None,
            detail: String::new(),
        }
    }

    pub fn op(mut self, op: Op) -> Self {
        self.op = Some(op);
        self
    }

    pub fn lba(mut self, lba: u64) -> Self {
        self.lba = Some(lba);
        self
    }

    pub fn tag(mut self, tag: Tag) -> Self {
        self.tag = Some(tag);
        self
    }

    pub fn because(mut self, detail: impl Into<String>) -> Self {
        self.detail = detail.into();
        self
    }

    /// A device error met while doing `step`; takes the operation and address from the error.
    pub fn device(check: &'static str, step: impl Into<String>, e: &DeviceError) -> Self {
        let f = ContractFailure::new(check, step).op(e.op());
        let f = match error_lba(e) {
            Some(lba) => f.lba(lba),
            None => f,
        };
        f.because(e.to_string())
    }
}

fn error_lba(e: &DeviceError) -> Option<u64> {
    match e {
        DeviceError::BadRequest { lba, .. }
        | DeviceError::OutOfRange { lba, .. }
        | DeviceError::QueueFull { lba, .. }
        | DeviceError::Io { lba, .. }
        | DeviceError::Stopped { lba, .. }
        | DeviceError::Nvme { lba, .. }
        | DeviceError::CommandTimeout { lba, .. }
        | DeviceError::Failed { lba, .. } => Some(*lba),
        DeviceError::Open { .. } | DeviceError::Timeout { .. } => None,
    }
}

impl fmt::Display for ContractFailure {
    /// `contract check round-trip: reading back ...: read at block 17 (tag 0x3): byte 5 reads ...`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "contract check {}: {}", self.check, self.step)?;
        let mut at = Vec::new();
        if let Some(op) = self.op {
            at.push(op.to_string());
        }
        if let Some(lba) = self.lba {
            at.push(format!("at block {lba}"));
        }
        if let Some(tag) = self.tag {
            at.push(format!("(tag {tag:#x})"));
        }
        if !at.is_empty() {
            write!(f, ": {}", at.join(" "))?;
        }
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_check_step_operation_address_and_tag() {
        let f = ContractFailure::new("round-trip", "reading back")
            .op(Op::Read)
            .lba(17)
            .tag(3)
            .because("byte 5 reads 0x00, wrote 0x2a");
        assert_eq!(
            f.to_string(),
            "contract check round-trip: reading back: read at block 17 (tag 0x3): byte 5 reads \
             0x00, wrote 0x2a"
        );
        let e = DeviceError::QueueFull {
            op: Op::Flush,
            lba: 0,
            depth: 2,
        };
        let f = ContractFailure::device("queue-depth", "collecting", &e);
        assert_eq!((f.op, f.lba), (Some(Op::Flush), Some(0)));
        assert!(f.to_string().contains("queue is full"), "{f}");
    }
}
