//! `bourse bench engine` and `bourse bench capacity`.
//!
//! The engine benchmark measures one core on one thread with no I/O. It first generates the
//! command stream against a shadow engine (so generating flow costs nothing in the measured
//! runs), then replays the identical stream from the same starting snapshot three ways:
//! back to back for throughput; with a clock read around each command for its service time;
//! and open loop at fixed offered rates, where each command's latency counts from the moment
//! it was *scheduled*, so a stall cannot hide itself (no coordinated omission). Every replay
//! must end in the shadow's state hash, which proves the measured runs did the same work.

use super::common::{self, histogram, record, Latency, Machine};
use anyhow::{bail, Result};
use bourse_core::*;
use bourse_engine::workload::{Flow, FlowConfig};
use bourse_engine::{Engine, EngineConfig};
use bourse_monitor::core_probe::EngineCounts;
use bourse_monitor::{clock, CoreMonitor, DashboardServer, Monitor, MonitorConfig, Stage, Trace};
use clap::Args;
use hdrhistogram::Histogram;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct EngineBenchArgs {
    /// Which mix: exchange-core (a), moex (b), or all.
    #[arg(long, default_value = "all")]
    scenario: String,
    /// Commands measured per run.
    #[arg(long, default_value_t = 2_000_000)]
    ops: usize,
    /// Commands run before measuring, to reach a steady book.
    #[arg(long, default_value_t = 200_000)]
    warmup: usize,
    /// Offered rates for the open-loop runs, commands per second (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "1000000")]
    rates: Vec<u64>,
    /// Seconds of each open-loop run at most.
    #[arg(long, default_value_t = 2)]
    open_loop_seconds: u64,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Print one JSON object per scenario and mode instead of tables.
    #[arg(long)]
    json: bool,
    /// Monitoring (probes, counters, dashboard server) during the measured runs: off, on, or
    /// both (adds a side-by-side comparison, runs interleaved).
    #[arg(long, default_value = "off")]
    monitor: String,
    /// With monitoring on, probes record one command in this many (default: the monitor's
    /// default, `sample_every` in docs/monitoring.md).
    #[arg(long)]
    monitor_sample_every: Option<u32>,
    /// With `--monitor both`: runs of each kind (off and on, interleaved) whose medians are
    /// compared.
    #[arg(long, default_value_t = 7)]
    monitor_runs: usize,
    /// Instead of the scenarios: a call auction of this many orders (half bids, half asks,
    /// crossed over 100 price levels) entered into one instrument, then its uncrossing; prints
    /// the time per order entered (the indicative price included) and the time of the
    /// uncrossing, medians of `--uncross-runs`.
    #[arg(long, default_value_t = 0)]
    uncross_orders: u32,
    #[arg(long, default_value_t = 5)]
    uncross_runs: usize,
}

/// A recorded stream: the starting snapshot and the measured commands.
struct Workload {
    name: &'static str,
    start: Vec<u8>,
    commands: Vec<Command>,
    final_hash: u64,
    trades: u64,
    orders_accepted: u64,
    live_orders: usize,
}

fn generate(name: &'static str, config: FlowConfig, warmup: usize, ops: usize) -> Workload {
    let mut engine = Engine::new(EngineConfig {
        orders_max: 1 << 20,
        ..EngineConfig::default()
    });
    let mut flow = Flow::new(config);
    let mut events = Vec::with_capacity(1024);
    let mut ts = 1_000_000_000u64;
    for body in flow.setup() {
        events.clear();
        engine.apply(&Command::new(ts, body), &mut events);
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, Event::CommandRejected { .. })),
            "setup rejected: {events:?}"
        );
    }
    for _ in 0..warmup {
        ts += 1_000;
        events.clear();
        engine.apply(&Command::new(ts, flow.next_command()), &mut events);
        flow.observe(&events);
    }
    let start = engine.snapshot();
    let before = *engine.counters();
    let mut commands = Vec::with_capacity(ops);
    for _ in 0..ops {
        ts += 1_000;
        let cmd = Command::new(ts, flow.next_command());
        events.clear();
        engine.apply(&cmd, &mut events);
        flow.observe(&events);
        commands.push(cmd);
    }
    Workload {
        name,
        start,
        commands,
        final_hash: engine.state_hash(),
        trades: engine.counters().trades - before.trades,
        orders_accepted: engine.counters().orders_accepted - before.orders_accepted,
        live_orders: engine.live_orders(),
    }
}

