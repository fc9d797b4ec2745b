//! Events: everything a trading core says in answer to commands.
//!
//! Events are small `Copy` values with no heap data, so that the engine can write them into a
//! reused buffer without allocating. In JSON Lines they are flat objects tagged by `event`.

use crate::command::Side;
use crate::ids::{AccountId, ClOrdId, FirmId, InstrumentId, OrderId, TradeId};
use crate::instrument::{InstrumentDef, Phase};
use crate::num::{Cash, Price, Qty};
use serde::{Deserialize, Serialize};

/// Why a command was refused. Each reason is specific, so that a client can act on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u16)]
pub enum RejectReason {
    UnknownInstrument = 1,
    UnknownAccount = 2,
    /// No live order with that id belongs to the account (never existed, already filled,
    /// cancelled or expired).
    UnknownOrder = 3,
    DuplicateInstrument = 4,
    DuplicateAccount = 5,
    /// The client order id is already used by a live order of the account.
    DuplicateClOrdId = 6,
    QtyNotPositive = 7,
    QtyTooLarge = 8,
    PriceNotPositive = 9,
    PriceOffTick = 10,
    PriceTooLarge = 11,
    PriceOutsideBand = 12,
    /// Market orders may only be IOC or FOK (Day is read as IOC), never GTC or GTD.
    InvalidTimeInForce = 13,
    ExpireTimeMissing = 14,
    ExpireTimeInPast = 15,
    /// The iceberg display quantity is negative, larger than the order, smaller than 1/1000 of
    /// it (at most 1,000 parts), or used with IOC/FOK or a market order.
    DisplayQtyInvalid = 16,
    InstrumentHalted = 17,
    InstrumentClosed = 18,
    /// Free cash does not cover the order's reservation (or its margin, for futures).
    InsufficientCollateral = 19,
    /// A sell of equities or FX larger than the account's free position, by an account that
    /// may not go short.
    InsufficientPosition = 20,
    /// The order could take the account's position past the position limit.
    PositionLimit = 21,
    /// An amount does not fit the arithmetic (a deliberately huge value).
    Overflow = 22,
    /// A replace asks for a total quantity at or below what is already filled.
    ReplaceQtyNotAboveFilled = 23,
    /// A replace that changes nothing.
    ReplaceNoChange = 24,
    /// A cancel or replace names neither an order id nor an original client id, or both.
    OrderRefInvalid = 25,
    AmountNotPositive = 26,
    /// A withdrawal larger than the account's free cash.
    InsufficientFreeCash = 27,
    /// A collateral setting below what the account's orders and positions already lock.
    CollateralBelowLocked = 28,
    /// An instrument definition with an impossible value (see the event's detail in docs).
    InvalidInstrument = 29,
    /// The core's fixed capacity (orders, instruments, accounts) is used up.
    CapacityExceeded = 30,
    /// A mass cancel with no filter at all is refused, to protect the whole market from a
    /// mistaken request.
    MassCancelUnfiltered = 31,
    /// A GTD order needs an expiry; other orders must not carry one.
    ExpireTimeUnexpected = 32,
    /// The instrument is in a scheduled pause (a clearing session); resting orders stay.
    InstrumentPaused = 33,
    /// The account, or its firm, is stopped by the kill switch until an operator releases it.
    TradingSuspended = 34,
    /// A kill switch names neither a firm nor an account, or both.
    KillSwitchTargetInvalid = 35,
    /// The account has a margin call open (clearing found its collateral below its initial
    /// margin): only orders that reduce its exposure, and cancels, are accepted until a
    /// deposit covers the call or the next clearing run closes it.
    MarginCallOpen = 36,
    /// The time in force is not valid in the instrument's phase: at the opening only in the
    /// opening auction, at the close only in the closing auction, good for auction only in an
    /// auction, IOC and FOK never in an auction (nothing executes during a call).
    TimeInForceNotInPhase = 37,
    /// The order names an account of another firm than the one it was sent for (a session
    /// entitled by firm trades its own firm's accounts only).
    AccountNotOfFirm = 38,
}

fn is_false(v: &bool) -> bool {
    !*v
}

impl RejectReason {
    pub fn code(self) -> u16 {
        self as u16
    }
}

/// Why an order left the book other than by trading.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelReason {
    /// The owner asked.
    Requested,
    MassCancel,
    SelfTradePrevention,
    /// What an IOC order could not trade at once.
    ImmediateOrCancelRemainder,
    /// A FOK order that could not be filled in full.
    FillOrKillUnfilled,
    /// What a market order could not trade within the band, or at a call auction's uncrossing.
    MarketRemainder,
    /// What an order valid for one auction only (at the opening, at the close, good for
    /// auction) did not execute at that auction's uncrossing.
    AuctionUnexecuted,
}

