//! The integration tests of `bourse-cluster`, one binary (the dependency graph
//! linked once, not once per file); each module was a test binary of its own under `tests/`.
//! To run one module:
//! `cargo test -p bourse-cluster --test it MODULE::`.
//! (`tests/alloc.rs`: a binary of its own for its global allocator.)

mod append_stream;
mod common;
mod frames;
mod link;
mod marketdata;
mod node_faults;
mod pre_vote;
mod simulation;
mod storage;
mod stream;
mod three_nodes;
mod tls;
