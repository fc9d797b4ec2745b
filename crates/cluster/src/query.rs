//! Queries a node answers from its committed state (`net::Request::Instruments`, and
//! `net::Request::Query` for an admin service in another process: [`Query`]).
//!
//! [`InstrumentsAnswer`]: every instrument the core holds, with the definition its
//! `InstrumentAdded` event carried, and the first log index the answering state has not
//! applied. A gateway's link asks for it when it starts: a gateway that crashed (no saved
//! order state) starts its committed stream after the leader's last applied index, so the
//! `InstrumentAdded` of an instrument an operator added earlier is behind it; the answer
//! covers every entry before the stream's start, so together they miss no instrument.
//!
//! The answer's bytes (little-endian, `bourse_core::codec`):
//!
//! ```text
//! version u8 = 1, next_index u64, instruments_total u32,
//! event list (bourse_core::codec::encode_events): one InstrumentAdded per instrument,
//!   ids strictly ascending, at most INSTRUMENTS_ANSWER_MAX
//! ```
//!
//! A core holding more than [`INSTRUMENTS_ANSWER_MAX`] instruments answers the first ones and
//! its total, and [`InstrumentsAnswer::complete`] refuses that answer by name: the bound keeps
//! the frame far below `net::FRAME_SIZE_BYTES_MAX`. The decoder refuses an unknown version,
//! an event of another kind, ids out of order, more instruments than the bound or than the
//! total, and trailing bytes, naming what is wrong; it never panics (property-tested below).

use bourse_core::codec::{decode_events, encode_events, Reader, Writer};
use bourse_core::{Event, InstrumentDef, InstrumentId};

use crate::state::ReplicatedState;

/// The most instruments one answer carries (an encoded `InstrumentAdded` takes at most 103
/// bytes, so an answer stays under 7 MB).
pub const INSTRUMENTS_ANSWER_MAX: usize = 65_536;

const VERSION: u8 = 1;

/// A core's instruments as of one applied log index (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstrumentsAnswer {
    /// The first log index the answering state had not applied: the answer reflects every
    /// entry before it.
    pub next_index: u64,
    /// How many instruments the core holds (more than `instruments` only past the bound).
    pub instruments_total: u32,
    /// Id and definition, ids strictly ascending.
    pub instruments: Vec<(InstrumentId, InstrumentDef)>,
}

