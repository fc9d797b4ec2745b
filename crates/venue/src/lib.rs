//! The whole venue on one machine, in this process: per market a trading core (a replica group
//! of three `bourse_cluster::Node`s, or an in-process engine) with its market data, and gateways
//! in front of every core.
//!
//! Start at [`LocalDeployment::start`]: it brings a [`DeploymentSpec`] up on 127.0.0.1,
//! implements `bourse_loadgen::Deployment`, and checks itself (every command accounted for by
//! its source, equal replica hashes, every trade on the feed). [`heap::Counting`] counts live
//! heap bytes. Core `i` numbers its orders from `i << ORDER_ID_CORE_SHIFT`.
//!
//! Modules and checks: ARCHITECTURE.md, `crates/venue`.

mod admin;
mod clearing;
mod feed;
pub mod heap;
mod host;
mod links;
mod sources;
mod spec;
mod timing;
mod under_load;

pub use admin::{VenueAdmin, ADMIN_CLIENT_ID_BASE, ADMIN_LANES};
pub use clearing::ClearingOptions;
pub use host::{sample_of, tune_allocator};
pub use spec::{Backend, DeploymentSpec, MarketSpec, MemoryBounds};
pub use under_load::ACCOUNTS_UNDER_LOAD_ID_BASE;

use feed::MdCounter;
use links::{cluster_link, CountingLink};
use sources::gateway_client_id;
use timing::{stage_figures, time_entries, EntryLegs};

use anyhow::{anyhow, bail, Context, Result};
use bourse_cluster::tokio;
use bourse_cluster::{Client, ClusterConfig, FsyncSetting, Node};
use bourse_core::*;
use bourse_engine::capacity::Preallocation;
use bourse_engine::in_process::InProcessCore;
use bourse_engine::{Engine, EngineConfig, ORDER_ID_CORE_SHIFT};
use bourse_gateway::config::CoreEntry;
use bourse_gateway::{CoreLink, GatewayConfig, GatewayHandle};
use bourse_loadgen::gateway::{SessionPlan, SessionProtocol, WorkerPlan};
use bourse_loadgen::{Connection, CoreTotals, Deployment};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Clients that apply the setup at once: the nodes batch what arrives together.
const SETUP_CLIENTS: usize = 64;
/// How long one setup command may take to be acknowledged (an election included).
const SETUP_COMMAND_DEADLINE: Duration = Duration::from_secs(10);
/// How long the replicas of a core may take to apply the same last entry at the end.
const CONVERGE_DEADLINE: Duration = Duration::from_secs(10);
/// How long a new group may take to elect its first leader.
const LEADER_DEADLINE: Duration = Duration::from_secs(10);
/// Client ids of the setup clients start here (gateways use 1..=gateways, and a standalone
/// gateway's links at most `LINK_EPOCH_MAX << 32 | u32::MAX`, below this).
const SETUP_CLIENT_ID_BASE: u64 = 1 << 61;
/// Client ids each core has in the setup's and the admin's ranges: core `c`'s ids of a range
/// start at its base plus `CLIENT_IDS_PER_CORE c`, so a core's ids tell the source apart
/// (`sources`).
const CLIENT_IDS_PER_CORE: u64 = 1_000;

/// A running core.
enum CoreRun {
    Engine(Arc<Mutex<Engine>>),
    Cluster {
        nodes: Vec<Node>,
        feeds: Vec<bourse_cluster::marketdata::MarketDataService>,
    },
}

struct Core {
    name: String,
    run: CoreRun,
    base: bourse_engine::Counters,
    /// Requests applied per client id when the setup was done (replicated cores; empty for an
    /// in-process engine, which has no clients): what `totals` counts each source from.
    base_by_client: HashMap<u64, u64>,
    forwarded: Arc<AtomicU64>,
    other: Arc<AtomicU64>,
    setup_commands: u64,
    setup_rejected: u64,
    setup_ms: u64,
    /// The UDP base port of the core's market data (cluster backend with market data).
    md_base_port: Option<u16>,
    md_counter: Option<MdCounter>,
    /// The gateways' links to this core, whose legs the report's stage table shows.
    links: Vec<bourse_cluster::link::ClusterLinkWatch>,
    /// Each replica's journal directory and its fsync figures when the setup was done.
    journals: Vec<(PathBuf, bourse_journal::stats::HistogramReading)>,
    /// The legs of every entry the core applied since the setup.
    spread: Option<Arc<Mutex<EntryLegs>>>,
}

/// Starts worker `n` of a plan elsewhere (a child process) and returns its connection.
pub type RemoteWorkers = Box<dyn FnMut(usize, &WorkerPlan) -> Result<Connection, String>>;

/// The whole local venue.
pub struct LocalDeployment {
    runtime: Option<tokio::runtime::Runtime>,
    cores: Vec<Core>,
    gateways: Vec<GatewayHandle>,
    plans: Vec<Option<WorkerPlan>>,
    backend: Backend,
    protocol: SessionProtocol,
    sessions: u32,
    fsync: FsyncSetting,
    /// Serves worker connections: locally, or as child processes (see `loadtest_cmd`).
    pub remote: Option<RemoteWorkers>,
    stopped: bool,
    /// The admin API's view, once asked for: its commands are not the generator's.
    admin: std::sync::OnceLock<Arc<VenueAdmin>>,
    /// Accounts to add through the admin path while the load runs, then what was added.
    under_load: Option<under_load::UnderLoad>,
    accounts_added: Option<bourse_loadgen::results::AccountsAdded>,
    /// Every market's instruments, in core order (what a clearing service clears with).
    instruments: Vec<Instrument>,
    /// The clearing service and the runs asked of it while the load runs, then what they did.
    clearing: Option<clearing::ClearingUnderLoad>,
    clearing_done: Vec<bourse_loadgen::results::ClearingRunDone>,
    /// When the load started (set by `run_starts_at`): the clearing runs' times count from it.
    run_start_unix_ns: Option<u64>,
}

/// How often the demo's dashboard takes the counts and the nodes' status of a core.
const WATCH_PERIOD_MS: u64 = 250;