/// What answered a cancel or replace request that was refused (FIX CxlRejResponseTo).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelRejectTo {
    Cancel,
    Replace,
}

/// The state of an order as the order log reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    New,
    PartiallyFilled,
    Filled,
    Cancelled,
    Replaced,
    Expired,
}

impl OrderStatus {
    pub fn is_live(self) -> bool {
        matches!(
            self,
            OrderStatus::New | OrderStatus::PartiallyFilled | OrderStatus::Replaced
        )
    }
}

/// What an order-log record says happened to the order's presence in the book.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderLogAction {
    /// The order entered the book (or was seen for the first time, if it never rested).
    New,
    /// The order changed (fill, replace, iceberg refill) and is still in the book.
    Change,
    /// The order left the book (filled, cancelled, expired, or never rested).
    Delete,
}

/// One record of the full order log: the latest state of an order after a change.
///
/// `rec` numbers records: every new order takes the next `rec` when it is accepted, and keeps it.
/// `seq` numbers changes: every change to any order takes the next `seq`. A client that
/// remembers the highest (`seq`) it saw can ask for everything after it (the delivery cursor
/// of seed 003), and the market data order log is built from these records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderLog {
    pub rec: u64,
    pub seq: u64,
    pub action: OrderLogAction,
    pub status: OrderStatus,
    pub order_id: OrderId,
    pub instrument: InstrumentId,
    pub account: AccountId,
    pub firm: FirmId,
    pub cl_ord_id: ClOrdId,
    pub side: Side,
    pub price: Price,
    /// Quantity visible in the book (the iceberg's shown part; 0 once the order left).
    pub qty_display: Qty,
    /// Quantity still open (0 once the order left the book).
    pub qty_leaves: Qty,
    /// Quantity filled so far.
    pub qty_filled: Qty,
    /// The order's total quantity (filled plus open plus cancelled).
    pub qty_total: Qty,
    pub ts_ns: u64,
}

/// One side of a trade.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fill {
    pub order_id: OrderId,
    pub account: AccountId,
    pub cl_ord_id: ClOrdId,
    /// Quantity of the order still open after this trade.
    pub qty_leaves: Qty,
    /// Quantity of the order filled so far, this trade included.
    pub qty_filled: Qty,
}

/// Why an account's cash changed outside trading.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CashReason {
    Deposit,
    Withdraw,
    SetCollateral,
}

