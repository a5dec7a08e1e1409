//! File backend: placeholder, being written.
