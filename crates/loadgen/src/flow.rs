//! The order flow of one market as one generator worker sends it.
//!
//! Modelled on `bourse_engine::workload::Flow` (and built on its [`Rng`] and fixtures), but
//! with what a load profile asks for that the benchmark flow does not offer: fill-or-kill
//! orders, mass cancels, limit orders that cross on arrival, and a choice of instrument that
//! can concentrate on a few hot ones. Like the engine's flow it reads no clock and learns
//! which orders are live from the answers ([`MarketFlow::observe`]), so its cancels and
//! replaces name real orders (some of them will have traded away by the time the cancel
//! arrives, as in real markets: those come back rejected and do not count as transactions).

use crate::profile::{MarketKind, MarketSpec, MixSpec};
use bourse_core::*;
use bourse_engine::fixtures;
use bourse_engine::workload::{LiveOrders, Rng};
use serde::{Deserialize, Serialize};

/// Cash each generated account starts with, in cash units (10^-4): enough that collateral
/// never limits the flow (the load test measures the core, not a shortage of money).
pub const CASH_PER_ACCOUNT: i128 = 10_000_000_000_000_000;
/// Order sizes are 1 to this many lots.
pub const QTY_LOTS_MAX: i64 = 10;
/// The middle of each instrument walks by a tick with this chance per command, per million.
const WALK_PER_MILLION: u64 = 5_000;

/// The kinds of command a profile mixes; the report gives latencies per op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Limit,
    Market,
    Ioc,
    Fok,
    Cancel,
    Replace,
    MassCancel,
}

impl Op {
    pub const ALL: [Op; 7] = [
        Op::Limit,
        Op::Market,
        Op::Ioc,
        Op::Fok,
        Op::Cancel,
        Op::Replace,
        Op::MassCancel,
    ];
    pub fn index(self) -> usize {
        self as usize
    }
    pub fn name(self) -> &'static str {
        match self {
            Op::Limit => "limit",
            Op::Market => "market",
            Op::Ioc => "ioc",
            Op::Fok => "fok",
            Op::Cancel => "cancel",
            Op::Replace => "replace",
            Op::MassCancel => "mass_cancel",
        }
    }
    pub fn is_new_order(self) -> bool {
        matches!(self, Op::Limit | Op::Market | Op::Ioc | Op::Fok)
    }
}

/// Instrument ids of market `m` start at `m * INSTRUMENT_ID_MARKET_STRIDE + 1`: ids are
/// unique across the venue, so that one gateway can route every market's instruments to the
/// core that owns them.
pub const INSTRUMENT_ID_MARKET_STRIDE: u32 = crate::profile::INSTRUMENTS_PER_MARKET_MAX;

/// The instruments of market number `market_index` (its place in the profile), with
/// venue-unique ids and symbols.
pub fn instruments(m: &MarketSpec, market_index: usize) -> Vec<Instrument> {
    let base = market_index as u32 * INSTRUMENT_ID_MARKET_STRIDE;
    (0..m.instruments)
        .map(|i| {
            let id = base + i + 1;
            // Spread the reference prices so that books differ; every price stays far inside
            // the core's limits.
            let spread = (i as i64 % 50) * 37;
            let n = i + 1;
            match m.kind {
                MarketKind::Equity => fixtures::equity(
                    id,
                    &format!("EQ{market_index:02}{n:04}"),
                    10_000 + spread * 100,
                ),
                MarketKind::Fx => fixtures::fx(
                    id,
                    &format!("FX{market_index:02}{n:04}"),
                    100_000 + spread * 10,
                ),
                MarketKind::Futures => fixtures::future(
                    id,
                    &format!("FU{market_index:02}{n:04}"),
                    100_000 + spread * 100,
                ),
            }
        })
        .collect()
}

/// The accounts added under load (`[accounts_under_load]`) that worker `worker` trades in
/// market `market`: a disjoint slice of the `traded` first ones, (first, count), the count
/// 0 for a worker without any or a market they are not added to.
pub fn worker_late_accounts(
    profile: &crate::profile::Profile,
    market: usize,
    worker: u32,
) -> (u32, u32) {
    let Some(a) = &profile.accounts_under_load else {
        return (0, 0);
    };
    if profile.markets[market].name != a.market || a.traded == 0 {
        return (0, 0);
    }
    let workers = profile.generator.workers.max(1);
    let per_worker = a.traded / workers;
    let count = if worker + 1 == workers {
        a.traded - worker * per_worker
    } else {
        per_worker
    };
    (
        crate::profile::ACCOUNTS_UNDER_LOAD_ID_BASE + worker * per_worker,
        count,
    )
}

/// The accounts worker `worker` of `workers` owns in a market of `accounts` accounts: a
/// disjoint slice, so that workers never cancel each other's orders. Returns (first, count).
pub fn worker_accounts(accounts: u32, worker: u32, workers: u32) -> (u32, u32) {
    let per_worker = accounts / workers.max(1);
    let first = 1 + worker * per_worker;
    let count = if worker + 1 == workers {
        accounts - worker * per_worker
    } else {
        per_worker
    };
    (first, count.max(1))
}

