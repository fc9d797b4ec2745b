//! # bourse-admin: market operations on a running venue
//!
//! An operator's HTTP/JSON API; every action is a command through the sequenced, replicated
//! path, answered after commit, applied once per request id. Start at [`AdminService`] (plans an
//! [`Action`] into commands per core, runs it once, audits it in the [`AuditLog`]) and
//! [`AdminVenue`], its seam to the venue (`bourse_venue` implements it). [`AdminServer`] is the
//! listener, [`AdminClient`] the CLI's client, and [`schedule`] the trading day's calendar and
//! the driver of its phase changes.
//!
//! Design: ARCHITECTURE.md, `crates/admin`.

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
