//! The one binary form of an event list: encoded once by the state machine that applied the
//! command, decoded once by each consumer of the committed stream.
//!
//! ```text
//! list   := count u32, count × event
//! event  := kind u8, the variant's fields in declaration order, fixed width, little-endian
//!           (ids at their own width, prices and quantities i64, cash i128, enums one byte,
//!            a reject reason its u16 code, an optional order id a flag byte and a u64,
//!            a symbol its length u32 and its UTF-8 bytes)
//! ```
//!
//! The kinds are the `K_*` constants. A change to a kind's fields takes a new kind number
//! and retires the old one, so that a consumer never misreads a stream written by another
//! build: instruments added (with their definition) are kind 17 since kind 11 carried only
//! the id. Two fields of the call auctions are carried by the kind instead: an auction trade
//! (`auction: true`) is kind 19 with kind 5's layout, and an instrument with a volatility
//! guard kind 20 (kind 17 and the guard), so that everything else encodes as before.
//!
//! Every applied request's events are encoded on every replica, so this sits on the apply
//! path; serde formats either wrote each variant's name (MessagePack) or cannot read the
//! core's internally tagged `Event` back at all (bincode). Decoding refuses a list longer
//! than [`EVENTS_SIZE_BYTES_MAX`], checks the count against the bytes left before it
//! allocates and refuses unknown kinds, enum values and trailing bytes, so garbage gives a
//! [`DecodeError`], never a panic.

use super::command::{code_of, opt_u32, read_opt_u32, MARKETS, PHASES, SIDES};
use super::{DecodeError, Reader, Writer};
use crate::{
    AccountId, CancelReason, CancelRejectTo, Cash, CashReason, ClOrdId, Event, Fill, FirmId,
    InstrumentDef, InstrumentId, OrderId, OrderLog, OrderLogAction, OrderStatus, Price, Qty,
    RejectReason, Side, Symbol, TradeId, VolatilityGuard, SYMBOL_LEN_MAX,
};

/// The largest encoded event list of one command (a sweep such as a mass cancel may emit many).
pub const EVENTS_SIZE_BYTES_MAX: usize = 16 * 1024 * 1024;

/// The smallest encoded event (a kind byte and a u64 timestamp at least).
const EVENT_SIZE_BYTES_MIN: usize = 9;
/// The largest encoded event (an instrument added with a volatility guard and the longest
/// symbol; a trade, the largest common one, takes 110). Only a capacity hint: a larger event
/// would still encode.
const EVENT_SIZE_BYTES_MAX: usize = 120;

const K_ORDER_ACCEPTED: u8 = 1;
const K_ORDER_REJECTED: u8 = 2;
const K_CANCEL_REJECTED: u8 = 3;
const K_COMMAND_REJECTED: u8 = 4;
const K_TRADE: u8 = 5;
const K_ORDER_CANCELLED: u8 = 6;
const K_ORDER_REPLACED: u8 = 7;
const K_ORDER_EXPIRED: u8 = 8;
const K_MASS_CANCEL_DONE: u8 = 9;
const K_ORDER_LOG: u8 = 10;
/// Kind 11 was an instrument added without its definition (before instruments could be
/// learned from the stream); it is retired, so a stream from an older core is refused as an
/// unknown kind rather than misread.
const K_INSTRUMENT_ADDED: u8 = 17;
const K_ACCOUNT_ADDED: u8 = 12;
const K_PHASE_CHANGED: u8 = 13;
const K_CASH_CHANGED: u8 = 14;
const K_END_OF_DAY_DONE: u8 = 15;
const K_KILL_SWITCH_SET: u8 = 16;
const K_MARGIN_CALL_SET: u8 = 18;
/// A trade of a call auction's uncrossing (`auction: true`): the layout of kind 5, so that a
/// continuous trade encodes as before.
const K_AUCTION_TRADE: u8 = 19;
/// An instrument added with a volatility guard: kind 17's fields, then the guard's dynamic
/// and static bands (u32 each) and auction length (u64). Without a guard the instrument
/// encodes as kind 17, as before.
const K_INSTRUMENT_ADDED_GUARDED: u8 = 20;
const K_AUCTION_INDICATIVE: u8 = 21;
const K_AUCTION_UNCROSSED: u8 = 22;
const K_VOLATILITY_INTERRUPTION: u8 = 23;

/// Every reject reason, to map codes back (the codes are the enum's discriminants).
const REJECT_REASONS: [RejectReason; 38] = [
    RejectReason::UnknownInstrument,
    RejectReason::UnknownAccount,
    RejectReason::UnknownOrder,
    RejectReason::DuplicateInstrument,
    RejectReason::DuplicateAccount,
    RejectReason::DuplicateClOrdId,
    RejectReason::QtyNotPositive,
    RejectReason::QtyTooLarge,
    RejectReason::PriceNotPositive,
    RejectReason::PriceOffTick,
    RejectReason::PriceTooLarge,
    RejectReason::PriceOutsideBand,
    RejectReason::InvalidTimeInForce,
    RejectReason::ExpireTimeMissing,
    RejectReason::ExpireTimeInPast,
    RejectReason::DisplayQtyInvalid,
    RejectReason::InstrumentHalted,
    RejectReason::InstrumentClosed,
    RejectReason::InsufficientCollateral,
    RejectReason::InsufficientPosition,
    RejectReason::PositionLimit,
    RejectReason::Overflow,
    RejectReason::ReplaceQtyNotAboveFilled,
    RejectReason::ReplaceNoChange,
    RejectReason::OrderRefInvalid,
    RejectReason::AmountNotPositive,
    RejectReason::InsufficientFreeCash,
    RejectReason::CollateralBelowLocked,
    RejectReason::InvalidInstrument,
    RejectReason::CapacityExceeded,
    RejectReason::MassCancelUnfiltered,
    RejectReason::ExpireTimeUnexpected,
    RejectReason::InstrumentPaused,
    RejectReason::TradingSuspended,
    RejectReason::KillSwitchTargetInvalid,
    RejectReason::MarginCallOpen,
    RejectReason::TimeInForceNotInPhase,
    RejectReason::AccountNotOfFirm,
];

