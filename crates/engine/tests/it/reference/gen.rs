//! A seeded generator of realistic, sometimes hostile, command flow, shared by the
//! differential and determinism tests. It reads the reference model to aim its orders: prices
//! cluster around each instrument's current reference so that orders cross often, and cancels
//! and replaces mostly name orders that are really live.
//!
//! No clock and no outside randomness: the same seed gives the same commands.

use super::Model;
use bourse_core::*;
use bourse_engine::fixtures;
use bourse_engine::EngineConfig;

/// A small deterministic PRNG (splitmix64): good enough spread, trivially reproducible.
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
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as u64) as i64
    }
    /// True with probability `per_mille / 1000`.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// The engine limits the tests use: small enough to create engines cheaply, large enough that
/// the flow never reaches them.
pub fn test_config() -> EngineConfig {
    EngineConfig {
        orders_max: 1 << 16,
        instruments_max: 16,
        accounts_max: 64,
        levels_per_side_hint: 64,
        first_order_id: 1,
    }
}

/// Accounts: (id, firm, stp, scope). Several share firms so that firm-scoped self-trade
/// prevention has something to find.
pub const ACCOUNTS: [(u32, u32, StpMode, StpScope); 8] = [
    (1, 1, StpMode::None, StpScope::Account),
    (2, 1, StpMode::CancelResting, StpScope::Account),
    (3, 1, StpMode::CancelIncoming, StpScope::Firm),
    (4, 2, StpMode::CancelBoth, StpScope::Account),
    (5, 2, StpMode::CancelResting, StpScope::Firm),
    (6, 3, StpMode::None, StpScope::Account),
    (7, 3, StpMode::CancelBoth, StpScope::Firm),
    (8, 4, StpMode::CancelIncoming, StpScope::Account),
];

/// An instrument id that is never added, and an account id that is never added.
pub const UNKNOWN_INSTRUMENT: u32 = 77;
pub const UNKNOWN_ACCOUNT: u32 = 99;

/// The set-up: four instruments (an equity with a volatility guard that interrupts often, a
/// narrow-band equity where the band really bites, an FX pair, a future with a 10-point tick)
/// and the accounts, each with more cash than the flow can use and permission to short, so
/// that the engine's risk checks never refuse.
pub fn setup() -> Vec<CommandBody> {
    let mut narrow = fixtures::equity(2, "NARROW", 5_000);
    narrow.band_bps = 40; // +-20 ticks around the reference
    let mut guarded = fixtures::equity(1, "EQA", 10_000);
    guarded.volatility = VolatilityGuard {
        dynamic_bps: 10,        // +-10 ticks around the last trade price
        static_bps: 60,         // +-60 ticks around the last auction price
        auction_ns: 30 * 1_000, // about 30 commands of the flow
    };
    let mut v = vec![
        CommandBody::AddInstrument(guarded),
        CommandBody::AddInstrument(narrow),
        CommandBody::AddInstrument(fixtures::fx(3, "EURUSD", 108_345)),
        CommandBody::AddInstrument(fixtures::future(4, "FUT", 100_000)),
    ];
    for (id, firm, stp, scope) in ACCOUNTS {
        let spec = AccountSpec {
            account: AccountId(id),
            firm: FirmId(firm),
            may_short: true,
            stp,
            stp_scope: scope,
        };
        let cash = Cash(CASH_AMOUNT_MAX);
        // Even accounts come funded in one command, odd ones as an addition and a deposit
        // (which the risk variant below changes).
        if id % 2 == 0 {
            v.push(CommandBody::AddFundedAccount { spec, cash });
        } else {
            v.push(CommandBody::AddAccount(spec));
            v.push(CommandBody::Deposit {
                account: AccountId(id),
                amount: cash,
            });
        }
    }
    v
}

/// Makes commands one at a time, looking at the model's current state.
pub struct Gen {
    pub rng: Rng,
    /// Draws for the withdrawals under a margin call, apart from `rng` so that adding them
    /// left the rest of the flow (and its mix of outcomes) as it was.
    aside: Rng,
    pub ts: u64,
    next_cl: u64,
}

impl Gen {
    pub fn new(seed: u64) -> Gen {
        Gen {
            rng: Rng::new(seed),
            aside: Rng::new(seed ^ 0xA51D_E000),
            ts: 1_000_000_000,
            next_cl: 1,
        }
    }

    /// Stamps `body` with the next time.
    pub fn stamp(&mut self, body: CommandBody) -> Command {
        self.ts += 1_000;
        Command::new(self.ts, body)
    }

    fn account(&mut self) -> u32 {
        if self.rng.chance(3) {
            UNKNOWN_ACCOUNT
        } else {
            ACCOUNTS[self.rng.below(ACCOUNTS.len() as u64) as usize].0
        }
    }

