//! [`CoreMonitor`]: what a trading core's thread carries to report its work.
//!
//! The counts of the seeds (transactions, orders, trades) are tallied in plain integers on the
//! core's thread and published to the shared atomic counters once per flush interval, so the
//! per-command cost is a few additions, not a locked instruction per counter. Sampled traces go
//! to the thread's own [`StageRecorder`].

use crate::metrics::{Counter, Gauge};
use crate::names;
use crate::probe::{kind_index, StageRecorder, Trace, COMMAND_KINDS as KINDS};
use crate::Monitor;
use bourse_core::{CancelReason, CommandKind, Event};

/// Counts one command's events the way the seeds count them. Successful transactions: new
/// orders registered, cancels and replaces that succeeded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub commands: [u64; KINDS],
    pub transactions: u64,
    pub orders: u64,
    pub trades: u64,
    pub cancels: u64,
    pub rejects: u64,
}

impl Tally {
    #[inline]
    pub fn add(&mut self, kind: CommandKind, events: &[Event]) {
        self.commands[kind_index(kind)] += 1;
        self.add_events(events);
    }

    /// Counts the events of one command whose kind is not known here (a replica node sees
    /// outcomes, not commands).
    #[inline]
    pub fn add_events(&mut self, events: &[Event]) {
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
}

struct Published {
    commands: [Counter; KINDS],
    transactions: Counter,
    orders: Counter,
    trades: Counter,
    cancels: Counter,
    rejects: Counter,
    live_orders: Gauge,
    applied_index: Gauge,
}

/// One core thread's monitoring state. Not shared: create one per core thread.
pub struct CoreMonitor {
    recorder: StageRecorder,
    local: Tally,
    flushed: Tally,
    published: Option<Published>,
    flush_interval_ns: u64,
    last_flush_ns: u64,
}

impl CoreMonitor {
    pub(crate) fn new(monitor: &Monitor, core: &str) -> CoreMonitor {
        let r = monitor.registry();
        let l = [("core", core)];
        let commands = bourse_core::CommandKind::ALL.map(|k| {
            r.counter(
                names::COMMANDS_TOTAL,
                "Commands applied by the trading core, by kind.",
                &[("core", core), ("kind", k.name())],
            )
        });
        CoreMonitor {
            recorder: monitor.probes().recorder(),
            local: Tally::default(),
            flushed: Tally::default(),
            published: Some(Published {
                commands,
                transactions: r.counter(
                    names::TRANSACTIONS_TOTAL,
                    "Successful transactions (orders registered, cancels and replaces done).",
                    &l,
                ),
                orders: r.counter(names::ORDERS_TOTAL, "Orders registered.", &l),
                trades: r.counter(names::TRADES_TOTAL, "Trades.", &l),
                cancels: r.counter(names::CANCELS_TOTAL, "Orders cancelled on request.", &l),
                rejects: r.counter(
                    names::REJECTS_TOTAL,
                    "Orders and cancels rejected by the core.",
                    &l,
                ),
                live_orders: r.gauge(names::LIVE_ORDERS, "Orders resting in the books.", &l),
                applied_index: r.gauge(
                    names::CORE_APPLIED_COMMANDS,
                    "Commands the core has applied since start.",
                    &l,
                ),
            }),
            flush_interval_ns: monitor.config().flush_interval_ms.max(1) * 1_000_000,
            last_flush_ns: 0,
        }
    }

    /// Monitoring off: every call is a cheap no-op.
    pub fn disabled() -> CoreMonitor {
        CoreMonitor {
            recorder: StageRecorder::disabled(),
            local: Tally::default(),
            flushed: Tally::default(),
            published: None,
            flush_interval_ns: u64::MAX,
            last_flush_ns: 0,
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.published.is_some()
    }

    /// Whether to stamp a trace for the next command (1 in the configured N).
    #[inline]
    pub fn sample(&mut self) -> bool {
        self.recorder.sample()
    }

    /// Counts a command and its events.
    #[inline]
    pub fn on_command(&mut self, kind: CommandKind, events: &[Event]) {
        if self.published.is_some() {
            self.local.add(kind, events);
        }
    }

    /// Records a sampled trace's legs.
    #[inline]
    pub fn on_trace(&mut self, trace: &Trace) {
        self.recorder.record(trace);
    }

    pub fn recorder(&mut self) -> &mut StageRecorder {
        &mut self.recorder
    }

    /// The figures tallied so far on this thread (published or not).
    pub fn tally(&self) -> &Tally {
        &self.local
    }

    pub fn set_live_orders(&mut self, n: u64) {
        if let Some(p) = &self.published {
            p.live_orders.set(n.min(i64::MAX as u64) as i64);
        }
    }

    /// Publishes counts and hands probe histograms over if the flush interval has passed.
    /// Call it once per loop iteration with a clock read the loop already made.
    #[inline]
    pub fn maybe_flush(&mut self, now_ns: u64) {
        if now_ns.saturating_sub(self.last_flush_ns) >= self.flush_interval_ns {
            self.last_flush_ns = now_ns;
            self.flush();
        }
    }

    /// Publishes counts and hands probe histograms over now.
    pub fn flush(&mut self) {
        let Some(p) = &self.published else { return };
        let (l, f) = (&self.local, &self.flushed);
        for i in 0..KINDS {
            if l.commands[i] != f.commands[i] {
                p.commands[i].add(l.commands[i] - f.commands[i]);
            }
        }
        p.transactions.add(l.transactions - f.transactions);
        p.orders.add(l.orders - f.orders);
        p.trades.add(l.trades - f.trades);
        p.cancels.add(l.cancels - f.cancels);
        p.rejects.add(l.rejects - f.rejects);
        let applied: u64 = l.commands.iter().sum();
        p.applied_index.set(applied.min(i64::MAX as u64) as i64);
        self.flushed = self.local;
        self.recorder.flush();
    }
}

impl Drop for CoreMonitor {
    fn drop(&mut self) {
        self.flush();
    }
}
