//! # bourse-monitor: probes, Prometheus metrics and the live dashboard
//!
//! One [`Monitor`] per process holds what the other crates report into: a
//! [`metrics::Registry`] exported at `/metrics` (families and labels in [`names`]); sampled
//! stage probes t0..t7 ([`probe::ProbeHub`], per-thread [`probe::StageRecorder`]s, no lock or
//! allocation on the hot path); a core's counts ([`core_probe::CoreMonitor`]) and a replica's
//! ([`node::NodeMetrics`]); the cluster view and alerts ([`cluster::ClusterView`]); LTP's split
//! ([`ltp`]); the dashboard ([`server::DashboardServer`]). [`doorkeeper::Doorkeeper`] (the
//! venue's one admission policy on a listener), [`server::serve_admitted`] (every HTTP
//! listener's accept loop) and [`rate::TokenBucket`] are what every service's listener shares.
//!
//! The hot path never waits for the control plane. Design: ARCHITECTURE.md, `crates/monitor`.

#![forbid(unsafe_code)]

pub mod admin;
pub mod clock;
pub mod cluster;
pub mod core_probe;
pub mod dashboard;
pub mod delivery;
pub mod doorkeeper;
pub mod ltp;
pub mod metrics;
pub mod node;
pub mod probe;
pub mod rate;
pub mod server;

pub use cluster::{AlertThresholds, ClusterView, NodeStatus, Role};
pub use core_probe::CoreMonitor;
pub use ltp::{derive as derive_breakdown, Breakdown, GatewayStages, NodeStages};
pub use metrics::{Counter, Gauge, Histogram, Registry};
pub use node::{NodeMetrics, NodeSample, Progress};
pub use probe::{ltp_network_leg_ns, ProbeHub, Stage, StageRecorder, Trace};
pub use server::DashboardServer;

use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Instant;

