//! Property tests: arbitrary and hostile command sequences never panic the engine, and after
//! every command its state is consistent and its bookkeeping adds up.
//!
//! Commands are drawn in an abstract form ([`Op`]) and made concrete against the engine's
//! current state, so that prices can be "three ticks above the reference" as well as zero,
//! negative, off the tick or astronomically large, and order references can name orders that
//! live, have filled, were cancelled, or never existed.
//!
//! Checked after every command (see [`Checker`]):
//! - `check_invariants()` holds;
//! - a rejected command changes nothing observable (books, orders, accounts, positions,
//!   instruments, phases), and only the command counters move;
//! - quantity is conserved per order across replaces: filled + open + cancelled/expired =
//!   total, and the engine's view of every live order agrees with the events;
//! - price-time priority: within a level, orders rest in the order in which they last entered
//!   the book (arrival, a replace that lost priority, an iceberg refill);
//! - cash and positions are conserved across both sides of every trade: each account's cash
//!   moves by exactly its trades' values (equities and FX) plus its deposits and withdrawals,
//!   each position by exactly its trades, positions of every instrument sum to zero;
//! - reservations and free cash are never negative, and accounts that may not short never do;
//! - order-log `seq` numbers, order ids and trade ids grow by one, with no gaps (a rejected
//!   command uses none up);
//! - at the end of each case: the state survives snapshot and restore byte for byte, and a
//!   replay of the same commands gives the same events.
//!
//! The same checks also run over the differential test's realistic flow, and over that flow
//! against real risk (accounts that may not short, modest cash, cash operations mixed in).
//!
//! Knob: `BOURSE_PROP_CASES` (default 256) sets the number of hostile cases; the realistic
//! properties run a tenth as many (default 24), each of 2,000-3,000 commands.

use crate::reference;

use bourse_core::*;
use bourse_engine::{fixtures, Engine};
use proptest::prelude::*;
use reference::gen::test_config;
use std::collections::BTreeMap;

// ----- abstract commands -----

#[derive(Clone, Debug)]
enum PriceSpec {
    /// `reference + k * tick` of the named instrument.
    Ticks(i8),
    /// A band edge plus `k` ticks.
    Edge(bool, i8),
    Raw(i64),
}

#[derive(Clone, Debug)]
enum RefSpec {
    /// The k-th live order (modulo their number), named by its owner, by exchange id if the
    /// flag is set, else by client id.
    Live(u16, bool),
    ById(u64),
    ByCl(u64),
    Both(u64, u64),
    Neither,
}

#[derive(Clone, Debug)]
enum Op {
    New {
        account: u32,
        cl: u64,
        instrument: u32,
        side: Side,
        market: bool,
        price: PriceSpec,
        qty: i64,
        tif: TimeInForce,
        /// Expiry relative to now (may be zero or negative); None: what the time in force
        /// wants (a future instant for GTD, none otherwise).
        expire: Option<i64>,
        display: i64,
    },
    Cancel {
        account: u32,
        target: RefSpec,
    },
    Replace {
        account: u32,
        cl: u64,
        target: RefSpec,
        price: Option<PriceSpec>,
        qty: Option<i64>,
    },
    Mass {
        account: Option<u32>,
        firm: Option<u32>,
        instrument: Option<u32>,
        side: Option<Side>,
    },
    Phase {
        instrument: Option<u32>,
        phase: Phase,
    },
    Deposit {
        account: u32,
        amount: i128,
    },
    Withdraw {
        account: u32,
        amount: i128,
    },
    /// A clearing run's debit: refused above the free cash, and then a margin call.
    ClearingDebit {
        account: u32,
        amount: i128,
    },
    Collateral {
        account: u32,
        amount: i128,
    },
    AddInstrument(Instrument),
    AddAccount(AccountSpec),
    EndOfDay,
    /// Let time pass (so that GTD orders come due).
    Sleep(u64),
}

fn side() -> impl Strategy<Value = Side> {
    prop_oneof![Just(Side::Buy), Just(Side::Sell)]
}

/// Mostly the accounts that exist at the start (1 to 5), sometimes one that does not (yet).
fn account() -> impl Strategy<Value = u32> {
    prop_oneof![9 => 1u32..=5, 1 => 0u32..=8]
}

/// Mostly the instruments that exist at the start (1 to 4), sometimes one that may have been
/// added since (5, 6), sometimes one that does not exist.
fn instrument() -> impl Strategy<Value = u32> {
    prop_oneof![7 => 1u32..=4, 2 => 4u32..=6, 1 => 0u32..=7]
}

fn price_spec() -> impl Strategy<Value = PriceSpec> {
    prop_oneof![
        8 => (-6i8..=6).prop_map(PriceSpec::Ticks),
        1 => (any::<bool>(), -2i8..=2).prop_map(|(high, k)| PriceSpec::Edge(high, k)),
        1 => prop_oneof![
            Just(0i64),
            Just(-1),
            Just(i64::MIN),
            Just(i64::MAX),
            Just(PRICE_MAX),
            Just(PRICE_MAX + 1),
            Just(10_001), // off the future's tick of 10
            any::<i64>(),
        ]
        .prop_map(PriceSpec::Raw),
    ]
}

fn qty() -> impl Strategy<Value = i64> {
    prop_oneof![
        6 => 1i64..=20,
        2 => 1i64..=1_000,
        1 => prop_oneof![Just(0i64), Just(-1), Just(i64::MIN), Just(i64::MAX), Just(QTY_MAX), Just(QTY_MAX + 1), any::<i64>()],
    ]
}

fn amount() -> impl Strategy<Value = i128> {
    prop_oneof![
        6 => 1i128..=1_000_000_000_000,
        1 => prop_oneof![
            Just(0i128),
            Just(-1),
            Just(CASH_AMOUNT_MAX),
            Just(CASH_AMOUNT_MAX + 1),
            Just(i128::MAX),
            Just(i128::MIN),
            any::<i128>(),
        ],
    ]
}

