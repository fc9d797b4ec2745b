//! The integration tests of `bourse-itch`, one binary (the dependency graph
//! linked once, not once per file); each module was a test binary of its own under `tests/`.
//! To run one module:
//! `cargo test -p bourse-itch --test it MODULE::`.

mod common;
mod hidden_trades;
mod projection;
mod retransmission;
mod service;
mod tshark;
