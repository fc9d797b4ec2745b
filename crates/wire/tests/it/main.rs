//! The integration tests of `bourse-wire`, one binary (the dependency graph
//! linked once, not once per file); each module was a test binary of its own under `tests/`.
//! To run one module:
//! `cargo test -p bourse-wire --test it MODULE::`.

mod fuzz;
mod market_data_roundtrip;
mod order_entry_roundtrip;