    fn instrument(&mut self, m: &Model) -> u32 {
        if self.rng.chance(3) {
            UNKNOWN_INSTRUMENT
        } else {
            m.books[self.rng.below(m.books.len() as u64) as usize].id
        }
    }

    /// A client id: usually fresh, sometimes one that may be live (to hit duplicates).
    fn cl(&mut self) -> u64 {
        if self.rng.chance(30) && self.next_cl > 1 {
            self.rng.range(1, self.next_cl as i64 - 1) as u64
        } else {
            self.next_cl += 1;
            self.next_cl - 1
        }
    }

    /// A price near the reference (so that orders cross), sometimes at or past the band,
    /// off the tick, zero or negative.
    fn price(&mut self, m: &Model, instrument: u32, side: Side) -> i64 {
        let Some(book) = m.book(instrument) else {
            return self.rng.range(1, 20_000);
        };
        let (tick, reference) = (book.tick, book.reference);
        let roll = self.rng.below(1000);
        if roll < 930 {
            // Mostly passive (a few ticks behind the reference on the order's own side),
            // a third aggressive enough to cross.
            let away = self.rng.range(-6, 14);
            match side {
                Side::Buy => reference - tick * away,
                Side::Sell => reference + tick * away,
            }
        } else if roll < 970 {
            let (low, high) = book.band();
            let edge = if self.rng.chance(500) { low } else { high };
            edge + tick * self.rng.range(-1, 1)
        } else if roll < 985 {
            reference
                + tick * self.rng.range(-30, 30)
                + if tick > 1 {
                    self.rng.range(1, tick - 1)
                } else {
                    0
                }
        } else if roll < 995 {
            self.rng.range(-5, 0)
        } else {
            PRICE_MAX + self.rng.range(0, 1)
        }
    }

    fn qty(&mut self) -> i64 {
        let roll = self.rng.below(1000);
        if roll < 600 {
            self.rng.range(1, 10)
        } else if roll < 980 {
            self.rng.range(1, 100)
        } else if roll < 993 {
            self.rng.range(-3, 0)
        } else {
            QTY_MAX + self.rng.range(0, 1)
        }
    }

    pub fn next(&mut self, m: &Model) -> Command {
        let live = m.live_count() as u64;
        // Cancel more when the books fill up, so that they stay at a realistic size.
        let cancel_share = 60 + (live / 4).min(300);
        // End of day about every 3,000 commands, so that Day orders live long enough to
        // build a book.
        if self.rng.below(3_000) == 0 {
            return self.stamp(CommandBody::EndOfDay);
        }
        // Halts and closes are short: reopen soon. Call auctions last longer, so that a call
        // book builds up (and some volatility auctions come due and end or extend by time).
        if let Some(b) = m.books.iter().find(|b| b.phase != Phase::Open) {
            let per_mille = if b.phase.is_auction() { 8 } else { 30 };
            if self.rng.chance(per_mille) {
                let body = CommandBody::SetPhase {
                    instrument: Some(InstrumentId(b.id)),
                    phase: Phase::Open,
                };
                return self.stamp(body);
            }
        }
        // A kill switch now and then, on an account or on its firm, engaged or released
        // at random, so that switches come and go.
        if self.rng.below(2_000) == 0 {
            let account = self.account();
            let on_firm = self.rng.chance(500);
            let body = CommandBody::KillSwitch {
                firm: on_firm
                    .then(|| {
                        m.accounts
                            .iter()
                            .find(|a| a.id == account)
                            .map_or(0, |a| a.firm)
                    })
                    .map(FirmId),
                account: (!on_firm).then_some(AccountId(account)),
                engaged: self.rng.chance(500),
            };
            return self.stamp(body);
        }
        // A margin call now and then, opened or closed at random, so that accounts trade
        // under a call for a while (only exposure-reducing orders pass).
        if self.rng.below(1_000) == 0 {
            let account = AccountId(self.account());
            let amount = if self.rng.chance(500) {
                Cash(0)
            } else {
                Cash(self.rng.range(1, 1_000_000) as i128)
            };
            return self.stamp(CommandBody::MarginCall { account, amount });
        }
        // Now and then an account under a margin call asks for cash back: refused while the
        // call is open (the model does not model cash, so only those accounts ask).
        let called = m.margin_called_accounts();
        if called.len() > 0 && self.aside.below(200) == 0 {
            let at = self.aside.below(called.len() as u64) as usize;
            let account = AccountId(m.margin_called_accounts().nth(at).expect("in range"));
            let amount = Cash(self.aside.range(1, 1_000_000) as i128);
            return self.stamp(CommandBody::Withdraw { account, amount });
        }
        let roll = self.rng.below(1000);
        let body = if roll < 4 {
            self.phase(m)
        } else if roll < 12 {
            self.mass_cancel(m)
        } else if roll < 12 + cancel_share {
            self.cancel(m)
        } else if roll < 12 + cancel_share + 170 {
            self.replace(m)
        } else {
            self.new_order(m)
        };
        self.stamp(body)
    }