/// Cumulative thresholds of the mix, in parts per million.
#[derive(Clone, Copy, Debug)]
struct Thresholds {
    limit: u64,
    market: u64,
    ioc: u64,
    fok: u64,
    cancel: u64,
    replace: u64,
}

impl Thresholds {
    fn of(mix: &MixSpec) -> Thresholds {
        let total = mix.total();
        let mut acc = 0.0;
        let mut next = |w: f64| {
            acc += w / total;
            (acc * 1e6).round() as u64
        };
        Thresholds {
            limit: next(mix.limit),
            market: next(mix.market),
            ioc: next(mix.ioc),
            fok: next(mix.fok),
            cancel: next(mix.cancel),
            replace: next(mix.replace),
        }
    }
}

/// Hot instruments in force: the first `instruments` take `share_ppm` of the new orders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hot {
    pub instruments: u32,
    pub share_ppm: u64,
}

/// One worker's flow on one market.
pub struct MarketFlow {
    instruments: Vec<Instrument>,
    first_account: u32,
    accounts: u32,
    /// Accounts added while the run goes on that this flow also trades (first, count).
    late: (u32, u32),
    thresholds: Thresholds,
    crossing_ppm: u64,
    live_orders_target: usize,
    spread_ticks: i64,
    rng: Rng,
    mid: Vec<i64>,
    live: LiveOrders,
    next_cl_ord_id: u64,
    hot: Option<Hot>,
}

impl MarketFlow {
    /// The flow of worker `worker` of `workers` on market `m`: the worker owns a disjoint
    /// slice of the market's accounts, so workers never cancel each other's orders.
    pub fn new(
        m: &MarketSpec,
        market_index: usize,
        mix: &MixSpec,
        worker: u32,
        workers: u32,
        seed: u64,
    ) -> MarketFlow {
        let (first_account, accounts) = worker_accounts(m.accounts, worker, workers);
        let instruments = instruments(m, market_index);
        let mid = instruments.iter().map(|i| i.reference_price.0).collect();
        let live_orders_target = (m.live_orders_target / workers.max(1)).max(1) as usize;
        let live = LiveOrders::new(&instruments, live_orders_target * 2);
        MarketFlow {
            instruments,
            first_account,
            accounts,
            late: (0, 0),
            thresholds: Thresholds::of(mix),
            crossing_ppm: (mix.crossing_share * 1e6).round() as u64,
            live_orders_target,
            spread_ticks: m.spread_ticks as i64,
            rng: Rng::new(seed ^ ((worker as u64) << 32)),
            live,
            mid,
            next_cl_ord_id: 1,
            hot: None,
        }
    }

    /// The commands that create the market's instruments and this worker's funded accounts
    /// (worker 0 also adds the instruments).
    pub fn setup(&self, with_instruments: bool) -> Vec<CommandBody> {
        let mut v: Vec<CommandBody> = Vec::new();
        if with_instruments {
            v.extend(
                self.instruments
                    .iter()
                    .cloned()
                    .map(CommandBody::AddInstrument),
            );
        }
        for n in 0..self.accounts {
            let account = AccountId(self.first_account + n);
            v.push(CommandBody::AddAccount(AccountSpec {
                account,
                firm: FirmId(1 + account.0 / 10),
                may_short: true,
                stp: StpMode::None,
                stp_scope: StpScope::Account,
            }));
            v.push(CommandBody::Deposit {
                account,
                amount: Cash(CASH_PER_ACCOUNT),
            });
        }
        v
    }

    /// The market's instruments, as this flow created them.
    pub fn instrument_list(&self) -> &[Instrument] {
        &self.instruments
    }

    /// The accounts this flow trades: (first, count).
    pub fn account_range(&self) -> (u32, u32) {
        (self.first_account, self.accounts)
    }

    /// Also trades `count` accounts from `first` that the venue adds while the run goes on
    /// (`[accounts_under_load]`), picked like its own: orders for one not yet added are
    /// refused by the core until it is.
    pub fn set_late_accounts(&mut self, first: u32, count: u32) {
        self.late = (first, count);
    }

    /// The added accounts this flow trades: (first, count).
    pub fn late_accounts(&self) -> (u32, u32) {
        self.late
    }

    pub fn set_hot(&mut self, hot: Option<Hot>) {
        self.hot = hot;
    }

    pub fn live_orders(&self) -> usize {
        self.live.len()
    }

    fn account(&mut self) -> AccountId {
        let k = self.rng.below(u64::from(self.accounts + self.late.1)) as u32;
        if k < self.accounts {
            AccountId(self.first_account + k)
        } else {
            AccountId(self.late.0 + k - self.accounts)
        }
    }

    fn instrument(&mut self) -> usize {
        let n = self.instruments.len() as u64;
        if let Some(h) = self.hot {
            if self.rng.below(1_000_000) < h.share_ppm {
                return self.rng.below((h.instruments as u64).min(n)) as usize;
            }
        }
        self.rng.below(n) as usize
    }

