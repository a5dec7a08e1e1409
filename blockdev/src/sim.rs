//! Sim backend: placeholder, being written.
