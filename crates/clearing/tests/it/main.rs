//! The integration tests of `bourse-clearing`, one binary (the dependency graph
//! linked once, not once per file); each module was a test binary of its own under `tests/`.
//! To run one module:
//! `cargo test -p bourse-clearing --test it MODULE::`.

mod cluster_run;
mod pure;
mod run_access;
mod service;