    fn cl_ord_id(&mut self) -> ClOrdId {
        let c = self.next_cl_ord_id;
        self.next_cl_ord_id += 1;
        ClOrdId(c)
    }

    /// The next command and its op.
    pub fn next_command(&mut self) -> (Op, CommandBody) {
        if self.rng.below(1_000_000) < WALK_PER_MILLION {
            let i = self.rng.below(self.mid.len() as u64) as usize;
            let tick = self.instruments[i].tick.0;
            let reference = self.instruments[i].reference_price.0;
            let step = if self.rng.coin() { tick } else { -tick };
            // Keep the middle within 2% of where it started, well inside every band.
            let m = self.mid[i] + step;
            if (m - reference).abs() * 50 < reference {
                self.mid[i] = m;
            }
        }
        let t = self.thresholds;
        let mut pick = self.rng.below(1_000_000);
        let below_target = self.live.len() < self.live_orders_target;
        // Keep the book near its target size: below it, cancels become limit orders; above
        // twice the target, limit orders become cancels.
        if (t.fok..t.cancel).contains(&pick) && below_target {
            pick = 0;
        }
        if pick < t.limit && self.live.len() > 2 * self.live_orders_target && t.cancel > t.fok {
            pick = t.fok;
        }
        if self.live.is_empty() && pick >= t.fok {
            pick = 0;
        }
        if pick < t.limit {
            let crossing = self.rng.below(1_000_000) < self.crossing_ppm;
            (
                Op::Limit,
                self.new_order(OrdType::Limit, crossing, TimeInForce::Day),
            )
        } else if pick < t.market {
            (
                Op::Market,
                self.new_order(OrdType::Market, true, TimeInForce::Ioc),
            )
        } else if pick < t.ioc {
            (
                Op::Ioc,
                self.new_order(OrdType::Limit, true, TimeInForce::Ioc),
            )
        } else if pick < t.fok {
            (
                Op::Fok,
                self.new_order(OrdType::Limit, true, TimeInForce::Fok),
            )
        } else if pick < t.cancel {
            let l = self.live.pick(&mut self.rng);
            (
                Op::Cancel,
                CommandBody::Cancel(Cancel {
                    account: l.account,
                    cl_ord_id: ClOrdId(0),
                    target: OrderRef {
                        order_id: Some(l.order_id),
                        orig_cl_ord_id: None,
                    },
                }),
            )
        } else if pick < t.replace {
            let l = self.live.pick(&mut self.rng);
            let tick = self.instruments[l.instrument_index as usize].tick.0;
            let mut step = self.rng.range(1, 3) * tick;
            if self.rng.coin() {
                step = -step;
            }
            let price = (l.price + step).max(tick);
            let cl_ord_id = self.cl_ord_id();
            (
                Op::Replace,
                CommandBody::Replace(Replace {
                    account: l.account,
                    cl_ord_id,
                    target: OrderRef {
                        order_id: Some(l.order_id),
                        orig_cl_ord_id: None,
                    },
                    price: Some(Price(price)),
                    qty: None,
                }),
            )
        } else {
            let l = self.live.pick(&mut self.rng);
            let cl_ord_id = self.cl_ord_id();
            (
                Op::MassCancel,
                CommandBody::MassCancel(MassCancel {
                    cl_ord_id,
                    account: Some(l.account),
                    firm: None,
                    instrument: Some(self.instruments[l.instrument_index as usize].instrument),
                    side: None,
                }),
            )
        }
    }

    fn new_order(&mut self, ord_type: OrdType, crossing: bool, tif: TimeInForce) -> CommandBody {
        let i = self.instrument();
        let tick = self.instruments[i].tick.0;
        let side = if self.rng.coin() {
            Side::Buy
        } else {
            Side::Sell
        };
        let price = if ord_type == OrdType::Market {
            0
        } else if crossing {
            // Through the middle by up to a quarter of the spread: it meets resting orders.
            let through = self.rng.range(1, (self.spread_ticks / 4).max(1)) * tick;
            match side {
                Side::Buy => self.mid[i] + through,
                Side::Sell => (self.mid[i] - through).max(tick),
            }
        } else {
            let away = self.rng.range(1, self.spread_ticks) * tick;
            match side {
                Side::Buy => (self.mid[i] - away).max(tick),
                Side::Sell => self.mid[i] + away,
            }
        };
        let qty = Qty(self.rng.range(1, QTY_LOTS_MAX));
        let account = self.account();
        let cl_ord_id = self.cl_ord_id();
        CommandBody::NewOrder(NewOrder {
            firm: None,
            account,
            cl_ord_id,
            instrument: self.instruments[i].instrument,
            side,
            ord_type,
            price: Price(price),
            qty,
            tif,
            expire_ts_ns: 0,
            display_qty: Qty(0),
        })
    }

    /// Learns from a core's events which orders are live and where.
    pub fn observe(&mut self, events: &[Event]) {
        self.live.observe(events);
    }
}