fn kind_index(k: CommandKind) -> usize {
    CommandKind::ALL.iter().position(|x| *x == k).unwrap()
}

struct Histograms {
    all: Histogram<u64>,
    by_kind: Vec<Histogram<u64>>,
}

impl Histograms {
    fn new() -> Histograms {
        Histograms {
            all: histogram(),
            by_kind: CommandKind::ALL.iter().map(|_| histogram()).collect(),
        }
    }
    fn record(&mut self, kind: CommandKind, ns: u64) {
        record(&mut self.all, ns);
        record(&mut self.by_kind[kind_index(kind)], ns);
    }
    fn by_command(&self) -> BTreeMap<&'static str, Latency> {
        CommandKind::ALL
            .iter()
            .zip(&self.by_kind)
            .filter(|(_, h)| !h.is_empty())
            .map(|(k, h)| (k.name(), Latency::of(h)))
            .collect()
    }
}

fn check_hash(engine: &Engine, w: &Workload) -> Result<()> {
    if engine.state_hash() != w.final_hash {
        bail!("{}: the replay ended in another state than the generator: the engine is not deterministic", w.name);
    }
    Ok(())
}

/// Back to back, no clock reads inside the loop (with monitoring: sampled ones only).
fn throughput(w: &Workload, monitor: Option<&Monitor>) -> Result<f64> {
    let mut engine = Engine::restore(&w.start)?;
    let mut events = Vec::with_capacity(1024);
    let mut core = monitor.map(|m| m.core(w.name));
    let t0 = Instant::now();
    match core.as_mut() {
        None => plain_run(&mut engine, &mut events, &w.commands),
        Some(core) => monitored_run(&mut engine, &mut events, &w.commands, core),
    }
    let elapsed = t0.elapsed();
    check_hash(&engine, w)?;
    Ok(w.commands.len() as f64 / elapsed.as_secs_f64())
}

/// A clock read before and after each command: the service time of each.
fn service_time(w: &Workload) -> Result<Histograms> {
    let mut engine = Engine::restore(&w.start)?;
    let mut events = Vec::with_capacity(1024);
    let mut h = Histograms::new();
    for cmd in &w.commands {
        events.clear();
        let t0 = Instant::now();
        engine.apply(cmd, &mut events);
        let ns = t0.elapsed().as_nanos() as u64;
        h.record(cmd.kind(), ns);
    }
    check_hash(&engine, w)?;
    Ok(h)
}

/// Open loop at `rate` commands per second: latency from each command's scheduled time.
fn open_loop(
    w: &Workload,
    rate: u64,
    seconds_max: u64,
    monitor: Option<&Monitor>,
) -> Result<(Histograms, f64, usize)> {
    let mut engine = Engine::restore(&w.start)?;
    let mut events = Vec::with_capacity(1024);
    let mut h = Histograms::new();
    let n = w
        .commands
        .len()
        .min((rate.saturating_mul(seconds_max)) as usize)
        .max(1);
    let interval_ns = 1e9 / rate as f64;
    let mut core = monitor.map(|m| m.core(w.name));
    if let Some(core) = core.as_mut() {
        core.engine_counts(engine_counts(&engine));
    }
    let start = Instant::now() + Duration::from_millis(1);
    for (i, cmd) in w.commands[..n].iter().enumerate() {
        let scheduled = start + Duration::from_nanos((i as f64 * interval_ns) as u64);
        // Wait for the scheduled time; a command that is already late goes at once and its
        // lateness counts in its latency.
        while Instant::now() < scheduled {
            std::hint::spin_loop();
        }
        events.clear();
        engine.apply(cmd, &mut events);
        let done = Instant::now();
        if let Some(core) = core.as_mut() {
            // The loop's own clock reads are the stamps.
            core.on_command_counted(cmd.kind(), &events);
            if core.sample() {
                let mut trace = Trace::new(cmd.kind());
                trace.stamp_at(Stage::SocketRead, clock::ns_of(scheduled));
                trace.stamp_at(Stage::Processed, clock::ns_of(done));
                core.on_trace(&trace);
            }
            if i % 1024 == 0 {
                core.engine_counts(engine_counts(&engine));
                core.maybe_flush(clock::ns_of(done));
            }
        }
        h.record(cmd.kind(), done.duration_since(scheduled).as_nanos() as u64);
    }
    let elapsed = start.elapsed().as_secs_f64();
    if let Some(core) = core.as_mut() {
        core.engine_counts(engine_counts(&engine));
        core.flush();
    }
    Ok((h, n as f64 / elapsed, n))
}

