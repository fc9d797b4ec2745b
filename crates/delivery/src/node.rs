//! [`DeliveryNode`]: a store fed by the committed streams of its cores, persisted to its state
//! directory, and served over HTTP (`server`).
//!
//! One feed task per core reads the core's committed stream through a remote
//! `StreamConsumer` (it moves to another node of the core when one fails, from the same log
//! index) and applies each entry under the store's write lock; readers take the read lock
//! only to copy out at most one answer's records, so neither a slow nor a stalled client
//! holds back the writer. Every `persist_interval_ms` (and at stop) the whole store is written
//! to `state_dir/delivery.state` (temporary file, then rename); at start the node loads it and
//! resumes each core's stream at the index the file stops at. Entries apply
//! deterministically, so records rebuilt after a restart sit at the same positions as
//! before, and every cursor a client holds stays valid.
//!
//! A read replica (`follow`) has no feeds of its own: one task polls its primary's binary
//! front, unfiltered, and applies each answer at the primary's positions (which are the
//! cores'), so a cursor holds on the primary and on every replica. It keeps no secondary
//! indexes unless asked, refuses filtered polls, and refuses every poll until it has read
//! its primary's whole picture once.

use crate::access::{AccessConfig, Gate};
use crate::cursor::Cursor;
use crate::store::{Store, StoreConfig};
use bourse_cluster::consumer::StreamConsumer;
use bourse_cluster::StreamError;
use bourse_monitor::doorkeeper::Doorkeeper;
use bourse_monitor::metrics::{Counter, Gauge, Histogram, Registry};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::{watch, Semaphore};

/// One core the node follows: its id (as cursors name it) and its replica group's nodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoreSource {
    pub id: u32,
    pub nodes: Vec<SocketAddr>,
    /// Mutual TLS to the core's nodes (`tls = { ca_path, cert_path, key_path }`); without
    /// it, plain TCP, which only loopback node addresses allow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<bourse_cluster::TlsFiles>,
}

/// Every explicit limit of a delivery node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Rows in one answer at most (a larger `limit` is refused).
    pub rows_per_answer_max: usize,
    /// Rows in one answer when the client names no `limit`.
    pub rows_per_answer_default: usize,
    /// How long a poll waits for `min_rows` when the client names no `wait_us`.
    pub wait_us_default: u64,
    /// The longest wait a client may ask for.
    pub wait_us_max: u64,
    /// Polls being answered at once (each holds no lock while it waits); more are refused
    /// with 503 and `Retry-After`.
    pub polls_in_flight_max: usize,
    /// Open connections per front (HTTP, binary); a newcomer past it displaces the connection
    /// that has waited longest for its next request, or is closed if every one is busy.
    pub connections_max: usize,
    /// Open connections per front from any one peer address, so that one client cannot take
    /// every slot; a newcomer past it displaces its address's longest-waiting connection, or
    /// is closed if every one is busy.
    pub connections_per_address_max: usize,
    /// Connections per front from one address waiting for their request at once; a newcomer
    /// past it displaces its address's longest-waiting one.
    pub waiting_per_address_max: usize,
    /// Records kept per core before the oldest final ones are evicted.
    pub records_per_core_max: usize,
    /// Polls one connection may make per second (in bursts of up to that many); more are
    /// refused (HTTP 429 `rate_limited`, binary `Busy`), so that a client polling in a
    /// tight loop cannot take the store's read lock from everyone else.
    pub polls_per_second_per_connection_max: u32,
    /// A request head (HTTP) or a whole request (binary) must arrive within this time.
    pub header_read_timeout_ms: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            rows_per_answer_max: 10_000,
            rows_per_answer_default: 1_000,
            wait_us_default: 500,
            wait_us_max: 10_000_000,
            polls_in_flight_max: 16_384,
            connections_max: 16_384,
            connections_per_address_max: 4_096,
            waiting_per_address_max: 4_096,
            records_per_core_max: 2_000_000,
            polls_per_second_per_connection_max: 20_000,
            header_read_timeout_ms: 10_000,
        }
    }
}

/// What a delivery node is (the `bourse delivery serve` TOML file has this shape).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveryConfig {
    /// The deployment's name. Cursors carry the store's identity: the name's tag and 48
    /// random bits drawn when the store starts empty, kept in the state file; a cursor of
    /// another deployment, or of an earlier store of this one, is refused as foreign.
    pub name: String,
    /// The HTTP/JSON API's address.
    pub listen: SocketAddr,
    /// The binary (SBE over TCP) API's address; `None` serves HTTP only.
    #[serde(default)]
    pub binary_listen: Option<SocketAddr>,
    /// Where the store is persisted; `None` keeps it in memory only (it then rebuilds from
    /// the cores' streams from log index 0 after a restart).
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    #[serde(default = "persist_interval_ms_default")]
    pub persist_interval_ms: u64,
    /// Worker threads of the node's runtime (the feeds, both fronts, the persister): more
    /// answer more readers at once on a machine with the cores for them.
    #[serde(default = "threads_default")]
    pub threads: usize,
    /// The cores read directly (a primary); empty on a read replica.
    #[serde(default)]
    pub cores: Vec<CoreSource>,
    /// Makes this node a read replica of another delivery node instead.
    #[serde(default)]
    pub follow: Option<Follow>,
    /// Keeps the records evicted from memory on disk under `state_dir/cold`, so that
    /// cursors from the last minutes or the day are still answered (`[cold]`; see
    /// [`crate::cold`]). Needs `state_dir`; a read replica keeps none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold: Option<crate::cold::ColdConfig>,
    #[serde(default)]
    pub limits: Limits,
    /// Who may read what (`[access]`: readers' credentials, TLS; see [`crate::access`]).
    #[serde(default)]
    pub access: AccessConfig,
}

