//! Seeded order flow for benchmarks, the demo and tests: a small deterministic random number
//! generator and a [`Flow`] that plays market makers and takers on a set of instruments.
//!
//! A [`Flow`] produces one command at a time and learns from the engine's events which orders
//! are live ([`Flow::observe`]), so that its cancels and replaces name real orders. It reads
//! no clock: the caller stamps the time. The same seed gives the same commands as long as the
//! same events are observed, which is what lets a benchmark generate a stream once against a
//! shadow engine and replay it, untouched, against the engine it measures.

use crate::fixtures;
use bourse_core::*;
use rustc_hash::FxHashMap;

/// SplitMix64: tiny, fast, and good enough for generating order flow.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// A number in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
    /// A number in `low..=high`.
    pub fn range(&mut self, low: i64, high: i64) -> i64 {
        debug_assert!(low <= high);
        low + self.below((high - low + 1) as u64) as i64
    }
    pub fn coin(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }
}

/// The shares of each kind of command a [`Flow`] sends, in per mille (they add up to 1000).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mix {
    /// Passive limit orders (GTC or Day) that rest away from the middle.
    pub new_passive: u32,
    /// Marketable IOC limit orders.
    pub new_ioc: u32,
    /// Market orders.
    pub new_market: u32,
    pub cancel: u32,
    /// Price moves of live orders (replace).
    pub replace: u32,
}

impl Mix {
    /// exchange-core's published benchmark mix: 9% GTC, 3% IOC, 6% cancels, 82% moves.
    pub const EXCHANGE_CORE: Mix = Mix {
        new_passive: 90,
        new_ioc: 30,
        new_market: 0,
        cancel: 60,
        replace: 820,
    };
    /// A MOEX-like mix: about half new orders and half cancels, some replaces; a small share
    /// of new orders is marketable, so trades are about 5% of orders.
    pub const MOEX: Mix = Mix {
        new_passive: 450,
        new_ioc: 20,
        new_market: 5,
        cancel: 460,
        replace: 65,
    };
    pub fn total(&self) -> u32 {
        self.new_passive + self.new_ioc + self.new_market + self.cancel + self.replace
    }
}

/// What a [`Flow`] trades and how.
#[derive(Clone, Debug)]
pub struct FlowConfig {
    pub instruments: Vec<Instrument>,
    /// Accounts are numbered `first_account ..first_account + accounts`, ten to a firm.
    pub first_account: u32,
    pub accounts: u32,
    /// Cash each account starts with, in cash units.
    pub cash_per_account: i128,
    pub mix: Mix,
    /// The flow keeps about this many orders live: below it, it sends new orders instead of
    /// cancels.
    pub live_orders_target: usize,
    /// Passive orders rest up to this many ticks away from the middle.
    pub spread_ticks: i64,
    /// Replaces move a price by up to this many ticks.
    pub move_ticks: i64,
    /// Order sizes are drawn from `1..=qty_max` lots.
    pub qty_max: i64,
    /// Share of passive orders that are icebergs, per mille.
    pub iceberg_per_mille: u32,
    /// The middle price of each instrument walks by a tick with this chance per command, per
    /// mille.
    pub walk_per_mille: u32,
    pub seed: u64,
}

impl FlowConfig {
    /// Mix (a) of the engine benchmark: one book, 1,000 accounts, about 1,000 resting orders
    /// over about 750 price levels, exchange-core's command mix.
    pub fn exchange_core(seed: u64) -> FlowConfig {
        FlowConfig {
            instruments: vec![fixtures::equity(1, "XCORE", 100_000)],
            first_account: 1,
            accounts: 1_000,
            cash_per_account: 1_000_000_000_000_0000,
            mix: Mix::EXCHANGE_CORE,
            live_orders_target: 1_000,
            spread_ticks: 375,
            move_ticks: 8,
            qty_max: 10,
            iceberg_per_mille: 0,
            walk_per_mille: 0,
            seed,
        }
    }

    /// Mix (b) of the engine benchmark: 100 instruments, 10,000 accounts, MOEX-like flow.
    pub fn moex(seed: u64) -> FlowConfig {
        FlowConfig {
            instruments: (0..100)
                .map(|i| {
                    fixtures::equity(i + 1, &format!("EQ{:03}", i + 1), 10_000 + 100 * i as i64)
                })
                .collect(),
            first_account: 1,
            accounts: 10_000,
            cash_per_account: 1_000_000_000_000_0000,
            mix: Mix::MOEX,
            live_orders_target: 20_000,
            spread_ticks: 50,
            move_ticks: 3,
            qty_max: 20,
            iceberg_per_mille: 20,
            walk_per_mille: 5,
            seed,
        }
    }

