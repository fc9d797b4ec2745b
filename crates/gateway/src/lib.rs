//! # bourse-gateway: the access servers
//!
//! Clients reach the trading cores through the gateway: FIX 4.4 sessions (QuickFIX-compatible,
//! driven by `bourse_fix::Session`) and binary SBE sessions (TWIME-like, see
//! `docs/protocol-binary-order-entry.md`). The gateway maps each session to its firm and the
//! accounts it may trade (from TOML config), throttles it, turns its requests into core
//! commands and the core's events into execution reports, and copies every execution report
//! of a firm to the firm's drop-copy sessions.
//!
//! Principal types:
//!
//! - [`CoreLink`]: *the core behind me*, the one seam between the gateway and whatever runs
//!   the trading core. It has three methods: [`CoreLink::submit`] hands over a command with
//!   an idempotency key ([`RequestKey`]: session number + per-session request sequence) and
//!   never blocks (a full queue is answered "system busy"); [`CoreLink::try_recv`] returns
//!   the core's outputs ([`CoreOutput`]): every event tagged with the key of the command that
//!   caused it, then `Done`; [`CoreLink::set_notify`] registers the wake-up the link calls
//!   when output is ready. Unsolicited events (the resting side of a trade, orders removed by
//!   someone else's mass cancel) arrive under the causing command's key and the gateway routes
//!   them by order id to the owning session. A core must apply a key at most once, so a
//!   gateway may resubmit after a failover. The trait lives in `bourse_core::link` (and is
//!   re-exported here); the gateway knows no implementation: the binary that starts it
//!   passes `bourse_engine::in_process::InProcessCore` (an engine on its own thread) or
//!   `bourse_cluster::link::ClusterLink` (a `bourse node` replica group), so the gateway
//!   depends on neither the engine nor the cluster.
//! - [`router::Router`]: protocol-neutral order identity and routing over one link per core.
//!   A front end hands it a [`router::Request`] (new, cancel, replace, mass cancel, status,
//!   mass status) with [`router::Router::handle`]; each command goes to the core that owns its
//!   instrument (a cancel or replace to its order's core, a mass cancel without instrument to
//!   every core, answered by one aggregated report); client order ids per session map to
//!   gateway-wide core ids and back, order ownership (events routed by order id, unique
//!   across cores), fills, average prices, order status answers (FIX H and AF), and the
//!   [`reports::Report`]s each session is owed, taken with [`router::Router::take_outbox`].
//! - [`fix_front`] and [`binary_front`]: parse each protocol's requests into
//!   [`router::Request`]s ([`fix_front::FixApp`], [`binary_front::parse_request`]) and render
//!   reports; [`fix_front::dictionary`] is the gateway's own compact FIX 4.4 dictionary.
//! - [`server::spawn_cores`] (and [`server::spawn`] for one core): the event loop (mio, one
//!   thread) that owns all sockets and sessions (binary sessions in `server::binary_session`),
//!   after an idempotent bootstrap of the cores ([`bootstrap::bootstrap`]);
//!   [`server::GatewayHandle`] and [`server::GatewayStats`] to watch and stop it. With
//!   `monitor_listen` it serves Prometheus `/metrics` and the dashboard (`bourse_monitor`):
//!   counters kept as plain integers in the loop ([`metrics::LoopCounters`],
//!   [`router::RouterCounters`]) and published on its timer, and sampled stage probes t0
//!   (socket read), t1, t2, t5, t6, t7 (written).
//! - [`GatewayConfig`]: sessions, cores (`[[cores]]`: the instruments each owns, in process or
//!   the nodes of its replica group), instruments, accounts and limits.
//! - FIX sessions keep their state in `bourse_fix::FileStore` (sequence numbers overwritten in
//!   place, sent messages appended), cheap enough for the order path.
//!
//! Limits: connections (`connections_max`), FIX message size, unsent output per connection
//! (a client that does not read is closed as a slow consumer), queue depth to the core,
//! messages kept for resend/retransmission, messages queued for a logged-off FIX session,
//! live orders tracked; each has a ceiling in [`config`].
//!
//! - [`recovery`]: what a restart keeps in front of replicated cores: the order state saved at
//!   stop with each core's stream position (loaded at start by links that resume there), and
//!   the link epoch that gives every run fresh idempotency keys at the cores.
//!
//! Not yet: after a crash (no orderly stop) the order table is lost (nothing is doubled); the
//! binary protocol has no status request.

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