/// What one clock read costs here: it is inside every service-time figure.
fn clock_read_ns() -> u64 {
    let mut h = histogram();
    for _ in 0..100_000 {
        let t0 = Instant::now();
        let ns = t0.elapsed().as_nanos() as u64;
        record(&mut h, ns);
    }
    h.value_at_quantile(0.5)
}

pub fn engine(args: EngineBenchArgs) -> Result<()> {
    if args.uncross_orders > 0 {
        return uncross(&args);
    }
    let scenarios: Vec<(&'static str, FlowConfig)> = match args.scenario.as_str() {
        "exchange-core" | "a" => vec![("exchange-core", FlowConfig::exchange_core(args.seed))],
        "moex" | "b" => vec![("moex", FlowConfig::moex(args.seed))],
        "all" => vec![
            ("exchange-core", FlowConfig::exchange_core(args.seed)),
            ("moex", FlowConfig::moex(args.seed)),
        ],
        other => bail!("unknown scenario '{other}': use exchange-core, moex or all"),
    };
    if args.ops == 0 {
        bail!("--ops must be positive");
    }
    if args.rates.contains(&0) {
        bail!("--rates must be positive");
    }
    if args.monitor_runs == 0 || args.monitor_runs > 101 {
        bail!("--monitor-runs must be between 1 and 101");
    }
    let sample_every = args
        .monitor_sample_every
        .unwrap_or(MonitorConfig::default().sample_every);
    let monitoring = Monitoring::start(&args.monitor, sample_every)?;
    let machine = Machine::this();
    let clock_ns = clock_read_ns();
    if !args.json {
        println!(
            "bourse bench engine — one core, one thread, no I/O; {} ({} cpus), version {}",
            machine.model,
            machine.cpus,
            common::version()
        );
        println!(
            "  includes: Engine::apply (validation, risk, matching, events into a reused buffer)"
        );
        println!(
            "  excludes: generating the flow (done beforehand), I/O, replication, serialisation"
        );
        println!(
            "  a clock read costs {clock_ns} ns here and is inside every service-time figure\n"
        );
    }
    for (name, config) in scenarios {
        let w = generate(name, config, args.warmup, args.ops);
        let tput = throughput(&w, monitoring.on())?;
        let service = service_time(&w)?;
        let base = json!({
            "bench": "engine",
            "scenario": name,
            "monitor": if monitoring.on().is_some() { "on" } else { "off" },
            "commands": w.commands.len(),
            "orders_accepted": w.orders_accepted,
            "trades": w.trades,
            "live_orders_at_end": w.live_orders,
            "machine": machine,
            "version": common::version(),
        });
        if args.json {
            let mut o = base.clone();
            o["mode"] = json!("service-time");
            o["offered_per_s"] = json!(null);
            o["throughput_per_s"] = json!(tput.round() as u64);
            o["latency_ns"] = json!(Latency::of(&service.all));
            o["by_command"] = json!(service.by_command());
            o["clock_read_ns"] = json!(clock_ns);
            println!("{o}");
        } else {
            println!(
                "scenario {name}: {} commands, {} orders accepted, {} trades, {} orders live at the end",
                common::count(w.commands.len() as u64),
                common::count(w.orders_accepted),
                common::count(w.trades),
                common::count(w.live_orders as u64)
            );
            println!(
                "  throughput, back to back: {} commands/s",
                common::count(tput as u64)
            );
            println!("  service time per command (clock read around each):");
            println!("{}", common::latency_header());
            println!("{}", common::latency_row("all", &Latency::of(&service.all)));
            for (k, l) in service.by_command() {
                println!("{}", common::latency_row(k, &l));
            }
        }
        for &rate in &args.rates {
            let (h, achieved, n) = open_loop(&w, rate, args.open_loop_seconds, monitoring.on())?;
            if args.json {
                let mut o = base.clone();
                o["mode"] = json!("open-loop");
                o["commands"] = json!(n);
                o["offered_per_s"] = json!(rate);
                o["throughput_per_s"] = json!(achieved.round() as u64);
                o["latency_ns"] = json!(Latency::of(&h.all));
                o["by_command"] = json!(h.by_command());
                println!("{o}");
            } else {
                println!(
                    "  open loop at {} commands/s offered ({} achieved, {} commands), latency from the scheduled time:",
                    common::count(rate),
                    common::count(achieved as u64),
                    common::count(n as u64)
                );
                println!("{}", common::latency_header());
                println!("{}", common::latency_row("all", &Latency::of(&h.all)));
                for (k, l) in h.by_command() {
                    println!("{}", common::latency_row(k, &l));
                }
            }
        }
        if monitoring.compare {
            compare_monitoring(&w, &args, &monitoring, &base)?;
        }
        if !args.json {
            println!();
        }
    }
    Ok(())
}