fn side(w: &mut Writer, s: Side) {
    w.u8(code_of(&SIDES, &s));
}

#[inline(always)]
fn read_side(r: &mut Reader) -> Result<Side, DecodeError> {
    r.code(&SIDES, "invalid side")
}

impl RejectReason {
    /// The reason with this code ([`RejectReason::code`]), if there is one.
    pub fn from_code(code: u16) -> Option<RejectReason> {
        REJECT_REASONS.iter().copied().find(|x| x.code() == code)
    }
}

fn read_definition(r: &mut Reader, guarded: bool) -> Result<InstrumentDef, DecodeError> {
    let symbol = std::str::from_utf8(r.bytes(SYMBOL_LEN_MAX)?)
        .ok()
        .and_then(Symbol::new)
        .ok_or_else(|| r.error("symbol is not 1 to 32 bytes of UTF-8"))?;
    Ok(InstrumentDef {
        symbol,
        market: r.code(&MARKETS, "invalid market")?,
        price_scale: r.u8()?,
        tick: Price(r.i64()?),
        lot_size: r.i64()?,
        multiplier: r.i64()?,
        initial_margin: Cash(r.i128()?),
        band_bps: r.u32()?,
        reference_price: Price(r.i64()?),
        volatility: if guarded {
            let guard = VolatilityGuard {
                dynamic_bps: r.u32()?,
                static_bps: r.u32()?,
                auction_ns: r.u64()?,
            };
            if guard.is_off() {
                return Err(r.error("a guarded instrument without a volatility band"));
            }
            guard
        } else {
            VolatilityGuard::default()
        },
    })
}

fn read_reason(r: &mut Reader) -> Result<RejectReason, DecodeError> {
    let code = r.u16()?;
    RejectReason::from_code(code).ok_or_else(|| r.error("unknown reject reason"))
}

const CANCEL_REASONS: [CancelReason; 7] = [
    CancelReason::Requested,
    CancelReason::MassCancel,
    CancelReason::SelfTradePrevention,
    CancelReason::ImmediateOrCancelRemainder,
    CancelReason::FillOrKillUnfilled,
    CancelReason::MarketRemainder,
    CancelReason::AuctionUnexecuted,
];
const CANCEL_REJECT_TO: [CancelRejectTo; 2] = [CancelRejectTo::Cancel, CancelRejectTo::Replace];
const ORDER_STATUSES: [OrderStatus; 6] = [
    OrderStatus::New,
    OrderStatus::PartiallyFilled,
    OrderStatus::Filled,
    OrderStatus::Cancelled,
    OrderStatus::Replaced,
    OrderStatus::Expired,
];
const LOG_ACTIONS: [OrderLogAction; 3] = [
    OrderLogAction::New,
    OrderLogAction::Change,
    OrderLogAction::Delete,
];
const CASH_REASONS: [CashReason; 3] = [
    CashReason::Deposit,
    CashReason::Withdraw,
    CashReason::SetCollateral,
];

fn fill(w: &mut Writer, f: &Fill) {
    w.u64(f.order_id.0);
    w.u32(f.account.0);
    w.u64(f.cl_ord_id.0);
    w.i64(f.qty_leaves.0);
    w.i64(f.qty_filled.0);
}

fn read_fill(r: &mut Reader) -> Result<Fill, DecodeError> {
    Ok(Fill {
        order_id: OrderId(r.u64()?),
        account: AccountId(r.u32()?),
        cl_ord_id: ClOrdId(r.u64()?),
        qty_leaves: Qty(r.i64()?),
        qty_filled: Qty(r.i64()?),
    })
}

