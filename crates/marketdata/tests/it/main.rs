//! The integration tests of `bourse-marketdata`, one binary (the dependency graph
//! linked once, not once per file); each module was a test binary of its own under `tests/`.
//! To run one module:
//! `cargo test -p bourse-marketdata --test it MODULE::`.
//! (`tests/alloc.rs`: a binary of its own for its global allocator.)

mod books;
mod common;
mod document;
mod feeds;
mod udp;