fn order_ref() -> impl Strategy<Value = RefSpec> {
    prop_oneof![
        8 => (any::<u16>(), any::<bool>()).prop_map(|(k, by_id)| RefSpec::Live(k, by_id)),
        4 => (1u64..40).prop_map(RefSpec::ById),
        4 => (1u64..12).prop_map(RefSpec::ByCl),
        1 => (1u64..40, 1u64..12).prop_map(|(a, b)| RefSpec::Both(a, b)),
        1 => Just(RefSpec::Neither),
        1 => any::<u64>().prop_map(RefSpec::ById),
    ]
}

fn tif() -> impl Strategy<Value = TimeInForce> {
    // Mostly orders that rest, so that books build up and later orders trade with them.
    prop_oneof![
        4 => Just(TimeInForce::Day),
        2 => Just(TimeInForce::Gtc),
        1 => Just(TimeInForce::Gtd),
        2 => Just(TimeInForce::Ioc),
        1 => Just(TimeInForce::Fok),
        1 => Just(TimeInForce::AtOpening),
        1 => Just(TimeInForce::AtClose),
        1 => Just(TimeInForce::GoodForAuction),
    ]
}

/// Instrument definitions from plausible to absurd (zero tick, giant lots and multipliers,
/// bands of 0 or 100%, reference prices at the limit), some of them valid.
fn instrument_def() -> impl Strategy<Value = Instrument> {
    (
        (
            4u32..=6,
            prop_oneof![
                Just(Market::Equity),
                Just(Market::Fx),
                Just(Market::Futures)
            ],
            0u8..=14,
            prop_oneof![4 => Just(1i64), 4 => Just(10), 1 => Just(0), 1 => Just(-1), 1 => Just(PRICE_MAX)],
        ),
        (
            prop_oneof![4 => Just(1i64), 4 => Just(1_000_000_000), 1 => Just(0), 1 => Just(1_000_000_001)],
            prop_oneof![4 => Just(1i64), 4 => Just(1_000_000_000), 1 => Just(0)],
            // A margin that suits the market (none for equities and FX, positive for
            // futures), or one that does not.
            prop_oneof![9 => Just(true), 1 => Just(false)],
            prop_oneof![Just(1i128), Just(5_000_0000), Just(1_000_000_000_000_000_000)],
        ),
        (
            prop_oneof![1 => Just(0u32), 3 => Just(1), 3 => Just(1000), 3 => Just(10_000), 1 => Just(10_001)],
            prop_oneof![
                3 => Just(100i64),
                3 => Just(10_000),
                3 => Just(PRICE_MAX),
                3 => Just(300_000_000_000_000),
                1 => Just(0),
            ],
            // A volatility guard now and then, valid or not.
            prop::option::of((0u32..=300, 0u32..=10_001, 0u64..=20_000)),
        ),
    )
        .prop_map(
            |(
                (id, market, price_scale, tick),
                (lot, mult, margin_fits, margin),
                (band, reference, guard),
            )| {
                let futures = market == Market::Futures;
                Instrument {
                    instrument: InstrumentId(id),
                    symbol: format!("X{id}"),
                    market,
                    price_scale,
                    tick: Price(tick),
                    lot_size: lot,
                    multiplier: mult,
                    initial_margin: Cash(if futures == margin_fits { margin } else { 0 }),
                    band_bps: band,
                    reference_price: Price(reference),
                    volatility: guard.map_or(VolatilityGuard::default(), |(d, s, n)| {
                        VolatilityGuard {
                            dynamic_bps: d,
                            static_bps: s,
                            auction_ns: n,
                        }
                    }),
                }
            },
        )
}

