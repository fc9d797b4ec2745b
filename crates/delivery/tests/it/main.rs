//! The integration tests of `bourse-delivery`, one binary (the dependency graph
//! linked once, not once per file); each module was a test binary of its own under `tests/`.
//! To run one module:
//! `cargo test -p bourse-delivery --test it MODULE::`.

mod common;
mod delivery;
mod entitlements;
