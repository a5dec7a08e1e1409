//! The crash simulator's machinery (storage.md §6–7), for the campaigns in `crash_sim.rs`:
//!
//! - `device`: the sim device as recovery and the writer get it (power cut at the n-th
//!   submission, batch writes misdirected on cue) and the stepped writer on the virtual clock;
//! - `world`: what the test knows about the log, and the checks of §7 against it;
//! - `damage`: misdirects and latent read errors, and which records each one destroys;
//! - `retention`: how far the head may move;
//! - `run`: one seed's cycles of recovery, checks, load and cut.

mod damage;
mod device;
mod retention;
mod run;
mod world;

pub use run::{run, Knobs, Summary};
