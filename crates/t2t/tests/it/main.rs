//! The integration tests of `bourse-t2t`, one binary (the dependency graph
//! linked once, not once per file); each module was a test binary of its own under `tests/`.
//! To run one module:
//! `cargo test -p bourse-t2t --test it MODULE::`.
//! (`tests/alloc.rs`: a binary of its own for its global allocator.)

mod drive_loopback;
mod itch_against_consumer;
mod reactor_against_subscriber;