/// What a read replica follows: its primary's binary front and the cores it serves (as the
/// primary lists them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Follow {
    /// The primary's binary (SBE over TCP) address.
    pub primary: SocketAddr,
    /// The ids of the primary's cores, in the primary's order.
    pub cores: Vec<u32>,
    /// Keep the firm, account and instrument indexes, so that this replica serves filtered
    /// polls too (off by default: replicas serve unfiltered clients, seed 003).
    #[serde(default)]
    pub secondary_indexes: bool,
    /// The replica's credentials at its primary (a `viewer` or `operator` there: it reads
    /// every firm's records and applies its own `[access]` to its clients).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub login: Option<FollowLogin>,
    /// TLS to the primary's binary front (required when the primary is off the loopback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<FollowTls>,
}

/// A read replica's credentials at its primary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FollowLogin {
    pub name: String,
    pub password: String,
}

/// How a read replica trusts its primary's certificate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FollowTls {
    /// The authorities (PEM) that signed the primary's certificate.
    pub ca_path: PathBuf,
    /// The name the certificate carries; the primary's IP address when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
}

impl Follow {
    /// What the replica's client brings to its primary.
    pub fn client_access(&self) -> Result<bourse_client::delivery::Access, String> {
        let tls = match &self.tls {
            Some(t) => {
                let name = t
                    .server_name
                    .clone()
                    .unwrap_or_else(|| self.primary.ip().to_string());
                Some(bourse_client::TlsClient::from_ca_file(&t.ca_path, &name)?)
            }
            None => None,
        };
        Ok(bourse_client::delivery::Access {
            tls,
            credentials: self
                .login
                .as_ref()
                .map(|l| (l.name.clone(), l.password.clone())),
        })
    }
}

/// What a node is: fed by cores, or a read replica of another node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Primary,
    Replica { secondary_indexes: bool },
}

impl Role {
    pub fn serves_filters(self) -> bool {
        match self {
            Role::Primary => true,
            Role::Replica { secondary_indexes } => secondary_indexes,
        }
    }
}

/// The most worker threads a node may ask for.
pub const THREADS_MAX: usize = 64;

fn threads_default() -> usize {
    2
}

fn persist_interval_ms_default() -> u64 {
    1_000
}

