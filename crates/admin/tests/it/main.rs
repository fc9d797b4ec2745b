//! The integration tests of `bourse-admin`, one binary (the dependency graph
//! linked once, not once per file); each module was a test binary of its own under `tests/`.
//! To run one module:
//! `cargo test -p bourse-admin --test it MODULE::`.

mod admin_tls;
mod bulk_early_answers;
mod common;
mod hostile_clients;
mod margin_call;
mod schedule_driver;