impl InstrumentsAnswer {
    /// The answer of `state`, which has applied every entry before `next_index`.
    pub fn of_state(state: &ReplicatedState, next_index: u64) -> InstrumentsAnswer {
        let mut instruments: Vec<(InstrumentId, InstrumentDef)> = state
            .engine()
            .instruments()
            // The engine holds only instruments whose definition is valid (it refuses the
            // others), so every one has a definition.
            .filter_map(|i| Some((i.instrument, i.def()?)))
            .collect();
        instruments.sort_by_key(|(id, _)| *id);
        let instruments_total = u32::try_from(instruments.len()).unwrap_or(u32::MAX);
        instruments.truncate(INSTRUMENTS_ANSWER_MAX);
        InstrumentsAnswer {
            next_index,
            instruments_total,
            instruments,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        assert!(self.instruments.len() <= INSTRUMENTS_ANSWER_MAX);
        let events: Vec<Event> = self
            .instruments
            .iter()
            .map(|&(instrument, definition)| Event::InstrumentAdded {
                instrument,
                definition,
                ts_ns: 0,
            })
            .collect();
        let list = encode_events(&events);
        let mut w = Writer::with_capacity(13 + list.len());
        w.u8(VERSION);
        w.u64(self.next_index);
        w.u32(self.instruments_total);
        w.buf.extend_from_slice(&list);
        w.finish()
    }

    /// Reads what [`InstrumentsAnswer::encode`] wrote, or says what is wrong and where.
    pub fn decode(bytes: &[u8]) -> Result<InstrumentsAnswer, String> {
        let bad = |e: bourse_core::codec::DecodeError| format!("instruments answer: {e}");
        let mut r = Reader::new(bytes);
        let version = r.u8().map_err(bad)?;
        if version != VERSION {
            return Err(format!(
                "instruments answer: version {version}, this build reads {VERSION}"
            ));
        }
        let next_index = r.u64().map_err(bad)?;
        let instruments_total = r.u32().map_err(bad)?;
        let list_at = r.offset();
        let events = decode_events(&bytes[list_at..]).map_err(|e| {
            format!(
                "instruments answer: {} at byte {}",
                e.what,
                list_at + e.offset
            )
        })?;
        if events.len() > INSTRUMENTS_ANSWER_MAX {
            return Err(format!(
                "instruments answer: {} instruments, more than the {INSTRUMENTS_ANSWER_MAX} \
                 an answer carries",
                events.len()
            ));
        }
        if events.len() as u64 > u64::from(instruments_total) {
            return Err(format!(
                "instruments answer: {} instruments listed, more than the total {instruments_total}",
                events.len()
            ));
        }
        let mut instruments = Vec::with_capacity(events.len());
        for (n, event) in events.into_iter().enumerate() {
            let Event::InstrumentAdded {
                instrument,
                definition,
                ..
            } = event
            else {
                return Err(format!(
                    "instruments answer: entry {n} is not an InstrumentAdded event"
                ));
            };
            if instruments
                .last()
                .is_some_and(|&(previous, _)| previous >= instrument)
            {
                return Err(format!(
                    "instruments answer: instrument {} at entry {n} is not after the one before \
                     (ids must be strictly ascending)",
                    instrument.0
                ));
            }
            instruments.push((instrument, definition));
        }
        Ok(InstrumentsAnswer {
            next_index,
            instruments_total,
            instruments,
        })
    }

    /// Whether the answer lists every instrument of the core; an error naming the counts if
    /// the core holds more than an answer carries.
    pub fn complete(&self) -> Result<(), String> {
        if self.instruments.len() as u64 == u64::from(self.instruments_total) {
            return Ok(());
        }
        Err(format!(
            "the core holds {} instruments, more than the {INSTRUMENTS_ANSWER_MAX} its instruments \
             answer carries",
            self.instruments_total
        ))
    }

    /// The answer as the `InstrumentAdded` events a consumer of the stream would have read
    /// (`ts_ns` 0: the core keeps no time of an addition).
    pub fn events(&self) -> Vec<Event> {
        self.instruments
            .iter()
            .map(|&(instrument, definition)| Event::InstrumentAdded {
                instrument,
                definition,
                ts_ns: 0,
            })
            .collect()
    }
}

/// The most instruments a [`PhasesAnswer`] lists (as [`INSTRUMENTS_ANSWER_MAX`]).
pub const PHASES_ANSWER_INSTRUMENTS_MAX: usize = INSTRUMENTS_ANSWER_MAX;
/// The most suspended firms, and the most suspended accounts, a [`PhasesAnswer`] lists.
pub const PHASES_ANSWER_SUSPENDED_MAX: usize = 65_536;
/// The most positions an [`AccountAnswer`] lists.
pub const ACCOUNT_ANSWER_POSITIONS_MAX: usize = 65_536;
/// The most live orders an [`AccountAnswer`] lists (more are flagged `orders_truncated`).
pub const ACCOUNT_ANSWER_ORDERS_MAX: usize = 1_000;
/// The most resting orders a [`BookAnswer`] lists (about 30 bytes each on the wire, so an
/// answer stays under 1 MB; more are counted in `orders_total`).
pub const BOOK_ANSWER_ORDERS_MAX: usize = 25_000;

/// A read of a core's applied state that a node answers for an admin service in another
/// process (`net::Request::Query`): the in-process admin runs the same [`Query::answer`] on
/// the leader's state, so both serve the same answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Query {
    /// Every instrument with its phase, and the kill switches engaged.
    Phases,
    /// One account's balances, positions and live orders.
    Account { account: u32 },
    /// One instrument's order-level book, as market data shows it. Last among the variants,
    /// so that every earlier query encodes as before.
    Book { instrument: u32 },
}