impl DeliveryConfig {
    /// Reads a TOML file of this shape (unknown keys are refused) and validates it.
    pub fn load(path: &std::path::Path) -> Result<DeliveryConfig, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let config: DeliveryConfig =
            toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), String> {
        if let Some(f) = &self.follow {
            return self.validate_replica(f);
        }
        if self.cores.is_empty() {
            return Err("a delivery node needs at least one core (or `follow` a primary)".into());
        }
        if self.cores.len() > crate::cursor::CORES_MAX {
            return Err(format!("at most {} cores", crate::cursor::CORES_MAX));
        }
        for (i, c) in self.cores.iter().enumerate() {
            if c.nodes.is_empty() {
                return Err(format!("core {} lists no node", c.id));
            }
            // Plain TCP never leaves the host.
            if let (None, Some(a)) = (&c.tls, c.nodes.iter().find(|a| !a.ip().is_loopback())) {
                return Err(format!(
                    "core {}: node {a} is not on the loopback, so reading it needs \
                     tls = {{ ca_path, cert_path, key_path }} (docs/deploy.md)",
                    c.id
                ));
            }
            if self.cores[..i].iter().any(|d| d.id == c.id) {
                return Err(format!("core {} is listed twice", c.id));
            }
        }
        if let Some(cold) = &self.cold {
            if self.state_dir.is_none() {
                return Err("[cold] keeps its files under `state_dir`: set `state_dir`".into());
            }
            cold.validate()?;
        }
        self.validate_access()?;
        self.validate_limits()
    }

    fn validate_access(&self) -> Result<(), String> {
        let mut listeners = vec![("listen", self.listen)];
        if let Some(b) = self.binary_listen {
            listeners.push(("binary_listen", b));
        }
        self.access.validate(&listeners)
    }

    fn validate_replica(&self, f: &Follow) -> Result<(), String> {
        if !self.cores.is_empty() {
            return Err("a read replica (`follow`) reads its primary, not cores: \
                 list the core ids in `follow.cores` and no `[[cores]]`"
                .into());
        }
        if self.state_dir.is_some() {
            return Err(
                "a read replica keeps no state file (it re-reads its primary at \
                 start): remove `state_dir`"
                    .into(),
            );
        }
        if self.cold.is_some() {
            return Err(
                "a read replica keeps no cold data (its primary serves old cursors): \
                 remove `[cold]`"
                    .into(),
            );
        }
        if f.cores.is_empty() || f.cores.len() > crate::cursor::CORES_MAX {
            return Err(format!(
                "follow.cores must list 1..={} core ids",
                crate::cursor::CORES_MAX
            ));
        }
        if (1..f.cores.len()).any(|i| f.cores[..i].contains(&f.cores[i])) {
            return Err("follow.cores lists a core twice".into());
        }
        if !f.primary.ip().is_loopback() && f.tls.is_none() {
            return Err(format!(
                "follow.primary {} is not on the loopback, and its binary front speaks TLS \
                 only there: set follow.tls = {{ ca_path }} (and follow.login)",
                f.primary
            ));
        }
        self.validate_access()?;
        self.validate_limits()
    }

    fn validate_limits(&self) -> Result<(), String> {
        if !(1..=THREADS_MAX).contains(&self.threads) {
            return Err(format!("threads must be 1..={THREADS_MAX}"));
        }
        let l = &self.limits;
        if l.rows_per_answer_default == 0 || l.rows_per_answer_default > l.rows_per_answer_max {
            return Err("limits: rows_per_answer_default must be 1..=rows_per_answer_max".into());
        }
        if l.wait_us_default > l.wait_us_max {
            return Err("limits: wait_us_default must not exceed wait_us_max".into());
        }
        if l.polls_per_second_per_connection_max == 0 {
            return Err("limits: polls_per_second_per_connection_max must be positive".into());
        }
        if l.connections_max == 0
            || l.connections_per_address_max == 0
            || l.connections_per_address_max > l.connections_max
        {
            return Err("limits: connections_max must be positive and \
                 connections_per_address_max 1..=connections_max"
                .into());
        }
        l.admission().validate("limits")
    }

    fn store_config(&self) -> StoreConfig {
        let (cores, secondary_indexes) = match &self.follow {
            Some(f) => (f.cores.clone(), f.secondary_indexes),
            None => (self.cores.iter().map(|c| c.id).collect(), true),
        };
        StoreConfig {
            deployment: self.name.clone(),
            cores,
            records_per_core_max: self.limits.records_per_core_max,
            secondary_indexes,
        }
    }

    pub fn role(&self) -> Role {
        match &self.follow {
            Some(f) => Role::Replica {
                secondary_indexes: f.secondary_indexes,
            },
            None => Role::Primary,
        }
    }

    fn state_file(&self) -> Option<PathBuf> {
        self.state_dir.as_ref().map(|d| d.join("delivery.state"))
    }
}

/// The node's figures, the seed's own (writes, readers, empty answers, records per answer,
/// lag, per-stage timings), kept in a registry exported at `GET /metrics` (Prometheus text)
/// and read by `/v1/status`.
pub struct ApiCounters {
    pub registry: Registry,
    /// Polls received, over both fronts (refused ones included).
    pub polls: Counter,
    /// Polls answered with no record.
    pub polls_empty: Counter,
    /// Records sent in answers.
    pub rows_sent: Counter,
    pub polls_refused_busy: Counter,
    /// Polls refused because their connection asked more often than
    /// `polls_per_second_per_connection_max`.
    pub polls_refused_rate: Counter,
    pub polls_bad_request: Counter,
    /// Records written into the store (new, or replacing an order's previous state).
    pub records_written: Counter,
    /// Committed entries applied.
    pub entries_applied: Counter,
    /// Open connections per front: the readers (the fronts' doorkeepers keep them).
    pub connections_http: Gauge,
    pub connections_binary: Gauge,
    /// Per record sent: the answer's time less the record's own time (the core's time of
    /// the command that changed the order), which is how late the reader learns of it.
    pub lag: Histogram,
    /// Per poll: time selecting under the read lock, and from arrival to answer.
    pub select: Histogram,
    pub answer: Histogram,
    /// Refusals by reason (`RefusalKind::ALL`'s order), both fronts, logons included.
    pub refusals: Vec<Counter>,
}