    fn phase(&mut self, m: &Model) -> CommandBody {
        // Mostly reopen what is not open, so that trading is not stopped for long.
        if let Some(b) = m.books.iter().find(|b| b.phase != Phase::Open) {
            if self.rng.chance(700) {
                return CommandBody::SetPhase {
                    instrument: Some(InstrumentId(b.id)),
                    phase: Phase::Open,
                };
            }
        }
        let instrument = if self.rng.chance(200) {
            None
        } else {
            Some(InstrumentId(self.instrument(m)))
        };
        let phase = self.rng.pick(&[
            Phase::Open,
            Phase::Halted,
            Phase::Closed,
            Phase::Paused,
            Phase::OpeningAuction,
            Phase::ClosingAuction,
            Phase::VolatilityAuction,
            Phase::OpeningAuction,
            Phase::ClosingAuction,
        ]);
        CommandBody::SetPhase { instrument, phase }
    }

    fn mass_cancel(&mut self, m: &Model) -> CommandBody {
        let mut mc = MassCancel {
            cl_ord_id: ClOrdId(self.cl()),
            ..MassCancel::default()
        };
        if self.rng.chance(500) {
            mc.account = Some(AccountId(self.account()));
        }
        if self.rng.chance(300) {
            mc.firm = Some(FirmId(self.rng.range(1, 5) as u32));
        }
        if self.rng.chance(400) {
            mc.instrument = Some(InstrumentId(self.instrument(m)));
        }
        if self.rng.chance(400) {
            mc.side = Some(self.rng.pick(&[Side::Buy, Side::Sell]));
        }
        CommandBody::MassCancel(mc)
    }

    /// A live order to aim at, if any: (id, cl, account, instrument, price, total, filled).
    fn target(&mut self, m: &Model) -> Option<(u64, u64, u32, u32, i64, i64, i64)> {
        let n = m.live_count();
        if n == 0 {
            return None;
        }
        let mut k = self.rng.below(n as u64) as usize;
        for b in &m.books {
            if k < b.resting.len() {
                let o = &b.resting[k];
                return Some((o.id, o.cl, o.account, b.id, o.price, o.total, o.filled));
            }
            k -= b.resting.len();
        }
        unreachable!()
    }

    /// A reference to `target`, by exchange id or client id; sometimes to a wrong account,
    /// an unknown order, or with both or neither ids.
    fn order_ref(
        &mut self,
        target: Option<(u64, u64, u32, u32, i64, i64, i64)>,
    ) -> (AccountId, OrderRef) {
        let roll = self.rng.below(1000);
        let (id, cl, account) = match target {
            Some((id, cl, account, ..)) if roll < 940 => (id, cl, account),
            Some((id, cl, ..)) if roll < 970 => (id, cl, self.account()),
            _ => (
                self.rng.range(1, 1_000_000) as u64,
                self.rng.range(1, 1_000_000) as u64,
                self.account(),
            ),
        };
        let r = match self.rng.below(100) {
            0 => OrderRef::default(),
            1 => OrderRef {
                order_id: Some(OrderId(id)),
                orig_cl_ord_id: Some(ClOrdId(cl)),
            },
            2..=50 => OrderRef {
                order_id: Some(OrderId(id)),
                orig_cl_ord_id: None,
            },
            _ => OrderRef {
                order_id: None,
                orig_cl_ord_id: Some(ClOrdId(cl)),
            },
        };
        (AccountId(account), r)
    }

    fn cancel(&mut self, m: &Model) -> CommandBody {
        let t = self.target(m);
        let (account, target) = self.order_ref(t);
        CommandBody::Cancel(Cancel {
            account,
            cl_ord_id: ClOrdId(self.cl()),
            target,
        })
    }

    fn replace(&mut self, m: &Model) -> CommandBody {
        let t = self.target(m);
        let (account, target) = self.order_ref(t);
        let (instrument, price, total, filled, cl, side) = match t {
            Some((id, cl, _, i, p, total, filled)) => {
                let side = m
                    .live_orders()
                    .find(|o| o.id == id)
                    .map_or(Side::Buy, |o| o.side);
                (i, p, total, filled, cl, side)
            }
            None => (1, 10_000, 10, 0, 0, Side::Buy),
        };
        let new_price = match self.rng.below(10) {
            0..=4 => None,
            5 => Some(Price(price)),
            _ => Some(Price(self.price(m, instrument, side))),
        };
        let new_qty = match self.rng.below(12) {
            0..=3 => None,
            // A decrease keeps priority; an increase loses it.
            4..=6 => Some(Qty(self.rng.range(filled + 1, total.max(filled + 1)))),
            7..=9 => Some(Qty(total + self.rng.range(1, 20))),
            10 => Some(Qty(self.rng.range(0, filled))),
            _ => Some(Qty(self.qty())),
        };
        // Usually a new client id, as FIX wants; sometimes the same one, or a used one.
        let cl_ord_id = match self.rng.below(10) {
            0 => ClOrdId(cl),
            _ => ClOrdId(self.cl()),
        };
        CommandBody::Replace(Replace {
            account,
            cl_ord_id,
            target,
            price: new_price,
            qty: new_qty,
        })
    }

