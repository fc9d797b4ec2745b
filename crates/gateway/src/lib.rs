//! # bourse-gateway: the access servers
//!
//! FIX 4.4 and binary SBE sessions in front of the trading cores, on one mio event loop. Start
//! at [`server::spawn_cores`] (the loop: sockets, sessions, delivery of reports) and
//! [`router::Router`] (protocol-neutral routing by instrument, order identity, the reports each
//! session is owed). [`fix_front`] and [`binary_front`] parse each protocol into
//! [`router::Request`]s and render reports; [`GatewayConfig`] holds sessions, cores,
//! instruments, accounts and limits; [`recovery`] keeps orders and stream positions across an
//! orderly restart. Cores sit behind [`CoreLink`] (`bourse_core::link`): the gateway knows no
//! engine and no cluster.
//!
//! Design, limits and invariants: ARCHITECTURE.md, `crates/gateway`.

pub mod binary_front;
pub mod bootstrap;
pub mod config;
pub mod convert;
pub mod disconnect;
pub mod fix_front;
pub mod metrics;
pub mod password_store;
pub mod prelogon;
pub mod recovery;
pub mod reports;
pub mod router;
pub mod server;
pub mod tls;

pub use bourse_core::link::{CoreLink, CoreOutput, RequestKey, SubmitError};
pub use config::GatewayConfig;
pub use server::{spawn, spawn_cores, DisconnectReason, GatewayHandle, GatewayStats};