/// Metric names, one place for all crates. Units are in the names; counters end in `_total`.
pub mod names {
    pub const COMMANDS_TOTAL: &str = "bourse_commands_total";
    pub const TRANSACTIONS_TOTAL: &str = "bourse_transactions_total";
    pub const ORDERS_TOTAL: &str = "bourse_orders_total";
    pub const TRADES_TOTAL: &str = "bourse_trades_total";
    pub const CANCELS_TOTAL: &str = "bourse_cancels_total";
    pub const REJECTS_TOTAL: &str = "bourse_rejects_total";
    pub const LIVE_ORDERS: &str = "bourse_live_orders";
    pub const CORE_APPLIED_COMMANDS: &str = "bourse_core_applied_commands";
    pub const STAGE_LATENCY_SECONDS: &str = "bourse_stage_latency_seconds";
    /// A replica node's own path, per batch, RPC or published entry (label `stage`: queue,
    /// propose, replicate, commit_apply, reply, md_published, ae_round_trip, follower_append).
    pub const NODE_STAGE_SECONDS: &str = "bourse_node_stage_seconds";
    pub const ORDER_LATENCY_SECONDS: &str = "bourse_order_latency_seconds";
    pub const NETWORK_LEG_SECONDS: &str = "bourse_network_leg_seconds";
    pub const PROBE_SAMPLE_EVERY: &str = "bourse_probe_sample_every";
    pub const QUEUE_DEPTH: &str = "bourse_queue_depth";
    pub const REPLICATION_LAG_ENTRIES: &str = "bourse_replication_lag_entries";
    pub const RAFT_COMMIT_INDEX: &str = "bourse_raft_commit_index";
    pub const RAFT_TERM: &str = "bourse_raft_term";
    pub const NODE_UP: &str = "bourse_node_up";
    pub const JOURNAL_BYTES_TOTAL: &str = "bourse_journal_bytes_total";
    pub const JOURNAL_RECORDS_TOTAL: &str = "bourse_journal_records_total";
    pub const JOURNAL_FSYNC_SECONDS: &str = "bourse_journal_fsync_seconds";
    pub const MD_PACKETS_TOTAL: &str = "bourse_marketdata_packets_total";
    pub const MD_BYTES_TOTAL: &str = "bourse_marketdata_bytes_total";
    pub const SESSIONS: &str = "bourse_sessions";
    pub const THROTTLE_REJECTS_TOTAL: &str = "bourse_throttle_rejects_total";
    /// A gateway's refused requests by `cause`; `cause="busy"` counts the overload refusals
    /// (a core's in-flight bound or queue, or the order table, was full).
    pub const GATEWAY_REJECTS_TOTAL: &str = "bourse_gateway_rejects_total";
    pub const ERRORS_TOTAL: &str = "bourse_errors_total";
    pub const ALERTS_FIRING: &str = "bourse_alerts_firing";
    pub const DASHBOARD_CLIENTS: &str = "bourse_dashboard_clients";
    pub const DASHBOARD_CLIENTS_DROPPED_TOTAL: &str = "bourse_dashboard_clients_dropped_total";
    /// Connections a listener refused or closed by the admission policy (labels `listener`,
    /// `reason`: full, address_full, displaced, address_share, timeout).
    pub const LISTENER_REFUSALS_TOTAL: &str = "bourse_listener_refusals_total";
    /// Connections open at a listener (label `listener`).
    pub const LISTENER_CONNECTIONS_OPEN: &str = "bourse_listener_connections_open";
    pub const BUILD_INFO: &str = "bourse_build_info";
    // A replica node's own figures (labelled `node`).
    pub const NODE_COMMANDS_APPLIED_TOTAL: &str = "bourse_node_commands_applied_total";
    pub const NODE_ENTRIES_APPLIED_TOTAL: &str = "bourse_node_entries_applied_total";
    pub const HASH_CHECKS_PASSED_TOTAL: &str = "bourse_hash_checks_passed_total";
    pub const RAFT_LAST_APPLIED_INDEX: &str = "bourse_raft_last_applied_index";
    pub const RAFT_LAST_LOG_INDEX: &str = "bourse_raft_last_log_index";
    pub const RAFT_SNAPSHOT_INDEX: &str = "bourse_raft_snapshot_index";
    pub const RAFT_IS_LEADER: &str = "bourse_raft_is_leader";
    pub const RAFT_LEADER_ID: &str = "bourse_raft_leader_id";
    pub const RAFT_PEER_LAG_ENTRIES: &str = "bourse_raft_peer_lag_entries";
    pub const DIVERGENCE_ALARM: &str = "bourse_divergence_alarm";
    pub const SNAPSHOTS_TOTAL: &str = "bourse_snapshots_total";
    pub const SNAPSHOT_BYTES_TOTAL: &str = "bourse_snapshot_bytes_total";
    pub const SNAPSHOT_SIZE_BYTES: &str = "bourse_snapshot_size_bytes";
    pub const SNAPSHOT_WRITE_SECONDS: &str = "bourse_snapshot_write_seconds";
    pub const SNAPSHOT_BUILD_SECONDS: &str = "bourse_snapshot_build_seconds";
    /// Connections a node refused before reading a frame (label `reason`: no_certificate,
    /// untrusted_certificate, not_tls, handshake_failed, handshake_timeout, busy).
    pub const NODE_CONNECTIONS_REFUSED_TOTAL: &str = "bourse_node_connections_refused_total";
    /// On a leader without a quorum (it refuses new commands): milliseconds since a quorum
    /// last acknowledged it; 0 while it has one or does not lead.
    pub const NODE_QUORUM_LOST_MS: &str = "bourse_node_quorum_lost_ms";
    /// Client commands a node refused because it led without a quorum.
    pub const NODE_NO_QUORUM_REFUSALS_TOTAL: &str = "bourse_node_no_quorum_refusals_total";
    /// Client commands a node refused as a just-elected leader that no quorum had
    /// acknowledged yet (openraft's leader lease); the clients retry them on that node.
    pub const NODE_UNCONFIRMED_REFUSALS_TOTAL: &str = "bourse_node_unconfirmed_refusals_total";
    // The admin API (`bourse_admin`).
    /// Admin requests answered, by `action` and `outcome`.
    pub const ADMIN_REQUESTS_TOTAL: &str = "bourse_admin_requests_total";
    /// Admin requests refused before they ran, by `reason` (unauthenticated, unauthorised).
    pub const ADMIN_AUTH_REFUSED_TOTAL: &str = "bourse_admin_auth_refused_total";
    /// Admin commands a core refused, by `reason` (the reject reason).
    pub const ADMIN_REJECTS_TOTAL: &str = "bourse_admin_rejects_total";
}

