//! The integration tests of `bourse-cli`, one binary (the dependency graph
//! linked once, not once per file); each module was a test binary of its own under `tests/`.
//! To run one module:
//! `cargo test -p bourse-cli --test it MODULE::`.

mod admin_journal;
mod admin_serve;
mod auth_cli;
mod clearing_cli;
mod cluster_kill;
mod delivery_cli;
mod demo_full;
mod demo_operator;
mod engine_run_cli;
mod failover_paused;
mod fix_orders;
mod gateway_cli;
mod gateway_failover;
mod gateway_quickfixj;
mod loadtest_smoke;
mod monitor_bad_input;
mod monitor_real_peers;
mod monitor_support;
mod netns_faults;
mod replica_check;
mod soak_cli;
mod t2t_cli;
mod t2t_gateway;