fn encode_event(w: &mut Writer, e: &Event) {
    match *e {
        Event::OrderAccepted {
            order_id,
            account,
            cl_ord_id,
            instrument,
            side: s,
            price,
            qty,
            ts_ns,
        } => {
            w.u8(K_ORDER_ACCEPTED);
            w.u64(order_id.0);
            w.u32(account.0);
            w.u64(cl_ord_id.0);
            w.u32(instrument.0);
            side(w, s);
            w.i64(price.0);
            w.i64(qty.0);
            w.u64(ts_ns);
        }
        Event::OrderRejected {
            account,
            cl_ord_id,
            instrument,
            reason,
            ts_ns,
        } => {
            w.u8(K_ORDER_REJECTED);
            w.u32(account.0);
            w.u64(cl_ord_id.0);
            w.u32(instrument.0);
            w.u16(reason.code());
            w.u64(ts_ns);
        }
        Event::CancelRejected {
            account,
            cl_ord_id,
            order_id,
            response_to,
            reason,
            ts_ns,
        } => {
            w.u8(K_CANCEL_REJECTED);
            w.u32(account.0);
            w.u64(cl_ord_id.0);
            match order_id {
                Some(o) => {
                    w.u8(1);
                    w.u64(o.0);
                }
                None => w.u8(0),
            }
            w.u8(code_of(&CANCEL_REJECT_TO, &response_to));
            w.u16(reason.code());
            w.u64(ts_ns);
        }
        Event::CommandRejected { reason, ts_ns } => {
            w.u8(K_COMMAND_REJECTED);
            w.u16(reason.code());
            w.u64(ts_ns);
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
            ts_ns,
        } => {
            w.u8(if auction { K_AUCTION_TRADE } else { K_TRADE });
            w.u64(trade_id.0);
            w.u32(instrument.0);
            w.i64(price.0);
            w.i64(qty.0);
            side(w, aggressor);
            fill(w, &buy);
            fill(w, &sell);
            w.u64(ts_ns);
        }
        Event::OrderCancelled {
            order_id,
            account,
            cl_ord_id,
            instrument,
            side: s,
            qty_cancelled,
            reason,
            ts_ns,
        } => {
            w.u8(K_ORDER_CANCELLED);
            w.u64(order_id.0);
            w.u32(account.0);
            w.u64(cl_ord_id.0);
            w.u32(instrument.0);
            side(w, s);
            w.i64(qty_cancelled.0);
            w.u8(code_of(&CANCEL_REASONS, &reason));
            w.u64(ts_ns);
        }
        Event::OrderReplaced {
            order_id,
            account,
            cl_ord_id,
            orig_cl_ord_id,
            instrument,
            price,
            qty_total,
            qty_leaves,
            priority_kept,
            ts_ns,
        } => {
            w.u8(K_ORDER_REPLACED);
            w.u64(order_id.0);
            w.u32(account.0);
            w.u64(cl_ord_id.0);
            w.u64(orig_cl_ord_id.0);
            w.u32(instrument.0);
            w.i64(price.0);
            w.i64(qty_total.0);
            w.i64(qty_leaves.0);
            w.bool(priority_kept);
            w.u64(ts_ns);
        }
        Event::OrderExpired {
            order_id,
            account,
            cl_ord_id,
            instrument,
            qty_expired,
            ts_ns,
        } => {
            w.u8(K_ORDER_EXPIRED);
            w.u64(order_id.0);
            w.u32(account.0);
            w.u64(cl_ord_id.0);
            w.u32(instrument.0);
            w.i64(qty_expired.0);
            w.u64(ts_ns);
        }
        Event::MassCancelDone {
            cl_ord_id,
            orders_cancelled,
            ts_ns,
        } => {
            w.u8(K_MASS_CANCEL_DONE);
            w.u64(cl_ord_id.0);
            w.u64(orders_cancelled);
            w.u64(ts_ns);
        }
        Event::OrderLog(l) => {
            w.u8(K_ORDER_LOG);
            w.u64(l.rec);
            w.u64(l.seq);
            w.u8(code_of(&LOG_ACTIONS, &l.action));
            w.u8(code_of(&ORDER_STATUSES, &l.status));
            w.u64(l.order_id.0);
            w.u32(l.instrument.0);
            w.u32(l.account.0);
            w.u32(l.firm.0);
            w.u64(l.cl_ord_id.0);
            side(w, l.side);
            w.i64(l.price.0);
            w.i64(l.qty_display.0);
            w.i64(l.qty_leaves.0);
            w.i64(l.qty_filled.0);
            w.i64(l.qty_total.0);
            w.u64(l.ts_ns);
        }
        Event::InstrumentAdded {
            instrument,
            definition: d,
            ts_ns,
        } => {
            let guarded = !d.volatility.is_off();
            w.u8(if guarded {
                K_INSTRUMENT_ADDED_GUARDED
            } else {
                K_INSTRUMENT_ADDED
            });
            w.u32(instrument.0);
            w.bytes(d.symbol.as_str().as_bytes());
            w.u8(code_of(&MARKETS, &d.market));
            w.u8(d.price_scale);
            w.i64(d.tick.0);
            w.i64(d.lot_size);
            w.i64(d.multiplier);
            w.i128(d.initial_margin.0);
            w.u32(d.band_bps);
            w.i64(d.reference_price.0);
            if guarded {
                w.u32(d.volatility.dynamic_bps);
                w.u32(d.volatility.static_bps);
                w.u64(d.volatility.auction_ns);
            }
            w.u64(ts_ns);
        }
        Event::AccountAdded {
            account,
            firm,
            ts_ns,
        } => {
            w.u8(K_ACCOUNT_ADDED);
            w.u32(account.0);
            w.u32(firm.0);
            w.u64(ts_ns);
        }
        Event::PhaseChanged {
            instrument,
            phase,
            ts_ns,
        } => {
            w.u8(K_PHASE_CHANGED);
            w.u32(instrument.0);
            w.u8(code_of(&PHASES, &phase));
            w.u64(ts_ns);
        }
        Event::CashChanged {
            account,
            reason,
            amount,
            cash,
            cash_free,
            ts_ns,
        } => {
            w.u8(K_CASH_CHANGED);
            w.u32(account.0);
            w.u8(code_of(&CASH_REASONS, &reason));
            w.i128(amount.0);
            w.i128(cash.0);
            w.i128(cash_free.0);
            w.u64(ts_ns);
        }
        Event::EndOfDayDone {
            orders_expired,
            ts_ns,
        } => {
            w.u8(K_END_OF_DAY_DONE);
            w.u64(orders_expired);
            w.u64(ts_ns);
        }
        Event::KillSwitchSet {
            firm,
            account,
            engaged,
            orders_cancelled,
            ts_ns,
        } => {
            w.u8(K_KILL_SWITCH_SET);
            opt_u32(w, firm.map(|f| f.0));
            opt_u32(w, account.map(|a| a.0));
            w.bool(engaged);
            w.u64(orders_cancelled);
            w.u64(ts_ns);
        }
        Event::MarginCallSet {
            account,
            amount,
            ts_ns,
        } => {
            w.u8(K_MARGIN_CALL_SET);
            w.u32(account.0);
            w.i128(amount.0);
            w.u64(ts_ns);
        }
        Event::AuctionIndicative {
            instrument,
            price,
            qty,
            surplus,
            surplus_side,
            ts_ns,
        } => {
            w.u8(K_AUCTION_INDICATIVE);
            w.u32(instrument.0);
            w.i64(price.0);
            w.i64(qty.0);
            w.i64(surplus.0);
            match surplus_side {
                Some(s) => {
                    w.u8(1);
                    side(w, s);
                }
                None => w.u8(0),
            }
            w.u64(ts_ns);
        }
        Event::AuctionUncrossed {
            instrument,
            auction,
            price,
            qty,
            ts_ns,
        } => {
            w.u8(K_AUCTION_UNCROSSED);
            w.u32(instrument.0);
            w.u8(code_of(&PHASES, &auction));
            w.i64(price.0);
            w.i64(qty.0);
            w.u64(ts_ns);
        }
        Event::VolatilityInterruption {
            instrument,
            price,
            end_ns,
            extended,
            ts_ns,
        } => {
            w.u8(K_VOLATILITY_INTERRUPTION);
            w.u32(instrument.0);
            w.i64(price.0);
            w.u64(end_ns);
            w.bool(extended);
            w.u64(ts_ns);
        }
    }
}

