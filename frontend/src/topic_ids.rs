//! Kafka topic ids (Metadata v10+, Fetch v13+, CreateTopics v7+, DeleteTopics v6+). A topic's
//! id is derived from its log name, which already is durable and names one incarnation of the
//! topic (`name`, then `name#k` after k deletions; the deletion count is replayed and
//! re-recorded with every snapshot): so the id survives restarts and ring wraps with nothing
//! new to record, and a topic deleted and created again gets a new id, as Kafka's clients
//! expect (they drop cached state when a name's id changes).
//!
//! The id is a name-based UUID of RFC 9562's version 8 ("custom", whose worked example is this
//! very construction): the first 16 bytes of SHA-256 over a fixed prefix and the log name, with
//! the version and variant bits set. It is never the nil id (Kafka's "no id") nor Kafka's
//! reserved metadata topic id (…0001), as both have other version bits.

use sha2::{Digest, Sha256};
use uuid::Uuid;

/// Keeps these ids apart from any other SHA-256 of a topic name.
const DOMAIN: &[u8] = b"nvmq topic id\0";

/// The id of the topic incarnation stored under `log_name`.
pub fn of(log_name: &str) -> Uuid {
    let digest = Sha256::new()
        .chain_update(DOMAIN)
        .chain_update(log_name.as_bytes())
        .finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    b[6] = (b[6] & 0x0f) | 0x80; // version 8
    b[8] = (b[8] & 0x3f) | 0x80; // the RFC's variant
    Uuid::from_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_distinct_and_never_kafkas_reserved_ones() {
        let a = of("orders");
        assert_eq!(a, of("orders"), "the same log name, the same id");
        assert_ne!(a, of("orders#1"), "a re-created topic gets a new id");
        assert_ne!(a, of("Orders"));
        assert_eq!(a.get_version_num(), 8);
        assert_eq!(a.get_variant(), uuid::Variant::RFC4122);
        for n in ["", "a", "orders#1", "x".repeat(249).as_str()] {
            let id = of(n);
            assert!(!id.is_nil());
            assert_ne!(id, Uuid::from_u128(1));
        }
        // Pinned: the id of a name must never change between nvmq versions, or every client's
        // cached topic ids would go stale on upgrade.
        assert_eq!(of("orders").to_string(), PINNED_ORDERS);
    }

    // Computed independently (Python: hashlib.sha256, then the same two bit fixes).
    const PINNED_ORDERS: &str = "d81d3e05-5678-8487-99d3-cd0264285fbf";
}
