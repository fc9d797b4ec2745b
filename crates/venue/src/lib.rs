//! A local deployment of the whole venue in this process: a trading core per market (a
//! replica group of three `bourse_cluster::Node`s on a tokio runtime, or an in-process engine),
//! market data published by the nodes, one or more gateways in front of every core, and the
//! sessions the load generator (or the demo's participants) trade through.
//!
//! [`LocalDeployment::start`] takes a [`DeploymentSpec`] (markets with their instruments and
//! setup commands, the sessions each generator worker gets, the backend) and brings it all up
//! on 127.0.0.1 with ports chosen free: the nodes first, then the instruments and funded
//! accounts, applied through the cluster client (many clients at once, so the setup of
//! thousands of accounts is batched by the nodes), then the gateways with `[[cores]]` routing
//! each market's instruments to its core. [`LocalDeployment::stop`] takes it down in the
//! reverse order. It implements `bourse_loadgen::Deployment`, so a profile runs against it.
//!
//! Order ids: core `i` numbers its orders from `i << ORDER_ID_CORE_SHIFT` (at least 1), so
//! one gateway can serve every core and an order id names one order across the venue.
//!
//! Accounting: every gateway's link to a core is wrapped in a counter of the commands the
//! gateway passed on, so that the report can check that each core applied exactly what the
//! gateways forwarded (a gateway answers some requests itself: an unknown order, a full
//! queue), and the cores' own counters are read at the end from every replica, whose state
//! hashes must agree.

mod host;
pub use host::{sample_of, tune_allocator};

use anyhow::{anyhow, bail, Context, Result};
use bourse_cluster::tokio;
use bourse_cluster::{Client, ClusterConfig, FsyncSetting, Node};
use bourse_core::*;
use bourse_engine::in_process::InProcessCore;
use bourse_engine::{Engine, EngineConfig, ORDER_ID_CORE_SHIFT};
use bourse_gateway::config::CoreEntry;
use bourse_gateway::{CoreLink, CoreOutput, GatewayConfig, GatewayHandle};
use bourse_loadgen::gateway::{SessionPlan, SessionProtocol, WorkerPlan};
use bourse_loadgen::{Connection, CoreTotals, Deployment};
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
/// Client ids of the setup clients start here (gateways use 1..=gateways).
const SETUP_CLIENT_ID_BASE: u64 = 1 << 32;

/// What runs the trading cores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// One engine per market inside the gateway's process (no replication).
    InProcess,
    /// One replica group of three nodes per market.
    Cluster,
}

/// One market: its core's name, instruments and setup commands.
pub struct MarketSpec {
    pub name: String,
    pub instruments: Vec<Instrument>,
    /// Instruments, accounts and deposits, applied in order before the gateways start.
    pub setup: Vec<CommandBody>,
}

/// Everything the deployment needs.
pub struct DeploymentSpec {
    pub markets: Vec<MarketSpec>,
    pub backend: Backend,
    pub protocol: SessionProtocol,
    /// Gateways in front of the cores; sessions are spread over them.
    pub gateways: usize,
    /// For each generator worker, the accounts of each of its sessions.
    pub worker_sessions: Vec<Vec<Vec<u32>>>,
    /// Journals, snapshots and FIX stores go here.
    pub data_dir: PathBuf,
    pub orders_max: u32,
    pub accounts_max: u32,
    pub fsync: FsyncSetting,
    /// Publish market data from the nodes (cluster backend only).
    pub market_data: bool,
    /// Gateway 0 reports into this monitor (its owner serves the dashboard and `/metrics`).
    pub monitor: Option<Arc<bourse_monitor::Monitor>>,
    /// FIX sessions for people (`bourse order`) on gateway 0: (CompID, accounts).
    pub extra_fix_sessions: Vec<(String, Vec<u32>)>,
    /// Print what starts, as it starts.
    pub verbose: bool,
}

