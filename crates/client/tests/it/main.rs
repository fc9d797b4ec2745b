//! The integration tests of `bourse-client`, one binary (the dependency graph
//! linked once, not once per file); each module was a test binary of its own under `tests/`.
//! To run one module:
//! `cargo test -p bourse-client --test it MODULE::`.

mod cluster;
mod gateway_restart;