impl ApiCounters {
    pub fn new() -> ApiCounters {
        let r = Registry::new();
        let polls = |result: &str| {
            r.counter(
                "bourse_delivery_polls_total",
                "GetOrders polls by result (both fronts)",
                &[("result", result)],
            )
        };
        let connections = |front: Front| {
            r.gauge(
                bourse_monitor::names::LISTENER_CONNECTIONS_OPEN,
                "Connections open at a listener.",
                &[("listener", front.listener())],
            )
        };
        let stage = |stage: &str| {
            r.histogram(
                "bourse_delivery_poll_seconds",
                "Per poll: selecting under the read lock, and arrival to answer",
                &[("stage", stage)],
            )
        };
        ApiCounters {
            polls: r.counter(
                "bourse_delivery_polls_received_total",
                "GetOrders polls received",
                &[],
            ),
            polls_empty: polls("empty"),
            polls_refused_busy: polls("busy"),
            polls_refused_rate: polls("rate_limited"),
            polls_bad_request: polls("refused"),
            rows_sent: r.counter(
                "bourse_delivery_records_sent_total",
                "Records sent in answers",
                &[],
            ),
            records_written: r.counter(
                "bourse_delivery_records_written_total",
                "Records written into the store",
                &[],
            ),
            entries_applied: r.counter(
                "bourse_delivery_entries_applied_total",
                "Committed entries applied",
                &[],
            ),
            connections_http: connections(Front::Http),
            connections_binary: connections(Front::Binary),
            lag: r.histogram(
                "bourse_delivery_lag_seconds",
                "Per record sent: answer time less the record's time",
                &[],
            ),
            select: stage("select"),
            answer: stage("answer"),
            refusals: crate::poll::RefusalKind::ALL
                .iter()
                .map(|k| {
                    r.counter(
                        "bourse_delivery_refusals_total",
                        "Requests refused, by reason (both fronts, logons included)",
                        &[("reason", k.code())],
                    )
                })
                .collect(),
            registry: r,
        }
    }
}

impl ApiCounters {
    /// Counts one refusal under its reason.
    pub fn refused(&self, kind: crate::poll::RefusalKind) {
        if let Some(i) = crate::poll::RefusalKind::ALL
            .iter()
            .position(|k| *k == kind)
        {
            self.refusals[i].inc();
        }
    }

    /// Refusals so far, by reason code.
    pub fn refusals_by_reason(&self) -> std::collections::BTreeMap<&'static str, u64> {
        crate::poll::RefusalKind::ALL
            .iter()
            .zip(&self.refusals)
            .map(|(k, c)| (k.code(), c.get()))
            .collect()
    }

    /// The running totals the dashboard's delivery panel reads (`bourse_monitor::delivery`).
    pub fn totals(&self) -> bourse_monitor::delivery::DeliveryTotals {
        bourse_monitor::delivery::DeliveryTotals {
            records_written: self.records_written.get(),
            polls: self.polls.get(),
            polls_empty: self.polls_empty.get(),
            polls_refused: self.polls_refused_busy.get()
                + self.polls_refused_rate.get()
                + self.polls_bad_request.get(),
            records_sent: self.rows_sent.get(),
            readers_http: self.connections_http.get(),
            readers_binary: self.connections_binary.get(),
            lag: Some(self.lag.clone()),
            select: Some(self.select.clone()),
            answer: Some(self.answer.clone()),
        }
    }

    /// The doorkeeper of one front under `limits` (the venue's admission policy), its
    /// refusals counted here as `bourse_listener_refusals_total{listener="delivery_http"}`
    /// (or `delivery_binary`).
    pub fn doorkeeper(&self, front: Front, limits: &Limits) -> Doorkeeper {
        Doorkeeper::new(front.listener(), limits.admission(), Some(&self.registry))
            .with_requests_per_s(limits.polls_per_second_per_connection_max)
    }
}

/// A delivery node's two fronts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Front {
    Http,
    Binary,
}

impl Front {
    /// The front's name in the `listener` label of `/metrics` and in logs.
    pub fn listener(self) -> &'static str {
        match self {
            Front::Http => "delivery_http",
            Front::Binary => "delivery_binary",
        }
    }
}

impl Limits {
    /// Each front's admission limits: a connection proves itself with each request, which
    /// must come within `header_read_timeout_ms`.
    pub fn admission(&self) -> bourse_admission::Limits {
        bourse_admission::Limits {
            connections_per_address_max: self.connections_per_address_max,
            ..bourse_admission::Limits::new(
                self.connections_max,
                self.waiting_per_address_max,
                self.header_read_timeout_ms,
            )
        }
    }
}

impl Default for ApiCounters {
    fn default() -> ApiCounters {
        ApiCounters::new()
    }
}

/// What the feeds, the server and the persister share.
pub struct Shared {
    pub store: RwLock<Store>,
    /// Bumped after every entry that wrote records; waiting polls watch it.
    pub changed: watch::Sender<u64>,
    /// Bumped after every entry applied (records or not); polls whose cursor is ahead of
    /// the node watch it.
    pub applied: watch::Sender<u64>,
    pub counters: ApiCounters,
    /// Per core, why its feed is not running (or is retrying), if it is not well.
    pub feed_errors: Mutex<Vec<Option<String>>>,
    pub limits: Limits,
    /// Polls being answered, over both fronts, at most `limits.polls_in_flight_max`.
    pub polls: Semaphore,
    pub role: Role,
    /// Who may read what: the readers' credentials, checked once and remembered.
    pub gate: Gate,
    /// Both fronts speak TLS with this certificate (`access.tls`).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// A replica has read its primary's whole picture (always true on a primary).
    ready: AtomicBool,
}

