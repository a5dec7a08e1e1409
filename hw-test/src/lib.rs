//! Power-cut validation rigs. Nothing here yet: the rig is the subject of a later issue, and this
//! crate exposes nothing until it works.