/// Everything a core says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A new order passed validation and risk and was registered.
    OrderAccepted {
        order_id: OrderId,
        account: AccountId,
        cl_ord_id: ClOrdId,
        instrument: InstrumentId,
        side: Side,
        price: Price,
        qty: Qty,
        ts_ns: u64,
    },
    /// A new order was refused; nothing changed.
    OrderRejected {
        account: AccountId,
        cl_ord_id: ClOrdId,
        instrument: InstrumentId,
        reason: RejectReason,
        ts_ns: u64,
    },
    /// A cancel or replace was refused; nothing changed.
    CancelRejected {
        account: AccountId,
        cl_ord_id: ClOrdId,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        order_id: Option<OrderId>,
        response_to: CancelRejectTo,
        reason: RejectReason,
        ts_ns: u64,
    },
    /// A control command (instrument, account, cash, phase, mass cancel) was refused.
    CommandRejected {
        reason: RejectReason,
        ts_ns: u64,
    },
    Trade {
        trade_id: TradeId,
        instrument: InstrumentId,
        price: Price,
        qty: Qty,
        /// The incoming order's side; in an auction trade, the side of the order that arrived
        /// later (the larger order id).
        aggressor: Side,
        buy: Fill,
        sell: Fill,
        /// A trade of a call auction's uncrossing (absent from JSON when false).
        #[serde(default, skip_serializing_if = "is_false")]
        auction: bool,
        ts_ns: u64,
    },
    OrderCancelled {
        order_id: OrderId,
        account: AccountId,
        cl_ord_id: ClOrdId,
        instrument: InstrumentId,
        side: Side,
        qty_cancelled: Qty,
        reason: CancelReason,
        ts_ns: u64,
    },
    OrderReplaced {
        order_id: OrderId,
        account: AccountId,
        cl_ord_id: ClOrdId,
        orig_cl_ord_id: ClOrdId,
        instrument: InstrumentId,
        price: Price,
        qty_total: Qty,
        qty_leaves: Qty,
        priority_kept: bool,
        ts_ns: u64,
    },
    OrderExpired {
        order_id: OrderId,
        account: AccountId,
        cl_ord_id: ClOrdId,
        instrument: InstrumentId,
        qty_expired: Qty,
        ts_ns: u64,
    },
    MassCancelDone {
        cl_ord_id: ClOrdId,
        orders_cancelled: u64,
        ts_ns: u64,
    },
    OrderLog(OrderLog),
    /// An instrument was added; its definition comes with it, so that whoever reads the
    /// committed stream can route, publish and clear it.
    InstrumentAdded {
        instrument: InstrumentId,
        /// Flattened, so that the JSON Lines event stays one flat object.
        #[serde(flatten)]
        definition: InstrumentDef,
        ts_ns: u64,
    },
    AccountAdded {
        account: AccountId,
        firm: FirmId,
        ts_ns: u64,
    },
    PhaseChanged {
        instrument: InstrumentId,
        phase: Phase,
        ts_ns: u64,
    },
    CashChanged {
        account: AccountId,
        reason: CashReason,
        amount: Cash,
        cash: Cash,
        cash_free: Cash,
        ts_ns: u64,
    },
    EndOfDayDone {
        orders_expired: u64,
        ts_ns: u64,
    },
    /// A kill switch was engaged (the target's orders cancelled, `orders_cancelled` of them in
    /// this core, and its new orders refused) or released.
    KillSwitchSet {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        firm: Option<FirmId>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        account: Option<AccountId>,
        engaged: bool,
        orders_cancelled: u64,
        ts_ns: u64,
    },
    /// The indicative uncrossing of an instrument in a call auction changed (after a command
    /// that changed its book): the price at which the book would uncross now, the quantity
    /// that would execute, and the quantity left unmatched at that price and on which side.
    /// No cross: price, quantity and surplus 0, no side.
    AuctionIndicative {
        instrument: InstrumentId,
        price: Price,
        qty: Qty,
        surplus: Qty,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        surplus_side: Option<Side>,
        ts_ns: u64,
    },
    /// A call auction ended: its trades (`auction: true`) come before this event. `price` is
    /// the uncrossing price, or with nothing executed (`qty` 0) the reference price (the last
    /// trade price, else the instrument's). For the closing auction it is the official close.
    AuctionUncrossed {
        instrument: InstrumentId,
        /// The auction phase that ended.
        auction: Phase,
        price: Price,
        qty: Qty,
        ts_ns: u64,
    },
    /// A volatility auction started (an order would have traded at `price`, outside a band of
    /// the instrument's volatility guard) or, `extended`, was extended because its indicative
    /// price was still outside (`price`); it ends at `end_ns`.
    VolatilityInterruption {
        instrument: InstrumentId,
        price: Price,
        end_ns: u64,
        extended: bool,
        ts_ns: u64,
    },
    /// The margin call open on an account changed: a `MarginCall` command set it, or a
    /// deposit reduced it. `amount` is what is still called (0: the call is closed).
    MarginCallSet {
        account: AccountId,
        amount: Cash,
        ts_ns: u64,
    },
}

impl Event {
    /// The time stamped on the command that produced the event (every event carries it).
    pub fn ts_ns(&self) -> u64 {
        // Events are small `Copy` values: reading through the one match below is cheaper
        // than keeping two lists of the variants in step.
        let mut e = *self;
        *e.ts_ns_mut()
    }

    /// The event's time stamp, to restamp it (a replay that measures delays from now).
    pub fn ts_ns_mut(&mut self) -> &mut u64 {
        match self {
            Event::OrderLog(l) => &mut l.ts_ns,
            Event::OrderAccepted { ts_ns, .. }
            | Event::OrderRejected { ts_ns, .. }
            | Event::CancelRejected { ts_ns, .. }
            | Event::CommandRejected { ts_ns, .. }
            | Event::Trade { ts_ns, .. }
            | Event::OrderCancelled { ts_ns, .. }
            | Event::OrderReplaced { ts_ns, .. }
            | Event::OrderExpired { ts_ns, .. }
            | Event::MassCancelDone { ts_ns, .. }
            | Event::InstrumentAdded { ts_ns, .. }
            | Event::AccountAdded { ts_ns, .. }
            | Event::PhaseChanged { ts_ns, .. }
            | Event::CashChanged { ts_ns, .. }
            | Event::EndOfDayDone { ts_ns, .. }
            | Event::KillSwitchSet { ts_ns, .. }
            | Event::AuctionIndicative { ts_ns, .. }
            | Event::AuctionUncrossed { ts_ns, .. }
            | Event::VolatilityInterruption { ts_ns, .. }
            | Event::MarginCallSet { ts_ns, .. } => ts_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_event_stays_two_cache_lines() {
        // The engine copies every event it emits into its caller's buffer: the auction flag
        // on trades and the volatility guard in an instrument's definition fit the padding.
        assert!(std::mem::size_of::<super::Event>() <= 128);
    }
}
