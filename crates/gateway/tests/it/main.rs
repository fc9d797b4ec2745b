//! The integration tests of `bourse-gateway`, one binary (the dependency graph
//! linked once, not once per file); each module was a test binary of its own under `tests/`.
//! To run one module:
//! `cargo test -p bourse-gateway --test it MODULE::`.

mod admission;
mod auction_tif;
mod bad_input;
mod binary_orders;
mod client_tls;
mod common;
mod credentials;
mod duty_cycle;
mod fix_orders;
mod fix_poss_dup;
mod margin_call;
mod multi_core;
mod password_change;
mod status_and_cores;
mod tls;
