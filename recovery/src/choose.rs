//! Choosing the superblock copy to trust (storage.md §4.1).

use nvmq_log::format::{Superblock, SuperblockFault, FORMAT_VERSION, OLDEST_READABLE_VERSION};

use crate::RecoveryError;

/// The copy to trust and which slots held valid copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub chosen: Superblock,
    pub valid: [bool; 2],
}

/// Applies the rules: both valid copies must share the format id, their sequences must differ by
/// exactly one and the newer must name the older as parent; the newer wins. One valid copy is
/// used alone. None is refused: as unformatted when both slots are blank, else as damaged.
///
/// A copy whose checksum holds but whose format version this build does not read was written by
/// a newer nvmq: the log is refused even if the other copy is readable, since falling back to the
/// older copy would replay a log the newer build may have written in its own format.
pub fn choose(copies: &[Result<Superblock, SuperblockFault>; 2]) -> Result<Choice, RecoveryError> {
    for (slot, copy) in copies.iter().enumerate() {
        if let Err(SuperblockFault::Version(version)) = copy {
            return Err(RecoveryError::UnreadableVersion {
                slot: slot_name(slot as u8),
                version: *version,
                oldest: OLDEST_READABLE_VERSION,
                newest: FORMAT_VERSION,
            });
        }
    }
    match (&copies[0], &copies[1]) {
        (Ok(a), Ok(b)) => {
            if a.format_id != b.format_id {
                return Err(RecoveryError::SuperblockConflict(format!(
                    "format ids {:#x} and {:#x}",
                    a.format_id, b.format_id
                )));
            }
            let (old, new) = if a.sequence < b.sequence {
                (a, b)
            } else {
                (b, a)
            };
            if new.sequence != old.sequence + 1 {
                return Err(RecoveryError::SuperblockConflict(format!(
                    "sequences {} and {} are not consecutive",
                    a.sequence, b.sequence
                )));
            }
            if new.parent != old.checksum() {
                return Err(RecoveryError::SuperblockConflict(format!(
                    "copy {} (sequence {}) does not name copy {} as its parent",
                    slot_name(new.copy),
                    new.sequence,
                    slot_name(old.copy)
                )));
            }
            Ok(Choice {
                chosen: *new,
                valid: [true, true],
            })
        }
        (Ok(a), Err(_)) => Ok(Choice {
            chosen: *a,
            valid: [true, false],
        }),
        (Err(_), Ok(b)) => Ok(Choice {
            chosen: *b,
            valid: [false, true],
        }),
        (Err(fa), Err(fb)) => {
            let (a, b) = (fa.to_string(), fb.to_string());
            if *fa == SuperblockFault::Blank && *fb == SuperblockFault::Blank
                || matches!(
                    (fa, fb),
                    (SuperblockFault::BadMagic, SuperblockFault::BadMagic)
                )
            {
                Err(RecoveryError::NotFormatted { a, b })
            } else {
                Err(RecoveryError::SuperblocksDamaged { a, b })
            }
        }
    }
}

pub fn slot_name(copy: u8) -> char {
    if copy == 0 {
        'A'
    } else {
        'B'
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvmq_log::format::{LOG_START, SUPERBLOCK_LEN};

    fn sb(copy: u8, sequence: u64, parent: u32) -> Superblock {
        Superblock {
            version: nvmq_log::format::FORMAT_VERSION,
            format_id: 77,
            copy,
            sequence,
            parent,
            write_unit: 4096,
            log_start: LOG_START,
            log_size: 64 << 20,
            max_batch: 1 << 20,
            head: 0,
            recovery_point: 0,
            recovery_link: 0,
            checkpoint: 0,
            durable_through: 4096 * sequence,
            epoch: 1,
            epoch_start: 0,
            window: 4 << 20,
        }
    }

    /// A copy as it reads back from its slot after damage of the given kind.
    fn as_read(s: &Superblock, slot: u8, how: &str) -> Result<Superblock, SuperblockFault> {
        let mut bytes = s.encode().to_vec();
        match how {
            "valid" => {}
            "torn" => bytes[SUPERBLOCK_LEN / 2..].fill(0),
            "damaged" => bytes[40] ^= 0x10,
            "blank" => bytes.fill(0),
            _ => unreachable!(),
        }
        Superblock::decode(&bytes, slot)
    }

    #[test]
    fn every_combination_of_valid_torn_damaged_blank_and_stale_copies() {
        let a1 = sb(0, 1, 0);
        let b2 = sb(1, 2, a1.checksum());
        let a3 = sb(0, 3, b2.checksum());
        let states = ["valid", "torn", "damaged", "blank"];
        for sa in states {
            for sb_ in states {
                // Current pair: A holds sequence 3, B holds 2.
                let copies = [as_read(&a3, 0, sa), as_read(&b2, 1, sb_)];
                let r = choose(&copies);
                match (sa, sb_) {
                    ("valid", _) => assert_eq!(r.unwrap().chosen, a3, "{sa}/{sb_}"),
                    (_, "valid") => assert_eq!(r.unwrap().chosen, b2, "{sa}/{sb_}"),
                    ("blank", "blank") => {
                        assert!(matches!(r, Err(RecoveryError::NotFormatted { .. })))
                    }
                    _ => assert!(
                        matches!(r, Err(RecoveryError::SuperblocksDamaged { .. })),
                        "{sa}/{sb_}: {r:?}"
                    ),
                }
            }
        }
        // Stale: A still holds sequence 1 while B says 2 → B wins (B names A as parent).
        let r = choose(&[Ok(a1), Ok(b2)]).unwrap();
        assert_eq!(r.chosen, b2);
        // Stale by two (a lost update): refused.
        let b4 = sb(1, 4, a3.checksum());
        assert!(matches!(
            choose(&[Ok(a1), Ok(b4)]),
            Err(RecoveryError::SuperblockConflict(_))
        ));
        // A fork: consecutive sequences but the parent does not match.
        let forked = sb(1, 4, 12345);
        assert!(matches!(
            choose(&[Ok(a3), Ok(forked)]),
            Err(RecoveryError::SuperblockConflict(_))
        ));
        // Two devices mixed: another format id.
        let other = Superblock {
            format_id: 78,
            ..b2
        };
        assert!(matches!(
            choose(&[Ok(a3), Ok(other)]),
            Err(RecoveryError::SuperblockConflict(_))
        ));
    }

    #[test]
    fn a_copy_in_the_wrong_slot_is_invalid() {
        let a = sb(0, 1, 0);
        assert!(matches!(
            Superblock::decode(&a.encode(), 1),
            Err(SuperblockFault::WrongSlot { says: 0 })
        ));
    }
}