/// `--monitor`: whether measured runs carry monitoring, and the monitor they report into.
struct Monitoring {
    /// With the dashboard server running, as in `bourse demo`.
    monitor: Option<(std::sync::Arc<Monitor>, DashboardServer)>,
    on_by_default: bool,
    compare: bool,
}

impl Monitoring {
    fn start(mode: &str, sample_every: u32) -> Result<Monitoring> {
        let (on_by_default, compare) = match mode {
            "off" => (false, false),
            "on" => (true, false),
            "both" => (false, true),
            other => bail!("--monitor must be on, off or both, not '{other}'"),
        };
        let monitor = if on_by_default || compare {
            let m = Monitor::new(MonitorConfig {
                sample_every,
                node_name: "bench".into(),
                ..MonitorConfig::default()
            });
            let server = DashboardServer::start(m.clone(), "127.0.0.1:0".parse()?)?;
            Some((m, server))
        } else {
            None
        };
        Ok(Monitoring {
            monitor,
            on_by_default,
            compare,
        })
    }
    fn on(&self) -> Option<&Monitor> {
        self.monitor
            .as_ref()
            .filter(|_| self.on_by_default)
            .map(|(m, _)| &**m)
    }
    fn always(&self) -> Option<&Monitor> {
        self.monitor.as_ref().map(|(m, _)| &**m)
    }
}

/// The measured loop without monitoring. Not inlined, like [`monitored_run`], so that a
/// profiler (callgrind's `--toggle-collect`) can count the instructions of each loop alone.
#[inline(never)]
fn plain_run(engine: &mut Engine, events: &mut Vec<Event>, commands: &[Command]) {
    for cmd in commands {
        events.clear();
        engine.apply(cmd, events);
    }
}

/// The engine's own counters in the monitor's plain form.
fn engine_counts(engine: &Engine) -> EngineCounts {
    let c = engine.counters();
    EngineCounts {
        orders_accepted: c.orders_accepted,
        orders_rejected: c.orders_rejected,
        trades: c.trades,
        replaces: c.replaces,
    }
}

/// The measured loop with monitoring, as a core thread would run it: commands counted by
/// kind (the seeds' figures from the engine's own counters, plus the events of commands other
/// than new orders: `CoreMonitor::on_command_counted`), probes on sampled commands (no clock
/// read otherwise), and once per 1,024 commands the engine's counters and a clock read for
/// the flush check.
#[inline(never)]
fn monitored_run(
    engine: &mut Engine,
    events: &mut Vec<Event>,
    commands: &[Command],
    core: &mut CoreMonitor,
) {
    core.engine_counts(engine_counts(engine));
    for (i, cmd) in commands.iter().enumerate() {
        events.clear();
        if core.sample() {
            let mut trace = Trace::new(cmd.kind());
            trace.stamp(Stage::Committed);
            engine.apply(cmd, events);
            trace.stamp(Stage::Processed);
            core.on_trace(&trace);
        } else {
            engine.apply(cmd, events);
        }
        core.on_command_counted(cmd.kind(), events);
        if i % 1024 == 0 {
            core.engine_counts(engine_counts(engine));
            core.maybe_flush(clock::now_ns());
        }
    }
    core.engine_counts(engine_counts(engine));
    core.flush();
}