/// What a node answers to a [`Query`]. Carried in the node protocol's bincode frame, so a
/// hostile peer is bounded by the frame's size on decode; [`QueryAnswer::check`] then refuses
/// lists longer than their bounds or their totals, naming which.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum QueryAnswer {
    Phases(PhasesAnswer),
    Account(AccountAnswer),
    /// The node could not answer (it is stopping, or the query is not one it knows).
    Refused(String),
    /// After `Refused`, so that every earlier answer encodes as before.
    Book(BookAnswer),
}

/// A resting order as the order-level market data shows it: the visible quantity only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BookLine {
    pub order_id: u64,
    pub side: bourse_core::Side,
    pub price: i64,
    pub qty_display: i64,
}

/// The answer to [`Query::Book`]: bids then asks, best price first, then time priority (the
/// order in which the feed's order-level book keeps them), as of the state that applied every
/// entry before `next_index`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BookAnswer {
    pub next_index: u64,
    pub instrument: u32,
    /// Whether this core holds the instrument (if not, the lists are empty).
    pub known: bool,
    pub orders_total: u64,
    /// More resting orders than [`BOOK_ANSWER_ORDERS_MAX`]: the first ones are listed.
    pub orders_truncated: bool,
    pub orders: Vec<BookLine>,
}

/// One instrument and its phase.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InstrumentPhase {
    pub instrument: u32,
    pub symbol: String,
    pub market: bourse_core::Market,
    /// `None` only for an instrument without a book (none is, today).
    pub phase: Option<bourse_core::Phase>,
    pub reference_price: i64,
}

/// The answer to [`Query::Phases`], as of the state that applied every entry before
/// `next_index`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PhasesAnswer {
    pub next_index: u64,
    pub instruments_total: u32,
    pub instruments: Vec<InstrumentPhase>,
    pub suspended_firms_total: u32,
    pub suspended_firms: Vec<u32>,
    pub suspended_accounts_total: u32,
    pub suspended_accounts: Vec<u32>,
}

/// An account's balances (cash units of 10^-4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AccountBalances {
    pub firm: u32,
    pub cash: i128,
    pub cash_reserved: i128,
    pub margin_locked: i128,
    pub cash_free: i128,
    /// A kill switch of the account or its firm is engaged.
    pub kill_switch_engaged: bool,
}

/// A position: net quantity and its cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PositionLine {
    pub instrument: u32,
    pub qty: i64,
    pub cost: i128,
}

/// A live order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OrderLine {
    pub order_id: u64,
    pub cl_ord_id: u64,
    pub instrument: u32,
    pub side: bourse_core::Side,
    pub price: i64,
    pub qty_total: i64,
    pub qty_filled: i64,
    pub qty_leaves: i64,
    pub tif: bourse_core::TimeInForce,
}

