//! The Kafka protocol frontend. Nothing here yet: the server is the subject of a later issue, and
//! this crate exposes nothing until it works.