    fn new_order(&mut self, m: &Model) -> CommandBody {
        let instrument = self.instrument(m);
        let ord_type = if self.rng.chance(100) {
            OrdType::Market
        } else {
            OrdType::Limit
        };
        let tif = match self.rng.below(100) {
            0..=39 => TimeInForce::Day,
            40..=61 => TimeInForce::Gtc,
            62..=71 => TimeInForce::Gtd,
            72..=87 => TimeInForce::Ioc,
            _ => TimeInForce::Fok,
        };
        // The auction times in force, from a draw of their own so that the rest of the flow
        // stays as it was; mostly while some instrument is in a call.
        let in_call = m.books.iter().any(|b| b.phase.is_auction());
        let tif = if self.aside.chance(if in_call { 150 } else { 10 }) {
            self.aside.pick(&[
                TimeInForce::AtOpening,
                TimeInForce::AtClose,
                TimeInForce::GoodForAuction,
            ])
        } else {
            tif
        };
        let qty = self.qty();
        let side = if self.rng.chance(500) {
            Side::Buy
        } else {
            Side::Sell
        };
        let price = if ord_type == OrdType::Market {
            0
        } else {
            self.price(m, instrument, side)
        };
        let expire_ts_ns = match tif {
            TimeInForce::Gtd => match self.rng.below(50) {
                0 => 0,
                1 => self.ts + 1_000 - self.rng.below(2) * 1_000, // now or in the past
                _ => self.ts + self.rng.range(1, 3_000) as u64 * 1_000,
            },
            _ if self.rng.chance(5) => self.ts + 5_000,
            _ => 0,
        };
        // Icebergs: mostly on resting TIFs with a small display; sometimes invalid.
        let resting_tif = matches!(tif, TimeInForce::Day | TimeInForce::Gtc | TimeInForce::Gtd);
        let display_qty = if self.rng.chance(if resting_tif { 200 } else { 10 }) {
            match self.rng.below(10) {
                0 => -1,
                1 => qty + 1,
                2 => qty,
                _ => self.rng.range(1, 5).min(qty.max(1)),
            }
        } else {
            0
        };
        // Sometimes reuse the client id of a live order of the same account: a duplicate.
        let (account, cl_ord_id) = match self.target(m) {
            Some((_, cl, account, ..)) if self.rng.chance(20) => (account, cl),
            _ => (self.account(), self.cl()),
        };
        CommandBody::NewOrder(NewOrder {
            firm: None,
            account: AccountId(account),
            cl_ord_id: ClOrdId(cl_ord_id),
            instrument: InstrumentId(instrument),
            side,
            ord_type,
            price: Price(price),
            qty: Qty(qty),
            tif,
            expire_ts_ns,
            display_qty: Qty(display_qty),
        })
    }
}

/// The same market with real risk: odd-numbered accounts may not short and hold modest cash,
/// so that orders are also refused for collateral and position. The reference model does not
/// follow such an engine; flow for it is aimed with [`Model::from_engine`].
pub fn setup_with_risk() -> Vec<CommandBody> {
    setup()
        .into_iter()
        .map(|body| match body {
            CommandBody::AddAccount(mut spec) if spec.account.0 % 2 == 1 => {
                spec.may_short = false;
                CommandBody::AddAccount(spec)
            }
            CommandBody::Deposit { account, .. } if account.0 % 2 == 1 => CommandBody::Deposit {
                account,
                amount: Cash(5_000_000_000),
            },
            other => other,
        })
        .collect()
}

/// A whole stream: the set-up followed by `n` generated commands, made by driving a model
/// alongside (the model agrees with the engine, which the differential test checks).
pub fn stream(seed: u64, n: usize) -> Vec<Command> {
    let mut model = Model::new();
    let mut gen = Gen::new(seed);
    let mut v = Vec::with_capacity(n + 32);
    for body in setup() {
        let cmd = gen.stamp(body);
        model.apply(&cmd);
        v.push(cmd);
    }
    for _ in 0..n {
        let cmd = gen.next(&model);
        model.apply(&cmd);
        v.push(cmd);
    }
    v
}