/// A core link that counts what the gateway passes on to the core.
struct CountingLink {
    inner: Box<dyn CoreLink>,
    forwarded: Arc<AtomicU64>,
    /// Commands from sessions outside the generator (a person's `bourse order`).
    other: Arc<AtomicU64>,
    /// Gateway session numbers (`RequestKey::session`) up to this one are not the
    /// generator's: the people's FIX sessions come first in the gateway's configuration.
    other_sessions_max: u32,
}

impl CoreLink for CountingLink {
    fn submit(
        &mut self,
        key: bourse_gateway::RequestKey,
        command: Command,
    ) -> Result<(), bourse_gateway::SubmitError> {
        let r = self.inner.submit(key, command);
        // Session 0 is the gateway's own administration (bootstrap), not client traffic.
        if r.is_ok() && key.session != 0 {
            if key.session <= self.other_sessions_max {
                self.other.fetch_add(1, Ordering::Relaxed);
            } else {
                self.forwarded.fetch_add(1, Ordering::Relaxed);
            }
        }
        r
    }
    fn try_recv(&mut self) -> Option<CoreOutput> {
        self.inner.try_recv()
    }
    fn set_notify(&mut self, notify: Arc<dyn Fn() + Send + Sync>) {
        self.inner.set_notify(notify)
    }
}

/// How many stamps of one side of the publication delay (trades applied, or trades read from
/// the feed) may wait for the other side's before the oldest are dropped: this bounds the
/// timer's memory when one side never comes (a trade of a lost packet that the subscriber
/// recovered from the snapshot loop instead of a replay).
const PUB_DELAY_PENDING_MAX: usize = 262_144;
/// Seconds of a run the publication delay is kept for per second (for the report's load
/// ranges); trades read later count in the overall figure only.
const PUB_DELAY_SECONDS_MAX: usize = 3_600;
/// How long the feed's subscriber blocks waiting for a datagram before it checks whether to
/// stop and runs its gap recovery.
const MD_WAIT_MS: u16 = 2;

/// Market data publication delay of one core: for each trade, from the moment the core
/// applied the log entry that made it to the moment the feed's subscriber read the first
/// copy (feed A or B) of its Trade record. The apply is seen by two subscribers of the
/// leader's committed stream, both woken by it: this deployment's entry timer, and the
/// node's publisher, which stamps the moment it took the entry as the packet's SendingTime;
/// the earlier of the two is the apply's time (whichever woke first is the closer to it).
/// Every stamp is read from the one wall clock of this process
/// (`bourse_marketdata::now_ns`, which the SendingTime also comes from). Whichever of the
/// apply and the read comes first waits, keyed by trade id (unique within a core).
struct PubDelay {
    applied: std::collections::BTreeMap<u64, u64>,
    /// Trade id -> (read at, the packet's SendingTime).
    received: std::collections::BTreeMap<u64, (u64, u64)>,
    /// The apply to the read.
    delay: hdrhistogram::Histogram<u64>,
    /// The packet's SendingTime to the read: the send, the loopback, the subscriber's
    /// wake-up (the part of the delay after the publisher took the entry).
    send_to_read: hdrhistogram::Histogram<u64>,
    /// Trades whose packet's SendingTime came before the entry timer's stamp (the publisher
    /// woke first, so its stamp stood for the apply).
    publisher_first: u64,
    /// When the generator's second 0 begins (ns since the Unix epoch), once the run starts.
    run_start_ns: Option<u64>,
    /// The delay by the generator's second in which the record was read.
    by_second: Vec<hdrhistogram::Histogram<u64>>,
}

impl PubDelay {
    fn new() -> PubDelay {
        PubDelay {
            applied: Default::default(),
            received: Default::default(),
            delay: bourse_loadgen::generator::second_histogram(),
            send_to_read: bourse_loadgen::generator::second_histogram(),
            publisher_first: 0,
            run_start_ns: None,
            by_second: Vec::new(),
        }
    }

