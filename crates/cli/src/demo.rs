//! `bourse demo`: one trading core with simulated participants on equities, FX and futures.
//!
//! Participants (market makers and takers from [`bourse_engine::workload`]) send commands on
//! an open-loop schedule at `--rate` commands per second. Every second the demo prints the
//! seeds' figures: transactions, orders and trades per second; at the end it prints a summary
//! with the maxima, the service time per command type, and proves the core deterministic by
//! restoring its snapshot and comparing state hashes.
//!
//! Later issues grow this into the full system: a replicated core per market, gateways,
//! market data and a dashboard.

use crate::report::{self, histogram, record, Latency};
use anyhow::{bail, Result};
use bourse_core::*;
use bourse_engine::workload::{Flow, FlowConfig};
use bourse_engine::{Engine, EngineConfig};
use clap::Args;
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
            second = Tally::default();
            second_service.reset();
            second_end += Duration::from_secs(1);
            continue;
        }
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
            let cmd = Command::new(now_ns(), flow.next_command());
            events.clear();
            let t0 = Instant::now();
            engine.apply(&cmd, &mut events);
            let ns = t0.elapsed().as_nanos() as u64;
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
            next_send += interval;
            sent += 1;
        }
    }
    total.merge(&second);
    let elapsed = start.elapsed().as_secs_f64();

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
    Ok(())
}
