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

/// Slots of the three commonest kinds in [`Tally::commands`] (see [`kind_index`]).
const NEW_ORDER: usize = 0;
const CANCEL: usize = 1;
const REPLACE: usize = 2;

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
        // A plain match with field increments: measured with callgrind, a lookup table into
        // local slots summed afterwards took more instructions per command, not fewer.
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

/// What the engine counts itself (the fields of `bourse_engine::Counters` of the same names),
/// read by the core's thread when it flushes. With them a core's monitor need not read the
/// events of new orders at all: see [`CoreMonitor::on_command_counted`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineCounts {
    pub orders_accepted: u64,
    pub orders_rejected: u64,
    pub trades: u64,
    pub replaces: u64,
}

/// The counted mode's state: what only events tell (cancels on request, cancel rejects) and
/// the engine's counts when counting started.
#[derive(Clone, Copy, Debug, Default)]
struct Counted {
    base: Option<EngineCounts>,
    cancels: u64,
    cancel_rejects: u64,
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
    counted: Counted,
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
            counted: Counted::default(),
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
            counted: Counted::default(),
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

    /// Counts a command in the counted mode: the command by kind, and from the events only
    /// what the engine does not count itself (cancels on request and cancel rejects), so a
    /// new order's events are not read at all. Orders, order rejects, trades and replaces
    /// come from the engine's counters handed to [`CoreMonitor::engine_counts`] (once before
    /// the first command, then before each flush). Use this or [`CoreMonitor::on_command`]
    /// on one monitor, not both; the figures are the same (a test checks it over the
    /// benchmark flows, rejects included).
    ///
    /// This is the per-command cost of counting on a core's thread, so it is kept to one
    /// match on the kind and a plain increment: no atomic, no label lookup, no check whether
    /// monitoring is on (a disabled monitor tallies locally and never publishes). The outcome
    /// of a cancel or a replace is its first event: the engine checks a command completely
    /// before it changes anything, so a rejected one emits only `CancelRejected`, and an
    /// accepted cancel emits `OrderCancelled` (reason `Requested`: only a cancel command
    /// cancels on request) before its order-log record. So only that one event is read;
    /// mass cancels and administration, which are rare, scan their events on a separate
    /// path.
    #[inline]
    pub fn on_command_counted(&mut self, kind: CommandKind, events: &[Event]) {
        match kind {
            CommandKind::NewOrder => self.local.commands[NEW_ORDER] += 1,
            CommandKind::Cancel => {
                self.local.commands[CANCEL] += 1;
                match events.first() {
                    Some(Event::OrderCancelled { .. }) => self.counted.cancels += 1,
                    Some(Event::CancelRejected { .. }) => self.counted.cancel_rejects += 1,
                    _ => {}
                }
            }
            CommandKind::Replace => {
                self.local.commands[REPLACE] += 1;
                if let Some(Event::CancelRejected { .. }) = events.first() {
                    self.counted.cancel_rejects += 1;
                }
            }
            _ => self.count_other(kind, events),
        }
    }

    /// The counted mode for mass cancels and administration: every event is read.
    #[inline(never)]
    fn count_other(&mut self, kind: CommandKind, events: &[Event]) {
        self.local.commands[kind_index(kind)] += 1;
        for e in events {
            match e {
                Event::OrderCancelled {
                    reason: CancelReason::Requested,
                    ..
                } => self.counted.cancels += 1,
                Event::CancelRejected { .. } => self.counted.cancel_rejects += 1,
                _ => {}
            }
        }
    }

