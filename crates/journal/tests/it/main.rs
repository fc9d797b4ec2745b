//! The integration tests of `bourse-journal`, one binary (the dependency graph
//! linked once, not once per file); each module was a test binary of its own under `tests/`.
//! To run one module:
//! `cargo test -p bourse-journal --test it MODULE::`.

mod common;
mod faults;
mod model;
mod operations;
mod read_ahead;
mod recovery;
mod snapshots;
