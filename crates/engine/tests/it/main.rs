//! The integration tests of `bourse-engine`, one binary (the dependency graph
//! linked once, not once per file); each module was a test binary of its own under `tests/`.
//! To run one module:
//! `cargo test -p bourse-engine --test it MODULE::`.

mod auction;
mod determinism;
mod differential;
mod operations;
mod prop_invariants;
mod reference;
mod rules;
mod scenarios;
mod state_digest;