    /// The engine's counters now (counted mode): the first call sets the base they count
    /// from; later calls bring the tally up to date.
    pub fn engine_counts(&mut self, now: EngineCounts) {
        let base = *self.counted.base.get_or_insert(now);
        let d = |a: u64, b: u64| a.saturating_sub(b);
        let orders = d(now.orders_accepted, base.orders_accepted);
        let c = &self.counted;
        self.local.orders = orders;
        self.local.trades = d(now.trades, base.trades);
        self.local.cancels = c.cancels;
        self.local.rejects = d(now.orders_rejected, base.orders_rejected) + c.cancel_rejects;
        self.local.transactions = orders + c.cancels + d(now.replaces, base.replaces);
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

#[cfg(test)]
mod tests {
    use super::*;
    use bourse_core::*;

    fn cancelled(reason: CancelReason) -> Event {
        Event::OrderCancelled {
            order_id: OrderId(7),
            account: AccountId(1),
            cl_ord_id: ClOrdId(2),
            instrument: InstrumentId(3),
            side: Side::Buy,
            qty_cancelled: Qty(5),
            reason,
            ts_ns: 1,
        }
    }

    #[test]
    fn the_tally_counts_the_seeds_figures_from_events() {
        let accepted = Event::OrderAccepted {
            order_id: OrderId(7),
            account: AccountId(1),
            cl_ord_id: ClOrdId(2),
            instrument: InstrumentId(3),
            side: Side::Buy,
            price: Price(100),
            qty: Qty(5),
            ts_ns: 1,
        };
        let rejected = Event::CommandRejected {
            reason: RejectReason::UnknownInstrument,
            ts_ns: 1,
        };
        let mut t = Tally::default();
        t.add(
            CommandKind::NewOrder,
            &[accepted, cancelled(CancelReason::Requested), rejected],
        );
        t.add(CommandKind::Cancel, &[cancelled(CancelReason::Requested)]);
        t.add_events(&[
            cancelled(CancelReason::MassCancel),
            Event::OrderRejected {
                account: AccountId(1),
                cl_ord_id: ClOrdId(3),
                instrument: InstrumentId(3),
                reason: RejectReason::UnknownInstrument,
                ts_ns: 1,
            },
        ]);
        assert_eq!(t.orders, 1);
        assert_eq!(t.cancels, 2, "only cancels on request count");
        assert_eq!(t.transactions, 3);
        assert_eq!(
            t.rejects, 1,
            "order and cancel rejects; a rejected command is neither"
        );
        assert_eq!(t.commands[kind_index(CommandKind::NewOrder)], 1);
        assert_eq!(t.commands[kind_index(CommandKind::Cancel)], 1);
    }

    /// The counted mode (engine counters plus the events of commands other than new orders)
    /// gives the same figures as reading every event, over both benchmark flows.
    #[test]
    fn the_counted_mode_agrees_with_reading_every_event() {
        use bourse_engine::workload::{Flow, FlowConfig};
        use bourse_engine::{Engine, EngineConfig};
        for config in [FlowConfig::exchange_core(7), FlowConfig::moex(7)] {
            let monitor = crate::Monitor::new(crate::MonitorConfig::default());
            let mut core = monitor.core("test");
            let mut engine = Engine::new(EngineConfig {
                orders_max: 1 << 18,
                ..EngineConfig::default()
            });
            let mut flow = Flow::new(config);
            let mut events = Vec::new();
            let mut ts = 1_000u64;
            for body in flow.setup() {
                events.clear();
                engine.apply(&Command::new(ts, body), &mut events);
            }
            let counts = |e: &Engine| {
                let c = e.counters();
                EngineCounts {
                    orders_accepted: c.orders_accepted,
                    orders_rejected: c.orders_rejected,
                    trades: c.trades,
                    replaces: c.replaces,
                }
            };
            core.engine_counts(counts(&engine));
            let mut reference = Tally::default();
            for i in 0..60_000u64 {
                ts += 1_000;
                // Now and then a cancel and a replace of no order and an order for no
                // instrument, so that every kind of reject occurs.
                let body = match i % 5_000 {
                    1 => CommandBody::Cancel(Cancel {
                        account: AccountId(1),
                        cl_ord_id: ClOrdId(i),
                        target: OrderRef {
                            order_id: Some(OrderId(u64::MAX)),
                            orig_cl_ord_id: None,
                        },
                    }),
                    3 => CommandBody::Replace(Replace {
                        account: AccountId(1),
                        cl_ord_id: ClOrdId(i),
                        target: OrderRef {
                            order_id: Some(OrderId(u64::MAX)),
                            orig_cl_ord_id: None,
                        },
                        price: Some(Price(100)),
                        qty: None,
                    }),
                    2 => CommandBody::NewOrder(NewOrder {
                        firm: None,
                        account: AccountId(1),
                        cl_ord_id: ClOrdId(i),
                        instrument: InstrumentId(999_999),
                        side: Side::Buy,
                        ord_type: OrdType::Limit,
                        price: Price(100),
                        qty: Qty(1),
                        tif: TimeInForce::Day,
                        expire_ts_ns: 0,
                        display_qty: Qty(0),
                    }),
                    _ => flow.next_command(),
                };
                let cmd = Command::new(ts, body);
                events.clear();
                engine.apply(&cmd, &mut events);
                flow.observe(&events);
                reference.add(cmd.kind(), &events);
                core.on_command_counted(cmd.kind(), &events);
            }
            core.engine_counts(counts(&engine));
            assert_eq!(kind_index(CommandKind::NewOrder), NEW_ORDER);
            assert_eq!(kind_index(CommandKind::Cancel), CANCEL);
            assert_eq!(kind_index(CommandKind::Replace), REPLACE);
            assert!(
                reference.cancels > 0 && reference.trades > 0 && reference.rejects >= 36,
                "{reference:?}"
            );
            assert_eq!(*core.tally(), reference);
        }
    }
}