    fn pair(&mut self, applied_ns: u64, read_ns: u64, sending_ns: u64) {
        let from = if sending_ns < applied_ns {
            self.publisher_first += 1;
            sending_ns
        } else {
            applied_ns
        };
        let ns = read_ns.saturating_sub(from);
        bourse_loadgen::generator::record(&mut self.delay, ns);
        let Some(start) = self.run_start_ns.filter(|s| read_ns >= *s) else {
            return;
        };
        let second = ((read_ns - start) / 1_000_000_000) as usize;
        if second >= PUB_DELAY_SECONDS_MAX {
            return;
        }
        while self.by_second.len() <= second {
            self.by_second
                .push(bourse_loadgen::generator::second_histogram());
        }
        bourse_loadgen::generator::record(&mut self.by_second[second], ns);
    }

    fn applied(&mut self, trade_id: u64, at_ns: u64) {
        match self.received.remove(&trade_id) {
            Some((read, sending)) => self.pair(at_ns, read, sending),
            None => {
                self.applied.insert(trade_id, at_ns);
                while self.applied.len() > PUB_DELAY_PENDING_MAX {
                    self.applied.pop_first();
                }
            }
        }
    }

    fn received(&mut self, trade_id: u64, read_ns: u64, sending_ns: u64) {
        bourse_loadgen::generator::record(
            &mut self.send_to_read,
            read_ns.saturating_sub(sending_ns),
        );
        match self.applied.remove(&trade_id) {
            Some(a) => self.pair(a, read_ns, sending_ns),
            None => {
                self.received.insert(trade_id, (read_ns, sending_ns));
                while self.received.len() > PUB_DELAY_PENDING_MAX {
                    self.received.pop_first();
                }
            }
        }
    }
}

