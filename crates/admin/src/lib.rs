//! # bourse-admin: market operations on a running venue
//!
//! An operator's HTTP/JSON API beside the trading protocols, and `bourse admin` on top of it.
//! Every action is a command through the same sequenced, replicated path as an order, answered
//! after it committed, under a request id so that a retried request applies once.
//!
//! - [`Action`] and [`NewAccount`] (`action`): what may be asked, checked field by field.
//! - [`AdminVenue`] (`venue`): the seam to the venue: submit commands to one market's core
//!   and wait for their events; query a core's state. `bourse_venue` implements it.
//! - [`AdminService`] (`service`): plans each action into commands per core, runs it once per
//!   request id, summarises what the cores said, audits and counts it.
//! - [`AuditLog`] (`audit`): who, when, what, outcome, as JSON lines; read back at start.
//! - [`AdminServer`] (`server`): the listener (plain HTTP on the loopback, HTTPS anywhere),
//!   operator authentication against a `bourse_auth::CredentialStore` (HTTP Basic), the bulk
//!   NDJSON stream.
//! - [`AdminClient`] (`client`): a small blocking HTTP/1.1 client (and HTTPS with a CA file)
//!   for the CLI and tests.
//! - [`schedule`]: the trading day's calendar, sessions and pauses, and the driver that
//!   issues phase changes and the end of day through the same path at their times.

pub mod action;
pub mod audit;
pub mod client;
pub mod schedule;
pub mod server;
pub mod service;
pub mod venue;

pub use action::{Action, NewAccount};
pub use audit::{AuditLog, AuditRecord};
pub use client::AdminClient;
pub use server::{AdminServer, AdminServerConfig, ROLE_OPERATOR, ROLE_VIEWER};
pub use service::{AdminService, Answer};
pub use venue::{AdminVenue, Asker, BoxFuture, Query, QueryAnswer};
