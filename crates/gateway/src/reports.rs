//! What the gateway owes its sessions: [`Report`]s (execution reports with the order's state
//! after them, cancel rejects, mass cancel answers, status answers and business rejects) and
//! the reasons a request was refused ([`RejectCause`]: the core's [`RejectReason`] or the
//! gateway's own [`GatewayReject`]). The router makes them; the FIX and binary fronts render
//! them.

use crate::router::ClientId;
use bourse_core::*;

/// Why the gateway itself refused a request before it reached the core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GatewayReject {
    NotAuthorized,
    /// A session entitled by firm (no account list) sent an order that names no account.
    AccountRequired,
    UnknownSymbol,
    InvalidPrice,
    InvalidQty,
    InvalidField,
    UnsupportedValue,
    /// A binary MassCancel's scope holds no valid value.
    UnsupportedScope,
    DuplicateClOrdId,
    UnknownOrder,
    /// The queue to the core is full, or the gateway's order table is.
    SystemBusy,
    CoreUnavailable,
    /// The core's replica group has no quorum: nothing can be committed until it has.
    CoreNoQuorum,
}

impl GatewayReject {
    pub fn text(self) -> &'static str {
        match self {
            GatewayReject::NotAuthorized => "not authorized for this account or session",
            GatewayReject::AccountRequired => {
                "an account is required: the session trades every account of its firm"
            }
            GatewayReject::UnknownSymbol => "unknown symbol",
            GatewayReject::InvalidPrice => "invalid price for the instrument's scale and type",
            GatewayReject::InvalidQty => "quantity must be a positive multiple of the lot size",
            GatewayReject::InvalidField => "invalid field value",
            GatewayReject::UnsupportedValue => "unsupported value",
            GatewayReject::UnsupportedScope => "mass cancel scope must be Session, Account or Firm",
            GatewayReject::DuplicateClOrdId => "duplicate ClOrdID among the session's live orders",
            GatewayReject::UnknownOrder => "unknown order",
            GatewayReject::SystemBusy => "system busy, retry",
            GatewayReject::CoreUnavailable => "trading core unavailable",
            GatewayReject::CoreNoQuorum => {
                "trading core has no quorum (replicas unreachable): not accepted, retry later"
            }
        }
    }
}

/// Why a request was refused: by the core (a specific [`RejectReason`]) or by the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectCause {
    Core(RejectReason),
    Gateway(GatewayReject),
}

impl RejectCause {
    pub fn text(self) -> String {
        match self {
            RejectCause::Core(r) => format!("{r:?}"),
            RejectCause::Gateway(g) => g.text().to_string(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecKind {
    New,
    Trade {
        trade_id: TradeId,
        last_px: Price,
        last_lots: i64,
        aggressor: bool,
    },
    Canceled {
        /// The id of the request that cancelled it (cancel or mass cancel), if one did.
        by: Option<ClientId>,
        reason: CancelReason,
        qty_lots: i64,
    },
    Replaced {
        orig: ClientId,
    },
    Expired,
    Rejected(RejectCause),
    /// The answer to a status request (FIX ExecType=I): the order's state, no change.
    Status(StatusQuery),
}

/// Which status request an [`ExecKind::Status`] report answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusQuery {
    /// OrderStatusRequest: its OrdStatusReqID (790), if it had one.
    pub status_req_id: Option<Box<str>>,
    /// OrderMassStatusRequest: its MassStatusReqID (584), the number of reports that answer
    /// it (911) and whether this is the last (912).
    pub mass: Option<(Box<str>, u32, bool)>,
    /// Submitted and not yet accepted by the core (OrdStatus=A).
    pub pending_new: bool,
    /// The order is no longer live: how it ended (OrdStatus 2, 4 or C).
    pub finished: Option<Finished>,
}

/// How an order that is no longer live ended, kept so that a status request after the fact
/// (or after a gateway restart) gets the true answer and not "unknown".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finished {
    Filled,
    Canceled,
    Expired,
}

/// A new order's fields exactly as the client sent them (FIX), echoed in the report that
/// rejects it: a client's order manager matches a reject by these, and an invalid value (an
/// unknown Symbol, a price off the tick, a quantity off the lot, Side=9) cannot be rendered
/// from what the gateway parsed. Absent fields stay absent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Echo {
    pub symbol: Option<Box<[u8]>>,
    pub side: Option<Box<[u8]>>,
    pub ord_type: Option<Box<[u8]>>,
    pub order_qty: Option<Box<[u8]>>,
    pub price: Option<Box<[u8]>>,
}

/// One execution report, with the order's state after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecReport {
    pub kind: ExecKind,
    pub order_id: Option<OrderId>,
    pub client: ClientId,
    pub account: AccountId,
    pub instrument: InstrumentId,
    pub side: Side,
    pub ord_type: OrdType,
    pub tif: TimeInForce,
    pub price: Price,
    pub qty_lots: i64,
    pub cum_lots: i64,
    pub leaves_lots: i64,
    pub notional: i128,
    pub ts_ns: u64,
    /// A rejected request's fields as received (FIX gateway rejects of a new order).
    pub echo: Option<Box<Echo>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report {
    Exec(ExecReport),
    CancelReject {
        client: ClientId,
        orig: ClientId,
        order_id: Option<OrderId>,
        to: CancelRejectTo,
        cause: RejectCause,
        ts_ns: u64,
    },
    MassCancel {
        client: ClientId,
        request_type: u8,
        total: u64,
        reject: Option<RejectCause>,
        ts_ns: u64,
    },
    /// A status request for an order the session does not have live (unknown, or already
    /// done): ExecType=I, OrdStatus=8, OrdRejReason=5 (unknown order). For a mass status
    /// request that found no order, `mass` says so (TotNumReports=0).
    StatusUnknown {
        client: Option<ClientId>,
        order_id: Option<OrderId>,
        symbol: Option<Box<str>>,
        side: Option<Side>,
        query: StatusQuery,
        ts_ns: u64,
    },
    /// The request was not processed at all (throttle, unsupported, busy).
    BusinessReject {
        ref_msg_type: String,
        ref_seq_num: u64,
        ref_id: Option<ClientId>,
        /// Binary template id of the refused request.
        ref_template_id: u16,
        throttled_retry_ms: Option<u32>,
        text: String,
        ts_ns: u64,
    },
}