/// Feeds a dashboard with one core: its committed stream (transactions, orders, trades, under
/// the core's name) and, for the first core only, its nodes' status. A dashboard has one
/// cluster view, and its alerts compare state hashes across the nodes it shows, so it may show
/// one replica group and never a mix of several (they would "differ" at every index). Ends
/// when the node's stream closes.
async fn watch_core(
    monitor: Arc<bourse_monitor::Monitor>,
    index: usize,
    name: String,
    mut subscription: bourse_cluster::Subscription,
    addrs: Vec<(u64, SocketAddr)>,
) {
    let shows_group = index == 0;
    let members: Vec<u64> = if shows_group {
        addrs.iter().map(|(id, _)| *id).collect()
    } else {
        Vec::new()
    };
    let mut metrics =
        bourse_monitor::NodeMetrics::new(Arc::clone(&monitor), addrs[0].0, &members, &name);
    let mut every = tokio::time::interval(Duration::from_millis(WATCH_PERIOD_MS));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            entry = subscription.recv() => match entry {
                Ok(entry) => {
                    for r in &entry.requests {
                        // A retried request answered from the idempotency table carries the events
                        // of its first application again: counting them twice would overstate
                        // orders and trades (seen as 3 extra orders in a loaded demo).
                        if r.kind != bourse_cluster::OutcomeKind::Applied {
                            continue;
                        }
                        if let Ok(events) = bourse_core::codec::decode_events(&r.events) {
                            metrics.on_applied_events(&events);
                        }
                    }
                }
                Err(_) => {
                    metrics.publish_events();
                    return;
                }
            },
            _ = every.tick() => {
                metrics.publish_events();
                if !shows_group {
                    continue;
                }
                for (_, addr) in &addrs {
                    // The brief status: it never hashes the state, so a poll does not stall
                    // the core; the dashboard compares the replicas' checkpoints instead.
                    let status = bourse_cluster::client::node_status_brief(
                        *addr,
                        Duration::from_millis(WATCH_PERIOD_MS * 2),
                    )
                    .await;
                    if let Ok(status) = status {
                        metrics.observe_peer(&crate::host::sample_of(&status));
                    }
                }
            }
        }
    }
}

fn unix_ns() -> u64 {
    bourse_loadgen::unix_ns()
}

fn is_reject(e: &Event) -> bool {
    matches!(
        e,
        Event::CommandRejected { .. } | Event::OrderRejected { .. } | Event::CancelRejected { .. }
    )
}

impl LocalDeployment {
    /// Starts every core, applies the setup, starts the gateways. On failure everything that
    /// started is stopped again.
    pub fn start(spec: DeploymentSpec) -> Result<LocalDeployment> {
        // The deployment hosts its nodes in this process: the same allocator tuning as
        // `bourse node` (see `tune_allocator`).
        crate::host::tune_allocator();
        if spec.markets.is_empty() {
            bail!("a deployment needs at least one market");
        }
        if spec.backend == Backend::InProcess && spec.gateways != 1 {
            bail!("in-process cores serve one gateway; use the cluster backend for more");
        }
        check_capacities_fit(&spec)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .thread_name("bourse-deploy")
            .build()
            .context("tokio runtime")?;
        let mut d = LocalDeployment {
            runtime: Some(runtime),
            cores: Vec::new(),
            gateways: Vec::new(),
            plans: Vec::new(),
            backend: spec.backend,
            protocol: spec.protocol,
            sessions: 0,
            fsync: spec.fsync,
            remote: None,
            stopped: false,
            admin: std::sync::OnceLock::new(),
            under_load: None,
            accounts_added: None,
            instruments: spec
                .markets
                .iter()
                .flat_map(|m| m.instruments.iter().cloned())
                .collect(),
            clearing: None,
            clearing_done: Vec::new(),
            run_start_unix_ns: None,
        };
        match d.start_inner(&spec) {
            Ok(()) => Ok(d),
            Err(e) => {
                d.stop();
                Err(e)
            }
        }
    }

    fn start_inner(&mut self, spec: &DeploymentSpec) -> Result<()> {
        std::fs::create_dir_all(&spec.data_dir)
            .with_context(|| format!("create {}", spec.data_dir.display()))?;
        for (index, m) in spec.markets.iter().enumerate() {
            let t0 = Instant::now();
            let core = match spec.backend {
                Backend::InProcess => {
                    let mut engine = Engine::new(in_process_engine_config(spec, index));
                    let mut rejected = 0;
                    let mut events = Vec::new();
                    let ts = unix_ns();
                    for body in &m.setup {
                        events.clear();
                        engine.apply(&Command::new(ts, body.clone()), &mut events);
                        rejected += events.iter().filter(|e| is_reject(e)).count() as u64;
                    }
                    Core {
                        name: m.name.clone(),
                        base: *engine.counters(),
                        run: CoreRun::Engine(Arc::new(Mutex::new(engine))),
                        base_by_client: HashMap::new(),
                        forwarded: Arc::new(AtomicU64::new(0)),
                        other: Arc::new(AtomicU64::new(0)),
                        setup_commands: m.setup.len() as u64,
                        setup_rejected: rejected,
                        setup_ms: 0,
                        md_base_port: None,
                        md_counter: None,
                        links: Vec::new(),
                        journals: Vec::new(),
                        spread: None,
                    }
                }
                Backend::Cluster => self.start_cluster(spec, index, m)?,
            };
            let mut core = core;
            core.setup_ms = t0.elapsed().as_millis() as u64;
            if core.setup_rejected > 0 {
                self.cores.push(core);
                bail!(
                    "market {}: {} setup commands were rejected",
                    m.name,
                    self.cores.last().map_or(0, |c| c.setup_rejected)
                );
            }
            if spec.verbose {
                eprintln!(
                    "  core {index} ({}): {} ready, {} setup commands in {} ms",
                    m.name,
                    match spec.backend {
                        Backend::InProcess => "in-process engine".to_string(),
                        Backend::Cluster => "3 replicas".to_string(),
                    },
                    core.setup_commands,
                    core.setup_ms
                );
            }
            self.cores.push(core);
        }
        self.start_gateways(spec)
    }

