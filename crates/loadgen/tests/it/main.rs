//! The integration tests of `bourse-loadgen`, one binary (the dependency graph
//! linked once, not once per file); each module was a test binary of its own under `tests/`.
//! To run one module:
//! `cargo test -p bourse-loadgen --test it MODULE::`.

mod open_loop;