fn stp() -> impl Strategy<Value = StpMode> {
    prop_oneof![
        Just(StpMode::None),
        Just(StpMode::CancelResting),
        Just(StpMode::CancelIncoming),
        Just(StpMode::CancelBoth)
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let new = (
        (
            account(),
            1u64..12,
            instrument(),
            side(),
            prop::bool::weighted(0.1),
        ),
        (
            price_spec(),
            qty(),
            tif(),
            prop_oneof![8 => Just(None), 1 => any::<i64>().prop_map(Some)],
        ),
        prop_oneof![12 => Just(0i64), 2 => 1i64..=4, 1 => Just(-1), 1 => any::<i64>()],
    )
        .prop_map(
            |((account, cl, instrument, side, market), (price, qty, tif, expire), display)| {
                Op::New {
                    account,
                    cl,
                    instrument,
                    side,
                    market,
                    price,
                    qty,
                    tif,
                    expire,
                    display,
                }
            },
        );
    prop_oneof![
        45 => new,
        8 => (account(), order_ref()).prop_map(|(account, target)| Op::Cancel { account, target }),
        8 => (account(), 1u64..12, order_ref(), prop::option::of(price_spec()), prop::option::of(qty()))
            .prop_map(|(account, cl, target, price, qty)| Op::Replace { account, cl, target, price, qty }),
        2 => (
            prop::option::of(0u32..=7),
            prop::option::of(0u32..=4),
            prop::option::of(0u32..=6),
            prop::option::of(side())
        )
            .prop_map(|(account, firm, instrument, side)| Op::Mass { account, firm, instrument, side }),
        1 => (
            prop::option::of(0u32..=6),
            prop_oneof![
                5 => Just(Phase::Open),
                1 => Just(Phase::Halted),
                1 => Just(Phase::Closed),
                2 => Just(Phase::OpeningAuction),
                2 => Just(Phase::ClosingAuction),
                1 => Just(Phase::VolatilityAuction)
            ]
        )
            .prop_map(|(instrument, phase)| Op::Phase { instrument, phase }),
        2 => (account(), amount()).prop_map(|(account, amount)| Op::Deposit { account, amount }),
        2 => (account(), amount()).prop_map(|(account, amount)| Op::Withdraw { account, amount }),
        1 => (account(), amount()).prop_map(|(account, amount)| Op::ClearingDebit { account, amount }),
        2 => (account(), amount()).prop_map(|(account, amount)| Op::Collateral { account, amount }),
        2 => instrument_def().prop_map(Op::AddInstrument),
        1 => (5u32..=8, 1u32..=3, any::<bool>(), stp(), any::<bool>()).prop_map(|(id, firm, may_short, stp, firm_scope)| {
            Op::AddAccount(AccountSpec {
                account: AccountId(id),
                firm: FirmId(firm),
                may_short,
                stp,
                stp_scope: if firm_scope { StpScope::Firm } else { StpScope::Account },
            })
        }),
        1 => Just(Op::EndOfDay),
        1 => (1u64..5_000_000).prop_map(Op::Sleep),
    ]
}

/// Turns an abstract price into a raw one against the instrument's current state.
fn resolve_price(e: &Engine, instrument: u32, p: &PriceSpec) -> i64 {
    let Some(def) = e.instrument(InstrumentId(instrument)) else {
        return match p {
            PriceSpec::Raw(x) => *x,
            _ => 10_000,
        };
    };
    let tick = def.tick.0;
    match *p {
        PriceSpec::Ticks(k) => def
            .reference_price
            .0
            .saturating_add(tick.saturating_mul(k as i64)),
        PriceSpec::Edge(high, k) => {
            let (lo, hi) = def.band();
            (if high { hi.0 } else { lo.0 }).saturating_add(tick.saturating_mul(k as i64))
        }
        PriceSpec::Raw(x) => x,
    }
}

/// The account, order reference and instrument a cancel or replace names.
fn resolve_target(e: &Engine, account: u32, t: &RefSpec) -> (AccountId, OrderRef, u32) {
    let by_id = |id| OrderRef {
        order_id: Some(OrderId(id)),
        orig_cl_ord_id: None,
    };
    let by_cl = |cl| OrderRef {
        order_id: None,
        orig_cl_ord_id: Some(ClOrdId(cl)),
    };
    let live: Vec<bourse_engine::OrderView> = e
        .instruments()
        .flat_map(|i| e.resting_orders(i.instrument))
        .collect();
    let (r, instrument) = match *t {
        RefSpec::Live(k, id) if !live.is_empty() => {
            let o = live[k as usize % live.len()];
            let r = if id {
                by_id(o.order_id.0)
            } else {
                by_cl(o.cl_ord_id.0)
            };
            return (o.account, r, o.instrument.0);
        }
        RefSpec::Live(k, _) => (by_id(k as u64), 1),
        RefSpec::ById(id) => (
            by_id(id),
            e.order(OrderId(id)).map_or(1, |o| o.instrument.0),
        ),
        RefSpec::ByCl(cl) => (by_cl(cl), 1),
        RefSpec::Both(id, cl) => (
            OrderRef {
                order_id: Some(OrderId(id)),
                orig_cl_ord_id: Some(ClOrdId(cl)),
            },
            1,
        ),
        RefSpec::Neither => (OrderRef::default(), 1),
    };
    (AccountId(account), r, instrument)
}

/// The concrete command for `op` at time `ts`, or None for a pause.
fn concrete(e: &Engine, op: &Op, ts: u64) -> Option<CommandBody> {
    Some(match op {
        Op::New {
            account,
            cl,
            instrument,
            side,
            market,
            price,
            qty,
            tif,
            expire,
            display,
        } => CommandBody::NewOrder(NewOrder {
            firm: None,
            account: AccountId(*account),
            cl_ord_id: ClOrdId(*cl),
            instrument: InstrumentId(*instrument),
            side: *side,
            ord_type: if *market {
                OrdType::Market
            } else {
                OrdType::Limit
            },
            price: Price(if *market {
                0
            } else {
                resolve_price(e, *instrument, price)
            }),
            qty: Qty(*qty),
            tif: *tif,
            expire_ts_ns: match (expire, tif) {
                (None, TimeInForce::Gtd) => ts + 3_000_000,
                (None, _) => 0,
                (Some(dt), _) => (ts as i64).saturating_add(*dt) as u64,
            },
            display_qty: Qty(*display),
        }),
        Op::Cancel { account, target } => {
            let (account, target, _) = resolve_target(e, *account, target);
            CommandBody::Cancel(Cancel {
                account,
                cl_ord_id: ClOrdId(999),
                target,
            })
        }
        Op::Replace {
            account,
            cl,
            target,
            price,
            qty,
        } => {
            // The price is aimed at the instrument of the order named, if it lives.
            let (account, target, instrument) = resolve_target(e, *account, target);
            CommandBody::Replace(Replace {
                account,
                cl_ord_id: ClOrdId(*cl),
                target,
                price: price
                    .as_ref()
                    .map(|p| Price(resolve_price(e, instrument, p))),
                qty: qty.map(Qty),
            })
        }
        Op::Mass {
            account,
            firm,
            instrument,
            side,
        } => CommandBody::MassCancel(MassCancel {
            cl_ord_id: ClOrdId(1),
            account: account.map(AccountId),
            firm: firm.map(FirmId),
            instrument: instrument.map(InstrumentId),
            side: *side,
        }),
        Op::Phase { instrument, phase } => CommandBody::SetPhase {
            instrument: instrument.map(InstrumentId),
            phase: *phase,
        },
        Op::Deposit { account, amount } => CommandBody::Deposit {
            account: AccountId(*account),
            amount: Cash(*amount),
        },
        Op::Withdraw { account, amount } => CommandBody::Withdraw {
            account: AccountId(*account),
            amount: Cash(*amount),
        },
        Op::ClearingDebit { account, amount } => CommandBody::ClearingDebit {
            account: AccountId(*account),
            amount: Cash(*amount),
        },
        Op::Collateral { account, amount } => CommandBody::SetCollateral {
            account: AccountId(*account),
            amount: Cash(*amount),
        },
        Op::AddInstrument(def) => CommandBody::AddInstrument(def.clone()),
        Op::AddAccount(spec) => CommandBody::AddAccount(*spec),
        Op::EndOfDay => CommandBody::EndOfDay,
        Op::Sleep(_) => return None,
    })
}

// ----- the starting market -----

/// Four instruments (an equity, an FX pair, a future, an extreme future) and five accounts: 1 rich and allowed to short, 2 modest and covered
/// only, 3 with no cash at all, 4 rich with firm-wide self-trade prevention in 1's firm, 5 with
/// some cash, allowed to short, in a firm of its own.
fn start() -> (Engine, u64) {
    let mut d = fixtures::Driver::new(test_config());
    d.add_instrument(fixtures::equity(1, "EQ", 10_000));
    d.add_instrument(fixtures::fx(2, "FX", 108_345));
    d.add_instrument(fixtures::future(3, "FUT", 100_000));
    // Valid but extreme: the largest lot and multiplier, a high price, margin of one unit.
    // The value of a trade of a few hundred lots here does not fit 128 bits.
    let mut big = fixtures::future(4, "BIG", 100_000_000_000_000);
    big.lot_size = 1_000_000_000;
    big.multiplier = 1_000_000_000;
    big.initial_margin = Cash(1);
    d.add_instrument(big);
    let spec = |id, firm, may_short, stp, stp_scope| AccountSpec {
        account: AccountId(id),
        firm: FirmId(firm),
        may_short,
        stp,
        stp_scope,
    };
    d.add_account_spec(
        spec(1, 1, true, StpMode::None, StpScope::Account),
        1_000_000_000_000_000,
    );
    d.add_account_spec(
        spec(2, 2, false, StpMode::CancelResting, StpScope::Account),
        5_000_000_000,
    );
    d.add_account_spec(
        spec(3, 2, false, StpMode::CancelIncoming, StpScope::Account),
        0,
    );
    d.add_account_spec(
        spec(4, 1, true, StpMode::CancelBoth, StpScope::Firm),
        1_000_000_000_000_000,
    );
    d.add_account_spec(
        spec(5, 3, true, StpMode::None, StpScope::Account),
        50_000_000_000_000,
    );
    (d.engine, d.ts_ns)
}

// ----- what is observed -----

/// Everything a rejected command must leave as it was.
#[derive(Debug, PartialEq)]
struct Observed {
    instruments: Vec<(Instrument, Option<Phase>, Vec<bourse_engine::OrderView>)>,
    accounts: Vec<Option<bourse_engine::AccountView>>,
    positions: Vec<(AccountId, InstrumentId, Qty, Cash)>,
    live: usize,
    /// The ends of the volatility auctions under way: one due when a command arrives ends
    /// (or is extended) before the command applies, whatever the command's own answer.
    volatility_ends: Vec<u64>,
}

const ACCOUNT_IDS: std::ops::RangeInclusive<u32> = 0..=8;

fn observe(e: &Engine) -> Observed {
    Observed {
        instruments: e
            .instruments()
            .map(|i| {
                let resting = e.resting_orders(i.instrument);
                // The bounded read an operator's query uses: a prefix, and the whole count.
                for max in [0, 3, usize::MAX] {
                    let (first, total) = e.book_orders(i.instrument, max).expect("a book");
                    assert_eq!(
                        total,
                        resting.len() as u64,
                        "book_orders counts every order"
                    );
                    assert_eq!(first[..], resting[..max.min(resting.len())]);
                }
                (i.clone(), e.phase(i.instrument), resting)
            })
            .collect(),
        accounts: ACCOUNT_IDS.map(|a| e.account(AccountId(a))).collect(),
        positions: e.positions().collect(),
        live: e.live_orders(),
        volatility_ends: e
            .instruments()
            .filter_map(|i| e.volatility_auction_end(i.instrument))
            .collect(),
    }
}

/// What the events say about one order.
#[derive(Debug, Clone)]
struct Tracked {
    total: i64,
    filled: i64,
    removed: i64,
    live: bool,
    /// When the order last entered its book: within a level, smaller stamps rest first.
    stamp: u64,
    /// The visible quantity of the last order-log record.
    display: i64,
    account: AccountId,
}

#[derive(Default)]
struct Checker {
    orders: BTreeMap<u64, Tracked>,
    next_stamp: u64,
    last_seq: u64,
    /// Exchange order ids and trade ids are handed out one by one: a rejected command must
    /// not use one up, and none may be skipped or repeated.
    last_order_id: u64,
    last_trade_id: u64,
    /// Sum of all deposits minus withdrawals plus collateral changes: what the total cash of
    /// all accounts must equal, since trades only move cash between accounts.
    external_cash: i128,
    /// Which accounts may sell what they do not hold.
    may_short: BTreeMap<AccountId, bool>,
}

impl Checker {
    fn new(e: &Engine) -> Checker {
        Checker {
            external_cash: ACCOUNT_IDS
                .filter_map(|a| e.account(AccountId(a)))
                .map(|a| a.cash.0)
                .sum(),
            may_short: [
                (AccountId(1), true),
                (AccountId(2), false),
                (AccountId(3), false),
                (AccountId(4), true),
                (AccountId(5), true),
            ]
            .into(),
            ..Checker::default()
        }
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    /// Checks the command `cmd` that took the engine from `before` (observed) to `e` with
    /// `events`.
    fn after(
        &mut self,
        cmd: &Command,
        before: &Observed,
        counters_before: bourse_engine::Counters,
        e: &Engine,
        events: &[Event],
    ) -> Result<(), String> {
        e.check_invariants()
            .map_err(|w| format!("invariants: {w}"))?;
        let after = observe(e);
        let counters = *e.counters();
        if counters.commands != counters_before.commands + 1 {
            return Err("the command counter did not move by one".into());
        }

        // A rejected command changes nothing but the counters.
        let rejected = events.iter().any(|ev| {
            matches!(
                ev,
                Event::OrderRejected { .. }
                    | Event::CancelRejected { .. }
                    | Event::CommandRejected { .. }
            )
        });
        // A volatility auction that came due ended or was extended first: its events come
        // before the command's own, which is then checked as the walk below checks any events.
        let timer_due = before.volatility_ends.iter().any(|&end| end <= cmd.ts_ns);
        if rejected && timer_due {
            if !matches!(
                events.last(),
                Some(
                    Event::OrderRejected { .. }
                        | Event::CancelRejected { .. }
                        | Event::CommandRejected { .. }
                )
            ) {
                return Err(format!("a reject after a timer is not last: {events:?}"));
            }
        } else if rejected {
            // The one reject that changes something: a clearing debit left unpaid adds the
            // amount to the account's margin call (nothing else moves).
            let unpaid_call = match (&cmd.body, events) {
                (
                    CommandBody::ClearingDebit { account, .. },
                    [Event::CommandRejected {
                        reason: RejectReason::InsufficientFreeCash,
                        ..
                    }, Event::MarginCallSet {
                        account: called,
                        amount,
                        ..
                    }],
                ) if called == account => {
                    if e.margin_called(*account) != amount.0 {
                        return Err(format!("the unpaid debit's call is not held: {events:?}"));
                    }
                    true
                }
                _ => false,
            };
            if events.len() != 1 && !unpaid_call {
                return Err(format!("a reject came with other events: {events:?}"));
            }
            if &after != before {
                return Err(format!(
                    "a rejected command changed the state:\nbefore {before:?}\nafter  {after:?}"
                ));
            }
            let mut expected = counters_before;
            expected.commands += 1;
            if matches!(events[0], Event::OrderRejected { .. }) {
                expected.orders_rejected += 1;
            }
            if counters != expected {
                return Err(format!(
                    "a reject moved counters: {counters_before:?} -> {counters:?}"
                ));
            }
            return Ok(());
        }
        if events.is_empty() {
            return Err("a command answered nothing".into());
        }

        // Walk the events: per-order quantities, priority stamps, cash and position flows.
        let cash_before: BTreeMap<AccountId, i128> = before
            .accounts
            .iter()
            .flatten()
            .map(|a| (a.account, a.cash.0))
            .collect();
        let mut cash_flow: BTreeMap<AccountId, i128> = BTreeMap::new();
        let mut pos_flow: BTreeMap<(AccountId, InstrumentId), (i64, i128)> = BTreeMap::new();
        let mut accepted_now = Vec::new();
        for ev in events {
            match *ev {
                Event::OrderAccepted {
                    order_id,
                    qty,
                    account,
                    ..
                } => {
                    if self.orders.contains_key(&order_id.0) {
                        return Err(format!("order id {order_id} accepted twice"));
                    }
                    if order_id.0 != self.last_order_id + 1 {
                        return Err(format!("order id {order_id} after {}", self.last_order_id));
                    }
                    self.last_order_id = order_id.0;
                    accepted_now.push(order_id.0);
                    self.orders.insert(
                        order_id.0,
                        Tracked {
                            total: qty.0,
                            filled: 0,
                            removed: 0,
                            live: true,
                            stamp: 0,
                            display: 0,
                            account,
                        },
                    );
                }
                Event::Trade {
                    trade_id,
                    instrument,
                    price,
                    qty,
                    aggressor,
                    buy,
                    sell,
                    auction,
                    ..
                } => {
                    if trade_id.0 != self.last_trade_id + 1 {
                        return Err(format!("trade id {trade_id} after {}", self.last_trade_id));
                    }
                    self.last_trade_id = trade_id.0;
                    if qty.0 <= 0 {
                        return Err(format!("trade of {qty} lots"));
                    }
                    let def = e
                        .instrument(instrument)
                        .ok_or("trade in an unknown instrument")?;
                    let value = def
                        .notional_floor(price, qty)
                        .ok_or("trade value overflows")?;
                    if def.market != Market::Futures {
                        *cash_flow.entry(buy.account).or_default() -= value;
                        *cash_flow.entry(sell.account).or_default() += value;
                    }
                    let b = pos_flow.entry((buy.account, instrument)).or_default();
                    b.0 += qty.0;
                    b.1 += value;
                    let s = pos_flow.entry((sell.account, instrument)).or_default();
                    s.0 -= qty.0;
                    s.1 -= value;
                    for (fill, side) in [(buy, Side::Buy), (sell, Side::Sell)] {
                        let refill_stamp = self.next_stamp + 1;
                        let t = self
                            .orders
                            .get_mut(&fill.order_id.0)
                            .filter(|t| t.live)
                            .ok_or_else(|| {
                                format!("trade for order {} that is not live", fill.order_id)
                            })?;
                        if t.account != fill.account {
                            return Err(format!(
                                "trade names the wrong account for {}",
                                fill.order_id
                            ));
                        }
                        t.filled += qty.0;
                        if t.filled == t.total {
                            t.live = false;
                        }
                        if fill.qty_filled.0 != t.filled || fill.qty_leaves.0 != t.total - t.filled
                        {
                            return Err(format!(
                                "order {}: fill says filled {} leaves {}, events say {} of {}",
                                fill.order_id, fill.qty_filled, fill.qty_leaves, t.filled, t.total
                            ));
                        }
                        // At an uncrossing both orders rest and the visible part goes first;
                        // an iceberg refills at the back after its last fill (its log record).
                        if auction {
                            t.display -= qty.0.min(t.display);
                        } else if side != aggressor && qty.0 == t.display && fill.qty_leaves.0 > 0 {
                            // A resting iceberg whose visible part is used up refills at the back.
                            t.stamp = refill_stamp;
                            self.next_stamp += 1;
                        } else if side != aggressor {
                            t.display -= qty.0;
                        }
                    }
                }
                Event::OrderCancelled {
                    order_id,
                    qty_cancelled: q,
                    ..
                }
                | Event::OrderExpired {
                    order_id,
                    qty_expired: q,
                    ..
                } => {
                    let t = self
                        .orders
                        .get_mut(&order_id.0)
                        .filter(|t| t.live)
                        .ok_or_else(|| {
                            format!("cancel or expiry of order {order_id} that is not live")
                        })?;
                    if q.0 != t.total - t.filled || q.0 <= 0 {
                        return Err(format!(
                            "order {order_id}: {q} removed but {} open",
                            t.total - t.filled
                        ));
                    }
                    t.removed = q.0;
                    t.live = false;
                }
                Event::OrderReplaced {
                    order_id,
                    qty_total,
                    qty_leaves,
                    priority_kept,
                    ..
                } => {
                    let stamp = self.stamp();
                    let t = self
                        .orders
                        .get_mut(&order_id.0)
                        .filter(|t| t.live)
                        .ok_or_else(|| format!("replace of order {order_id} that is not live"))?;
                    t.total = qty_total.0;
                    if qty_leaves.0 != t.total - t.filled || qty_leaves.0 <= 0 {
                        return Err(format!(
                            "order {order_id}: replaced with impossible quantities"
                        ));
                    }
                    if !priority_kept {
                        t.stamp = stamp;
                    }
                }
                Event::OrderLog(l) => {
                    if l.seq != self.last_seq + 1 && self.last_seq != 0 {
                        return Err(format!(
                            "order-log seq jumped from {} to {}",
                            self.last_seq, l.seq
                        ));
                    }
                    self.last_seq = l.seq;
                    let stamp = self.next_stamp + 1;
                    let t = self
                        .orders
                        .get_mut(&l.order_id.0)
                        .ok_or_else(|| format!("order log of unknown order {}", l.order_id))?;
                    if l.qty_filled.0 != t.filled || l.qty_total.0 != t.total {
                        return Err(format!(
                            "order log of {} disagrees with the events: {l:?} vs {t:?}",
                            l.order_id
                        ));
                    }
                    if l.action == OrderLogAction::New
                        || (l.action == OrderLogAction::Change
                            && t.display == 0
                            && l.qty_leaves.0 > 0)
                    {
                        // Entered the book, or (an uncrossing's iceberg) refilled at the back.
                        t.stamp = stamp;
                        self.next_stamp += 1;
                    }
                    t.display = l.qty_display.0;
                }
                Event::AccountAdded { account, .. } => {
                    let spec = match &cmd.body {
                        CommandBody::AddAccount(spec)
                        | CommandBody::AddFundedAccount { spec, .. } => spec,
                        _ => return Err("an account added by another command".into()),
                    };
                    self.may_short.insert(account, spec.may_short);
                }
                Event::CashChanged {
                    account,
                    reason,
                    amount,
                    cash,
                    ..
                } => {
                    let delta = match reason {
                        CashReason::Deposit => amount.0,
                        CashReason::Withdraw => -amount.0,
                        CashReason::SetCollateral => cash.0 - cash_before[&account],
                    };
                    self.external_cash += delta;
                    *cash_flow.entry(account).or_default() += delta;
                }
                _ => {}
            }
        }

        // Quantity: every order accepted now either rests or has been accounted for in full.
        for id in accepted_now {
            let t = &self.orders[&id];
            if t.live && e.order(OrderId(id)).is_none() {
                return Err(format!(
                    "order {id} vanished without a fill, cancel or expiry"
                ));
            }
        }
        for (&id, t) in &self.orders {
            match e.order(OrderId(id)) {
                Some(v) if t.live => {
                    if (v.qty_total.0, v.qty_filled.0, v.qty_leaves.0)
                        != (t.total, t.filled, t.total - t.filled)
                    {
                        return Err(format!("order {id}: engine {v:?} vs events {t:?}"));
                    }
                }
                None if !t.live => {
                    if t.filled + t.removed != t.total {
                        return Err(format!(
                            "order {id}: filled {} + removed {} != total {}",
                            t.filled, t.removed, t.total
                        ));
                    }
                }
                other => return Err(format!("order {id}: engine {other:?} vs events {t:?}")),
            }
        }

        // Priority: within each level, orders in the order they last entered the book.
        for (_, _, resting) in &after.instruments {
            for w in resting.windows(2) {
                if w[0].side == w[1].side && w[0].price == w[1].price {
                    let (a, b) = (
                        self.orders[&w[0].order_id.0].stamp,
                        self.orders[&w[1].order_id.0].stamp,
                    );
                    if a >= b {
                        return Err(format!(
                            "orders {} and {} rest out of time priority",
                            w[0].order_id, w[1].order_id
                        ));
                    }
                }
            }
        }

        // Cash: each account moved by its trades and its own cash operations; in total, only
        // by deposits, withdrawals and collateral changes.
        let mut total = 0i128;
        for (i, a) in ACCOUNT_IDS.enumerate() {
            let Some(now) = after.accounts[i] else {
                continue;
            };
            total += now.cash.0;
            let was = before.accounts[i].map_or(0, |v| v.cash.0);
            let flow = cash_flow.get(&AccountId(a)).copied().unwrap_or(0);
            if now.cash.0 != was + flow {
                return Err(format!(
                    "account {a}: cash {} -> {} but flows say {flow}",
                    was, now.cash
                ));
            }
            if now.cash_reserved.0 < 0 || now.margin_locked.0 < 0 || now.cash_free.0 < 0 {
                return Err(format!(
                    "account {a}: negative reservation or free cash {now:?}"
                ));
            }
        }
        if total != self.external_cash {
            return Err(format!(
                "cash of all accounts {total} but deposits net {}",
                self.external_cash
            ));
        }

        // Positions: each moved by its trades; per instrument they sum to zero.
        let pos_before: BTreeMap<(AccountId, InstrumentId), (i64, i128)> = before
            .positions
            .iter()
            .map(|p| ((p.0, p.1), (p.2 .0, p.3 .0)))
            .collect();
        let mut sums: BTreeMap<InstrumentId, (i64, i128)> = BTreeMap::new();
        for &(a, i, q, c) in &after.positions {
            let was = pos_before.get(&(a, i)).copied().unwrap_or_default();
            let flow = pos_flow.get(&(a, i)).copied().unwrap_or_default();
            if (q.0, c.0) != (was.0 + flow.0, was.1 + flow.1) {
                return Err(format!(
                    "account {a} in {i}: position {was:?} -> {:?} but trades say {flow:?}",
                    (q, c)
                ));
            }
            let s = sums.entry(i).or_default();
            s.0 += q.0;
            s.1 += c.0;
            let market = e
                .instrument(i)
                .ok_or("position in an unknown instrument")?
                .market;
            if q.0 < 0
                && market != Market::Futures
                && !self.may_short.get(&a).copied().unwrap_or(false)
            {
                return Err(format!(
                    "account {a} is short {q} of {i} without permission"
                ));
            }
        }
        for (i, s) in sums {
            if s != (0, 0) {
                return Err(format!("positions in {i} sum to {s:?}, not zero"));
            }
        }
        Ok(())
    }
}

/// Applies `cmd` and checks everything after it.
fn step(
    e: &mut Engine,
    checker: &mut Checker,
    cmd: &Command,
    events: &mut Vec<Event>,
) -> Result<(), String> {
    let before = observe(e);
    let counters = *e.counters();
    events.clear();
    e.apply(cmd, events);
    checker.after(cmd, &before, counters, e, events)
}

/// Runs `ops` from the starting market, checking after every command; at the end, checks
/// that the state survives a snapshot and restore and that a replay reproduces it.
fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let (mut e, mut ts) = start();
    let mut checker = Checker::new(&e);
    let mut events = Vec::new();
    let mut history = Vec::new();
    for (n, op) in ops.iter().enumerate() {
        ts += 1_000;
        if let Op::Sleep(dt) = op {
            ts += dt;
            continue;
        }
        let body = concrete(&e, op, ts).expect("not a pause");
        let cmd = Command::new(ts, body);
        if let Err(why) = step(&mut e, &mut checker, &cmd, &mut events) {
            return Err(TestCaseError::fail(format!(
                "after command #{n} {cmd:?}:\n{why}\nevents {events:?}"
            )));
        }
        history.push((cmd, events.clone()));
    }
    // Whatever hostile state was reached, a snapshot restores to the same bytes and hash...
    let bytes = e.snapshot();
    let restored =
        Engine::restore(&bytes).map_err(|w| TestCaseError::fail(format!("restore: {w}")))?;
    prop_assert_eq!(restored.snapshot(), bytes.clone());
    prop_assert_eq!(restored.state_hash(), e.state_hash());
    // ...and the same commands from the same start give the same events and the same state.
    let (mut again, _) = start();
    for (n, (cmd, expected)) in history.iter().enumerate() {
        events.clear();
        again.apply(cmd, &mut events);
        prop_assert_eq!(&events, expected, "replay differs at command #{}", n);
    }
    prop_assert_eq!(again.snapshot(), bytes);
    Ok(())
}

/// Generates and checks `n` commands of realistic flow under real risk (see
/// `reference::gen::setup_with_risk`), aiming each at the engine's current books; returns
/// an error if a check fails, or if risk never refused anything (the run would prove little).
fn run_risky(seed: u64, n: usize) -> Result<(), String> {
    use reference::gen::{setup_with_risk, Gen, ACCOUNTS};
    let mut e = Engine::new(test_config());
    let mut checker = Checker::new(&e);
    let mut gen = Gen::new(seed);
    let mut events = Vec::new();
    let mut risk_rejects = 0;
    for i in 0..setup_with_risk().len() + n {
        let cmd = match setup_with_risk().get(i) {
            Some(body) => gen.stamp(body.clone()),
            None if gen.rng.chance(20) => {
                let account = AccountId(gen.rng.pick(&ACCOUNTS).0);
                let amount = Cash(gen.rng.range(1, 2_000_000_000) as i128);
                let body = match gen.rng.below(3) {
                    0 => CommandBody::Deposit { account, amount },
                    1 => CommandBody::Withdraw { account, amount },
                    _ => CommandBody::SetCollateral {
                        account,
                        amount: Cash(amount.0 * 3),
                    },
                };
                gen.stamp(body)
            }
            None => gen.next(&reference::Model::from_engine(&e)),
        };
        step(&mut e, &mut checker, &cmd, &mut events)
            .map_err(|why| format!("after command #{i} {cmd:?}:\n{why}\nevents {events:?}"))?;
        risk_rejects += events
            .iter()
            .filter(|ev| {
                matches!(
                    ev,
                    Event::OrderRejected {
                        reason: RejectReason::InsufficientCollateral
                            | RejectReason::InsufficientPosition,
                        ..
                    }
                )
            })
            .count();
    }
    if risk_rejects == 0 {
        return Err("risk never refused an order".into());
    }
    Ok(())
}

/// Runs a whole command stream from an empty engine, checking after every command.
fn run_stream(cmds: &[Command]) -> Result<(), String> {
    let mut e = Engine::new(test_config());
    let mut checker = Checker::new(&e);
    let mut events = Vec::new();
    for (n, cmd) in cmds.iter().enumerate() {
        step(&mut e, &mut checker, cmd, &mut events)
            .map_err(|why| format!("after command #{n} {cmd:?}:\n{why}\nevents {events:?}"))?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("BOURSE_PROP_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256),
        max_shrink_iters: 4096,
        // Integration tests have no lib.rs for proptest to file regressions next to; the
        // failure message prints the minimal input instead.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn arbitrary_commands_keep_the_engine_consistent_and_conserve_everything(
        ops in prop::collection::vec(op(), 1..200)
    ) {
        run(&ops)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("BOURSE_PROP_CASES").ok().and_then(|v| v.parse::<u32>().ok()).map_or(24, |c| (c / 10).max(1)),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Realistic flow against real risk: accounts that may not short and have modest cash,
    /// so that collateral, covered sells and futures margin all refuse orders along the way,
    /// with deposits, withdrawals and collateral settings mixed in.
    #[test]
    fn flow_under_real_risk_conserves_quantities_cash_and_positions(seed in any::<u64>()) {
        run_risky(seed, 2_000).map_err(|why| TestCaseError::fail(format!("seed {seed}: {why}")))?;
    }

    /// The hostile sequences above trade little; the differential test's realistic flow
    /// trades a lot (every order type, icebergs, self-trade prevention, replaces), so the
    /// bookkeeping checks are run over it too.
    #[test]
    fn realistic_flow_conserves_quantities_cash_and_positions(seed in any::<u64>()) {
        let cmds = reference::gen::stream(seed, 3_000);
        run_stream(&cmds).map_err(|why| TestCaseError::fail(format!("seed {seed}: {why}")))?;
    }
}

/// The checker itself must be able to fail: a doctored trade event (one side's account
/// swapped) is caught as a cash or position mismatch.
#[test]
fn the_checker_catches_a_trade_that_does_not_add_up() {
    let (mut e, ts) = start();
    let mut checker = Checker::new(&e);
    let mut ev = Vec::new();
    let sell = Command::new(
        ts + 1,
        CommandBody::NewOrder(NewOrder {
            firm: None,
            account: AccountId(1),
            cl_ord_id: ClOrdId(1),
            instrument: InstrumentId(1),
            side: Side::Sell,
            ord_type: OrdType::Limit,
            price: Price(10_000),
            qty: Qty(5),
            tif: TimeInForce::Day,
            expire_ts_ns: 0,
            display_qty: Qty(0),
        }),
    );
    let before = observe(&e);
    let c = *e.counters();
    e.apply(&sell, &mut ev);
    checker.after(&sell, &before, c, &e, &ev).unwrap();
    let buy = Command::new(
        ts + 2,
        CommandBody::NewOrder(NewOrder {
            account: AccountId(2),
            side: Side::Buy,
            ..match sell.body {
                CommandBody::NewOrder(o) => o,
                _ => unreachable!(),
            }
        }),
    );
    let before = observe(&e);
    let c = *e.counters();
    ev.clear();
    e.apply(&buy, &mut ev);
    for x in ev.iter_mut() {
        if let Event::Trade { buy, .. } = x {
            buy.account = AccountId(4);
        }
    }
    assert!(checker.after(&buy, &before, c, &e, &ev).is_err());
}

/// Regression: an iceberg could be split into any number of parts, so one order (10^12 lots
/// showing 1) met by a large enough order made one command produce 10^12 trades and run the
/// core out of memory. Now the display must be at least 1/1000 of the total, on entry and on
/// a replace that raises the total.
#[test]
fn an_iceberg_cannot_be_cut_into_more_than_a_thousand_parts() {
    let (e, ts) = start();
    let mut d = fixtures::Driver {
        engine: e,
        events: Vec::new(),
        ts_ns: ts,
    };
    let iceberg = |qty, display| NewOrder {
        firm: None,
        account: AccountId(1),
        cl_ord_id: ClOrdId(qty as u64),
        instrument: InstrumentId(1),
        side: Side::Sell,
        ord_type: OrdType::Limit,
        price: Price(10_000),
        qty: Qty(qty),
        tif: TimeInForce::Gtc,
        expire_ts_ns: 0,
        display_qty: Qty(display),
    };
    let ev = d.order(iceberg(QTY_MAX, 1));
    assert_eq!(
        fixtures::reject_reason(&ev),
        Some(RejectReason::DisplayQtyInvalid)
    );
    let ev = d.order(iceberg(1_001, 1));
    assert_eq!(
        fixtures::reject_reason(&ev),
        Some(RejectReason::DisplayQtyInvalid)
    );
    let ev = d.order(iceberg(1_000, 1));
    let id = fixtures::accepted_id(&ev).expect("1,000 parts are allowed");
    let ev = d
        .run(CommandBody::Replace(Replace {
            account: AccountId(1),
            cl_ord_id: ClOrdId(7),
            target: OrderRef {
                order_id: Some(id),
                orig_cl_ord_id: None,
            },
            price: None,
            qty: Some(Qty(1_001)),
        }))
        .to_vec();
    assert_eq!(
        fixtures::reject_reason(&ev),
        Some(RejectReason::DisplayQtyInvalid)
    );
    // The largest allowed split still trades, one part at a time, and completely.
    let ev = d.order(NewOrder {
        account: AccountId(1),
        side: Side::Buy,
        cl_ord_id: ClOrdId(1),
        display_qty: Qty(0),
        tif: TimeInForce::Ioc,
        ..iceberg(1_000, 0)
    });
    assert_eq!(fixtures::trades(&ev).len(), 1_000);
    assert!(d.engine.order(id).is_none());
}

/// Regression: a future whose contract is huge (lot and multiplier at their limits) and whose
/// price is high has trades whose value does not fit the arithmetic. Futures reserve margin,
/// not notional, so such orders were admitted and the engine panicked ("notional of an
/// admitted order fits") when they traded. They must be refused up front with Overflow.
#[test]
fn an_order_whose_trade_value_cannot_be_computed_is_refused_not_a_panic() {
    let (e, ts) = start();
    let mut d = fixtures::Driver {
        engine: e,
        events: Vec::new(),
        ts_ns: ts,
    };
    let mut def = fixtures::future(9, "HUGE", PRICE_MAX / 10 * 10);
    def.lot_size = 1_000_000_000;
    def.multiplier = 1_000_000_000;
    def.initial_margin = Cash(1);
    def.band_bps = 10;
    d.add_instrument(def.clone());
    let order = |account, side| NewOrder {
        firm: None,
        account: AccountId(account),
        cl_ord_id: ClOrdId(900),
        instrument: InstrumentId(9),
        side,
        ord_type: OrdType::Limit,
        price: def.reference_price,
        qty: Qty(1_000),
        tif: TimeInForce::Day,
        expire_ts_ns: 0,
        display_qty: Qty(0),
    };
    let sell = d.order(order(1, Side::Sell));
    let buy = d.order(order(5, Side::Buy));
    assert_eq!(fixtures::reject_reason(&sell), Some(RejectReason::Overflow));
    assert_eq!(fixtures::reject_reason(&buy), Some(RejectReason::Overflow));
    // With 12 decimals of price one lot's value fits; raising the order by a replace to a
    // size whose value does not is refused too.
    let mut fine = def.clone();
    fine.instrument = InstrumentId(10);
    fine.symbol = "FINE".into();
    fine.price_scale = 12;
    fine.reference_price = Price(10_000_000_000);
    d.add_instrument(fine.clone());
    let small = |account, side| NewOrder {
        instrument: InstrumentId(10),
        price: fine.reference_price,
        qty: Qty(1),
        ..order(account, side)
    };
    let id = fixtures::accepted_id(&d.order(small(1, Side::Sell))).expect("one lot's value fits");
    let ev = d
        .run(CommandBody::Replace(Replace {
            account: AccountId(1),
            cl_ord_id: ClOrdId(901),
            target: OrderRef {
                order_id: Some(id),
                orig_cl_ord_id: None,
            },
            price: None,
            qty: Some(Qty(1_000)),
        }))
        .to_vec();
    assert_eq!(fixtures::reject_reason(&ev), Some(RejectReason::Overflow));
    // And the lot that rests trades without trouble.
    let ev = d.order(small(5, Side::Buy));
    assert_eq!(fixtures::trades(&ev).len(), 1);
    d.engine.check_invariants().unwrap();
}