/// Throughput and open-loop p99 with monitoring off and on, interleaved in pairs whose order
/// alternates (off-on, on-off, …) so that drift of the machine and the position in a pair hit
/// both alike; each figure is the median of its runs, and the spread of the pairwise changes
/// is printed so that a reader can tell an effect from noise.
fn compare_monitoring(
    w: &Workload,
    args: &EngineBenchArgs,
    monitoring: &Monitoring,
    base: &serde_json::Value,
) -> Result<()> {
    let runs = args.monitor_runs;
    let on = monitoring.always();
    let (mut tput_off, mut tput_on, mut tput_pairs) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..runs {
        let (off, on) = if i % 2 == 0 {
            let off = throughput(w, None)?;
            (off, throughput(w, on)?)
        } else {
            let on = throughput(w, on)?;
            (throughput(w, None)?, on)
        };
        tput_off.push(off);
        tput_on.push(on);
        tput_pairs.push((on / off - 1.0) * 100.0);
    }
    let rate = args.rates.first().copied().unwrap_or(1_000_000);
    let (mut p99_off, mut p99_on, mut p99_pairs) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..runs {
        let one = |monitor| -> Result<u64> {
            let (h, _, _) = open_loop(w, rate, args.open_loop_seconds, monitor)?;
            Ok(h.all.value_at_quantile(0.99))
        };
        let (off, on) = if i % 2 == 0 {
            let off = one(None)?;
            (off, one(on)?)
        } else {
            let on = one(on)?;
            (one(None)?, on)
        };
        p99_off.push(off);
        p99_on.push(on);
        p99_pairs.push((on as f64 / off.max(1) as f64 - 1.0) * 100.0);
    }
    let spread = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (lo, hi)
    };
    let (t_lo, t_hi) = spread(&tput_pairs);
    let (p_lo, p_hi) = spread(&p99_pairs);
    let (tput_off, tput_on) = (common::median(tput_off), common::median(tput_on));
    let median_ns = |v: Vec<u64>| common::median(v.into_iter().map(|x| x as f64).collect()) as u64;
    let (p99_off, p99_on) = (median_ns(p99_off), median_ns(p99_on));
    let tput_change_pct = (tput_on / tput_off - 1.0) * 100.0;
    let p99_change_pct = (p99_on as f64 / p99_off.max(1) as f64 - 1.0) * 100.0;
    let sample_every = on.map(|m| m.config().sample_every).unwrap_or(0);
    let round2 = |x: f64| (x * 100.0).round() / 100.0;
    if args.json {
        let mut o = base.clone();
        o["mode"] = json!("monitor-compare");
        o["monitor"] = json!("both");
        o["sample_every"] = json!(sample_every);
        o["runs"] = json!(runs);
        o["offered_per_s"] = json!(rate);
        o["throughput_per_s"] =
            json!({"off": tput_off.round() as u64, "on": tput_on.round() as u64});
        o["throughput_change_pct"] = json!(round2(tput_change_pct));
        o["throughput_pair_change_pct"] = json!({"min": round2(t_lo), "max": round2(t_hi)});
        o["open_loop_p99_ns"] = json!({"off": p99_off, "on": p99_on});
        o["p99_change_pct"] = json!(round2(p99_change_pct));
        o["p99_pair_change_pct"] = json!({"min": round2(p_lo), "max": round2(p_hi)});
        println!("{o}");
    } else {
        println!(
            "  monitoring off vs on (probes 1 in {sample_every}, counters, dashboard server), medians of {runs} interleaved runs each:"
        );
        println!(
            "    throughput, back to back:   {:>12} vs {:>12} commands/s  ({:+.1}%; pairs {:+.1}% to {:+.1}%)",
            common::count(tput_off as u64),
            common::count(tput_on as u64),
            tput_change_pct,
            t_lo,
            t_hi
        );
        println!(
            "    open loop p99 at {:>9}/s: {:>12} vs {:>12}             ({:+.1}%; pairs {:+.1}% to {:+.1}%)",
            common::count(rate),
            common::ns(p99_off),
            common::ns(p99_on),
            p99_change_pct,
            p_lo,
            p_hi
        );
    }
    Ok(())
}