/// The answer to [`Query::Account`]: `balances` is `None` for an account the core does not
/// hold (then the lists are empty).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AccountAnswer {
    pub next_index: u64,
    pub account: u32,
    pub balances: Option<AccountBalances>,
    pub positions_total: u32,
    pub positions: Vec<PositionLine>,
    /// More live orders than [`ACCOUNT_ANSWER_ORDERS_MAX`]: the first ones are listed.
    pub orders_truncated: bool,
    pub orders: Vec<OrderLine>,
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Query {
    /// The answer of `engine`, whose state applied every entry before `next_index`.
    pub fn answer(&self, engine: &bourse_engine::Engine, next_index: u64) -> QueryAnswer {
        let (firms, accounts) = engine.suspended();
        match *self {
            Query::Phases => {
                let mut instruments: Vec<InstrumentPhase> = engine
                    .instruments()
                    .map(|i| InstrumentPhase {
                        instrument: i.instrument.0,
                        symbol: i.symbol.clone(),
                        market: i.market,
                        phase: engine.phase(i.instrument),
                        reference_price: i.reference_price.0,
                    })
                    .collect();
                let instruments_total = count(instruments.len());
                instruments.truncate(PHASES_ANSWER_INSTRUMENTS_MAX);
                let firms_listed = firms.len().min(PHASES_ANSWER_SUSPENDED_MAX);
                let accounts_listed = accounts.len().min(PHASES_ANSWER_SUSPENDED_MAX);
                QueryAnswer::Phases(PhasesAnswer {
                    next_index,
                    instruments_total,
                    instruments,
                    suspended_firms_total: count(firms.len()),
                    suspended_firms: firms[..firms_listed].iter().map(|f| f.0).collect(),
                    suspended_accounts_total: count(accounts.len()),
                    suspended_accounts: accounts[..accounts_listed].iter().map(|a| a.0).collect(),
                })
            }
            Query::Account { account } => {
                let id = bourse_core::AccountId(account);
                let Some(v) = engine.account(id) else {
                    return QueryAnswer::Account(AccountAnswer {
                        next_index,
                        account,
                        balances: None,
                        positions_total: 0,
                        positions: Vec::new(),
                        orders_truncated: false,
                        orders: Vec::new(),
                    });
                };
                let mut positions: Vec<PositionLine> = engine
                    .account_positions(id)
                    .into_iter()
                    .map(|(i, q, c)| PositionLine {
                        instrument: i.0,
                        qty: q.0,
                        cost: c.0,
                    })
                    .collect();
                let positions_total = count(positions.len());
                positions.truncate(ACCOUNT_ANSWER_POSITIONS_MAX);
                let mut orders: Vec<OrderLine> = engine
                    .account_orders(id, ACCOUNT_ANSWER_ORDERS_MAX + 1)
                    .iter()
                    .map(|o| OrderLine {
                        order_id: o.order_id.0,
                        cl_ord_id: o.cl_ord_id.0,
                        instrument: o.instrument.0,
                        side: o.side,
                        price: o.price.0,
                        qty_total: o.qty_total.0,
                        qty_filled: o.qty_filled.0,
                        qty_leaves: o.qty_leaves.0,
                        tif: o.tif,
                    })
                    .collect();
                let orders_truncated = orders.len() > ACCOUNT_ANSWER_ORDERS_MAX;
                orders.truncate(ACCOUNT_ANSWER_ORDERS_MAX);
                QueryAnswer::Account(AccountAnswer {
                    next_index,
                    account,
                    balances: Some(AccountBalances {
                        firm: v.firm.0,
                        cash: v.cash.0,
                        cash_reserved: v.cash_reserved.0,
                        margin_locked: v.margin_locked.0,
                        cash_free: v.cash_free.0,
                        kill_switch_engaged: accounts.contains(&id) || firms.contains(&v.firm),
                    }),
                    positions_total,
                    positions,
                    orders_truncated,
                    orders,
                })
            }
            Query::Book { instrument } => {
                let (views, orders_total) = engine
                    .book_orders(
                        bourse_core::InstrumentId(instrument),
                        BOOK_ANSWER_ORDERS_MAX,
                    )
                    .unwrap_or_default();
                let orders: Vec<BookLine> = views
                    .iter()
                    .map(|o| BookLine {
                        order_id: o.order_id.0,
                        side: o.side,
                        price: o.price.0,
                        qty_display: o.qty_display.0,
                    })
                    .collect();
                QueryAnswer::Book(BookAnswer {
                    next_index,
                    instrument,
                    known: engine
                        .instrument(bourse_core::InstrumentId(instrument))
                        .is_some(),
                    orders_truncated: orders_total > orders.len() as u64,
                    orders_total,
                    orders,
                })
            }
        }
    }
}

