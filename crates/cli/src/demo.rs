//! `bourse demo`: one trading core with simulated participants on equities, FX and futures.
//!
//! Participants (market makers and takers from [`bourse_engine::workload`]) send commands on
//! an open-loop schedule at `--rate` commands per second. Every second the demo prints the
//! seeds' figures: transactions, orders and trades per second; at the end it prints a summary
//! with the maxima, the service time per command type, and proves the core deterministic by
//! restoring its snapshot and comparing state hashes.
//!
//! The live dashboard (bourse-monitor) runs on its own thread at `--dashboard-port` and serves
//! `/metrics` for Prometheus; the engine loop stays a plain thread and only feeds it: sampled
//! stage timestamps (t0 = the command's scheduled arrival, t4 = taken by the core, which has no
//! replication to wait for here, t5 = processed, t6 = its events counted) and the seeds'
//! counts, published every flush interval.
//!
//! Later issues grow this into the full system: a replicated core per market, gateways and
//! market data.

use crate::report::{self, histogram, record, Latency};
use anyhow::{bail, Result};
use bourse_core::*;
use bourse_engine::workload::{Flow, FlowConfig};
use bourse_engine::{Engine, EngineConfig};
use bourse_monitor::{
    clock, DashboardServer, Monitor, MonitorConfig, NodeStatus, Role, Stage, Trace,
};
use clap::Args;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(Args)]
pub struct DemoArgs {
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    seconds: Option<u64>,
    /// Commands per second the participants send.
    #[arg(long, default_value_t = 50_000)]
    rate: u64,
    /// Number of participant accounts.
    #[arg(long, default_value_t = 10_000)]
    accounts: u32,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Port of the live dashboard and /metrics on 127.0.0.1 (0: any free port). Without it,
    /// 8088, or any free port if 8088 is taken.
    #[arg(long)]
    dashboard_port: Option<u16>,
    /// Run without the dashboard, /metrics and probes.
    #[arg(long)]
    no_dashboard: bool,
    /// Monitoring config (TOML: sample_every, tick_ms, [alerts] p99_us_max, ...).
    #[arg(long)]
    monitor_config: Option<std::path::PathBuf>,
    /// Stage probes record one command in this many (overrides the config; 0: probes off).
    #[arg(long)]
    sample_every: Option<u32>,
    /// Keep the dashboard serving this many seconds after the run ends (Ctrl-C ends it early).
    #[arg(long, default_value_t = 0)]
    linger_seconds: u64,
}

/// Default dashboard port when none is given.
const DASHBOARD_PORT_DEFAULT: u16 = 8088;

/// Starts the monitor and its server as the arguments say; `None` with `--no-dashboard`.
fn start_monitor(args: &DemoArgs) -> Result<Option<(std::sync::Arc<Monitor>, DashboardServer)>> {
    if args.no_dashboard {
        return Ok(None);
    }
    let mut config = match &args.monitor_config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
            MonitorConfig::from_toml(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        None => MonitorConfig::default(),
    };
    if let Some(n) = args.sample_every {
        config.sample_every = n;
    }
    config.node_name = "demo (one core, in process)".into();
    let monitor = Monitor::new(config);
    let at = |port| SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let server = match args.dashboard_port {
        Some(port) => DashboardServer::start(monitor.clone(), at(port)).map_err(|e| {
            anyhow::anyhow!(
                "dashboard on 127.0.0.1:{port}: {e} (try --dashboard-port 0 or --no-dashboard)"
            )
        })?,
        None => DashboardServer::start(monitor.clone(), at(DASHBOARD_PORT_DEFAULT))
            .or_else(|_| DashboardServer::start(monitor.clone(), at(0)))?,
    };
    Ok(Some((monitor, server)))
}

/// Figures of one second (or of the whole run).
#[derive(Clone, Copy, Default)]
struct Tally {
    commands: u64,
    /// Successful transactions as the seeds count them: new orders registered, cancels and
    /// replaces that succeeded.
    transactions: u64,
    orders: u64,
    trades: u64,
    cancels: u64,
    rejects: u64,
}