/// Monitoring settings; every field has a default, and a TOML file may set any of them.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MonitorConfig {
    /// Stage probes record 1 command in this many (1: all; 0: probes off).
    pub sample_every: u32,
    /// How often hot threads publish counts and hand over probe histograms.
    pub flush_interval_ms: u64,
    /// Dashboard frame period.
    pub tick_ms: u64,
    /// Frames kept for a dashboard that opens late (the charts' width).
    pub history_frames: usize,
    /// Event-stream clients served at once; more get 503.
    pub sse_clients_max: usize,
    /// Frames queued per event-stream client before the client is cut off as too slow.
    pub sse_queue_frames: usize,
    /// TCP connections served at once; a newcomer past it displaces the connection that has
    /// waited longest for its request, or is closed if every one is busy.
    pub connections_max: usize,
    /// Connections from one address waiting for their request at once; a newcomer past it
    /// displaces its own address's longest-waiting one.
    pub waiting_per_address_max: usize,
    /// A request whose headers take longer than this is dropped (slowloris).
    pub header_read_timeout_ms: u64,
    /// Socket send buffer for dashboard connections: bounds what a non-reading client holds.
    pub send_buffer_bytes: usize,
    /// The node's name in the dashboard title.
    pub node_name: String,
    /// How often a replica node polls its own and its peers' status for the cluster view.
    /// A poll reads positions and the newest hash checkpoint (no hashing on demand).
    pub status_poll_ms: u64,
    pub alerts: AlertThresholds,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        MonitorConfig {
            sample_every: 64,
            flush_interval_ms: 100,
            tick_ms: 1_000,
            history_frames: 300,
            sse_clients_max: 64,
            sse_queue_frames: 8,
            connections_max: 512,
            waiting_per_address_max: 64,
            header_read_timeout_ms: 5_000,
            send_buffer_bytes: 64 * 1024,
            node_name: "bourse".into(),
            status_poll_ms: 250,
            alerts: AlertThresholds::default(),
        }
    }
}

impl MonitorConfig {
    /// Parses a TOML config (the keys of [`MonitorConfig`], thresholds under `[alerts]`).
    pub fn from_toml(text: &str) -> Result<MonitorConfig, String> {
        let c: MonitorConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        c.validated()
    }

    /// Checks limits: every period and cap must be positive and bounded.
    pub fn validated(self) -> Result<MonitorConfig, String> {
        if !(1..=60_000).contains(&self.tick_ms) {
            return Err("tick_ms must be between 1 and 60000".into());
        }
        if !(1..=60_000).contains(&self.flush_interval_ms) {
            return Err("flush_interval_ms must be between 1 and 60000".into());
        }
        if !(1..=100_000).contains(&self.history_frames) {
            return Err("history_frames must be between 1 and 100000".into());
        }
        if !(1..=10_000).contains(&self.sse_clients_max) {
            return Err("sse_clients_max must be between 1 and 10000".into());
        }
        if !(1..=1_024).contains(&self.sse_queue_frames) {
            return Err("sse_queue_frames must be between 1 and 1024".into());
        }
        if !(1..=100_000).contains(&self.connections_max) {
            return Err("connections_max must be between 1 and 100000".into());
        }
        if !(10..=600_000).contains(&self.status_poll_ms) {
            return Err("status_poll_ms must be between 10 and 600000".into());
        }
        if self.header_read_timeout_ms == 0 {
            return Err("header_read_timeout_ms must be positive".into());
        }
        self.admission().validate("monitor")?;
        Ok(self)
    }

