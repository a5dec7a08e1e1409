//! The damage `fuzz_recovery.rs` does to a log image: byte overwrites, bit flips, zeroed
//! ranges, misdirected and stale blocks, superblock fields re-encoded with a valid CRC; their
//! proptest strategies, and applying one to a simulated device.

use blockdev::sim::SimHandle;
use nvmq_log::format::{superblock_offset, Superblock, LOG_START, SUPERBLOCK_B, SUPERBLOCK_LEN};
use proptest::collection::vec;
use proptest::prelude::*;

use crate::fuzz_images::{snapshot_block, Image, BLOCK, CAPACITY, DEVICE_BLOCKS};

#[derive(Debug, Clone)]
pub enum FieldValue {
    Any(u64),
    /// A multiple of the 4 KiB write unit.
    Blocks(u64),
    /// The current value plus a small signed delta.
    Delta(i64),
    /// The current value plus a small signed number of write units.
    DeltaBlocks(i64),
    /// An aligned position within a few write units of u64::MAX.
    High(u64),
    /// u64::MAX minus a little.
    Top(u64),
}

#[derive(Debug, Clone)]
pub enum Mutation {
    Overwrite {
        at: u64,
        bytes: Vec<u8>,
    },
    FlipBit {
        at: u64,
        bit: u8,
    },
    Zero {
        at: u64,
        len: u64,
    },
    /// A misdirected write: block `from` copied over block `to`.
    CopyBlock {
        from: u64,
        to: u64,
    },
    /// A stale block: `block` as it was at the end of an earlier era.
    Stale {
        block: u64,
        era: usize,
    },
    /// A superblock copy with one field changed (`field` 16 and up: every position shifted
    /// together) and a valid CRC. `relink`: 0 leaves the other
    /// copy as it is, 1 makes the two copies a valid chain again, 2 erases the other copy.
    SuperblockField {
        slot: u8,
        field: u8,
        value: FieldValue,
        relink: u8,
    },
}

pub fn device_offset() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => LOG_START..CAPACITY,
        1 => 0..SUPERBLOCK_LEN as u64,
        1 => SUPERBLOCK_B..SUPERBLOCK_B + SUPERBLOCK_LEN as u64,
        1 => 0..CAPACITY,
    ]
}

pub fn device_block() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => (LOG_START / BLOCK)..DEVICE_BLOCKS,
        1 => Just(0),
        1 => Just(SUPERBLOCK_B / BLOCK),
        1 => 0..DEVICE_BLOCKS,
    ]
}

pub fn field_value() -> impl Strategy<Value = FieldValue> {
    prop_oneof![
        any::<u64>().prop_map(FieldValue::Any),
        (0u64..64).prop_map(FieldValue::Blocks),
        (-3i64..=3).prop_map(FieldValue::Delta),
        (-8i64..=8).prop_map(FieldValue::DeltaBlocks),
        (0u64..4).prop_map(FieldValue::High),
        (0u64..3).prop_map(FieldValue::Top),
    ]
}

pub fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => (device_offset(), vec(any::<u8>(), 1..64))
            .prop_map(|(at, bytes)| Mutation::Overwrite { at, bytes }),
        3 => (device_offset(), 0u8..8).prop_map(|(at, bit)| Mutation::FlipBit { at, bit }),
        2 => (device_offset(), 1u64..8192).prop_map(|(at, len)| Mutation::Zero { at, len }),
        2 => (device_block(), device_block()).prop_map(|(from, to)| Mutation::CopyBlock { from, to }),
        2 => (device_block(), 0usize..8).prop_map(|(block, era)| Mutation::Stale { block, era }),
        4 => (0u8..2, 0u8..20, field_value(), 0u8..3).prop_map(|(slot, field, value, relink)| {
            Mutation::SuperblockField { slot, field, value, relink }
        }),
    ]
}