impl Tally {
    fn add(&mut self, events: &[Event]) {
        self.commands += 1;
        for e in events {
            match e {
                Event::OrderAccepted { .. } => {
                    self.orders += 1;
                    self.transactions += 1;
                }
                Event::Trade { .. } => self.trades += 1,
                Event::OrderCancelled {
                    reason: CancelReason::Requested,
                    ..
                } => {
                    self.cancels += 1;
                    self.transactions += 1;
                }
                Event::OrderReplaced { .. } => self.transactions += 1,
                Event::OrderRejected { .. } | Event::CancelRejected { .. } => self.rejects += 1,
                _ => {}
            }
        }
    }
    fn max(&mut self, o: &Tally) {
        self.commands = self.commands.max(o.commands);
        self.transactions = self.transactions.max(o.transactions);
        self.orders = self.orders.max(o.orders);
        self.trades = self.trades.max(o.trades);
        self.cancels = self.cancels.max(o.cancels);
        self.rejects = self.rejects.max(o.rejects);
    }
    fn merge(&mut self, o: &Tally) {
        self.commands += o.commands;
        self.transactions += o.transactions;
        self.orders += o.orders;
        self.trades += o.trades;
        self.cancels += o.cancels;
        self.rejects += o.rejects;
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

pub fn run(args: DemoArgs) -> Result<()> {
    if args.rate == 0 || args.rate > 10_000_000 {
        bail!("--rate must be between 1 and 10,000,000 commands per second");
    }
    if args.accounts == 0 || args.accounts > 4_000_000 {
        bail!("--accounts must be between 1 and 4,000,000");
    }
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        // A second Ctrl-C while stopping falls through to the default handler's exit.
        let _ = ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst));
    }

    let dashboard = start_monitor(&args)?;
    let mut core_monitor = match &dashboard {
        Some((m, _)) => m.core("demo"),
        None => bourse_monitor::CoreMonitor::disabled(),
    };
    let mut engine = Engine::new(EngineConfig::default());
    let mut flow = Flow::new(FlowConfig::three_markets(args.accounts, args.seed));
    let mut events = Vec::with_capacity(1024);
    for body in flow.setup() {
        events.clear();
        engine.apply(&Command::new(now_ns(), body), &mut events);
    }
    println!(
        "bourse demo — one trading core, in process, {} participant accounts",
        report::count(args.accounts as u64)
    );
    println!("  markets:");
    for i in engine.instruments() {
        println!(
            "    {:<8} {:<8} price scale {}, tick {}, lot {}, band ±{}%",
            i.symbol,
            format!("{:?}", i.market).to_lowercase(),
            i.price_scale,
            format_scaled(i.tick.0 as i128, i.price_scale),
            i.lot_size,
            i.band_bps as f64 / 100.0
        );
    }
    match &dashboard {
        Some((m, server)) => println!(
            "  dashboard: {}  (Prometheus: {}metrics; probes sample 1 in {})",
            server.url(),
            server.url(),
            m.config().sample_every
        ),
        None => println!("  dashboard: off"),
    }
    match args.seconds {
        Some(s) => println!(
            "  {} commands/s offered for {s} s (Ctrl-C stops early)\n",
            report::count(args.rate)
        ),
        None => println!(
            "  {} commands/s offered until Ctrl-C\n",
            report::count(args.rate)
        ),
    }
    println!(
        "  {:>4}  {:>10}  {:>12}  {:>10}  {:>10}  {:>10}  {:>10}  {:>12}",
        "sec",
        "commands/s",
        "successful/s",
        "orders/s",
        "trades/s",
        "cancels/s",
        "live",
        "p99 service"
    );

    let mut service = [
        histogram(),
        histogram(),
        histogram(),
        histogram(),
        histogram(),
    ];
    let mut second_service = histogram();
    let mut total = Tally::default();
    let mut peak = Tally::default();
    let interval = Duration::from_nanos(1_000_000_000 / args.rate);
    let start = Instant::now();
    let deadline = args.seconds.map(|s| start + Duration::from_secs(s));
    let mut next_send = start;
    let mut second = Tally::default();
    let mut second_end = start + Duration::from_secs(1);
    let mut seconds = 0u64;
    loop {
        let now = Instant::now();
        if stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| now >= d) {
            break;
        }
        if now >= second_end {
            seconds += 1;
            println!(
                "  {:>4}  {:>10}  {:>12}  {:>10}  {:>10}  {:>10}  {:>10}  {:>12}",
                seconds,
                report::count(second.commands),
                report::count(second.transactions),
                report::count(second.orders),
                report::count(second.trades),
                report::count(second.cancels),
                report::count(engine.live_orders() as u64),
                report::ns(second_service.value_at_quantile(0.99))
            );
            total.merge(&second);
            peak.max(&second);
            core_monitor.set_live_orders(engine.live_orders() as u64);
            if let Some((m, _)) = &dashboard {
                // Once a second, off the per-command path: the view takes a short lock.
                let applied = total.commands;
                m.cluster().report(NodeStatus {
                    id: 1,
                    role: Role::Standalone,
                    term: 0,
                    commit_index: applied,
                    applied_index: applied,
                    state_hash: None,
                });
            }
            second = Tally::default();
            second_service.reset();
            second_end += Duration::from_secs(1);
            continue;
        }
        core_monitor.maybe_flush(clock::ns_of(now));
        if now < next_send {
            // Sleep most of the gap; a 2-core machine has no core to spin on.
            let gap = next_send - now;
            if gap > Duration::from_micros(200) {
                std::thread::sleep(gap - Duration::from_micros(100));
            } else {
                std::thread::yield_now();
            }
            continue;
        }
        // Send every command that is due (open loop: a slow second is caught up, not skipped).
        let mut sent = 0;
        while next_send <= now && sent < 10_000 {
            let sampled = core_monitor.sample();
            let cmd = Command::new(now_ns(), flow.next_command());
            events.clear();
            let t0 = Instant::now();
            engine.apply(&cmd, &mut events);
            let t1 = Instant::now();
            let ns = t1.duration_since(t0).as_nanos() as u64;
            record(
                &mut service[CommandKind::ALL
                    .iter()
                    .position(|k| *k == cmd.kind())
                    .unwrap()],
                ns,
            );
            record(&mut second_service, ns);
            flow.observe(&events);
            second.add(&events);
            core_monitor.on_command(cmd.kind(), &events);
            if sampled {
                // The clock reads around apply serve as stamps; one more read ends the trace.
                let mut trace = Trace::new(cmd.kind());
                trace.stamp_at(Stage::SocketRead, clock::ns_of(next_send));
                trace.stamp_at(Stage::Committed, clock::ns_of(t0));
                trace.stamp_at(Stage::Processed, clock::ns_of(t1));
                trace.stamp(Stage::Encoded);
                core_monitor.on_trace(&trace);
            }
            next_send += interval;
            sent += 1;
        }
    }
    total.merge(&second);
    let elapsed = start.elapsed().as_secs_f64();
    core_monitor.set_live_orders(engine.live_orders() as u64);
    core_monitor.flush();

    println!("\nsummary after {elapsed:.1} s");
    println!(
        "  transactions (successful): {:>12}   max per second {:>10}",
        report::count(total.transactions),
        report::count(peak.transactions)
    );
    println!(
        "  commands:                  {:>12}   max per second {:>10}",
        report::count(total.commands),
        report::count(peak.commands)
    );
    println!(
        "  orders registered:         {:>12}   max per second {:>10}",
        report::count(total.orders),
        report::count(peak.orders)
    );
    println!(
        "  trades:                    {:>12}   max per second {:>10}",
        report::count(total.trades),
        report::count(peak.trades)
    );
    println!(
        "  cancels:                   {:>12}",
        report::count(total.cancels)
    );
    println!(
        "  rejects:                   {:>12}",
        report::count(total.rejects)
    );
    println!(
        "  orders live at the end:    {:>12}",
        report::count(engine.live_orders() as u64)
    );
    println!("\n  service time of the core per command (Engine::apply, clock read around it):");
    println!("{}", report::latency_header());
    for (k, h) in CommandKind::ALL.iter().zip(&service) {
        if !h.is_empty() {
            println!("{}", report::latency_row(k.name(), &Latency::of(h)));
        }
    }
    let hash = engine.state_hash();
    let restored = Engine::restore(&engine.snapshot())?;
    let same = restored.state_hash() == hash;
    println!(
        "\n  state hash {hash:016x}; snapshot restored to {} hash",
        if same { "the same" } else { "A DIFFERENT" }
    );
    engine
        .check_invariants()
        .map_err(|e| anyhow::anyhow!("invariant broken: {e}"))?;
    println!("  invariants hold: no crossed book, reservations and positions consistent");
    if !same {
        bail!("snapshot restore changed the state hash");
    }
    if let Some((m, server)) = &dashboard {
        if args.linger_seconds > 0 {
            m.cluster().report(NodeStatus {
                id: 1,
                role: Role::Standalone,
                term: 0,
                commit_index: total.commands,
                applied_index: total.commands,
                state_hash: Some(hash),
            });
            println!(
                "\n  dashboard stays at {} for {} s (Ctrl-C ends it)",
                server.url(),
                args.linger_seconds
            );
            let until = Instant::now() + Duration::from_secs(args.linger_seconds);
            while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                // The standalone node is alive while it lingers.
                m.cluster().report(NodeStatus {
                    id: 1,
                    role: Role::Standalone,
                    term: 0,
                    commit_index: total.commands,
                    applied_index: total.commands,
                    state_hash: Some(hash),
                });
            }
        }
    }
    Ok(())
}