    /// The dashboard listener's admission limits: a connection proves itself with each
    /// request head, which must come within `header_read_timeout_ms`.
    pub fn admission(&self) -> bourse_admission::Limits {
        bourse_admission::Limits::new(
            self.connections_max,
            self.waiting_per_address_max,
            self.header_read_timeout_ms,
        )
    }
}

/// Everything one process reports into. Share it as `Arc<Monitor>`.
pub struct Monitor {
    config: MonitorConfig,
    registry: Registry,
    probes: ProbeHub,
    cluster: ClusterView,
    dashboard: dashboard::Dashboard,
    admin: admin::AdminFeed,
    delivery: delivery::DeliveryFeed,
    started: Instant,
    /// A process's own named figures for the dashboard (e.g. a node's snapshot build time).
    figures: std::sync::Mutex<Vec<(String, String)>>,
}

/// Named dashboard figures one process keeps at most.
pub const FIGURES_MAX: usize = 32;

/// Market data counters for one channel and feed (A or B).
#[derive(Clone, Debug)]
pub struct MdChannelMetrics {
    pub packets: Counter,
    pub bytes: Counter,
}

/// Journal counters of one node.
#[derive(Clone, Debug)]
pub struct JournalMetrics {
    pub bytes: Counter,
    pub records: Counter,
    pub fsync: Histogram,
}

/// Session figures of one protocol at an access server.
#[derive(Clone, Debug)]
pub struct SessionMetrics {
    pub active: Gauge,
    pub throttle_rejects: Counter,
}

impl Monitor {
    pub fn new(config: MonitorConfig) -> Arc<Monitor> {
        let registry = Registry::new();
        registry
            .gauge(
                names::BUILD_INFO,
                "Always 1; the labels say what is running.",
                &[("node", &config.node_name)],
            )
            .set(1);
        registry
            .gauge(
                names::PROBE_SAMPLE_EVERY,
                "Stage probes record one command in this many.",
                &[],
            )
            .set(config.sample_every as i64);
        Arc::new(Monitor {
            probes: ProbeHub::new(
                config.sample_every,
                config.flush_interval_ms.max(1) * 1_000_000,
            ),
            dashboard: dashboard::Dashboard::new(&config, &registry),
            registry,
            cluster: ClusterView::default(),
            admin: admin::AdminFeed::default(),
            delivery: delivery::DeliveryFeed::default(),
            started: Instant::now(),
            figures: std::sync::Mutex::new(Vec::new()),
            config,
        })
    }

    /// Sets a named figure the dashboard lists as text (at most [`FIGURES_MAX`] names; more
    /// are ignored). Control plane only: it takes a lock.
    pub fn set_figure(&self, name: &str, text: String) {
        let Ok(mut f) = self.figures.lock() else {
            return;
        };
        if let Some(slot) = f.iter_mut().find(|(n, _)| n == name) {
            slot.1 = text;
        } else if f.len() < FIGURES_MAX {
            f.push((name.to_string(), text));
        }
    }

    /// The named figures, in the order they were first set.
    pub fn figures(&self) -> Vec<(String, String)> {
        self.figures.lock().map(|f| f.clone()).unwrap_or_default()
    }

