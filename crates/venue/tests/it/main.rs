//! The integration tests of `bourse-venue`, one binary (the dependency graph
//! linked once, not once per file); each module was a test binary of its own under `tests/`.
//! To run one module:
//! `cargo test -p bourse-venue --test it MODULE::`.
//! (`tests/steady_memory.rs`: a binary of its own for its global allocator.)

mod accounts_under_load;
mod admin;
mod clearing_under_load;
mod instrument_added;