#[inline]
pub fn decode_event(r: &mut Reader) -> Result<Event, DecodeError> {
    Ok(match r.u8()? {
        K_ORDER_ACCEPTED => Event::OrderAccepted {
            order_id: OrderId(r.u64()?),
            account: AccountId(r.u32()?),
            cl_ord_id: ClOrdId(r.u64()?),
            instrument: InstrumentId(r.u32()?),
            side: read_side(r)?,
            price: Price(r.i64()?),
            qty: Qty(r.i64()?),
            ts_ns: r.u64()?,
        },
        K_ORDER_REJECTED => Event::OrderRejected {
            account: AccountId(r.u32()?),
            cl_ord_id: ClOrdId(r.u64()?),
            instrument: InstrumentId(r.u32()?),
            reason: read_reason(r)?,
            ts_ns: r.u64()?,
        },
        K_CANCEL_REJECTED => Event::CancelRejected {
            account: AccountId(r.u32()?),
            cl_ord_id: ClOrdId(r.u64()?),
            order_id: match r.u8()? {
                0 => None,
                1 => Some(OrderId(r.u64()?)),
                _ => return Err(r.error("invalid option flag")),
            },
            response_to: r.code(&CANCEL_REJECT_TO, "invalid cancel reject target")?,
            reason: read_reason(r)?,
            ts_ns: r.u64()?,
        },
        K_COMMAND_REJECTED => Event::CommandRejected {
            reason: read_reason(r)?,
            ts_ns: r.u64()?,
        },
        kind @ (K_TRADE | K_AUCTION_TRADE) => Event::Trade {
            trade_id: TradeId(r.u64()?),
            instrument: InstrumentId(r.u32()?),
            price: Price(r.i64()?),
            qty: Qty(r.i64()?),
            aggressor: read_side(r)?,
            buy: read_fill(r)?,
            sell: read_fill(r)?,
            auction: kind == K_AUCTION_TRADE,
            ts_ns: r.u64()?,
        },
        K_ORDER_CANCELLED => Event::OrderCancelled {
            order_id: OrderId(r.u64()?),
            account: AccountId(r.u32()?),
            cl_ord_id: ClOrdId(r.u64()?),
            instrument: InstrumentId(r.u32()?),
            side: read_side(r)?,
            qty_cancelled: Qty(r.i64()?),
            reason: r.code(&CANCEL_REASONS, "invalid cancel reason")?,
            ts_ns: r.u64()?,
        },
        K_ORDER_REPLACED => Event::OrderReplaced {
            order_id: OrderId(r.u64()?),
            account: AccountId(r.u32()?),
            cl_ord_id: ClOrdId(r.u64()?),
            orig_cl_ord_id: ClOrdId(r.u64()?),
            instrument: InstrumentId(r.u32()?),
            price: Price(r.i64()?),
            qty_total: Qty(r.i64()?),
            qty_leaves: Qty(r.i64()?),
            priority_kept: r.bool()?,
            ts_ns: r.u64()?,
        },
        K_ORDER_EXPIRED => Event::OrderExpired {
            order_id: OrderId(r.u64()?),
            account: AccountId(r.u32()?),
            cl_ord_id: ClOrdId(r.u64()?),
            instrument: InstrumentId(r.u32()?),
            qty_expired: Qty(r.i64()?),
            ts_ns: r.u64()?,
        },
        K_MASS_CANCEL_DONE => Event::MassCancelDone {
            cl_ord_id: ClOrdId(r.u64()?),
            orders_cancelled: r.u64()?,
            ts_ns: r.u64()?,
        },
        K_ORDER_LOG => Event::OrderLog(OrderLog {
            rec: r.u64()?,
            seq: r.u64()?,
            action: r.code(&LOG_ACTIONS, "invalid order log action")?,
            status: r.code(&ORDER_STATUSES, "invalid order status")?,
            order_id: OrderId(r.u64()?),
            instrument: InstrumentId(r.u32()?),
            account: AccountId(r.u32()?),
            firm: FirmId(r.u32()?),
            cl_ord_id: ClOrdId(r.u64()?),
            side: read_side(r)?,
            price: Price(r.i64()?),
            qty_display: Qty(r.i64()?),
            qty_leaves: Qty(r.i64()?),
            qty_filled: Qty(r.i64()?),
            qty_total: Qty(r.i64()?),
            ts_ns: r.u64()?,
        }),
        kind @ (K_INSTRUMENT_ADDED | K_INSTRUMENT_ADDED_GUARDED) => Event::InstrumentAdded {
            instrument: InstrumentId(r.u32()?),
            definition: read_definition(r, kind == K_INSTRUMENT_ADDED_GUARDED)?,
            ts_ns: r.u64()?,
        },
        K_ACCOUNT_ADDED => Event::AccountAdded {
            account: AccountId(r.u32()?),
            firm: FirmId(r.u32()?),
            ts_ns: r.u64()?,
        },
        K_PHASE_CHANGED => Event::PhaseChanged {
            instrument: InstrumentId(r.u32()?),
            phase: r.code(&PHASES, "invalid phase")?,
            ts_ns: r.u64()?,
        },
        K_CASH_CHANGED => Event::CashChanged {
            account: AccountId(r.u32()?),
            reason: r.code(&CASH_REASONS, "invalid cash reason")?,
            amount: Cash(r.i128()?),
            cash: Cash(r.i128()?),
            cash_free: Cash(r.i128()?),
            ts_ns: r.u64()?,
        },
        K_END_OF_DAY_DONE => Event::EndOfDayDone {
            orders_expired: r.u64()?,
            ts_ns: r.u64()?,
        },
        K_KILL_SWITCH_SET => Event::KillSwitchSet {
            firm: read_opt_u32(r)?.map(FirmId),
            account: read_opt_u32(r)?.map(AccountId),
            engaged: r.bool()?,
            orders_cancelled: r.u64()?,
            ts_ns: r.u64()?,
        },
        K_MARGIN_CALL_SET => Event::MarginCallSet {
            account: AccountId(r.u32()?),
            amount: Cash(r.i128()?),
            ts_ns: r.u64()?,
        },
        K_AUCTION_INDICATIVE => Event::AuctionIndicative {
            instrument: InstrumentId(r.u32()?),
            price: Price(r.i64()?),
            qty: Qty(r.i64()?),
            surplus: Qty(r.i64()?),
            surplus_side: match r.u8()? {
                0 => None,
                1 => Some(read_side(r)?),
                _ => return Err(r.error("invalid option flag")),
            },
            ts_ns: r.u64()?,
        },
        K_AUCTION_UNCROSSED => Event::AuctionUncrossed {
            instrument: InstrumentId(r.u32()?),
            auction: r.code(&PHASES, "invalid phase")?,
            price: Price(r.i64()?),
            qty: Qty(r.i64()?),
            ts_ns: r.u64()?,
        },
        K_VOLATILITY_INTERRUPTION => Event::VolatilityInterruption {
            instrument: InstrumentId(r.u32()?),
            price: Price(r.i64()?),
            end_ns: r.u64()?,
            extended: r.bool()?,
            ts_ns: r.u64()?,
        },
        _ => return Err(r.error("unknown event kind")),
    })
}