/// Counts the trades one core publishes on its trades channel (feeds A and B, gaps
/// recovered from the replay service), and times each one's publication ([`PubDelay`]), on
/// a thread of its own.
struct MdCounter {
    trades: Arc<AtomicU64>,
    delay: Arc<Mutex<PubDelay>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MdCounter {
    fn start(base_port: u16) -> Result<MdCounter> {
        use bourse_marketdata::udp::{FeedAddrs, UdpSubscriber};
        let addrs = FeedAddrs::localhost(base_port);
        let mut sub = UdpSubscriber::bind(
            &addrs,
            &[bourse_marketdata::Channel::Trades],
            bourse_marketdata::SubscriberConfig::default(),
            true,
        )
        .with_context(|| format!("bind the market data feeds at {base_port}"))?;
        let trades = Arc::new(AtomicU64::new(0));
        let delay = Arc::new(Mutex::new(PubDelay::new()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (t, st, d) = (Arc::clone(&trades), Arc::clone(&stop), Arc::clone(&delay));
        let thread = std::thread::Builder::new()
            .name("bourse-md-count".into())
            .spawn(move || {
                // The highest MsgSeqNum read so far: a packet at or below it is the other
                // feed's copy (or a replay) of one already timed.
                let mut seq_seen = 0u32;
                let mut ids: Vec<u64> = Vec::with_capacity(64);
                let mut on_packet = |_: bourse_marketdata::Channel,
                                     _: bourse_marketdata::Feed,
                                     datagram: &[u8],
                                     read_ns: u64| {
                    use bourse_marketdata::wire::market_data::{parse_packet, Message};
                    let Ok(mut delay) = d.lock() else { return };
                    let Ok(p) = parse_packet(datagram) else {
                        return;
                    };
                    if p.header.msg_seq_num <= seq_seen {
                        return;
                    }
                    seq_seen = p.header.msg_seq_num;
                    ids.clear();
                    ids.extend(p.messages().filter_map(|m| match m {
                        Message::Trade(t) => Some(t.trade_id()),
                        _ => None,
                    }));
                    for id in &ids {
                        delay.received(*id, read_ns, p.header.sending_time_ns);
                    }
                };
                while !st.load(Ordering::Relaxed) {
                    if sub.poll_once(&mut on_packet) == 0 {
                        // Blocks until a datagram arrives, so a receipt is stamped when the
                        // datagram is there, not when a sleep ends.
                        if sub.wait_readable(MD_WAIT_MS).is_err() {
                            std::thread::sleep(Duration::from_millis(u64::from(MD_WAIT_MS)));
                        }
                    }
                    t.store(sub.sub.stats().trades, Ordering::Relaxed);
                }
            })
            .context("market data thread")?;
        Ok(MdCounter {
            trades,
            delay,
            stop,
            thread: Some(thread),
        })
    }

    /// The trades seen, once they reach `expected` or the feed has been quiet for a while.
    fn settle(&self, expected: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut last = (self.trades.load(Ordering::Relaxed), Instant::now());
        loop {
            let n = self.trades.load(Ordering::Relaxed);
            if n >= expected || Instant::now() >= deadline {
                return n;
            }
            if n != last.0 {
                last = (n, Instant::now());
            } else if last.1.elapsed() > Duration::from_secs(2) {
                return n;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for MdCounter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

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

use bourse_cluster::link::LegTimes;

/// Entries the replica-spread timer remembers while waiting for the other replicas.
const SPREAD_ENTRIES_MAX: usize = 65_536;

/// What [`time_entries`] measures of each entry a core applies.
#[derive(Clone, Default)]
struct EntryLegs {
    /// From the first replica's journal append of the entry (the leader's) to the second's
    /// (a quorum holds it): sending it to a follower, its append and fsync.
    quorum_append: LegTimes,
    /// From that second append to the first replica applying the entry: the follower's
    /// answer, the commit, the apply.
    commit_apply: LegTimes,
    /// How much later the last replica applied the entry than the first.
    apply_spread: LegTimes,
}

/// Appends remembered per replica while their entries are awaited.
const APPENDS_KEPT: usize = 8_192;

/// Times every entry a core applies, from the replicas' journals' append rings (when each
/// append, fsync included, completed) and their committed streams (when each replica
/// applied it), all on this process's one clock: one task per replica's stream stamps each
/// entry as it arrives, this one pairs the stamps. The task that delivers an entry first
/// (normally the leader's stream, which applies first) also stamps the apply of each of its
/// trades for the publication delay (`pub_delay`). Ends when the streams end.
async fn time_entries(
    subs: Vec<bourse_cluster::Subscription>,
    journal_dirs: Vec<PathBuf>,
    out: Arc<Mutex<EntryLegs>>,
    pub_delay: Option<Arc<Mutex<PubDelay>>>,
) {
    use std::collections::BTreeMap;
    let replicas = subs.len() as u8;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(u64, Instant)>(SPREAD_ENTRIES_MAX);
    // The highest index any replica's task has delivered: a task that moves it is the first.
    let first_seen = Arc::new(AtomicU64::new(0));
    for mut sub in subs {
        let tx = tx.clone();
        let first_seen = Arc::clone(&first_seen);
        let pub_delay = pub_delay.clone();
        tokio::spawn(async move {
            let mut trades: Vec<u64> = Vec::new();
            while let Ok(entry) = sub.recv().await {
                let at = Instant::now();
                if let Some(d) = &pub_delay {
                    if first_seen.fetch_max(entry.index, Ordering::Relaxed) < entry.index {
                        stamp_trades(&entry, bourse_marketdata::now_ns(), d, &mut trades);
                    }
                }
                if tx.send((entry.index, at)).await.is_err() {
                    return;
                }
            }
        });
    }
    drop(tx);
    let mut journals: Vec<Option<Arc<bourse_journal::JournalStats>>> =
        journal_dirs.iter().map(|_| None).collect();
    // Per replica: last index of an append -> (its first index, completed at).
    let mut appends: Vec<BTreeMap<u64, (u64, Instant)>> =
        journal_dirs.iter().map(|_| BTreeMap::new()).collect();
    let mut seen: BTreeMap<u64, (Instant, u8)> = BTreeMap::new();
    while let Some((index, at)) = rx.recv().await {
        let e = seen.entry(index).or_insert((at, 0));
        e.1 += 1;
        let count = e.1;
        if count == 1 {
            // The first apply: a quorum has appended the entry by now.
            let mut times = Vec::new();
            for (n, dir) in journal_dirs.iter().enumerate() {
                if journals[n].is_none() {
                    journals[n] = bourse_journal::journal_stats_for(dir);
                }
                let Some(j) = &journals[n] else { continue };
                let after = appends[n].keys().next_back().copied();
                for (first, last, done) in j.append_times_after(after) {
                    appends[n].insert(last, (first, done));
                }
                while appends[n].len() > APPENDS_KEPT {
                    appends[n].pop_first();
                }
                if let Some((_, &(first, done))) = appends[n].range(index..).next() {
                    if first <= index {
                        times.push(done);
                    }
                }
            }
            times.sort();
            if times.len() >= 2 {
                let mut o = out.lock().expect("entry legs lock");
                o.quorum_append
                    .observe(times[1].saturating_duration_since(times[0]).as_nanos() as u64);
                o.commit_apply
                    .observe(at.saturating_duration_since(times[1]).as_nanos() as u64);
            }
        }
        if count == replicas {
            let first = seen.remove(&index).map_or(at, |e| e.0);
            out.lock()
                .expect("entry legs lock")
                .apply_spread
                .observe(at.saturating_duration_since(first).as_nanos() as u64);
        }
        while seen.len() > SPREAD_ENTRIES_MAX {
            seen.pop_first();
        }
    }
}

/// Stamps the apply of every trade of `entry` (requests that applied; a duplicate's events
/// were published when it first applied) for the publication delay.
fn stamp_trades(
    entry: &bourse_cluster::stream::CommittedEntry,
    at_ns: u64,
    delay: &Mutex<PubDelay>,
    trades: &mut Vec<u64>,
) {
    trades.clear();
    for r in &entry.requests {
        if r.kind != bourse_cluster::OutcomeKind::Applied || r.events.is_empty() {
            continue;
        }
        if let Ok(events) = bourse_core::codec::decode_events(&r.events) {
            trades.extend(events.iter().filter_map(|e| match e {
                Event::Trade { trade_id, .. } => Some(trade_id.0),
                _ => None,
            }));
        }
    }
    if trades.is_empty() {
        return;
    }
    let Ok(mut d) = delay.lock() else { return };
    for id in trades.iter() {
        d.applied(*id, at_ns);
    }
}

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
    pub remote: Option<Box<dyn FnMut(usize, &WorkerPlan) -> Result<Connection, String>>>,
    stopped: bool,
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
            let first_order_id = ((index as u64) << ORDER_ID_CORE_SHIFT).max(1);
            let t0 = Instant::now();
            let core = match spec.backend {
                Backend::InProcess => {
                    let mut engine = Engine::new(EngineConfig {
                        orders_max: spec.orders_max,
                        accounts_max: spec.accounts_max.max(1),
                        first_order_id,
                        ..EngineConfig::default()
                    });
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
                Backend::Cluster => self.start_cluster(spec, index, m, first_order_id)?,
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
        first_order_id: u64,
    ) -> Result<Core> {
        // Ports below the ephemeral range (see `bourse_testkit`): one found free by a bind to
        // port 0 could be taken by a parallel deployment's outgoing connection.
        let node_base = bourse_testkit::try_free_port_block(3)?;
        let ports = [node_base, node_base + 1, node_base + 2];
        let mut config = ClusterConfig::local(
            1_000 + index as u64,
            spec.data_dir.join(format!("core-{index}-{}", m.name)),
            ports,
        );
        config.fsync = spec.fsync;
        config.orders_max = spec.orders_max;
        config.accounts_max = spec.accounts_max.max(1);
        config.instruments_max = (m.instruments.len() as u32 + 16).max(1_024);
        config.first_order_id = first_order_id;
        // Snapshots of a big core are large; take them rarely in a run of minutes.
        config.snapshot_every_entries = 200_000;
        let md_base_port = if spec.market_data {
            Some(bourse_testkit::try_free_port_block(40)?)
        } else {
            None
        };
        let md_section = md_base_port.map(|base| bourse_cluster::marketdata::MarketDataSection {
            base_port: base,
            ..Default::default()
        });
        // The section goes into the nodes' config too: the replicated state then keeps the
        // feed's numbering (in its snapshots), so a node restored from a snapshot can publish.
        config.marketdata = md_section.clone();
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
        let base = rt.block_on(async {
            converge(&nodes).await;
            nodes[0]
                .state_machine()
                .with_state(|s| *s.engine().counters())
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
                        Backend::Cluster => Some(1 + g as u64),
                        Backend::InProcess => None,
                    },
                    bootstrap: Some(false),
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
                        let (link, watch) =
                            cluster_link(nodes, 1 + g as u64, config.gateway.core_queue_depth)?;
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
        let mut out = Vec::new();
        for core in &self.cores {
            let (c, live, hash, replicas) = match &core.run {
                CoreRun::Engine(engine) => {
                    let e = engine.lock().map_err(|_| anyhow!("engine lock poisoned"))?;
                    (*e.counters(), e.live_orders() as u64, e.state_hash(), None)
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
                    let (c, live, hash) = nodes[most]
                        .state_machine()
                        .with_state(|s| {
                            (
                                *s.engine().counters(),
                                s.engine().live_orders() as u64,
                                s.state_hash(),
                            )
                        })
                        .await;
                    (c, live, hash, Some(hashes))
                }),
            };
            let b = core.base;
            out.push(CoreTotals {
                market: core.name.clone(),
                commands: c.commands - b.commands,
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
    fn run_starts_at(&mut self, start_unix_ns: u64) {
        for core in &self.cores {
            if let Some(m) = &core.md_counter {
                let mut d = m.delay.lock().expect("publication delay lock");
                d.run_start_ns = Some(start_unix_ns);
            }
        }
    }
}

/// What the deployment timed of one core's path over the run (see
/// `bourse_loadgen::CoreTotals::stage_figures`).
fn stage_figures(core: &Core) -> Vec<bourse_loadgen::StageFigure> {
    let mut out = Vec::new();
    if core.links.is_empty() {
        return out;
    }
    let mut legs = bourse_cluster::link::LinkLegs::default();
    for w in &core.links {
        let l = w.status().legs;
        legs.answered.add(&l.answered);
        legs.streamed_after_answer.add(&l.streamed_after_answer);
        legs.round_trip.add(&l.round_trip);
    }
    let mut push = |name: &str, what: &str, latency| {
        out.push(bourse_loadgen::StageFigure {
            name: name.into(),
            what: what.into(),
            latency,
        })
    };
    push(
        "link_round_trip",
        "a gateway's link: command taken to its outputs handed to the gateway",
        Option::unwrap_or_default(legs.round_trip.percentiles()),
    );
    push(
        "group_answer",
        "a gateway's link: command taken to the replica group's answer",
        Option::unwrap_or_default(legs.answered.percentiles()),
    );
    push(
        "stream_after_answer",
        "a gateway's link: the group's answer to the entry on the committed stream",
        Option::unwrap_or_default(legs.streamed_after_answer.percentiles()),
    );
    // The journals' fsyncs since the setup, over every replica.
    let bounds = bourse_journal::FSYNC_BUCKETS_NS;
    let mut buckets = vec![0u64; bounds.len() + 1];
    let (mut sum_ns, mut count) = (0u64, 0u64);
    for (dir, base) in &core.journals {
        let Some(now) = bourse_journal::journal_stats_for(dir).map(|j| j.snapshot().fsync) else {
            continue;
        };
        for (i, b) in buckets.iter_mut().enumerate() {
            let at = |r: &bourse_journal::stats::HistogramReading| r.buckets.get(i).copied();
            *b += at(&now).unwrap_or(0).saturating_sub(at(base).unwrap_or(0));
        }
        sum_ns += now.sum_ns.saturating_sub(base.sum_ns);
        count += now.count.saturating_sub(base.count);
    }
    if count > 0 {
        let mut all: Vec<u64> = bounds.to_vec();
        all.push(bounds[bounds.len() - 1]);
        let cumulative: Vec<u64> = buckets
            .iter()
            .scan(0u64, |acc, c| {
                *acc += c;
                Some(*acc)
            })
            .collect();
        push(
            "journal_fsync",
            "one fsync of a replica's journal",
            Option::unwrap_or_default(bourse_monitor::ltp::percentiles_from_buckets(
                &all,
                &cumulative,
                sum_ns,
                count,
            )),
        );
    }
    if let Some(legs) = &core.spread {
        let t = legs.lock().expect("entry legs lock").clone();
        push(
            "quorum_append",
            "an entry's first journal append (the leader's) to its second (a quorum holds it)",
            Option::unwrap_or_default(t.quorum_append.percentiles()),
        );
        push(
            "commit_apply",
            "an entry's second journal append to the first replica applying it",
            Option::unwrap_or_default(t.commit_apply.percentiles()),
        );
        push(
            "replica_apply_spread",
            "how much later the last replica applied an entry than the first",
            Option::unwrap_or_default(t.apply_spread.percentiles()),
        );
    }
    if let Some(md) = &core.md_counter {
        let d = md.delay.lock().expect("publication delay lock");
        out.push(bourse_loadgen::StageFigure {
            name: "md_publication_delay".into(),
            what: format!(
                "a trade's apply (the earlier of the entry timer's stamp and the publisher's \
                 SendingTime; the publisher's for {} of {} trades) to its Trade record read \
                 from the feed (first of A and B)",
                d.publisher_first,
                d.delay.len()
            ),
            latency: bourse_loadgen::results::Latency::of(&d.delay),
        });
        out.push(bourse_loadgen::StageFigure {
            name: "md_send_to_read".into(),
            what: "a Trade record's packet SendingTime (the publisher took the entry) to its \
                   read from the feed (first of A and B)"
                .into(),
            latency: bourse_loadgen::results::Latency::of(&d.send_to_read),
        });
    }
    out
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
async fn apply_setup(
    nodes: &[(u64, SocketAddr)],
    setup: &[CommandBody],
    core_index: usize,
) -> Result<(u64, u64)> {
    let (first, rest): (Vec<&CommandBody>, Vec<&CommandBody>) = setup
        .iter()
        .partition(|b| matches!(b, CommandBody::AddInstrument(_)));
    let ts = unix_ns();
    let mut rejected = 0u64;
    let client_base = SETUP_CLIENT_ID_BASE + (core_index as u64) * 1_000;
    let mut c = Client::new(nodes.to_vec(), client_base, 1);
    for b in first.iter() {
        let ack = c
            .submit(&Command::new(ts, (*b).clone()), SETUP_COMMAND_DEADLINE)
            .await
            .map_err(|e| anyhow!("setup: {e}"))?;
        rejected += ack.events.iter().filter(|e| is_reject(e)).count() as u64;
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
                let ack = c
                    .submit(&Command::new(ts, b), SETUP_COMMAND_DEADLINE)
                    .await
                    .map_err(|e| format!("setup: {e}"))?;
                rejected += ack.events.iter().filter(|e| is_reject(e)).count() as u64;
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

/// The gateway's link to a replicated core: a `ClusterLink` (pipelined submissions, every
/// output from the group's committed stream) under the gateway's own client id.
fn cluster_link(
    nodes: &[Node],
    client_id: u64,
    queue_depth: usize,
) -> Result<(Box<dyn CoreLink>, bourse_cluster::link::ClusterLinkWatch)> {
    let config = bourse_cluster::link::ClusterLinkConfig::new(
        nodes.iter().map(|n| n.addr).collect(),
        client_id,
        queue_depth,
    );
    let link = bourse_cluster::link::ClusterLink::start(config).map_err(|e| anyhow!(e))?;
    let watch = link.watch();
    Ok((Box::new(link), watch))
}