pub fn set_field(sb: &mut Superblock, field: u8, value: &FieldValue) {
    if field >= 16 {
        // Every position at once, kept in order: the superblock names another place of the log.
        let mut head = sb.head;
        set_field(sb, 8, value);
        std::mem::swap(&mut head, &mut sb.head);
        let delta = head.wrapping_sub(sb.head);
        sb.head = head;
        sb.recovery_point = sb.recovery_point.wrapping_add(delta);
        sb.checkpoint = sb.checkpoint.wrapping_add(delta);
        sb.durable_through = sb.durable_through.wrapping_add(delta);
        sb.epoch_start = sb.epoch_start.wrapping_add(delta);
        return;
    }
    let current = match field {
        0 => sb.format_id,
        1 => u64::from(sb.copy),
        2 => sb.sequence,
        3 => u64::from(sb.parent),
        4 => u64::from(sb.write_unit),
        5 => sb.log_start,
        6 => sb.log_size,
        7 => u64::from(sb.max_batch),
        8 => sb.head,
        9 => sb.recovery_point,
        10 => u64::from(sb.recovery_link),
        11 => sb.checkpoint,
        12 => sb.durable_through,
        13 => sb.epoch,
        14 => sb.epoch_start,
        _ => sb.window,
    };
    let v = match *value {
        FieldValue::Any(x) => x,
        FieldValue::Blocks(k) => k * BLOCK,
        FieldValue::Delta(d) => current.wrapping_add_signed(d),
        FieldValue::DeltaBlocks(d) => current.wrapping_add_signed(d * BLOCK as i64),
        FieldValue::High(k) => (u64::MAX / BLOCK - k) * BLOCK,
        FieldValue::Top(k) => u64::MAX - k,
    };
    match field {
        0 => sb.format_id = v,
        1 => sb.copy = v as u8,
        2 => sb.sequence = v,
        3 => sb.parent = v as u32,
        4 => sb.write_unit = v as u32,
        5 => sb.log_start = v,
        6 => sb.log_size = v,
        7 => sb.max_batch = v as u32,
        8 => sb.head = v,
        9 => sb.recovery_point = v,
        10 => sb.recovery_link = v as u32,
        11 => sb.checkpoint = v,
        12 => sb.durable_through = v,
        13 => sb.epoch = v,
        14 => sb.epoch_start = v,
        _ => sb.window = v,
    }
}

/// The superblock in `slot` as it reads now, else as the image had it, decoded even if its
/// geometry no longer checks (re-encoded fields are the point).
pub fn current_superblock(handle: &SimHandle, img: &Image, slot: u8) -> Option<Superblock> {
    let now = handle.peek(superblock_offset(slot), SUPERBLOCK_LEN);
    if let Ok(sb) = Superblock::decode(&now, slot) {
        return Some(sb);
    }
    let orig = snapshot_block(&img.regions, superblock_offset(slot));
    Superblock::decode(&orig, slot).ok()
}

pub fn apply(handle: &SimHandle, img: &Image, m: &Mutation) {
    match m {
        Mutation::Overwrite { at, bytes } => handle.poke_durable(*at, bytes),
        Mutation::FlipBit { at, bit } => handle.flip_bit(*at, *bit),
        Mutation::Zero { at, len } => handle.poke_durable(*at, &vec![0u8; *len as usize]),
        Mutation::CopyBlock { from, to } => {
            let b = handle.peek(from * BLOCK, BLOCK as usize);
            handle.poke_durable(to * BLOCK, &b);
        }
        Mutation::Stale { block, era } => {
            if !img.history.is_empty() {
                let s = &img.history[era % img.history.len()];
                handle.poke_durable(block * BLOCK, &snapshot_block(s, block * BLOCK));
            }
        }
        Mutation::SuperblockField {
            slot,
            field,
            value,
            relink,
        } => {
            let Some(mut sb) = current_superblock(handle, img, *slot) else {
                return;
            };
            set_field(&mut sb, *field, value);
            let other_slot = 1 - *slot;
            match relink {
                1 => {
                    if let Some(mut other) = current_superblock(handle, img, other_slot) {
                        if sb.sequence > other.sequence {
                            sb.parent = other.checksum();
                        } else {
                            other.parent = sb.checksum();
                            handle.poke_durable(superblock_offset(other_slot), &other.encode());
                        }
                    }
                }
                2 => handle.poke_durable(superblock_offset(other_slot), &[0u8; BLOCK as usize]),
                _ => {}
            }
            handle.poke_durable(superblock_offset(*slot), &sb.encode());
        }
    }
}