    fn start_cluster(
        &mut self,
        spec: &DeploymentSpec,
        index: usize,
        m: &MarketSpec,
    ) -> Result<Core> {
        // Ports below the ephemeral range (see `bourse_testkit`): one found free by a bind to
        // port 0 could be taken by a parallel deployment's outgoing connection.
        let node_base = bourse_testkit::try_free_port_block(3)?;
        let md_base_port = if spec.market_data {
            Some(bourse_testkit::try_free_port_block(40)?)
        } else {
            None
        };
        let config = core_cluster_config(
            spec,
            index,
            m,
            [node_base, node_base + 1, node_base + 2],
            md_base_port,
        );
        let md_section = config.marketdata.clone();
        let rt = self.runtime.as_ref().expect("runtime");
        let mut nodes = Vec::new();
        for n in &config.nodes {
            let node = rt
                .block_on(Node::start(&config, n.id))
                .map_err(|e| anyhow!("core {} node {}: {e}", m.name, n.id))?;
            nodes.push(node);
        }
        let addrs: Vec<(u64, SocketAddr)> = nodes.iter().map(|n| (n.id(), n.addr)).collect();
        // Wait for a leader, so the setup does not spend its deadline on the election.
        let deadline = Instant::now() + LEADER_DEADLINE;
        loop {
            let st = rt.block_on(nodes[0].status());
            if st.leader.is_some() {
                break;
            }
            if Instant::now() >= deadline {
                bail!(
                    "core {}: no leader elected within {LEADER_DEADLINE:?}",
                    m.name
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut feeds = Vec::new();
        if let Some(section) = &md_section {
            for node in &nodes {
                feeds.push(
                    bourse_cluster::marketdata::MarketDataService::start(node, section)
                        .map_err(|e| anyhow!("core {} market data: {e}", m.name))?,
                );
            }
        }
        let md_counter = md_base_port.map(MdCounter::start).transpose()?;
        let (commands, rejected) = rt.block_on(apply_setup(&addrs, &m.setup, index))?;
        // The counters after the setup, once every replica has applied all of it (the
        // acknowledgements came from the leader; a follower may still be behind).
        let (base, base_by_client) = rt.block_on(async {
            converge(&nodes).await;
            nodes[0]
                .state_machine()
                .with_state(|s| (*s.engine().counters(), s.applied_by_client().collect()))
                .await
        });
        // The stage figures count from here: the journals' fsyncs so far were the setup's.
        let journals: Vec<(PathBuf, bourse_journal::stats::HistogramReading)> = nodes
            .iter()
            .map(|n| {
                let dir = config.node_dir(n.id()).join("journal");
                let base = bourse_journal::journal_stats_for(&dir)
                    .map(|j| j.snapshot().fsync)
                    .unwrap_or_default();
                (dir, base)
            })
            .collect();
        let spread = {
            let from = rt
                .block_on(nodes[0].status())
                .last_applied_index
                .map_or(0, |i| i + 1);
            let subs: Vec<_> = nodes
                .iter()
                .filter_map(|n| n.subscribe(from).ok())
                .collect();
            (subs.len() == nodes.len()).then(|| {
                let out = Arc::new(Mutex::new(EntryLegs::default()));
                let dirs = journals.iter().map(|(d, _)| d.clone()).collect();
                let pub_delay = md_counter.as_ref().map(|m| Arc::clone(&m.delay));
                rt.spawn(time_entries(subs, dirs, Arc::clone(&out), pub_delay));
                out
            })
        };
        if let Some(monitor) = &spec.monitor {
            // The dashboard's trading figures come from what the core committed, as a node's
            // own dashboard counts them; the cluster view shows the first core's group.
            let from = rt
                .block_on(nodes[0].status())
                .last_applied_index
                .map_or(0, |i| i + 1);
            if let Ok(subscription) = nodes[0].subscribe(from) {
                rt.spawn(watch_core(
                    Arc::clone(monitor),
                    index,
                    m.name.clone(),
                    subscription,
                    addrs.clone(),
                ));
            }
        }
        Ok(Core {
            name: m.name.clone(),
            run: CoreRun::Cluster { nodes, feeds },
            base,
            base_by_client,
            forwarded: Arc::new(AtomicU64::new(0)),
            other: Arc::new(AtomicU64::new(0)),
            setup_commands: commands,
            setup_rejected: rejected,
            setup_ms: 0,
            md_base_port,
            md_counter,
            links: Vec::new(),
            journals,
            spread,
        })
    }

    fn start_gateways(&mut self, spec: &DeploymentSpec) -> Result<()> {
        let gateways = spec.gateways.max(1);
        // Sessions go round-robin over the gateways; every gateway routes every market.
        let mut per_gateway: Vec<Vec<(usize, usize, Vec<u32>)>> = vec![Vec::new(); gateways];
        let mut k = 0usize;
        for (w, sessions) in spec.worker_sessions.iter().enumerate() {
            for (s, accounts) in sessions.iter().enumerate() {
                per_gateway[k % gateways].push((w, s, accounts.clone()));
                k += 1;
            }
        }
        self.sessions = k as u32;
        let instruments: Vec<Instrument> = spec
            .markets
            .iter()
            .flat_map(|m| m.instruments.iter().cloned())
            .collect();
        let mut plans: Vec<WorkerPlan> = spec
            .worker_sessions
            .iter()
            .map(|_| WorkerPlan {
                sessions: Vec::new(),
                instruments: spec.markets.iter().map(|m| m.instruments.clone()).collect(),
            })
            .collect();
        let markets: Vec<usize> = (0..spec.markets.len()).collect();
        for (g, sessions) in per_gateway.iter().enumerate() {
            let mut config = GatewayConfig::from_toml(
                "[gateway]\nbinary_listen = \"127.0.0.1:0\"\nfix_listen = \"127.0.0.1:0\"\n",
            )
            .map_err(|e| anyhow!(e))?;
            config.gateway.store_dir = spec.data_dir.join(format!("gateway-{g}"));
            config.gateway.throttle_msgs_per_s = 1_000_000;
            config.gateway.connections_max = (sessions.len() + 16).min(10_000);
            config.gateway.core_queue_depth = 65_536;
            if let Some(n) = spec.core_in_flight_max {
                config.gateway.core_in_flight_max = n;
            }
            if let Some(b) = &spec.bounds {
                config.gateway.stored_messages_max = b.gateway_stored_messages_max;
                config.gateway.finished_orders_kept = b.gateway_finished_orders_kept;
            }
            if g == 0 {
                for (name, accounts) in &spec.extra_fix_sessions {
                    config
                        .fix_sessions
                        .push(bourse_gateway::config::FixSessionConfig {
                            client_comp_id: name.clone(),
                            gateway_comp_id: "BOURSE".into(),
                            firm: FirmId(1),
                            accounts: accounts.iter().map(|&a| AccountId(a)).collect(),
                            drop_copy: false,
                            throttle_msgs_per_s: None,
                            allowed_addresses: Vec::new(),
                            allowed_sources: Vec::new(),
                            password_hash: None,
                            tls_required: false,
                        });
                }
            }
            config.instruments = instruments.clone();
            config.cores = spec
                .markets
                .iter()
                .enumerate()
                .map(|(i, m)| CoreEntry {
                    name: m.name.clone(),
                    instruments: m.instruments.iter().map(|x| x.instrument).collect(),
                    in_process: spec.backend == Backend::InProcess,
                    nodes: match &self.cores[i].run {
                        CoreRun::Cluster { nodes, .. } => nodes.iter().map(|n| n.addr).collect(),
                        CoreRun::Engine(_) => Vec::new(),
                    },
                    client_id: match spec.backend {
                        Backend::Cluster => Some(gateway_client_id(g)),
                        Backend::InProcess => None,
                    },
                    bootstrap: Some(false),
                    tls: None,
                })
                .collect();
            for (w, s, accounts) in sessions {
                let name = format!("W{w}S{s}");
                match spec.protocol {
                    SessionProtocol::Binary => {
                        config
                            .binary_sessions
                            .push(bourse_gateway::config::BinarySessionConfig {
                                credentials: name.clone(),
                                firm: FirmId(1),
                                accounts: accounts.iter().map(|&a| AccountId(a)).collect(),
                                throttle_msgs_per_s: None,
                                allowed_addresses: Vec::new(),
                                allowed_sources: Vec::new(),
                                password_hash: None,
                                tls_required: false,
                            })
                    }
                    SessionProtocol::Fix => {
                        config
                            .fix_sessions
                            .push(bourse_gateway::config::FixSessionConfig {
                                client_comp_id: name.clone(),
                                gateway_comp_id: "BOURSE".into(),
                                firm: FirmId(1),
                                accounts: accounts.iter().map(|&a| AccountId(a)).collect(),
                                drop_copy: false,
                                throttle_msgs_per_s: None,
                                allowed_addresses: Vec::new(),
                                allowed_sources: Vec::new(),
                                password_hash: None,
                                tls_required: false,
                            })
                    }
                }
            }
            config.validate().map_err(|e| anyhow!("gateway {g}: {e}"))?;
            let mut links: Vec<Box<dyn CoreLink>> = Vec::new();
            for core in &mut self.cores {
                let inner: Box<dyn CoreLink> = match &core.run {
                    CoreRun::Engine(engine) => {
                        let engine = Arc::clone(engine);
                        Box::new(InProcessCore::spawn(
                            Box::new(move |c, out| {
                                engine.lock().expect("engine lock").apply(c, out)
                            }),
                            config.gateway.core_queue_depth,
                        ))
                    }
                    CoreRun::Cluster { nodes, .. } => {
                        let (link, watch) = cluster_link(
                            nodes,
                            gateway_client_id(g),
                            config.gateway.core_queue_depth,
                        )?;
                        core.links.push(watch);
                        link
                    }
                };
                links.push(Box::new(CountingLink {
                    inner,
                    forwarded: Arc::clone(&core.forwarded),
                    other: Arc::clone(&core.other),
                    other_sessions_max: if g == 0 {
                        spec.extra_fix_sessions.len() as u32
                    } else {
                        0
                    },
                }));
            }
            let monitor = if g == 0 { spec.monitor.clone() } else { None };
            let handle = bourse_gateway::spawn_cores(config, links, monitor)
                .map_err(|e| anyhow!("gateway {g}: {e}"))?;
            let addr = match spec.protocol {
                SessionProtocol::Binary => handle.binary_addr(),
                SessionProtocol::Fix => handle.fix_addr(),
            }
            .ok_or_else(|| anyhow!("gateway {g} has no listener"))?;
            for (w, s, accounts) in sessions {
                plans[*w].sessions.push(SessionPlan {
                    addr,
                    protocol: spec.protocol,
                    name: format!("W{w}S{s}"),
                    gateway_comp_id: "BOURSE".into(),
                    markets: markets.clone(),
                    accounts: accounts.clone(),
                });
            }
            if spec.verbose {
                eprintln!(
                    "  gateway {g}: binary {}, FIX {}{}, {} sessions",
                    handle.binary_addr().map_or("-".into(), |a| a.to_string()),
                    handle.fix_addr().map_or("-".into(), |a| a.to_string()),
                    handle
                        .monitor_addr()
                        .map_or(String::new(), |a| format!(", dashboard http://{a}/")),
                    sessions.len()
                );
            }
            self.gateways.push(handle);
        }
        self.plans = plans.into_iter().map(Some).collect();
        Ok(())
    }

    pub fn gateways(&self) -> &[GatewayHandle] {
        &self.gateways
    }

    /// Each replica's committed stream ring, named "core/node": what a sampler reads to
    /// attribute held bytes to the nodes (`CommittedStream::kept`). Clones share the ring.
    pub fn stream_rings(&self) -> Vec<(String, bourse_cluster::stream::CommittedStream)> {
        let mut rings = Vec::new();
        for core in &self.cores {
            if let CoreRun::Cluster { nodes, .. } = &core.run {
                for n in nodes {
                    let name = format!("{}/{}", core.name, n.id());
                    rings.push((name, n.state_machine().stream().clone()));
                }
            }
        }
        rings
    }

    /// Each replica's market data feed status, named "core/node": what a sampler reads to
    /// attribute the replay history's resident bytes to the feeds
    /// (`FeedStatus::replay_history_bytes`).
    pub fn feed_statuses(&self) -> Vec<(String, bourse_cluster::marketdata::FeedStatusReader)> {
        let mut readers = Vec::new();
        for core in &self.cores {
            if let CoreRun::Cluster { nodes, feeds } = &core.run {
                for (n, f) in nodes.iter().zip(feeds) {
                    readers.push((format!("{}/{}", core.name, n.id()), f.status_reader()));
                }
            }
        }
        readers
    }

    /// The admin API's view of this venue (replicated cores only: see `admin`).
    pub fn admin_venue(&self) -> Result<Arc<VenueAdmin>> {
        if let Some(a) = self.admin.get() {
            return Ok(Arc::clone(a));
        }
        let mut cores = Vec::new();
        for c in &self.cores {
            match &c.run {
                CoreRun::Cluster { nodes, .. } => cores.push((c.name.clone(), nodes.as_slice())),
                CoreRun::Engine(_) => bail!(
                    "the admin API needs replicated cores: its commands go through the \
                     sequenced, replicated path, where every gateway sees what they did"
                ),
            }
        }
        Ok(Arc::clone(
            self.admin.get_or_init(|| Arc::new(VenueAdmin::new(cores))),
        ))
    }

    /// Starts the admin API on this venue's runtime: its service (auditing into
    /// `audit_path`, counting on `monitor`) behind a listener on `listen`, operators checked
    /// against `credentials`.
    pub fn start_admin(
        &self,
        credentials: Arc<bourse_auth::CredentialStore>,
        audit_path: &std::path::Path,
        listen: SocketAddr,
        monitor: Option<Arc<bourse_monitor::Monitor>>,
    ) -> Result<(Arc<bourse_admin::AdminService>, bourse_admin::AdminServer)> {
        let venue = self.admin_venue()?;
        let service = Arc::new(
            bourse_admin::AdminService::new(venue, audit_path, monitor)
                .with_context(|| format!("audit log {}", audit_path.display()))?,
        );
        let rt = self.runtime.as_ref().context("the deployment is stopped")?;
        let server = rt
            .block_on(bourse_admin::AdminServer::start(
                Arc::clone(&service),
                credentials,
                bourse_admin::AdminServerConfig::new(listen),
            ))
            .with_context(|| format!("admin API on {listen}"))?;
        Ok((service, server))
    }

    /// The deployment's runtime (the admin API's tasks and the schedule driver run on it).
    pub fn runtime_handle(&self) -> Option<tokio::runtime::Handle> {
        self.runtime.as_ref().map(|rt| rt.handle().clone())
    }

    /// The node addresses of each core (empty for in-process cores).
    pub fn node_addrs(&self) -> Vec<(String, Vec<SocketAddr>)> {
        self.cores
            .iter()
            .map(|c| {
                let addrs = match &c.run {
                    CoreRun::Cluster { nodes, .. } => nodes.iter().map(|n| n.addr).collect(),
                    CoreRun::Engine(_) => Vec::new(),
                };
                (c.name.clone(), addrs)
            })
            .collect()
    }

    /// The market data base port of each core that publishes.
    pub fn md_ports(&self) -> Vec<(String, Option<u16>)> {
        self.cores
            .iter()
            .map(|c| (c.name.clone(), c.md_base_port))
            .collect()
    }

    /// Each core's counts since the setup, read from every replica (which must agree).
    pub fn totals(&mut self) -> Result<Vec<CoreTotals>> {
        let rt = self.runtime.as_ref().ok_or_else(|| anyhow!("stopped"))?;
        let gateways = self.gateways.len();
        let mut out = Vec::new();
        for (index, core) in self.cores.iter().enumerate() {
            let (c, live, hash, replicas, by_client) = match &core.run {
                CoreRun::Engine(engine) => {
                    let e = engine.lock().map_err(|_| anyhow!("engine lock poisoned"))?;
                    let (c, live, hash) = (*e.counters(), e.live_orders() as u64, e.state_hash());
                    (c, live, hash, None, None)
                }
                CoreRun::Cluster { nodes, .. } => rt.block_on(async {
                    converge(nodes).await;
                    let mut hashes = Vec::new();
                    for n in nodes {
                        let h = n.state_machine().with_state(|s| s.state_hash()).await;
                        hashes.push(format!("{h:016x}"));
                    }
                    // The counts of the replica that applied the most: if the replicas did not
                    // converge in time (an overloaded run), a lagging follower's counts would
                    // understate what the core did (the hashes above still tell).
                    let mut most = 0;
                    let mut most_applied = None;
                    for (i, n) in nodes.iter().enumerate() {
                        let applied = n.status().await.last_applied_index;
                        if applied > most_applied {
                            (most, most_applied) = (i, applied);
                        }
                    }
                    let (c, live, hash, by_client) = nodes[most]
                        .state_machine()
                        .with_state(|s| {
                            (
                                *s.engine().counters(),
                                s.engine().live_orders() as u64,
                                s.state_hash(),
                                s.applied_by_client().collect::<Vec<_>>(),
                            )
                        })
                        .await;
                    (c, live, hash, Some(hashes), Some(by_client))
                }),
            };
            let b = core.base;
            let sources = match by_client {
                Some(now) => sources::applied_since(&core.base_by_client, now, index, gateways),
                // An in-process engine takes commands from its one gateway alone: the admin
                // API and clearing serve replicated cores only.
                None => bourse_loadgen::AppliedBySource {
                    gateways: c.commands - b.commands,
                    ..Default::default()
                },
            };
            out.push(CoreTotals {
                market: core.name.clone(),
                // The admin's commands (a deposit, a halt) and a clearing run's movements are
                // not the generator's: they are counted apart, in `applied_by_source`.
                commands: sources.gateways,
                applied_by_source: Some(sources),
                orders_accepted: c.orders_accepted - b.orders_accepted,
                orders_rejected: c.orders_rejected - b.orders_rejected,
                trades: c.trades - b.trades,
                cancels: c.cancels - b.cancels,
                replaces: c.replaces - b.replaces,
                live_orders_at_end: live,
                setup_commands: core.setup_commands,
                setup_rejected: core.setup_rejected,
                setup_ms: core.setup_ms,
                state_hash: format!("{hash:016x}"),
                commands_forwarded: Some(core.forwarded.load(Ordering::Relaxed)),
                commands_other: core.other.load(Ordering::Relaxed),
                md_trades: core
                    .md_counter
                    .as_ref()
                    .map(|m| m.settle(c.trades - b.trades)),
                replica_hashes: replicas,
                stage_figures: stage_figures(core),
                md_delay_by_second: core.md_counter.as_ref().map_or_else(Vec::new, |m| {
                    let d = m.delay.lock().expect("publication delay lock");
                    d.by_second
                        .iter()
                        .map(bourse_loadgen::generator::HistogramWire::of)
                        .collect()
                }),
            });
        }
        Ok(out)
    }

    /// Stops the gateways, the market data, the nodes and the runtime, in that order.
    pub fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        self.join_clearing();
        if let Some(c) = self.clearing.take() {
            // The service stops before the cores it follows (its feeds would retry).
            if let Ok(node) = Arc::try_unwrap(c.node) {
                if let Err(e) = node.stop() {
                    eprintln!("clearing service: {e}");
                }
            }
        }
        for g in self.gateways.drain(..) {
            g.shutdown();
        }
        let cores = std::mem::take(&mut self.cores);
        if let Some(rt) = self.runtime.as_ref() {
            for core in cores {
                drop(core.md_counter);
                if let CoreRun::Cluster { nodes, feeds, .. } = core.run {
                    for f in feeds {
                        f.stop();
                    }
                    for n in nodes {
                        rt.block_on(n.shutdown());
                    }
                }
            }
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }

    /// What the report says sits between the generator and the cores.
    pub fn describe(&self) -> String {
        let cores = match self.backend {
            Backend::InProcess => "one in-process engine per market (no replication)".to_string(),
            Backend::Cluster => format!(
                "one replica group of 3 nodes per market (openraft, journal fsync = {:?}, \
                 all nodes in this process)",
                self.fsync
            )
            .to_lowercase(),
        };
        format!(
            "{} {} sessions on {} gateway(s) over loopback TCP, routing by instrument to {}",
            self.sessions,
            match self.protocol {
                SessionProtocol::Binary => "binary (SBE)",
                SessionProtocol::Fix => "FIX 4.4",
            },
            self.gateways.len(),
            cores
        )
    }
}

impl Drop for LocalDeployment {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Deployment for LocalDeployment {
    fn note(&self) -> String {
        self.describe()
    }
    fn sessions(&self) -> u32 {
        self.sessions
    }
    fn connect(&mut self, worker: usize) -> Result<Connection, String> {
        let plan = self
            .plans
            .get_mut(worker)
            .and_then(|p| p.take())
            .ok_or_else(|| format!("no sessions planned for worker {worker}"))?;
        if let Some(remote) = self.remote.as_mut() {
            return remote(worker, &plan);
        }
        let target = bourse_loadgen::gateway::GatewayTarget::connect(&plan)?;
        Ok(Connection::Local(Box::new(target)))
    }
    fn finish(&mut self) -> Result<Vec<CoreTotals>, String> {
        // The admin's and clearing's commands are counted apart from the gateways': all of
        // them must have applied before the counts are read.
        self.join_under_load();
        self.join_clearing();
        if let Some(c) = self.clearing.as_ref() {
            // A run the service's schedule started is counted whole.
            c.node.block_on(c.node.shared().wait_idle());
        }
        // Let the gateways hand over what is still in flight before the counts are read.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline
            && self.gateways.iter().any(|g| {
                g.stats()
                    .requests_pending
                    .load(std::sync::atomic::Ordering::Relaxed)
                    > 0
            })
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.totals().map_err(|e| format!("{e:#}"))
    }
    fn run_starts_at(&mut self, start_unix_ns: u64, series_seconds_max: u32) {
        self.run_start_unix_ns = Some(start_unix_ns);
        for core in &self.cores {
            if let Some(m) = &core.md_counter {
                let mut d = m.delay.lock().expect("publication delay lock");
                d.run_start_ns = Some(start_unix_ns);
                d.seconds_kept = series_seconds_max as usize;
            }
        }
        if let Some(c) = self.clearing.as_mut() {
            match clearing::start(Arc::clone(&c.node), c.runs.clone(), start_unix_ns) {
                Ok(thread) => c.running = Some(thread),
                Err(e) => {
                    self.clearing_done = c
                        .runs
                        .iter()
                        .map(|r| clearing::not_run(r, start_unix_ns, format!("{e}")))
                        .collect()
                }
            }
        }
        if let Err(e) = self.start_under_load(start_unix_ns) {
            self.accounts_added = Some(bourse_loadgen::results::AccountsAdded {
                market: self
                    .under_load
                    .as_ref()
                    .map_or_else(String::new, |u| u.plan.market.clone()),
                accounts: 0,
                commands: 0,
                start_unix_ns,
                end_unix_ns: start_unix_ns,
                outcome: "failed".into(),
                error: Some(format!("{e:#}")),
                traded_accounts: 0,
                positions_held: 0,
            });
        }
    }
    fn clearing_runs(&mut self) -> Vec<bourse_loadgen::results::ClearingRunDone> {
        self.join_clearing();
        let mut runs = std::mem::take(&mut self.clearing_done);
        if let (Some(c), Some(start)) = (self.clearing.as_ref(), self.run_start_unix_ns) {
            runs.extend(clearing::scheduled_runs(&c.node, start));
        }
        runs.sort_by_key(|r| r.start_unix_ns);
        runs
    }
    fn accounts_added(&mut self) -> Option<bourse_loadgen::results::AccountsAdded> {
        self.join_under_load();
        let mut added = self.accounts_added.take()?;
        let traded = self.under_load.as_ref().map_or(0, |u| u.plan.traded);
        if traded > 0 {
            added.traded_accounts = u64::from(traded);
            match self.positions_held(&added.market, traded) {
                Ok(n) => added.positions_held = n,
                Err(e) => {
                    added.error = Some(format!("counting their positions: {e:#}"));
                }
            }
        }
        Some(added)
    }
}

impl LocalDeployment {
    /// Starts a clearing service (as `bourse clearing serve` runs it, in this process) on
    /// every core, keeping its runs, reports and snapshots in `state_dir`, and asks it for
    /// `runs` at their times once the load starts; the load test's results then say what
    /// each run did and trading latency around it. Replicated cores only.
    pub fn clear_under_load(
        &mut self,
        runs: Vec<bourse_loadgen::profile::ClearingRunSpec>,
        state_dir: PathBuf,
    ) -> Result<()> {
        self.start_clearing(ClearingOptions::asked_only(state_dir))?;
        if let Some(c) = self.clearing.as_mut() {
            c.runs = runs;
        }
        Ok(())
    }

    /// Starts a clearing service (as `bourse clearing serve` runs it, in this process) on
    /// every core: operators ask it for runs over HTTP, and with a schedule it runs by itself
    /// at the day's pauses; the load test's results say what every run did and trading
    /// latency around it. Replicated cores only.
    pub fn start_clearing(&mut self, options: ClearingOptions) -> Result<()> {
        let mut cores = Vec::new();
        for c in &self.cores {
            match &c.run {
                CoreRun::Cluster { nodes, .. } => {
                    cores.push(nodes.iter().map(|n| n.addr).collect())
                }
                CoreRun::Engine(_) => bail!(
                    "clearing needs replicated cores: it follows their committed streams and \
                     pays through their sequenced path"
                ),
            }
        }
        let node = clearing::start_node(cores, self.instruments.clone(), options)
            .map_err(|e| anyhow!("clearing service: {e}"))?;
        self.clearing = Some(clearing::ClearingUnderLoad {
            node: Arc::new(node),
            runs: Vec::new(),
            running: None,
        });
        Ok(())
    }

    /// The clearing service started by [`LocalDeployment::start_clearing`].
    pub fn clearing_node(&self) -> Option<&bourse_clearing::ClearingNode> {
        self.clearing.as_ref().map(|c| &*c.node)
    }

    /// Waits for the clearing runs asked under load (each bounded by the service's wait for
    /// the cores' ends and its movements' deadline).
    fn join_clearing(&mut self) {
        if let Some(thread) = self.clearing.as_mut().and_then(|c| c.running.take()) {
            self.clearing_done = thread.join().unwrap_or_default();
        }
    }

    /// Waits for the accounts under load to be added (each command is bounded by the admin
    /// path's deadline), so that the counts read next include every admin command.
    fn join_under_load(&mut self) {
        if let Some(thread) = self.under_load.as_mut().and_then(|u| u.running.take()) {
            self.accounts_added =
                Some(
                    thread
                        .join()
                        .unwrap_or_else(|_| bourse_loadgen::results::AccountsAdded {
                            market: String::new(),
                            accounts: 0,
                            commands: 0,
                            start_unix_ns: 0,
                            end_unix_ns: 0,
                            outcome: "failed".into(),
                            error: Some("the adding thread panicked".into()),
                            traded_accounts: 0,
                            positions_held: 0,
                        }),
                );
        }
    }
}

impl LocalDeployment {
    /// Adds `plan.count` accounts to `plan.market` through the admin path while the load
    /// runs (from `plan.start_s` after the run's start), auditing into `audit_path`; the
    /// load test's results then say what was added and the latency during it.
    pub fn add_accounts_under_load(
        &mut self,
        plan: bourse_loadgen::profile::AccountsUnderLoad,
        audit_path: PathBuf,
    ) {
        self.under_load = Some(under_load::UnderLoad {
            plan,
            audit_path,
            running: None,
        });
    }

    /// The positions with a non-zero net quantity that the first `traded` accounts added
    /// under load hold in `market`, read at its core's leader.
    fn positions_held(&self, market: &str, traded: u32) -> Result<u64> {
        let core = self
            .cores
            .iter()
            .position(|c| c.name == market)
            .with_context(|| format!("no market {market}"))?;
        let venue = self.admin_venue()?;
        let rt = self.runtime.as_ref().context("the deployment is stopped")?;
        let read: admin::EngineRead = Box::new(move |e: &Engine| {
            let held: usize = (0..traded)
                .map(|n| {
                    e.account_positions(AccountId(ACCOUNTS_UNDER_LOAD_ID_BASE + n))
                        .iter()
                        .filter(|(_, qty, _)| qty.0 != 0)
                        .count()
                })
                .sum();
            serde_json::json!(held)
        });
        let v = rt
            .block_on(venue.read(core, read))
            .map_err(|e| anyhow!(e))?;
        v.as_u64().context("a count")
    }

    fn start_under_load(&mut self, start_unix_ns: u64) -> Result<()> {
        let Some(u) = &self.under_load else {
            return Ok(());
        };
        let venue = self.admin_venue()?;
        let service = Arc::new(
            bourse_admin::AdminService::new(venue, &u.audit_path, None)
                .with_context(|| format!("audit log {}", u.audit_path.display()))?,
        );
        let handle = self.runtime_handle().context("the deployment is stopped")?;
        let plan = u.plan.clone();
        let thread = under_load::start(service, handle, plan, start_unix_ns)?;
        if let Some(u) = self.under_load.as_mut() {
            u.running = Some(thread);
        }
        Ok(())
    }
}

/// The limits of the in-process engine of core `index` (the deployment's sizes).
fn in_process_engine_config(spec: &DeploymentSpec, index: usize) -> EngineConfig {
    EngineConfig {
        orders_max: spec.orders_max,
        accounts_max: spec.accounts_max.max(1),
        first_order_id: ((index as u64) << ORDER_ID_CORE_SHIFT).max(1),
        ..EngineConfig::default()
    }
}

/// Refuses a deployment whose cores, all hosted in this process, would together set aside
/// more memory than the machine can give: an in-process engine per market, or three nodes
/// per market on the cluster backend. Checked before anything starts, since an allocation
/// too large for the machine aborts the process instead of failing.
fn check_capacities_fit(spec: &DeploymentSpec) -> Result<()> {
    let preallocations = deployment_preallocations(spec)?;
    bourse_cluster::machine::check_fits_machine(&preallocations).map_err(|why| anyhow!(why))
}

/// The memory every core of `spec` sets aside in this process, by the setting that sizes it.
fn deployment_preallocations(spec: &DeploymentSpec) -> Result<Vec<Preallocation>> {
    let mut preallocations = Vec::new();
    for (index, m) in spec.markets.iter().enumerate() {
        match spec.backend {
            Backend::InProcess => {
                let config = in_process_engine_config(spec, index);
                config
                    .check()
                    .map_err(|why| anyhow!("core {index}: {why}"))?;
                preallocations.extend(config.preallocations());
            }
            Backend::Cluster => {
                let config = core_cluster_config(spec, index, m, [0; 3], None);
                let nodes = config.nodes.len() as u64;
                preallocations.extend(config.preallocations().into_iter().map(|p| p.times(nodes)));
            }
        }
    }
    Ok(preallocations)
}

/// The replica group configuration of core `index` (market `m`) of `spec`: its nodes on
/// 127.0.0.1 at `ports`, its journals under the spec's data directory, its sizes and bounds,
/// and its market data from `md_base_port` when it publishes. The deployment starts its nodes
/// in this process from it; `bourse soak --processes` writes it out for `bourse node`s.
pub fn core_cluster_config(
    spec: &DeploymentSpec,
    index: usize,
    m: &MarketSpec,
    ports: [u16; 3],
    md_base_port: Option<u16>,
) -> ClusterConfig {
    let mut config = ClusterConfig::local(
        1_000 + index as u64,
        spec.data_dir.join(format!("core-{index}-{}", m.name)),
        ports,
    );
    config.fsync = spec.fsync;
    config.orders_max = spec.orders_max;
    config.accounts_max = spec.accounts_max.max(1);
    config.instruments_max = (m.instruments.len() as u32 + 16).max(1_024);
    config.first_order_id = ((index as u64) << ORDER_ID_CORE_SHIFT).max(1);
    // Snapshots of a big core are large; take them rarely in a run of minutes.
    config.snapshot_every_entries = 200_000;
    if let Some(b) = &spec.bounds {
        config.stream_entries_kept = b.stream_entries_kept;
        config.stream_bytes_kept = b.stream_bytes_kept;
        config.snapshot_every_entries = b.snapshot_every_entries;
        config.log_tail_entries_kept = b.log_tail_entries_kept;
        config.log_tail_bytes_kept = b.log_tail_bytes_kept;
    }
    // The section goes into the nodes' config too: the replicated state then keeps the
    // feed's numbering (in its snapshots), so a node restored from a snapshot can publish.
    config.marketdata = md_base_port.map(|base| {
        let mut section = bourse_cluster::marketdata::MarketDataSection {
            base_port: base,
            ..Default::default()
        };
        if let Some(b) = &spec.bounds {
            section.replay_history_packets = b.replay_history_packets;
            section.replay_history_bytes = b.replay_history_bytes;
        }
        section
    });
    config
}

/// Waits (bounded) until every replica has applied the same last entry, which is the
/// leader's last one once nothing more is being submitted.
async fn converge(nodes: &[Node]) {
    let deadline = Instant::now() + CONVERGE_DEADLINE;
    loop {
        let mut applied = Vec::new();
        let mut last_log = None;
        for n in nodes {
            let st = n.status().await;
            applied.push(st.last_applied_index);
            last_log = last_log.max(st.last_log_index);
        }
        if (applied.iter().all(|a| *a == applied[0]) && applied[0] >= last_log)
            || Instant::now() >= deadline
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Applies `setup` to a replica group through many clients at once. Instruments go first
/// (one client, in order); accounts and their deposits follow, each account's pair in order
/// on one client. Returns (commands, rejected).
pub async fn apply_setup(
    nodes: &[(u64, SocketAddr)],
    setup: &[CommandBody],
    core_index: usize,
) -> Result<(u64, u64)> {
    let (first, rest): (Vec<&CommandBody>, Vec<&CommandBody>) = setup
        .iter()
        .partition(|b| matches!(b, CommandBody::AddInstrument(_)));
    let ts = unix_ns();
    let mut rejected = 0u64;
    let client_base = SETUP_CLIENT_ID_BASE + (core_index as u64) * CLIENT_IDS_PER_CORE;
    let mut c = Client::new(nodes.to_vec(), client_base, 1);
    for b in first.iter() {
        let (_, events) = c
            .submit_for_events(&Command::new(ts, (*b).clone()), SETUP_COMMAND_DEADLINE)
            .await
            .map_err(|e| anyhow!("setup: {e}"))?;
        rejected += events.iter().filter(|e| is_reject(e)).count() as u64;
    }
    // Chunks that keep an account's AddAccount and Deposit together and in order.
    let per = rest.len().div_ceil(SETUP_CLIENTS).max(2);
    let per = per + per % 2;
    let chunks: Vec<Vec<CommandBody>> = rest
        .chunks(per)
        .map(|c| c.iter().map(|b| (*b).clone()).collect())
        .collect();
    let mut tasks = Vec::new();
    for (i, chunk) in chunks.into_iter().enumerate() {
        let nodes = nodes.to_vec();
        tasks.push(tokio::spawn(async move {
            let mut c = Client::new(nodes, client_base + 1 + i as u64, 1);
            let mut rejected = 0u64;
            for b in chunk {
                let (_, events) = c
                    .submit_for_events(&Command::new(ts, b), SETUP_COMMAND_DEADLINE)
                    .await
                    .map_err(|e| format!("setup: {e}"))?;
                rejected += events.iter().filter(|e| is_reject(e)).count() as u64;
            }
            Ok::<u64, String>(rejected)
        }));
    }
    for t in tasks {
        rejected += t
            .await
            .map_err(|e| anyhow!("setup task: {e}"))?
            .map_err(|e| anyhow!(e))?;
    }
    Ok((setup.len() as u64, rejected))
}

#[cfg(test)]
mod capacity_tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn spec(backend: Backend, markets: usize, orders_max: u32) -> DeploymentSpec {
        DeploymentSpec {
            markets: (0..markets)
                .map(|i| MarketSpec {
                    name: format!("market{i}"),
                    instruments: Vec::new(),
                    setup: Vec::new(),
                })
                .collect(),
            backend,
            protocol: SessionProtocol::Binary,
            gateways: 1,
            worker_sessions: Vec::new(),
            data_dir: PathBuf::from("/tmp/unused"),
            orders_max,
            accounts_max: 16,
            fsync: FsyncSetting::Never,
            market_data: false,
            core_in_flight_max: None,
            monitor: None,
            extra_fix_sessions: Vec::new(),
            verbose: false,
            bounds: None,
        }
    }

    #[test]
    fn every_node_of_every_market_is_charged_its_order_table() {
        let spec = spec(Backend::Cluster, 2, 4_294_967_294);
        let list = deployment_preallocations(&spec).unwrap();
        let text = bourse_engine::capacity::check_fits(&list, 23 * GIB).unwrap_err();
        assert!(text.starts_with("orders_max 4294967294 needs "), "{text}");
        assert!(text.contains("(6 copies)"), "{text}");
    }

    #[test]
    fn every_in_process_market_is_charged_one_engine() {
        let spec = spec(Backend::InProcess, 3, 4_294_967_294);
        let list = deployment_preallocations(&spec).unwrap();
        let text = bourse_engine::capacity::check_fits(&list, 23 * GIB).unwrap_err();
        assert!(text.contains("(3 copies)"), "{text}");
    }

    #[test]
    fn an_in_process_orders_max_of_zero_is_refused_rather_than_a_panic() {
        let text = deployment_preallocations(&spec(Backend::InProcess, 1, 0))
            .unwrap_err()
            .to_string();
        assert!(text.contains("orders_max 0 is out of range"), "{text}");
    }

    #[test]
    fn a_small_deployment_fits_in_a_gibibyte() {
        for backend in [Backend::InProcess, Backend::Cluster] {
            let list = deployment_preallocations(&spec(backend, 3, 1 << 16)).unwrap();
            assert_eq!(bourse_engine::capacity::check_fits(&list, GIB), Ok(()));
        }
    }
}