/// Encodes an event list (see the module documentation) into a vector of its own.
pub fn encode_events(events: &[Event]) -> Vec<u8> {
    // Sized for the largest event (a trade, 110 bytes) so that the buffer is allocated once:
    // a smaller guess made nearly every command with a trade pay a `realloc` and a copy,
    // which callgrind counted at about 570 instructions per command on replay.
    let mut w = Writer::with_capacity(4 + events.len() * EVENT_SIZE_BYTES_MAX);
    encode_events_into(&mut w, events);
    w.finish()
}

/// Appends an event list's encoding to `w`. Panics if the list encodes larger than
/// [`EVENTS_SIZE_BYTES_MAX`] (the engine's sweeps stay far below it).
pub fn encode_events_into(w: &mut Writer, events: &[Event]) {
    let start = w.buf.len();
    w.u32(u32::try_from(events.len()).expect("fewer than 2^32 events"));
    for e in events {
        encode_event(w, e);
    }
    assert!(
        w.buf.len() - start <= EVENTS_SIZE_BYTES_MAX,
        "event list over the limit"
    );
}

/// Decodes an event list, refusing anything but exactly one well-formed list.
pub fn decode_events(bytes: &[u8]) -> Result<Vec<Event>, DecodeError> {
    let mut events = Vec::new();
    decode_events_into(bytes, &mut events)?;
    Ok(events)
}