    pub fn config(&self) -> &MonitorConfig {
        &self.config
    }
    pub fn registry(&self) -> &Registry {
        &self.registry
    }
    pub fn probes(&self) -> &ProbeHub {
        &self.probes
    }
    pub fn cluster(&self) -> &ClusterView {
        &self.cluster
    }
    pub fn dashboard(&self) -> &dashboard::Dashboard {
        &self.dashboard
    }
    /// Where the admin API hands its audit entries for the dashboard.
    pub fn admin(&self) -> &admin::AdminFeed {
        &self.admin
    }
    /// Where a data-delivery node in this process plugs its counters in for the dashboard.
    pub fn delivery(&self) -> &delivery::DeliveryFeed {
        &self.delivery
    }
    pub fn uptime(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    /// A trading core thread's monitor; `core` names it in labels (e.g. "equities").
    pub fn core(&self, core: &str) -> CoreMonitor {
        CoreMonitor::new(self, core)
    }

    /// Depth of a named queue (ring between threads), set by whoever owns it.
    pub fn queue_depth(&self, queue: &str) -> Gauge {
        self.registry.gauge(
            names::QUEUE_DEPTH,
            "Entries waiting in a queue between threads.",
            &[("queue", queue)],
        )
    }

    /// Packets and bytes sent on a market data channel (e.g. "olr", "book20", "msr") and feed.
    pub fn marketdata_channel(&self, channel: &str, feed: &str) -> MdChannelMetrics {
        let l = [("channel", channel), ("feed", feed)];
        MdChannelMetrics {
            packets: self.registry.counter(
                names::MD_PACKETS_TOTAL,
                "Market data packets sent.",
                &l,
            ),
            bytes: self.registry.counter(
                names::MD_BYTES_TOTAL,
                "Market data bytes sent (UDP payload).",
                &l,
            ),
        }
    }

    pub fn journal(&self, node: &str) -> JournalMetrics {
        let l = [("node", node)];
        JournalMetrics {
            bytes: self.registry.counter(
                names::JOURNAL_BYTES_TOTAL,
                "Bytes appended to the journal.",
                &l,
            ),
            records: self.registry.counter(
                names::JOURNAL_RECORDS_TOTAL,
                "Records appended to the journal.",
                &l,
            ),
            fsync: self.registry.histogram(
                names::JOURNAL_FSYNC_SECONDS,
                "Time one journal fsync took.",
                &l,
            ),
        }
    }

    /// Sessions of one protocol ("fix", "sbe") at an access server.
    pub fn sessions(&self, protocol: &str) -> SessionMetrics {
        let l = [("protocol", protocol)];
        SessionMetrics {
            active: self
                .registry
                .gauge(names::SESSIONS, "Sessions logged on.", &l),
            throttle_rejects: self.registry.counter(
                names::THROTTLE_REJECTS_TOTAL,
                "Messages rejected by a per-client throttle.",
                &l,
            ),
        }
    }

    /// Errors of one kind in one component (e.g. ("gateway", "decode")).
    pub fn errors(&self, component: &str, kind: &str) -> Counter {
        self.registry.counter(
            names::ERRORS_TOTAL,
            "Errors by component and kind.",
            &[("component", component), ("kind", kind)],
        )
    }

    /// The Prometheus text exposition of everything.
    pub fn render_metrics(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        self.registry.render(&mut out);
        dashboard::render_probe_histograms(self, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_reads_from_toml_and_rejects_bad_limits() {
        let c = MonitorConfig::from_toml("sample_every = 4\n[alerts]\np99_us_max = 900\n").unwrap();
        assert_eq!(c.sample_every, 4);
        assert_eq!(c.alerts.p99_us_max, 900);
        assert_eq!(c.tick_ms, 1_000);
        assert!(MonitorConfig::from_toml("tick_ms = 0").is_err());
        assert!(MonitorConfig::from_toml("no_such_key = 1").is_err());
        assert!(MonitorConfig::from_toml("[[[").is_err());
    }

    #[test]
    fn a_misspelled_key_is_refused_naming_its_line_and_field() {
        let e = MonitorConfig::from_toml("sample_every = 4\ntick_mss = 10\n").unwrap_err();
        assert!(
            e.contains("line 2") && e.contains("unknown field `tick_mss`"),
            "{e}"
        );
        let e =
            MonitorConfig::from_toml("[alerts]\np99_us_max = 900\nnode_down = 5\n").unwrap_err();
        assert!(
            e.contains("line 3") && e.contains("unknown field `node_down`"),
            "{e}"
        );
    }
}