    /// The demo's markets: equities, FX pairs and futures, traded by `accounts` participants.
    pub fn three_markets(accounts: u32, seed: u64) -> FlowConfig {
        FlowConfig {
            instruments: vec![
                fixtures::equity(1, "SBER", 30_000),
                fixtures::equity(2, "GAZP", 16_000),
                fixtures::equity(3, "LKOH", 700_000),
                fixtures::equity(4, "YNDX", 400_000),
                fixtures::fx(11, "EURUSD", 108_000),
                fixtures::fx(12, "USDRUB", 9_000_000),
                fixtures::future(21, "RIZ6", 110_000),
                fixtures::future(22, "SiZ6", 92_000),
            ],
            first_account: 1,
            accounts,
            cash_per_account: 100_000_000_0000,
            mix: Mix::MOEX,
            live_orders_target: 4_000,
            spread_ticks: 40,
            move_ticks: 3,
            qty_max: 10,
            iceberg_per_mille: 30,
            walk_per_mille: 20,
            seed,
        }
    }
}

/// A live order as a flow knows it.
#[derive(Clone, Copy, Debug)]
pub struct LiveOrder {
    pub order_id: OrderId,
    pub account: AccountId,
    /// Index of the instrument in the flow's own list.
    pub instrument_index: u32,
    pub price: i64,
}

/// The orders a flow believes live, learnt from the order log, with O(1) insert, remove and
/// random pick, so that cancels and replaces can name real orders.
#[derive(Clone, Debug, Default)]
pub struct LiveOrders {
    live: Vec<LiveOrder>,
    index: FxHashMap<OrderId, usize>,
    instrument_index: FxHashMap<InstrumentId, u32>,
}