impl Shared {
    pub fn new(store: Store, limits: Limits) -> Arc<Shared> {
        Shared::with_role(store, limits, Role::Primary)
    }

    pub fn with_role(store: Store, limits: Limits, role: Role) -> Arc<Shared> {
        Shared::with_access(store, limits, role, Gate::open(), None)
    }

    /// A node's shared state with its readers' gate and its fronts' TLS.
    pub fn with_access(
        store: Store,
        limits: Limits,
        role: Role,
        gate: Gate,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> Arc<Shared> {
        let cores = store.core_ids().len();
        Arc::new(Shared {
            role,
            gate,
            tls,
            ready: AtomicBool::new(role == Role::Primary),
            store: RwLock::new(store),
            changed: watch::channel(0).0,
            applied: watch::channel(0).0,
            counters: ApiCounters::default(),
            feed_errors: Mutex::new(vec![None; cores]),
            polls: Semaphore::new(limits.polls_in_flight_max),
            limits,
        })
    }

    /// Whether polls are answered (a replica: once it has read its primary's picture).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    fn set_feed_error(&self, slot: usize, why: Option<String>) {
        self.feed_errors.lock().expect("feed errors")[slot] = why;
    }
}

/// A running delivery node; [`DeliveryNode::stop`] (or dropping it) persists the store and
/// stops everything.
pub struct DeliveryNode {
    shared: Arc<Shared>,
    addr: SocketAddr,
    binary_addr: Option<SocketAddr>,
    config: DeliveryConfig,
    stop: watch::Sender<bool>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl DeliveryNode {
    /// Loads the persisted store if there is one, binds the listener (a port in use is
    /// reported here), and starts the feeds, the persister and the server on a runtime of
    /// its own.
    pub fn start(config: DeliveryConfig) -> Result<DeliveryNode, String> {
        config.validate()?;
        let readers = bourse_auth::CredentialStore::from_entries(&config.access.readers)
            .map_err(|e| format!("access.readers: {e}"))?;
        let gate = Gate::new(readers, &config.access, config.threads);
        let tls = config.access.server_tls()?;
        let follow_access = match &config.follow {
            Some(f) => Some(f.client_access().map_err(|e| format!("follow.tls: {e}"))?),
            None => None,
        };
        let store = load_store(&config)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.threads)
            .thread_name("bourse-delivery")
            .enable_all()
            .build()
            .map_err(|e| format!("runtime: {e}"))?;
        let listener = bind(config.listen)?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("listener: {e}"))?;
        let binary = match config.binary_listen {
            Some(a) => Some(bind(a)?),
            None => None,
        };
        let binary_addr = match &binary {
            Some(l) => Some(l.local_addr().map_err(|e| format!("listener: {e}"))?),
            None => None,
        };
        let shared = Shared::with_access(store, config.limits.clone(), config.role(), gate, tls);
        let (stop, stopped) = watch::channel(false);
        {
            let _guard = runtime.enter();
            if let (Some(f), Some(access)) = (&config.follow, follow_access) {
                tokio::spawn(follow(
                    shared.clone(),
                    f.primary,
                    config.name.clone(),
                    access,
                    stopped.clone(),
                ));
            }
            for (slot, core) in config.cores.iter().enumerate() {
                bourse_cluster::transport::configure_client(&core.nodes, core.tls.as_ref())
                    .map_err(|e| format!("core {}: tls: {e}", core.id))?;
                tokio::spawn(feed(
                    shared.clone(),
                    slot,
                    core.nodes.clone(),
                    stopped.clone(),
                ));
            }
            if let Some(file) = config.state_file() {
                tokio::spawn(persist_every(
                    shared.clone(),
                    file,
                    config.persist_interval_ms,
                    stopped.clone(),
                ));
            }
            let listener =
                tokio::net::TcpListener::from_std(listener).map_err(|e| format!("{e}"))?;
            if let Some(binary) = binary {
                let binary =
                    tokio::net::TcpListener::from_std(binary).map_err(|e| format!("{e}"))?;
                tokio::spawn(crate::binary::serve(
                    binary,
                    shared.clone(),
                    stopped.clone(),
                ));
            }
            tokio::spawn(crate::server::serve(listener, shared.clone(), stopped));
        }
        Ok(DeliveryNode {
            shared,
            addr,
            binary_addr,
            config,
            stop,
            runtime: Some(runtime),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The binary API's address, when it is served.
    pub fn binary_addr(&self) -> Option<SocketAddr> {
        self.binary_addr
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The next log index the store applies, per core in configuration order (a replica:
    /// the entries before it are whole here).
    pub fn applied_indexes(&self) -> Vec<u64> {
        let store = self.shared.store.read().expect("store");
        (0..store.core_ids().len())
            .map(|s| store.applied_index(s))
            .collect()
    }

    /// Stops the feeds and the server and writes the store to its state file.
    pub fn stop(mut self) -> Result<(), String> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), String> {
        let Some(runtime) = self.runtime.take() else {
            return Ok(());
        };
        let _ = self.stop.send(true);
        runtime.shutdown_timeout(Duration::from_secs(5));
        match self.config.state_file() {
            Some(file) => persist(&self.shared, &file),
            None => Ok(()),
        }
    }

    /// Stops without writing the state file, as a crash would (for tests: the next start
    /// resumes from the last periodic write).
    pub fn kill(mut self) {
        if let Some(runtime) = self.runtime.take() {
            let _ = self.stop.send(true);
            runtime.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

impl Drop for DeliveryNode {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, String> {
    let listener =
        std::net::TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("listener: {e}"))?;
    Ok(listener)
}

fn load_store(config: &DeliveryConfig) -> Result<Store, String> {
    let mut store = load_state(config)?;
    if let (Some(cold), Some(dir)) = (&config.cold, &config.state_dir) {
        store.attach_cold(&dir.join("cold"), cold)?;
    }
    Ok(store)
}

/// A new, empty store: a primary's gets a fresh random identity (a replica's is its
/// primary's, learnt on its first answer).
fn fresh_store(config: &DeliveryConfig) -> Store {
    let mut store = Store::new(&config.store_config());
    if config.follow.is_none() {
        store.set_identity(crate::cursor::fresh_identity(
            &config.name,
            bourse_auth::random_u64(),
        ));
    }
    store
}

fn load_state(config: &DeliveryConfig) -> Result<Store, String> {
    let Some(file) = config.state_file() else {
        return Ok(fresh_store(config));
    };
    match std::fs::read(&file) {
        Ok(bytes) => Store::decode(&config.store_config(), &bytes).map_err(|e| {
            format!(
                "{}: {e}; move the file away to rebuild the store from the cores' streams",
                file.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let dir = file.parent().expect("a state dir");
            std::fs::create_dir_all(dir).map_err(|e| format!("state dir: {e}"))?;
            // Cold data of an earlier store carries that store's identity: keep it aside.
            let cold = dir.join("cold");
            if cold.exists() {
                let secs = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                let aside = dir.join(format!("cold.before-{secs}"));
                std::fs::rename(&cold, &aside).map_err(|e| format!("{}: {e}", cold.display()))?;
                eprintln!(
                    "bourse delivery: no state file, so this is a new store with a new identity; \
                     the earlier store's cold data is set aside as {}",
                    aside.display()
                );
            }
            Ok(fresh_store(config))
        }
        Err(e) => Err(format!("{}: {e}", file.display())),
    }
}

/// Writes the store to `file` atomically (a temporary file, then rename). The encoding holds
/// the read lock, which holds back the writer for as long (see BENCHMARKS.md).
fn persist(shared: &Shared, file: &std::path::Path) -> Result<(), String> {
    let bytes = shared.store.read().expect("store").encode();
    let tmp = file.with_extension("state.tmp");
    std::fs::write(&tmp, &bytes).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, file).map_err(|e| format!("{}: {e}", file.display()))
}

async fn persist_every(
    shared: Arc<Shared>,
    file: PathBuf,
    interval_ms: u64,
    mut stopped: watch::Receiver<bool>,
) {
    let mut every = tokio::time::interval(Duration::from_millis(interval_ms.max(10)));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stopped.changed() => return,
            _ = every.tick() => {}
        }
        let (s, f) = (shared.clone(), file.clone());
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || persist(&s, &f)).await {
            eprintln!("bourse delivery: cannot persist the store: {e}");
        }
    }
}

/// The pause before a feed that found no node of its core tries again.
const FEED_RETRY_MS: u64 = 200;

/// Reads one core's committed stream into the store, from the index the store stops at.
async fn feed(
    shared: Arc<Shared>,
    slot: usize,
    nodes: Vec<SocketAddr>,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
        let position = shared.store.read().expect("store").applied_index(slot);
        let mut consumer = StreamConsumer::remote(nodes.clone(), position);
        loop {
            let got = tokio::select! {
                _ = stopped.changed() => return,
                got = consumer.next() => got,
            };
            match got {
                Ok(entry) => {
                    let applied = shared
                        .store
                        .write()
                        .expect("store")
                        .apply_entry(slot, &entry);
                    shared.counters.entries_applied.inc();
                    shared.applied.send_modify(|v| *v += 1);
                    match applied {
                        Ok(0) => {}
                        Ok(n) => {
                            shared.counters.records_written.add(n as u64);
                            shared.changed.send_modify(|v| *v += 1);
                        }
                        Err(e) => {
                            // The store cannot go on past this entry without a gap.
                            shared.set_feed_error(
                                slot,
                                Some(format!("stopped at entry {}: {e}", entry.index())),
                            );
                            return;
                        }
                    }
                }
                Err(StreamError::Unreachable(why)) => {
                    shared.set_feed_error(slot, Some(format!("retrying: {why}")));
                    tokio::select! {
                        _ = stopped.changed() => return,
                        _ = tokio::time::sleep(Duration::from_millis(FEED_RETRY_MS)) => {}
                    }
                    break;
                }
                Err(e) => {
                    shared.set_feed_error(
                        slot,
                        Some(format!(
                            "stopped at log index {}: {e}; the core no longer keeps the \
                             events this store needs: move the state file away and restart \
                             to rebuild from what the core keeps",
                            consumer.position()
                        )),
                    );
                    return;
                }
            }
            if shared.feed_errors.lock().expect("feed errors")[slot].is_some() {
                shared.set_feed_error(slot, None);
            }
        }
    }
}

/// Records a replica asks its primary for in one poll, and how long that poll may wait.
const FOLLOW_ROWS_PER_POLL: usize = 4_096;
const FOLLOW_WAIT_US: u64 = 200_000;

/// A read replica's one feed: polls the primary's binary front, unfiltered, from the cursor
/// the store has read up to, and applies each answer. It first learns the primary's
/// identity (one poll without a cursor), which its store and its cursors take. A primary
/// that is down is retried from the same cursor, as is one that calls the cursor ahead (it
/// restarted from an older state file and is catching up); one that no longer keeps what the
/// replica needs (the cursor is too old) makes the replica start over from the primary's
/// current picture, and one that calls the cursor foreign (it started over from an empty
/// store, with a new identity) makes it start over from the origin, refusing polls until it
/// has the picture again; a primary of another deployment or other cores, or one that
/// refuses the replica's credentials, stops the feed.
async fn follow(
    shared: Arc<Shared>,
    primary: SocketAddr,
    name: String,
    access: bourse_client::delivery::Access,
    mut stopped: watch::Receiver<bool>,
) {
    let mut client = crate::BinaryClient::new(primary).with_access(access);
    let mut identity: Option<u64> = None;
    // First from the origin (exact, when the primary evicted nothing); after the primary
    // refused that, from its current picture (the horizon is then the first record read).
    let mut from_origin = true;
    // The cursor of the primary's last answer, handed back unchanged (a snapshot's floors
    // included).
    let mut resume: Option<String> = None;
    loop {
        let learning = identity.is_none();
        let request = if learning {
            crate::client::PollRequest {
                limit: Some(1),
                wait_us: Some(0),
                ..Default::default()
            }
        } else {
            let cursor = match &resume {
                Some(text) => Some(text.clone()),
                None if from_origin => {
                    let mut store = shared.store.write().expect("store");
                    store.read_from_origin();
                    let origin = vec![crate::record::Pos::START; store.core_ids().len()];
                    Some(store.cursor(&origin).encode())
                }
                None => None,
            };
            crate::client::PollRequest {
                cursor,
                limit: Some(FOLLOW_ROWS_PER_POLL),
                wait_us: Some(FOLLOW_WAIT_US),
                min_rows: Some(1),
                ..Default::default()
            }
        };
        let got = tokio::select! {
            _ = stopped.changed() => return,
            got = client.poll(&request) => got,
        };
        let why = match got {
            Ok(_) if client.logon().is_some_and(|l| !l.all_firms) => {
                // A firm's credentials would give the replica a firm's picture, withheld
                // sides and all, and its readers a wrong one.
                shared.set_feed_error(
                    0,
                    Some(format!(
                        "stopped: follow.login reads some firms' records only at primary \
                         {primary}; a replica needs a viewer's or operator's credentials there"
                    )),
                );
                return;
            }
            Ok(answer) if learning => match learn_identity(&shared, &answer, &name) {
                Ok(id) => {
                    identity = Some(id);
                    continue;
                }
                Err(why) => {
                    shared.set_feed_error(0, Some(format!("stopped: {why}")));
                    return;
                }
            },
            Ok(answer) => match apply_answer(&shared, &answer) {
                Ok(()) => {
                    resume = Some(answer.header.next_cursor);
                    if shared.feed_errors.lock().expect("feed errors")[0].is_some() {
                        shared.set_feed_error(0, None);
                    }
                    continue;
                }
                Err(why) => {
                    shared.set_feed_error(0, Some(format!("stopped: {why}")));
                    return;
                }
            },
            Err(crate::ClientError::Api { status: 410, error }) => {
                // The primary evicted past this replica's place: start over from its picture.
                start_over(&shared, identity);
                from_origin = false;
                resume = None;
                format!(
                    "starting over from the primary's current state: {}",
                    error.message
                )
            }
            Err(crate::ClientError::Api { status: 409, error })
                if error.code == crate::poll::RefusalKind::CursorForeign.code() =>
            {
                // The primary's identity changed: it is a new store; read it from the origin.
                start_over(&shared, None);
                identity = None;
                from_origin = true;
                resume = None;
                format!(
                    "starting over: the primary no longer knows this replica's cursor \
                     ({}); it started over from an empty store",
                    error.message
                )
            }
            Err(crate::ClientError::Api { status: 409, error })
                if error.code == crate::poll::RefusalKind::CursorAhead.code() =>
            {
                format!("retrying: primary {primary}: {}", error.message)
            }
            Err(
                e @ crate::ClientError::Api {
                    status: 401 | 403 | 409,
                    ..
                },
            ) => {
                shared.set_feed_error(0, Some(format!("stopped: primary {primary}: {e}")));
                return;
            }
            Err(e) => format!("retrying: primary {primary}: {e}"),
        };
        shared.set_feed_error(0, Some(why));
        tokio::select! {
            _ = stopped.changed() => return,
            _ = tokio::time::sleep(Duration::from_millis(FEED_RETRY_MS)) => {}
        }
    }
}

/// Empties a replica's store (keeping `identity`, when known) and refuses polls until it has
/// read its primary's picture again.
fn start_over(shared: &Shared, identity: Option<u64>) {
    let mut store = shared.store.write().expect("store");
    let config = store.config();
    let old = store.deployment();
    *store = Store::new(&config);
    store.set_identity(identity.unwrap_or(old));
    shared.ready.store(false, Ordering::Release);
}

/// Takes the primary's identity from its answer's cursor, after checking that the primary
/// serves this deployment (the identity's name tag) and these cores.
fn learn_identity(shared: &Shared, answer: &crate::PollAnswer, name: &str) -> Result<u64, String> {
    let next = Cursor::decode(&answer.header.next_cursor)
        .map_err(|e| format!("the primary's cursor: {e}"))?;
    if !crate::cursor::identity_names(next.deployment, name) {
        return Err(format!(
            "the primary serves another deployment than `{name}` (its `name` differs)"
        ));
    }
    let mut store = shared.store.write().expect("store");
    let ids: Vec<u32> = next.parts.iter().map(|(c, _)| *c).collect();
    if ids != store.core_ids() {
        return Err(format!(
            "the primary serves cores {ids:?}, this replica's follow.cores are {:?}",
            store.core_ids()
        ));
    }
    store.set_identity(next.deployment);
    Ok(next.deployment)
}

/// Applies one answer of the primary to a replica's store; checks that the primary serves
/// this deployment and these cores.
fn apply_answer(shared: &Shared, answer: &crate::PollAnswer) -> Result<(), String> {
    let next = Cursor::decode(&answer.header.next_cursor)
        .map_err(|e| format!("the primary's cursor: {e}"))?;
    let mut store = shared.store.write().expect("store");
    if next.deployment != store.deployment() {
        return Err("the primary's identity changed between two answers".into());
    }
    let ids: Vec<u32> = next.parts.iter().map(|(c, _)| *c).collect();
    if ids != store.core_ids() {
        return Err(format!(
            "the primary serves cores {ids:?}, this replica's follow.cores are {:?}",
            store.core_ids()
        ));
    }
    let complete = answer.records.len() < FOLLOW_ROWS_PER_POLL;
    let n = store
        .apply_answer(&answer.records, &next.parts, complete)
        .map_err(|e| e.to_string())?;
    // Ready once an answer held everything the primary had for every core.
    if complete && store.has_read_every_core() && !shared.is_ready() {
        shared.ready.store(true, Ordering::Release);
    }
    drop(store);
    shared.counters.records_written.add(n as u64);
    if n > 0 {
        shared.changed.send_modify(|v| *v += 1);
    }
    shared.applied.send_modify(|v| *v += 1);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_configuration_loads() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/delivery.toml");
        let c = DeliveryConfig::load(std::path::Path::new(path)).unwrap();
        assert_eq!(c.cores.len(), 1);
        assert_eq!(c.limits, Limits::default());
        assert_eq!(c.cold, Some(crate::cold::ColdConfig::default()));
        let without_dir = DeliveryConfig {
            state_dir: None,
            ..c.clone()
        };
        assert!(without_dir.validate().unwrap_err().contains("state_dir"));
        let tiny = DeliveryConfig {
            cold: Some(crate::cold::ColdConfig {
                segment_bytes: 1024,
                ..Default::default()
            }),
            ..c
        };
        assert!(tiny.validate().unwrap_err().contains("segment_bytes"));
    }

    #[test]
    fn a_configuration_without_cores_or_with_a_core_twice_is_refused() {
        let mut c = DeliveryConfig {
            name: "x".into(),
            listen: "127.0.0.1:0".parse().unwrap(),
            binary_listen: None,
            state_dir: None,
            persist_interval_ms: 10,
            threads: 2,
            cores: Vec::new(),
            follow: None,
            cold: None,
            limits: Limits::default(),
            access: Default::default(),
        };
        assert!(c.validate().unwrap_err().contains("at least one core"));
        let core = CoreSource {
            id: 3,
            nodes: vec!["127.0.0.1:1".parse().unwrap()],
            tls: None,
        };
        c.cores = vec![core.clone(), core];
        assert!(c.validate().unwrap_err().contains("core 3 is listed twice"));
        c.cores.pop();
        c.threads = 0;
        assert!(c.validate().unwrap_err().contains("threads must be 1..=64"));
        c.threads = 65;
        assert!(c.validate().unwrap_err().contains("threads must be 1..=64"));
        c.threads = 8;
        assert!(c.validate().is_ok());
    }
}