/// Decodes an event list and appends its events to `out` (a consumer reuses one buffer). On
/// an error `out` keeps what it had before the call.
pub fn decode_events_into(bytes: &[u8], out: &mut Vec<Event>) -> Result<(), DecodeError> {
    if bytes.len() > EVENTS_SIZE_BYTES_MAX {
        return Err(DecodeError {
            offset: 0,
            what: "event list longer than allowed",
        });
    }
    let mut r = Reader::new(bytes);
    let count = r.u32()? as usize;
    if count > r.remaining() / EVENT_SIZE_BYTES_MIN {
        return Err(r.error("event count larger than the bytes can hold"));
    }
    let start = out.len();
    out.reserve(count);
    for _ in 0..count {
        match decode_event(&mut r) {
            Ok(e) => out.push(e),
            Err(e) => {
                out.truncate(start);
                return Err(e);
            }
        }
    }
    if let Err(e) = r.expect_end() {
        out.truncate(start);
        return Err(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Market, Phase};
    use proptest::prelude::*;

    fn every_kind() -> Vec<Event> {
        let fill = Fill {
            order_id: OrderId(7),
            account: AccountId(3),
            cl_ord_id: ClOrdId(9),
            qty_leaves: Qty(1),
            qty_filled: Qty(2),
        };
        let mut v = vec![
            Event::OrderAccepted {
                order_id: OrderId(u64::MAX),
                account: AccountId(1),
                cl_ord_id: ClOrdId(2),
                instrument: InstrumentId(3),
                side: Side::Sell,
                price: Price(-5),
                qty: Qty(6),
                ts_ns: 7,
            },
            Event::CancelRejected {
                account: AccountId(1),
                cl_ord_id: ClOrdId(2),
                order_id: None,
                response_to: CancelRejectTo::Replace,
                reason: RejectReason::UnknownOrder,
                ts_ns: 3,
            },
            Event::CancelRejected {
                account: AccountId(1),
                cl_ord_id: ClOrdId(2),
                order_id: Some(OrderId(4)),
                response_to: CancelRejectTo::Cancel,
                reason: RejectReason::ReplaceNoChange,
                ts_ns: 3,
            },
            Event::Trade {
                trade_id: TradeId(1),
                instrument: InstrumentId(2),
                price: Price(3),
                qty: Qty(4),
                aggressor: Side::Buy,
                buy: fill,
                sell: fill,
                auction: false,
                ts_ns: 5,
            },
            Event::Trade {
                trade_id: TradeId(2),
                instrument: InstrumentId(2),
                price: Price(3),
                qty: Qty(4),
                aggressor: Side::Sell,
                buy: fill,
                sell: fill,
                auction: true,
                ts_ns: 5,
            },
            Event::InstrumentAdded {
                instrument: InstrumentId(9),
                definition: InstrumentDef {
                    symbol: Symbol::new(&"G".repeat(SYMBOL_LEN_MAX)).unwrap(),
                    market: Market::Equity,
                    price_scale: 2,
                    tick: Price(1),
                    lot_size: 1,
                    multiplier: 1,
                    initial_margin: Cash(0),
                    band_bps: 1_000,
                    reference_price: Price(10_000),
                    volatility: VolatilityGuard {
                        dynamic_bps: 200,
                        static_bps: 0,
                        auction_ns: u64::MAX,
                    },
                },
                ts_ns: 2,
            },
            Event::AuctionIndicative {
                instrument: InstrumentId(1),
                price: Price(2),
                qty: Qty(3),
                surplus: Qty(4),
                surplus_side: Some(Side::Sell),
                ts_ns: 5,
            },
            Event::AuctionIndicative {
                instrument: InstrumentId(1),
                price: Price(0),
                qty: Qty(0),
                surplus: Qty(0),
                surplus_side: None,
                ts_ns: 5,
            },
            Event::AuctionUncrossed {
                instrument: InstrumentId(1),
                auction: Phase::ClosingAuction,
                price: Price(2),
                qty: Qty(3),
                ts_ns: 4,
            },
            Event::VolatilityInterruption {
                instrument: InstrumentId(1),
                price: Price(2),
                end_ns: 3,
                extended: true,
                ts_ns: 4,
            },
            Event::OrderReplaced {
                order_id: OrderId(1),
                account: AccountId(2),
                cl_ord_id: ClOrdId(3),
                orig_cl_ord_id: ClOrdId(4),
                instrument: InstrumentId(5),
                price: Price(6),
                qty_total: Qty(7),
                qty_leaves: Qty(8),
                priority_kept: true,
                ts_ns: 9,
            },
            Event::OrderExpired {
                order_id: OrderId(1),
                account: AccountId(2),
                cl_ord_id: ClOrdId(3),
                instrument: InstrumentId(4),
                qty_expired: Qty(5),
                ts_ns: 6,
            },
            Event::MassCancelDone {
                cl_ord_id: ClOrdId(1),
                orders_cancelled: 2,
                ts_ns: 3,
            },
            Event::InstrumentAdded {
                instrument: InstrumentId(1),
                definition: InstrumentDef {
                    // The longest symbol, so that the capacity hint is checked against it.
                    symbol: Symbol::new(&"S".repeat(SYMBOL_LEN_MAX)).unwrap(),
                    market: Market::Futures,
                    price_scale: 0,
                    tick: Price(1),
                    lot_size: 1_000,
                    multiplier: 1,
                    initial_margin: Cash(i128::MAX),
                    band_bps: u32::MAX,
                    reference_price: Price(i64::MIN),
                    volatility: VolatilityGuard::default(),
                },
                ts_ns: 2,
            },
            Event::AccountAdded {
                account: AccountId(1),
                firm: FirmId(2),
                ts_ns: 3,
            },
            Event::CashChanged {
                account: AccountId(1),
                reason: CashReason::SetCollateral,
                amount: Cash(i128::MIN),
                cash: Cash(i128::MAX),
                cash_free: Cash(-1),
                ts_ns: 2,
            },
            Event::EndOfDayDone {
                orders_expired: 1,
                ts_ns: 2,
            },
            Event::KillSwitchSet {
                firm: Some(FirmId(1)),
                account: None,
                engaged: true,
                orders_cancelled: 3,
                ts_ns: 4,
            },
            Event::KillSwitchSet {
                firm: None,
                account: Some(AccountId(2)),
                engaged: false,
                orders_cancelled: 0,
                ts_ns: 5,
            },
            Event::MarginCallSet {
                account: AccountId(3),
                amount: Cash(i128::MAX),
                ts_ns: 6,
            },
        ];
        for reason in REJECT_REASONS {
            v.push(Event::CommandRejected { reason, ts_ns: 1 });
            v.push(Event::OrderRejected {
                account: AccountId(1),
                cl_ord_id: ClOrdId(2),
                instrument: InstrumentId(3),
                reason,
                ts_ns: 4,
            });
        }
        for (i, reason) in CANCEL_REASONS.into_iter().enumerate() {
            v.push(Event::OrderCancelled {
                order_id: OrderId(i as u64),
                account: AccountId(2),
                cl_ord_id: ClOrdId(3),
                instrument: InstrumentId(4),
                side: Side::Buy,
                qty_cancelled: Qty(5),
                reason,
                ts_ns: 6,
            });
        }
        for phase in PHASES {
            v.push(Event::PhaseChanged {
                instrument: InstrumentId(1),
                phase,
                ts_ns: 2,
            });
        }
        for (i, (action, status)) in LOG_ACTIONS
            .into_iter()
            .zip(ORDER_STATUSES)
            .chain([(OrderLogAction::Delete, OrderStatus::Expired)])
            .enumerate()
        {
            v.push(Event::OrderLog(OrderLog {
                rec: i as u64,
                seq: 2,
                action,
                status,
                order_id: OrderId(3),
                instrument: InstrumentId(4),
                account: AccountId(5),
                firm: FirmId(6),
                cl_ord_id: ClOrdId(7),
                side: Side::Sell,
                price: Price(8),
                qty_display: Qty(9),
                qty_leaves: Qty(10),
                qty_filled: Qty(11),
                qty_total: Qty(12),
                ts_ns: 13,
            }));
        }
        v
    }

    #[test]
    fn every_kind_of_event_round_trips_and_a_cut_or_longer_list_is_refused() {
        let events = every_kind();
        let bytes = encode_events(&events);
        assert_eq!(decode_events(&bytes).unwrap(), events);
        for cut in 0..bytes.len() {
            assert!(decode_events(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode_events(&longer).is_err());
        assert_eq!(
            decode_events(&encode_events(&[])).unwrap(),
            Vec::<Event>::new()
        );
    }

    #[test]
    fn the_retired_instrument_kind_and_a_bad_symbol_are_refused() {
        // Kind 11 (an instrument without its definition), as an older core wrote it.
        let mut w = Writer::with_capacity(32);
        w.u32(1);
        w.u8(11);
        w.u32(5);
        w.u64(9);
        let err = decode_events(&w.finish()).unwrap_err();
        assert!(err.to_string().contains("kind"), "{err}");
        // A definition whose symbol is empty.
        let mut w = Writer::with_capacity(32);
        w.u32(1);
        w.u8(K_INSTRUMENT_ADDED);
        w.u32(5);
        w.bytes(b"");
        let err = decode_events(&w.finish()).unwrap_err();
        assert!(err.to_string().contains("symbol"), "{err}");
    }

    #[test]
    fn no_kind_of_event_encodes_larger_than_the_capacity_hint() {
        for e in every_kind() {
            let one = encode_events(std::slice::from_ref(&e));
            assert!(
                one.len() - 4 <= EVENT_SIZE_BYTES_MAX,
                "{e:?} encodes to {} bytes",
                one.len() - 4
            );
        }
    }

    fn id<T: Arbitrary>() -> impl Strategy<Value = T> {
        any::<T>()
    }

    fn any_definition() -> impl Strategy<Value = InstrumentDef> {
        (
            (
                "\\PC{1,8}",
                prop::sample::select(MARKETS.to_vec()),
                any::<u8>(),
            ),
            (id::<i64>(), id::<i64>(), id::<i64>(), id::<i128>()),
            (id::<u32>(), id::<i64>(), any::<Option<(u32, u32, u64)>>()),
        )
            .prop_filter_map(
                "a symbol of 1 to 32 bytes",
                |(
                    (symbol, market, price_scale),
                    (tick, lot, mult, margin),
                    (band, reference, guard),
                )| {
                    Some(InstrumentDef {
                        symbol: Symbol::new(&symbol)?,
                        market,
                        price_scale,
                        tick: Price(tick),
                        lot_size: lot,
                        multiplier: mult,
                        initial_margin: Cash(margin),
                        band_bps: band,
                        reference_price: Price(reference),
                        // A guard has a band (or it is off, and encodes without one).
                        volatility: guard.map_or(VolatilityGuard::default(), |(d, s, n)| {
                            VolatilityGuard {
                                dynamic_bps: d.max(1),
                                static_bps: s,
                                auction_ns: n,
                            }
                        }),
                    })
                },
            )
    }

    fn any_fill() -> impl Strategy<Value = Fill> {
        (
            id::<u64>(),
            id::<u32>(),
            id::<u64>(),
            id::<i64>(),
            id::<i64>(),
        )
            .prop_map(|(o, a, c, leaves, filled)| Fill {
                order_id: OrderId(o),
                account: AccountId(a),
                cl_ord_id: ClOrdId(c),
                qty_leaves: Qty(leaves),
                qty_filled: Qty(filled),
            })
    }

    fn reason() -> impl Strategy<Value = RejectReason> {
        prop::sample::select(REJECT_REASONS.to_vec())
    }

    fn side() -> impl Strategy<Value = Side> {
        prop::sample::select(SIDES.to_vec())
    }

    fn any_order_log() -> impl Strategy<Value = OrderLog> {
        (
            (
                id::<u64>(),
                id::<u64>(),
                prop::sample::select(LOG_ACTIONS.to_vec()),
            ),
            (
                prop::sample::select(ORDER_STATUSES.to_vec()),
                id::<u64>(),
                id::<u32>(),
            ),
            (id::<u32>(), id::<u32>(), id::<u64>(), side(), id::<i64>()),
            (
                id::<i64>(),
                id::<i64>(),
                id::<i64>(),
                id::<i64>(),
                id::<u64>(),
            ),
        )
            .prop_map(
                |(
                    (rec, seq, action),
                    (status, o, i),
                    (a, f, c, side, price),
                    (d, l, fi, t, ts),
                )| {
                    OrderLog {
                        rec,
                        seq,
                        action,
                        status,
                        order_id: OrderId(o),
                        instrument: InstrumentId(i),
                        account: AccountId(a),
                        firm: FirmId(f),
                        cl_ord_id: ClOrdId(c),
                        side,
                        price: Price(price),
                        qty_display: Qty(d),
                        qty_leaves: Qty(l),
                        qty_filled: Qty(fi),
                        qty_total: Qty(t),
                        ts_ns: ts,
                    }
                },
            )
    }

    /// Every variant of `Event`, with any field values.
    fn any_event() -> impl Strategy<Value = Event> {
        let ts = id::<u64>;
        prop_oneof![
            (
                (id::<u64>(), id::<u32>(), id::<u64>(), id::<u32>()),
                (side(), id::<i64>(), id::<i64>(), ts())
            )
                .prop_map(|((o, a, c, i), (side, p, q, ts_ns))| Event::OrderAccepted {
                    order_id: OrderId(o),
                    account: AccountId(a),
                    cl_ord_id: ClOrdId(c),
                    instrument: InstrumentId(i),
                    side,
                    price: Price(p),
                    qty: Qty(q),
                    ts_ns,
                }),
            (id::<u32>(), id::<u64>(), id::<u32>(), reason(), ts()).prop_map(
                |(a, c, i, reason, ts_ns)| Event::OrderRejected {
                    account: AccountId(a),
                    cl_ord_id: ClOrdId(c),
                    instrument: InstrumentId(i),
                    reason,
                    ts_ns,
                }
            ),
            (
                (id::<u32>(), id::<u64>(), id::<Option<u64>>()),
                (
                    prop::sample::select(CANCEL_REJECT_TO.to_vec()),
                    reason(),
                    ts()
                )
            )
                .prop_map(|((a, c, o), (response_to, reason, ts_ns))| {
                    Event::CancelRejected {
                        account: AccountId(a),
                        cl_ord_id: ClOrdId(c),
                        order_id: o.map(OrderId),
                        response_to,
                        reason,
                        ts_ns,
                    }
                }),
            (reason(), ts()).prop_map(|(reason, ts_ns)| Event::CommandRejected { reason, ts_ns }),
            (
                (id::<u64>(), id::<u32>(), id::<i64>(), id::<i64>()),
                (side(), any_fill(), any_fill(), any::<bool>(), ts())
            )
                .prop_map(|((t, i, p, q), (aggressor, buy, sell, auction, ts_ns))| {
                    Event::Trade {
                        trade_id: TradeId(t),
                        instrument: InstrumentId(i),
                        price: Price(p),
                        qty: Qty(q),
                        aggressor,
                        buy,
                        sell,
                        auction,
                        ts_ns,
                    }
                }),
            (
                (id::<u64>(), id::<u32>(), id::<u64>(), id::<u32>()),
                (
                    side(),
                    id::<i64>(),
                    prop::sample::select(CANCEL_REASONS.to_vec()),
                    ts()
                )
            )
                .prop_map(|((o, a, c, i), (side, q, reason, ts_ns))| {
                    Event::OrderCancelled {
                        order_id: OrderId(o),
                        account: AccountId(a),
                        cl_ord_id: ClOrdId(c),
                        instrument: InstrumentId(i),
                        side,
                        qty_cancelled: Qty(q),
                        reason,
                        ts_ns,
                    }
                }),
            (
                (
                    id::<u64>(),
                    id::<u32>(),
                    id::<u64>(),
                    id::<u64>(),
                    id::<u32>()
                ),
                (id::<i64>(), id::<i64>(), id::<i64>(), any::<bool>(), ts())
            )
                .prop_map(|((o, a, c, oc, i), (p, total, leaves, kept, ts_ns))| {
                    Event::OrderReplaced {
                        order_id: OrderId(o),
                        account: AccountId(a),
                        cl_ord_id: ClOrdId(c),
                        orig_cl_ord_id: ClOrdId(oc),
                        instrument: InstrumentId(i),
                        price: Price(p),
                        qty_total: Qty(total),
                        qty_leaves: Qty(leaves),
                        priority_kept: kept,
                        ts_ns,
                    }
                }),
            (
                id::<u64>(),
                id::<u32>(),
                id::<u64>(),
                id::<u32>(),
                id::<i64>(),
                ts()
            )
                .prop_map(|(o, a, c, i, q, ts_ns)| Event::OrderExpired {
                    order_id: OrderId(o),
                    account: AccountId(a),
                    cl_ord_id: ClOrdId(c),
                    instrument: InstrumentId(i),
                    qty_expired: Qty(q),
                    ts_ns,
                }),
            (id::<u64>(), id::<u64>(), ts()).prop_map(|(c, n, ts_ns)| Event::MassCancelDone {
                cl_ord_id: ClOrdId(c),
                orders_cancelled: n,
                ts_ns,
            }),
            any_order_log().prop_map(Event::OrderLog),
            (id::<u32>(), any_definition(), ts()).prop_map(|(i, definition, ts_ns)| {
                Event::InstrumentAdded {
                    instrument: InstrumentId(i),
                    definition,
                    ts_ns,
                }
            }),
            (id::<u32>(), id::<u32>(), ts()).prop_map(|(a, f, ts_ns)| Event::AccountAdded {
                account: AccountId(a),
                firm: FirmId(f),
                ts_ns,
            }),
            (id::<u32>(), prop::sample::select(PHASES.to_vec()), ts()).prop_map(
                |(i, phase, ts_ns)| Event::PhaseChanged {
                    instrument: InstrumentId(i),
                    phase,
                    ts_ns,
                }
            ),
            (
                (id::<u32>(), prop::sample::select(CASH_REASONS.to_vec())),
                (id::<i128>(), id::<i128>(), id::<i128>(), ts())
            )
                .prop_map(|((a, reason), (amount, cash, free, ts_ns))| {
                    Event::CashChanged {
                        account: AccountId(a),
                        reason,
                        amount: Cash(amount),
                        cash: Cash(cash),
                        cash_free: Cash(free),
                        ts_ns,
                    }
                }),
            (id::<u64>(), ts()).prop_map(|(n, ts_ns)| Event::EndOfDayDone {
                orders_expired: n,
                ts_ns,
            }),
            (
                any::<Option<u32>>(),
                any::<Option<u32>>(),
                any::<bool>(),
                id::<u64>(),
                ts()
            )
                .prop_map(|(f, a, engaged, n, ts_ns)| Event::KillSwitchSet {
                    firm: f.map(FirmId),
                    account: a.map(AccountId),
                    engaged,
                    orders_cancelled: n,
                    ts_ns,
                }),
            (id::<u32>(), id::<i128>(), ts()).prop_map(|(a, amount, ts_ns)| {
                Event::MarginCallSet {
                    account: AccountId(a),
                    amount: Cash(amount),
                    ts_ns,
                }
            }),
            (
                (id::<u32>(), id::<i64>(), id::<i64>(), id::<i64>()),
                (any::<Option<bool>>(), ts())
            )
                .prop_map(|((i, p, q, s), (side, ts_ns))| Event::AuctionIndicative {
                    instrument: InstrumentId(i),
                    price: Price(p),
                    qty: Qty(q),
                    surplus: Qty(s),
                    surplus_side: side.map(|b| if b { Side::Buy } else { Side::Sell }),
                    ts_ns,
                }),
            (
                (id::<u32>(), prop::sample::select(PHASES.to_vec())),
                (id::<i64>(), id::<i64>(), ts())
            )
                .prop_map(|((i, auction), (p, q, ts_ns))| Event::AuctionUncrossed {
                    instrument: InstrumentId(i),
                    auction,
                    price: Price(p),
                    qty: Qty(q),
                    ts_ns,
                }),
            (id::<u32>(), id::<i64>(), id::<u64>(), any::<bool>(), ts()).prop_map(
                |(i, p, end_ns, extended, ts_ns)| Event::VolatilityInterruption {
                    instrument: InstrumentId(i),
                    price: Price(p),
                    end_ns,
                    extended,
                    ts_ns,
                }
            ),
        ]
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_events(&bytes);
        }

        #[test]
        fn any_list_of_any_events_round_trips_and_keeps_its_ts(
            events in proptest::collection::vec(any_event(), 0..12),
        ) {
            let bytes = encode_events(&events);
            prop_assert_eq!(decode_events(&bytes), Ok(events.clone()));
            for e in &events {
                let one = encode_events(std::slice::from_ref(e));
                prop_assert!(one.len() - 4 <= EVENT_SIZE_BYTES_MAX);
                prop_assert_eq!(decode_events(&one).map(|d| d[0].ts_ns()), Ok(e.ts_ns()));
            }
            let mut out = vec![Event::EndOfDayDone { orders_expired: 0, ts_ns: 0 }];
            if !bytes.is_empty() {
                prop_assert!(decode_events_into(&bytes[..bytes.len() - 1], &mut out).is_err());
                prop_assert_eq!(out.len(), 1);
            }
        }

        #[test]
        fn a_flipped_byte_decodes_to_something_else_or_fails(i in any::<prop::sample::Index>(), bit in 0u8..8) {
            let events = every_kind();
            let mut bytes = encode_events(&events);
            let n = i.index(bytes.len());
            bytes[n] ^= 1 << bit;
            if let Ok(back) = decode_events(&bytes) {
                prop_assert_ne!(back, events);
            }
        }
    }
}