impl QueryAnswer {
    /// Refuses an answer whose lists break their bounds (a hostile or broken peer), naming
    /// the list; a refusal by the node comes back as its reason.
    pub fn check(&self) -> Result<(), String> {
        fn list(what: &str, len: usize, max: usize, total: u32) -> Result<(), String> {
            if len > max {
                return Err(format!(
                    "query answer: {len} {what}, more than the {max} an answer carries"
                ));
            }
            if len as u64 > u64::from(total) {
                return Err(format!(
                    "query answer: {len} {what} listed, more than the total {total}"
                ));
            }
            Ok(())
        }
        match self {
            QueryAnswer::Phases(p) => {
                list(
                    "instruments",
                    p.instruments.len(),
                    PHASES_ANSWER_INSTRUMENTS_MAX,
                    p.instruments_total,
                )?;
                list(
                    "suspended firms",
                    p.suspended_firms.len(),
                    PHASES_ANSWER_SUSPENDED_MAX,
                    p.suspended_firms_total,
                )?;
                list(
                    "suspended accounts",
                    p.suspended_accounts.len(),
                    PHASES_ANSWER_SUSPENDED_MAX,
                    p.suspended_accounts_total,
                )?;
                if let Some(i) = p
                    .instruments
                    .iter()
                    .find(|i| i.symbol.is_empty() || i.symbol.len() > bourse_core::SYMBOL_LEN_MAX)
                {
                    return Err(format!(
                        "query answer: instrument {}'s symbol has {} bytes, not 1 to {}",
                        i.instrument,
                        i.symbol.len(),
                        bourse_core::SYMBOL_LEN_MAX
                    ));
                }
                Ok(())
            }
            QueryAnswer::Account(a) => {
                list(
                    "positions",
                    a.positions.len(),
                    ACCOUNT_ANSWER_POSITIONS_MAX,
                    a.positions_total,
                )?;
                list(
                    "orders",
                    a.orders.len(),
                    ACCOUNT_ANSWER_ORDERS_MAX,
                    u32::MAX,
                )?;
                if a.balances.is_none() && (!a.positions.is_empty() || !a.orders.is_empty()) {
                    return Err(format!(
                        "query answer: account {} is unknown but has positions or orders",
                        a.account
                    ));
                }
                Ok(())
            }
            QueryAnswer::Book(b) => {
                if b.orders.len() > BOOK_ANSWER_ORDERS_MAX || b.orders.len() as u64 > b.orders_total
                {
                    return Err(format!(
                        "query answer: {} orders of instrument {} listed, more than the {} an \
                         answer carries or the total {}",
                        b.orders.len(),
                        b.instrument,
                        BOOK_ANSWER_ORDERS_MAX,
                        b.orders_total
                    ));
                }
                if b.orders_truncated != (b.orders_total > b.orders.len() as u64) {
                    return Err(format!(
                        "query answer: instrument {}'s book lists {} of {} orders but says \
                         truncated = {}",
                        b.instrument,
                        b.orders.len(),
                        b.orders_total,
                        b.orders_truncated
                    ));
                }
                if !b.known && b.orders_total > 0 {
                    return Err(format!(
                        "query answer: instrument {} is unknown but has orders",
                        b.instrument
                    ));
                }
                Ok(())
            }
            QueryAnswer::Refused(reason) => Err(format!("the node refused the query: {reason}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bourse_core::{Cash, Market, Price, Symbol};
    use proptest::prelude::*;

    fn definition() -> impl Strategy<Value = InstrumentDef> {
        (
            "[A-Z0-9]{1,32}",
            0u8..3,
            any::<u8>(),
            any::<i64>(),
            any::<i64>(),
            any::<i64>(),
            any::<i128>(),
            any::<u32>(),
            any::<i64>(),
        )
            .prop_map(
                |(symbol, market, scale, tick, lot, multiplier, margin, band, reference)| {
                    InstrumentDef {
                        symbol: Symbol::new(&symbol).expect("1 to 32 bytes"),
                        market: [Market::Equity, Market::Fx, Market::Futures][market as usize],
                        price_scale: scale,
                        tick: Price(tick),
                        lot_size: lot,
                        multiplier,
                        initial_margin: Cash(margin),
                        band_bps: band,
                        reference_price: Price(reference),
                        volatility: Default::default(),
                    }
                },
            )
    }

    fn answer() -> impl Strategy<Value = InstrumentsAnswer> {
        (
            any::<u64>(),
            proptest::collection::btree_map(any::<u32>(), definition(), 0..20),
            0u32..5,
        )
            .prop_map(|(next_index, defs, beyond)| InstrumentsAnswer {
                next_index,
                instruments_total: defs.len() as u32 + beyond,
                instruments: defs
                    .into_iter()
                    .map(|(id, d)| (InstrumentId(id), d))
                    .collect(),
            })
    }

    proptest! {
        #[test]
        fn an_answer_reads_back_as_written(a in answer()) {
            let bytes = a.encode();
            prop_assert_eq!(InstrumentsAnswer::decode(&bytes), Ok(a));
        }

        #[test]
        fn every_cut_of_an_answer_is_refused_by_name(a in answer(), cut in any::<prop::sample::Index>()) {
            let bytes = a.encode();
            let len = cut.index(bytes.len());
            let e = InstrumentsAnswer::decode(&bytes[..len]).unwrap_err();
            prop_assert!(e.starts_with("instruments answer: "), "{}", e);
        }

        #[test]
        fn arbitrary_bytes_never_panic_the_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = InstrumentsAnswer::decode(&bytes);
        }

        #[test]
        fn a_changed_byte_never_panics_and_still_reads_as_a_valid_answer_or_is_refused(
            a in answer(),
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let mut bytes = a.encode();
            let i = at.index(bytes.len());
            bytes[i] = byte;
            if let Ok(b) = InstrumentsAnswer::decode(&bytes) {
                // What decodes keeps the answer's rules.
                prop_assert!(b.instruments.len() as u64 <= u64::from(b.instruments_total));
                prop_assert!(b.instruments.windows(2).all(|w| w[0].0 < w[1].0));
            }
        }
    }

    fn some_definition(symbol: &str) -> InstrumentDef {
        InstrumentDef {
            symbol: Symbol::new(symbol).unwrap(),
            market: Market::Futures,
            price_scale: 0,
            tick: Price(10),
            lot_size: 1,
            multiplier: 1,
            initial_margin: Cash(5_000),
            band_bps: 1_000,
            reference_price: Price(110_000),
            volatility: Default::default(),
        }
    }

    #[test]
    fn an_unknown_version_other_events_ids_out_of_order_and_a_short_total_are_refused() {
        let a = InstrumentsAnswer {
            next_index: 7,
            instruments_total: 2,
            instruments: vec![
                (InstrumentId(3), some_definition("RTS")),
                (InstrumentId(5), some_definition("SI")),
            ],
        };
        let mut bytes = a.encode();
        bytes[0] = 2;
        let e = InstrumentsAnswer::decode(&bytes).unwrap_err();
        assert!(e.contains("version 2"), "{e}");

        let mut swapped = a.clone();
        swapped.instruments.reverse();
        let e = InstrumentsAnswer::decode(&swapped.encode()).unwrap_err();
        assert!(e.contains("strictly ascending"), "{e}");

        let mut short = a.clone();
        short.instruments_total = 1;
        let e = InstrumentsAnswer::decode(&short.encode()).unwrap_err();
        assert!(e.contains("more than the total 1"), "{e}");

        let mut other = Writer::default();
        other.u8(VERSION);
        other.u64(1);
        other.u32(1);
        other
            .buf
            .extend_from_slice(&encode_events(&[Event::EndOfDayDone {
                orders_expired: 0,
                ts_ns: 0,
            }]));
        let e = InstrumentsAnswer::decode(&other.finish()).unwrap_err();
        assert!(e.contains("entry 0 is not an InstrumentAdded"), "{e}");

        let mut trailing = a.encode();
        trailing.push(0);
        assert!(InstrumentsAnswer::decode(&trailing).is_err());
    }

    #[test]
    fn an_answer_past_the_bound_is_refused_as_incomplete() {
        let a = InstrumentsAnswer {
            next_index: 1,
            instruments_total: 70_000,
            instruments: vec![(InstrumentId(1), some_definition("RTS"))],
        };
        let e = a.complete().unwrap_err();
        assert!(e.contains("70000 instruments"), "{e}");
        let whole = InstrumentsAnswer {
            instruments_total: 1,
            ..a
        };
        assert_eq!(whole.complete(), Ok(()));
    }

    fn query_answer() -> impl Strategy<Value = QueryAnswer> {
        let phase = proptest::option::of(prop_oneof![
            Just(bourse_core::Phase::Open),
            Just(bourse_core::Phase::Halted),
            Just(bourse_core::Phase::Closed),
        ]);
        let instrument = (any::<u32>(), "[A-Z0-9]{1,32}", 0u8..3, phase, any::<i64>()).prop_map(
            |(instrument, symbol, market, phase, reference_price)| InstrumentPhase {
                instrument,
                symbol,
                market: [Market::Equity, Market::Fx, Market::Futures][market as usize],
                phase,
                reference_price,
            },
        );
        let phases = (
            any::<u64>(),
            proptest::collection::vec(instrument, 0..8),
            proptest::collection::vec(any::<u32>(), 0..8),
            proptest::collection::vec(any::<u32>(), 0..8),
        )
            .prop_map(|(next_index, instruments, firms, accounts)| {
                QueryAnswer::Phases(PhasesAnswer {
                    next_index,
                    instruments_total: instruments.len() as u32,
                    instruments,
                    suspended_firms_total: firms.len() as u32,
                    suspended_firms: firms,
                    suspended_accounts_total: accounts.len() as u32,
                    suspended_accounts: accounts,
                })
            });
        let order = (
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<bool>(),
            any::<i64>(),
            any::<i64>(),
        )
            .prop_map(
                |(order_id, cl_ord_id, instrument, buy, price, qty)| OrderLine {
                    order_id,
                    cl_ord_id,
                    instrument,
                    side: if buy {
                        bourse_core::Side::Buy
                    } else {
                        bourse_core::Side::Sell
                    },
                    price,
                    qty_total: qty,
                    qty_filled: 0,
                    qty_leaves: qty,
                    tif: bourse_core::TimeInForce::Day,
                },
            );
        let account = (
            any::<u64>(),
            any::<u32>(),
            any::<(u32, i128, i128, bool)>(),
            proptest::collection::vec(any::<(u32, i64, i128)>(), 0..8),
            proptest::collection::vec(order, 0..8),
        )
            .prop_map(
                |(next_index, account, (firm, cash, reserved, killed), positions, orders)| {
                    QueryAnswer::Account(AccountAnswer {
                        next_index,
                        account,
                        balances: Some(AccountBalances {
                            firm,
                            cash,
                            cash_reserved: reserved,
                            margin_locked: 0,
                            cash_free: cash,
                            kill_switch_engaged: killed,
                        }),
                        positions_total: positions.len() as u32,
                        positions: positions
                            .into_iter()
                            .map(|(instrument, qty, cost)| PositionLine {
                                instrument,
                                qty,
                                cost,
                            })
                            .collect(),
                        orders_truncated: false,
                        orders,
                    })
                },
            );
        let line = (any::<u64>(), any::<bool>(), any::<i64>(), any::<i64>()).prop_map(
            |(order_id, buy, price, qty_display)| BookLine {
                order_id,
                side: if buy {
                    bourse_core::Side::Buy
                } else {
                    bourse_core::Side::Sell
                },
                price,
                qty_display,
            },
        );
        let book = (
            any::<u64>(),
            any::<u32>(),
            proptest::collection::vec(line, 0..8),
            0u64..3,
        )
            .prop_map(|(next_index, instrument, orders, more)| {
                QueryAnswer::Book(BookAnswer {
                    next_index,
                    instrument,
                    known: true,
                    orders_total: orders.len() as u64 + more,
                    orders_truncated: more > 0,
                    orders,
                })
            });
        prop_oneof![phases, account, book]
    }

    proptest! {
        #[test]
        fn a_query_answer_reads_back_as_written_and_passes_its_check(a in query_answer()) {
            let frame = crate::net::encode_frame(&a);
            let back: QueryAnswer = crate::net::decode_message(&frame[4..]).unwrap();
            prop_assert_eq!(back.check(), Ok(()));
            prop_assert_eq!(back, a);
        }

        #[test]
        fn a_changed_query_answer_is_refused_or_keeps_its_bounds_never_a_panic(
            a in query_answer(),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ) {
            let mut bytes = crate::net::encode_frame(&a)[4..].to_vec();
            for (at, x) in flips {
                let i = at.index(bytes.len());
                bytes[i] ^= x | 1;
            }
            if let Ok(b) = crate::net::decode_message::<QueryAnswer>(&bytes) {
                if b.check().is_ok() {
                    if let QueryAnswer::Phases(p) = &b {
                        prop_assert!(p.instruments.len() as u64 <= u64::from(p.instruments_total));
                    }
                }
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic_the_query_answer_decoder(
            bytes in proptest::collection::vec(any::<u8>(), 0..400),
        ) {
            if let Ok(b) = crate::net::decode_message::<QueryAnswer>(&bytes) {
                let _ = b.check();
            }
        }
    }

    #[test]
    fn a_query_answer_over_its_bounds_or_totals_is_refused_by_name() {
        let phases = PhasesAnswer {
            next_index: 1,
            instruments_total: 0,
            instruments: vec![InstrumentPhase {
                instrument: 1,
                symbol: "SBER".into(),
                market: Market::Equity,
                phase: None,
                reference_price: 1,
            }],
            suspended_firms_total: 0,
            suspended_firms: Vec::new(),
            suspended_accounts_total: 0,
            suspended_accounts: Vec::new(),
        };
        let e = QueryAnswer::Phases(phases.clone()).check().unwrap_err();
        assert!(
            e.contains("1 instruments listed, more than the total 0"),
            "{e}"
        );
        let mut long_symbol = phases.clone();
        long_symbol.instruments_total = 1;
        long_symbol.instruments[0].symbol = "X".repeat(33);
        let e = QueryAnswer::Phases(long_symbol).check().unwrap_err();
        assert!(e.contains("symbol has 33 bytes"), "{e}");
        let orders = vec![
            OrderLine {
                order_id: 1,
                cl_ord_id: 1,
                instrument: 1,
                side: bourse_core::Side::Buy,
                price: 1,
                qty_total: 1,
                qty_filled: 0,
                qty_leaves: 1,
                tif: bourse_core::TimeInForce::Day,
            };
            ACCOUNT_ANSWER_ORDERS_MAX + 1
        ];
        let account = AccountAnswer {
            next_index: 1,
            account: 7,
            balances: None,
            positions_total: 0,
            positions: Vec::new(),
            orders_truncated: true,
            orders,
        };
        let e = QueryAnswer::Account(account).check().unwrap_err();
        assert!(e.contains("1001 orders, more than the 1000"), "{e}");
        let line = BookLine {
            order_id: 1,
            side: bourse_core::Side::Sell,
            price: 1,
            qty_display: 1,
        };
        let book = BookAnswer {
            next_index: 1,
            instrument: 3,
            known: true,
            orders_total: 1,
            orders_truncated: false,
            orders: vec![line; 2],
        };
        let e = QueryAnswer::Book(book.clone()).check().unwrap_err();
        assert!(e.contains("2 orders of instrument 3 listed"), "{e}");
        let quiet_truncation = BookAnswer {
            orders_total: 3,
            ..book.clone()
        };
        let e = QueryAnswer::Book(quiet_truncation).check().unwrap_err();
        assert!(
            e.contains("lists 2 of 3 orders but says truncated = false"),
            "{e}"
        );
        let unknown = BookAnswer {
            known: false,
            orders_total: 2,
            ..book
        };
        let e = QueryAnswer::Book(unknown).check().unwrap_err();
        assert!(e.contains("instrument 3 is unknown but has orders"), "{e}");
        let e = QueryAnswer::Refused("stopping".into()).check().unwrap_err();
        assert!(e.contains("stopping"), "{e}");
    }
}