impl LiveOrders {
    /// Tracks orders of `instruments` (others are ignored), expecting about `capacity` live.
    pub fn new(instruments: &[Instrument], capacity: usize) -> LiveOrders {
        LiveOrders {
            live: Vec::with_capacity(capacity),
            index: FxHashMap::default(),
            instrument_index: instruments
                .iter()
                .enumerate()
                .map(|(n, i)| (i.instrument, n as u32))
                .collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// A live order chosen uniformly by `rng`. The set must not be empty.
    pub fn pick(&self, rng: &mut Rng) -> LiveOrder {
        self.live[rng.below(self.live.len() as u64) as usize]
    }

    /// Learns from a core's events which orders are live and where.
    pub fn observe(&mut self, events: &[Event]) {
        for e in events {
            let Event::OrderLog(log) = e else { continue };
            match log.action {
                OrderLogAction::New => {
                    let Some(&instrument_index) = self.instrument_index.get(&log.instrument) else {
                        continue;
                    };
                    if self.index.contains_key(&log.order_id) {
                        continue;
                    }
                    self.index.insert(log.order_id, self.live.len());
                    self.live.push(LiveOrder {
                        order_id: log.order_id,
                        account: log.account,
                        instrument_index,
                        price: log.price.0,
                    });
                }
                OrderLogAction::Change => {
                    if let Some(&i) = self.index.get(&log.order_id) {
                        self.live[i].price = log.price.0;
                    }
                }
                OrderLogAction::Delete => {
                    if let Some(i) = self.index.remove(&log.order_id) {
                        self.live.swap_remove(i);
                        if i < self.live.len() {
                            let moved = self.live[i].order_id;
                            self.index.insert(moved, i);
                        }
                    }
                }
            }
        }
    }
}

/// Market makers and takers, as a stream of commands.
pub struct Flow {
    config: FlowConfig,
    rng: Rng,
    /// Middle price of each instrument, in raw units.
    mid: Vec<i64>,
    live: LiveOrders,
    next_cl_ord_id: u64,
}

impl Flow {
    pub fn new(config: FlowConfig) -> Flow {
        assert!(!config.instruments.is_empty() && config.accounts > 0);
        assert_eq!(
            config.mix.total(),
            1000,
            "mix must add up to 1000 per mille"
        );
        let mid = config
            .instruments
            .iter()
            .map(|i| i.reference_price.0)
            .collect();
        Flow {
            rng: Rng::new(config.seed),
            mid,
            live: LiveOrders::new(&config.instruments, config.live_orders_target * 2),
            next_cl_ord_id: 1,
            config,
        }
    }

    pub fn config(&self) -> &FlowConfig {
        &self.config
    }

    pub fn live_orders(&self) -> usize {
        self.live.len()
    }

    /// The commands that create the instruments and funded accounts.
    pub fn setup(&self) -> Vec<CommandBody> {
        let c = &self.config;
        let mut v: Vec<CommandBody> = c
            .instruments
            .iter()
            .cloned()
            .map(CommandBody::AddInstrument)
            .collect();
        for n in 0..c.accounts {
            let account = AccountId(c.first_account + n);
            v.push(CommandBody::AddAccount(AccountSpec {
                account,
                firm: FirmId(1 + n / 10),
                may_short: true,
                stp: StpMode::None,
                stp_scope: StpScope::Account,
            }));
            v.push(CommandBody::Deposit {
                account,
                amount: Cash(c.cash_per_account),
            });
        }
        v
    }

    fn account(&mut self) -> AccountId {
        AccountId(self.config.first_account + self.rng.below(self.config.accounts as u64) as u32)
    }

    fn qty(&mut self) -> Qty {
        Qty(self.rng.range(1, self.config.qty_max))
    }

    /// The next command of the flow.
    pub fn next_command(&mut self) -> CommandBody {
        let c = &self.config;
        if c.walk_per_mille > 0 && self.rng.below(1000) < c.walk_per_mille as u64 {
            let i = self.rng.below(self.mid.len() as u64) as usize;
            let tick = c.instruments[i].tick.0;
            let reference = c.instruments[i].reference_price.0;
            let step = if self.rng.coin() { tick } else { -tick };
            // Keep the middle within 5% of where it started, well inside every band.
            let m = self.mid[i] + step;
            if (m - reference).abs() * 20 < reference {
                self.mid[i] = m;
            }
        }
        let mix = c.mix;
        let below_target = self.live.len() < c.live_orders_target;
        let mut pick = self.rng.below(1000) as u32;
        // Keep the book near its target size: below it, cancels become new orders; above
        // twice the target, new passive orders become cancels.
        if pick >= 1000 - mix.cancel - mix.replace && pick < 1000 - mix.replace && below_target {
            pick = 0;
        }
        if pick < mix.new_passive && self.live.len() > 2 * c.live_orders_target {
            pick = 1000 - mix.replace - 1;
        }
        if pick < mix.new_passive || self.live.is_empty() {
            self.new_passive()
        } else if pick < mix.new_passive + mix.new_ioc {
            self.new_aggressive(OrdType::Limit)
        } else if pick < mix.new_passive + mix.new_ioc + mix.new_market {
            self.new_aggressive(OrdType::Market)
        } else if pick < 1000 - mix.replace {
            let l = self.live.pick(&mut self.rng);
            CommandBody::Cancel(Cancel {
                account: l.account,
                cl_ord_id: ClOrdId(0),
                target: OrderRef {
                    order_id: Some(l.order_id),
                    orig_cl_ord_id: None,
                },
            })
        } else {
            let l = self.live.pick(&mut self.rng);
            let def = &self.config.instruments[l.instrument_index as usize];
            let tick = def.tick.0;
            let mut step = self.rng.range(1, self.config.move_ticks) * tick;
            if self.rng.coin() {
                step = -step;
            }
            let price = (l.price + step).max(tick);
            let cl = self.next_cl_ord_id;
            self.next_cl_ord_id += 1;
            CommandBody::Replace(Replace {
                account: l.account,
                cl_ord_id: ClOrdId(cl),
                target: OrderRef {
                    order_id: Some(l.order_id),
                    orig_cl_ord_id: None,
                },
                price: Some(Price(price)),
                qty: None,
            })
        }
    }

    fn new_passive(&mut self) -> CommandBody {
        let i = self.rng.below(self.config.instruments.len() as u64) as usize;
        let tick = self.config.instruments[i].tick.0;
        let side = if self.rng.coin() {
            Side::Buy
        } else {
            Side::Sell
        };
        let away = self.rng.range(1, self.config.spread_ticks) * tick;
        let price = match side {
            Side::Buy => (self.mid[i] - away).max(tick),
            Side::Sell => self.mid[i] + away,
        };
        let qty = self.qty();
        let iceberg = self.rng.below(1000) < self.config.iceberg_per_mille as u64 && qty.0 > 1;
        let account = self.account();
        let cl = self.next_cl_ord_id;
        self.next_cl_ord_id += 1;
        CommandBody::NewOrder(NewOrder {
            firm: None,
            account,
            cl_ord_id: ClOrdId(cl),
            instrument: self.config.instruments[i].instrument,
            side,
            ord_type: OrdType::Limit,
            price: Price(price),
            qty,
            tif: if self.rng.coin() {
                TimeInForce::Gtc
            } else {
                TimeInForce::Day
            },
            expire_ts_ns: 0,
            display_qty: Qty(if iceberg { 1.max(qty.0 / 4) } else { 0 }),
        })
    }

    fn new_aggressive(&mut self, ord_type: OrdType) -> CommandBody {
        let i = self.rng.below(self.config.instruments.len() as u64) as usize;
        let tick = self.config.instruments[i].tick.0;
        let side = if self.rng.coin() {
            Side::Buy
        } else {
            Side::Sell
        };
        let through = self.rng.range(1, (self.config.spread_ticks / 4).max(1)) * tick;
        let price = match (ord_type, side) {
            (OrdType::Market, _) => 0,
            (_, Side::Buy) => self.mid[i] + through,
            (_, Side::Sell) => (self.mid[i] - through).max(tick),
        };
        let qty = self.qty();
        let account = self.account();
        let cl = self.next_cl_ord_id;
        self.next_cl_ord_id += 1;
        CommandBody::NewOrder(NewOrder {
            firm: None,
            account,
            cl_ord_id: ClOrdId(cl),
            instrument: self.config.instruments[i].instrument,
            side,
            ord_type,
            price: Price(price),
            qty,
            tif: TimeInForce::Ioc,
            expire_ts_ns: 0,
            display_qty: Qty(0),
        })
    }

    /// Learns from the engine's events which orders are live and where.
    pub fn observe(&mut self, events: &[Event]) {
        self.live.observe(events);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Engine, EngineConfig};

    fn run(config: FlowConfig, commands: usize) -> (Engine, usize, u64) {
        let mut engine = Engine::new(EngineConfig::default());
        let mut flow = Flow::new(config);
        let mut events = Vec::new();
        for (n, body) in flow.setup().into_iter().enumerate() {
            events.clear();
            engine.apply(&Command::new(n as u64, body), &mut events);
        }
        let mut rejects = 0;
        for n in 0..commands {
            let body = flow.next_command();
            events.clear();
            engine.apply(&Command::new(1_000_000 + n as u64, body), &mut events);
            rejects += events
                .iter()
                .filter(|e| {
                    matches!(
                        e,
                        Event::OrderRejected { .. } | Event::CancelRejected { .. }
                    )
                })
                .count();
            flow.observe(&events);
        }
        let trades = engine.counters().trades;
        (engine, rejects, trades)
    }

    #[test]
    fn the_exchange_core_mix_keeps_about_a_thousand_orders_live() {
        let (engine, rejects, trades) = run(FlowConfig::exchange_core(7), 50_000);
        assert!(
            (700..=2_500).contains(&engine.live_orders()),
            "{} live",
            engine.live_orders()
        );
        assert!(rejects < 2_500, "{rejects} rejects");
        assert!(trades > 0);
        engine.check_invariants().unwrap();
    }

    #[test]
    fn the_moex_mix_trades_a_few_percent_of_orders() {
        let (engine, rejects, trades) = run(FlowConfig::moex(7), 50_000);
        let accepted = engine.counters().orders_accepted;
        assert!(
            trades * 100 > accepted,
            "{trades} trades for {accepted} orders"
        );
        assert!(
            trades * 100 < accepted * 30,
            "{trades} trades for {accepted} orders"
        );
        assert!(rejects < 2_500, "{rejects} rejects");
        engine.check_invariants().unwrap();
    }

    #[test]
    fn the_same_seed_gives_the_same_stream() {
        let (a, _, _) = run(FlowConfig::three_markets(100, 3), 5_000);
        let (b, _, _) = run(FlowConfig::three_markets(100, 3), 5_000);
        assert_eq!(a.state_hash(), b.state_hash());
    }
}