/// `--uncross-orders`: the cost of a call auction's order entry (each order publishes the
/// indicative uncrossing when it changes) and of its uncrossing.
fn uncross(args: &EngineBenchArgs) -> Result<()> {
    let n = args.uncross_orders;
    if args.uncross_runs == 0 || args.uncross_runs > 101 {
        bail!("--uncross-runs must be between 1 and 101");
    }
    let accounts = 1_000u32;
    let mut engine = Engine::new(EngineConfig {
        orders_max: n + 16,
        instruments_max: 1,
        accounts_max: accounts,
        levels_per_side_hint: 256,
        first_order_id: 1,
    });
    let mut events = Vec::with_capacity(1 << 16);
    let mut ts = 1_000_000_000u64;
    let mut run = |engine: &mut Engine, events: &mut Vec<Event>, body: CommandBody| {
        ts += 1_000;
        events.clear();
        engine.apply(&Command::new(ts, body), events);
        ts
    };
    run(
        &mut engine,
        &mut events,
        CommandBody::AddInstrument(bourse_engine::fixtures::equity(1, "AUCT", 10_000)),
    );
    for a in 1..=accounts {
        run(
            &mut engine,
            &mut events,
            CommandBody::AddFundedAccount {
                spec: AccountSpec {
                    account: AccountId(a),
                    firm: FirmId(a),
                    may_short: true,
                    stp: StpMode::None,
                    stp_scope: StpScope::Account,
                },
                cash: Cash(CASH_AMOUNT_MAX),
            },
        );
    }
    run(
        &mut engine,
        &mut events,
        CommandBody::SetPhase {
            instrument: Some(InstrumentId(1)),
            phase: Phase::OpeningAuction,
        },
    );
    let start = engine.snapshot();
    // The orders, drawn beforehand (splitmix64): prices over 9950..10049 on both sides.
    let mut x = args.seed;
    let mut next = || {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let orders: Vec<Command> = (0..n)
        .map(|i| {
            let r = next();
            Command::new(
                2_000_000_000 + u64::from(i),
                CommandBody::NewOrder(NewOrder {
                    firm: None,
                    account: AccountId(1 + (r % u64::from(accounts)) as u32),
                    cl_ord_id: ClOrdId(u64::from(i) + 1),
                    instrument: InstrumentId(1),
                    side: if i % 2 == 0 { Side::Buy } else { Side::Sell },
                    ord_type: OrdType::Limit,
                    price: Price(9_950 + ((r >> 16) % 100) as i64),
                    qty: Qty(1 + ((r >> 32) % 100) as i64),
                    tif: TimeInForce::Day,
                    expire_ts_ns: 0,
                    display_qty: Qty(0),
                }),
            )
        })
        .collect();
    let open = Command::new(
        3_000_000_000,
        CommandBody::SetPhase {
            instrument: Some(InstrumentId(1)),
            phase: Phase::Open,
        },
    );
    // Every order's entry and every run's uncrossing go into HDR histograms, as in every
    // other bench; the clock read per order costs the same in every run.
    let (mut entry_h, mut uncross_h) = (histogram(), histogram());
    let (mut trades, mut indicative, mut hash) = (0usize, 0usize, None);
    for _ in 0..args.uncross_runs {
        let mut e = Engine::restore(&start)?;
        indicative = 0;
        for cmd in &orders {
            events.clear();
            let t0 = Instant::now();
            e.apply(cmd, &mut events);
            record(&mut entry_h, t0.elapsed().as_nanos() as u64);
            indicative += events
                .iter()
                .filter(|ev| matches!(ev, Event::AuctionIndicative { .. }))
                .count();
        }
        events.clear();
        let t1 = Instant::now();
        e.apply(&open, &mut events);
        record(&mut uncross_h, t1.elapsed().as_nanos() as u64);
        trades = events
            .iter()
            .filter(|ev| matches!(ev, Event::Trade { .. }))
            .count();
        let h = e.state_hash();
        if *hash.get_or_insert(h) != h {
            bail!("the runs of the uncrossing ended in different states");
        }
    }
    let (entry, uncross) = (Latency::of(&entry_h), Latency::of(&uncross_h));
    if args.json {
        println!(
            "{}",
            json!({
                "mode": "uncross",
                "orders": n,
                "runs": args.uncross_runs,
                "entry_latency_ns": entry,
                "indicative_events": indicative,
                "uncross_latency_ns": uncross,
                "trades": trades,
            })
        );
    } else {
        println!(
            "bourse bench engine --uncross-orders {n}: one instrument in an opening auction, \
             {n} orders over 100 crossed price levels, {} runs",
            args.uncross_runs
        );
        println!(
            "  order entry in the call includes the indicative price ({indicative} indicative \
             events a run); the uncrossing is set_phase open, {trades} trades"
        );
        println!("{}", common::latency_header());
        println!("{}", common::latency_row("entry", &entry));
        println!("{}", common::latency_row("uncross", &uncross));
    }
    Ok(())
}
