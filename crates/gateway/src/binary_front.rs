//! The binary (SBE) front end: requests decoded into the router's [`Request`]s
//! ([`parse_request`]), reports encoded as sequenced server responses
//! (docs/protocol-binary-order-entry.md). The session layer (establishment, sequencing,
//! retransmission) is the event loop's, `server::binary_session`.

use crate::router::{
    ClientId, ExecKind, GatewayReject, MassCancelScope, NewOrderRequest, RejectCause, Report,
    Request, Router,
};
use bourse_core::*;
use bourse_wire::frame::encode_frame;
use bourse_wire::order_entry::codec::{
    aggressor_flag::AggressorFlag, business_reject_codec::BusinessRejectEncoder,
    business_reject_reason::BusinessRejectReason as BinBizReason,
    cancel_ack_codec::CancelAckEncoder, cancel_reason::CancelReason as BinCancelReason,
    cancel_reject_codec::CancelRejectEncoder, cancel_reject_reason::CancelRejectReason,
    execution_report_codec::ExecutionReportEncoder, mass_cancel_ack_codec::MassCancelAckEncoder,
    mass_cancel_codec::MassCancelDecoder, mass_cancel_result::MassCancelResult,
    mass_cancel_scope::MassCancelScope as WireScope, new_order_ack_codec::NewOrderAckEncoder,
    new_order_codec::NewOrderDecoder, ord_type::OrdType as BinOrdType,
    order_reject_codec::OrderRejectEncoder, order_reject_reason::OrderRejectReason,
    replace_ack_codec::ReplaceAckEncoder, replace_reject_codec::ReplaceRejectEncoder,
    side::Side as BinSide, time_in_force::TimeInForce as BinTif,
};
use bourse_wire::order_entry::{Message, FRAME_BYTES_MAX};

pub fn bin_side(side: Side) -> BinSide {
    match side {
        Side::Buy => BinSide::Buy,
        Side::Sell => BinSide::Sell,
    }
}

pub fn order_reject_reason(cause: RejectCause) -> OrderRejectReason {
    use RejectReason::*;
    match cause {
        RejectCause::Core(r) => match r {
            UnknownInstrument => OrderRejectReason::UnknownInstrument,
            UnknownAccount => OrderRejectReason::UnknownAccount,
            UnknownOrder => OrderRejectReason::UnknownOrder,
            DuplicateClOrdId => OrderRejectReason::DuplicateClOrdId,
            QtyNotPositive => OrderRejectReason::InvalidQty,
            QtyTooLarge => OrderRejectReason::QtyTooLarge,
            PriceNotPositive | PriceTooLarge => OrderRejectReason::InvalidPrice,
            PriceOffTick => OrderRejectReason::PriceNotOnTick,
            PriceOutsideBand => OrderRejectReason::PriceOutOfBand,
            InvalidTimeInForce | TimeInForceNotInPhase => OrderRejectReason::InvalidTimeInForce,
            ExpireTimeMissing | ExpireTimeInPast | ExpireTimeUnexpected => {
                OrderRejectReason::InvalidExpireTime
            }
            DisplayQtyInvalid => OrderRejectReason::InvalidDisplayQty,
            InstrumentClosed => OrderRejectReason::InstrumentNotTrading,
            InstrumentHalted => OrderRejectReason::InstrumentHalted,
            InstrumentPaused => OrderRejectReason::InstrumentPaused,
            TradingSuspended => OrderRejectReason::TradingSuspended,
            InsufficientCollateral | InsufficientPosition => {
                OrderRejectReason::InsufficientCollateral
            }
            CapacityExceeded => OrderRejectReason::TooManyOpenOrders,
            ReplaceQtyNotAboveFilled => OrderRejectReason::TooLateToReplace,
            MarginCallOpen => OrderRejectReason::MarginCallOpen,
            AccountNotOfFirm => OrderRejectReason::NotAuthorized,
            _ => OrderRejectReason::Other,
        },
        RejectCause::Gateway(g) => match g {
            GatewayReject::NotAuthorized => OrderRejectReason::NotAuthorized,
            GatewayReject::UnknownSymbol => OrderRejectReason::UnknownInstrument,
            GatewayReject::InvalidPrice => OrderRejectReason::InvalidPrice,
            GatewayReject::InvalidQty => OrderRejectReason::QtyNotMultipleOfLot,
            GatewayReject::DuplicateClOrdId => OrderRejectReason::DuplicateClOrdId,
            GatewayReject::UnknownOrder => OrderRejectReason::UnknownOrder,
            GatewayReject::AccountRequired => OrderRejectReason::UnknownAccount,
            _ => OrderRejectReason::Other,
        },
    }
}

fn cancel_reject_reason(cause: RejectCause) -> CancelRejectReason {
    match cause {
        RejectCause::Core(RejectReason::UnknownOrder)
        | RejectCause::Gateway(GatewayReject::UnknownOrder) => CancelRejectReason::UnknownOrder,
        RejectCause::Core(RejectReason::DuplicateClOrdId)
        | RejectCause::Gateway(GatewayReject::DuplicateClOrdId) => {
            CancelRejectReason::DuplicateClOrdId
        }
        RejectCause::Gateway(GatewayReject::NotAuthorized) => CancelRejectReason::NotAuthorized,
        RejectCause::Core(
            RejectReason::InstrumentHalted
            | RejectReason::InstrumentClosed
            | RejectReason::InstrumentPaused,
        ) => CancelRejectReason::InstrumentNotTrading,
        RejectCause::Core(RejectReason::TradingSuspended) => CancelRejectReason::TradingSuspended,
        RejectCause::Core(RejectReason::OrderRefInvalid) => {
            CancelRejectReason::MissingOrderIdentifier
        }
        _ => CancelRejectReason::Other,
    }
}

fn cancel_reason(reason: CancelReason) -> BinCancelReason {
    match reason {
        CancelReason::Requested => BinCancelReason::Requested,
        CancelReason::MassCancel => BinCancelReason::MassCancel,
        CancelReason::SelfTradePrevention => BinCancelReason::SelfTradePrevention,
        CancelReason::ImmediateOrCancelRemainder => BinCancelReason::ImmediateOrCancelRemainder,
        CancelReason::FillOrKillUnfilled => BinCancelReason::FillOrKillNotFilled,
        CancelReason::MarketRemainder => BinCancelReason::MarketOrderNoLiquidity,
        // The order's validity (one auction) ran out: the schema's nearest reason.
        CancelReason::AuctionUnexecuted => BinCancelReason::Expired,
    }
}

/// The schema version that added `BusinessRejectReason::CoreNoQuorum`.
pub const CORE_NO_QUORUM_SINCE_VERSION: u16 = 4;

/// The BusinessReject reason of a request the gateway refused unprocessed, for a session that
/// established with schema `version`: a core without a quorum has its own reason since version
/// 4; an older client gets SystemUnavailable, the reason it already knows for "not processed,
/// retry", never a value its decoder would report as unknown.
pub fn refusal_reason(g: GatewayReject, version: u16) -> BinBizReason {
    match g {
        GatewayReject::CoreNoQuorum if version >= CORE_NO_QUORUM_SINCE_VERSION => {
            BinBizReason::CoreNoQuorum
        }
        _ => BinBizReason::SystemUnavailable,
    }
}

/// The schema version that added `MassCancelResult::CoreNoQuorum` and `SystemUnavailable`.
pub const MASS_CANCEL_REFUSALS_SINCE_VERSION: u16 = 5;

/// The MassCancelAck result for a mass cancel done (`None`) or refused, for a session that
/// established with schema `version`: a core without a quorum or an overloaded one has a
/// result of its own since version 5 (the request was not processed; retry); an older client
/// gets Other, a value its decoder knows.
pub fn mass_cancel_result(reject: Option<RejectCause>, version: u16) -> MassCancelResult {
    let refusals = version >= MASS_CANCEL_REFUSALS_SINCE_VERSION;
    match reject {
        None => MassCancelResult::Done,
        Some(RejectCause::Gateway(GatewayReject::NotAuthorized)) => MassCancelResult::NotAuthorized,
        Some(RejectCause::Core(RejectReason::UnknownAccount)) => MassCancelResult::UnknownAccount,
        Some(RejectCause::Core(RejectReason::UnknownInstrument)) => {
            MassCancelResult::UnknownInstrument
        }
        Some(RejectCause::Gateway(GatewayReject::UnsupportedScope)) => {
            MassCancelResult::UnsupportedScope
        }
        Some(RejectCause::Gateway(GatewayReject::CoreNoQuorum)) if refusals => {
            MassCancelResult::CoreNoQuorum
        }
        Some(RejectCause::Gateway(GatewayReject::SystemBusy | GatewayReject::CoreUnavailable))
            if refusals =>
        {
            MassCancelResult::SystemUnavailable
        }
        Some(_) => MassCancelResult::Other,
    }
}

/// Encodes a report as one frame into `buf`, for a session that established with schema
/// `version` (some reasons depend on it, see [`refusal_reason`]); returns its length. Never
/// fails for the fixed-size messages of the schema (the buffer is the protocol's frame limit).
pub fn render(
    router: &Router,
    report: &Report,
    version: u16,
    buf: &mut [u8; FRAME_BYTES_MAX],
) -> usize {
    let result = match report {
        Report::Exec(r) => {
            let lot = router.instrument(r.instrument).map_or(1, |i| i.lot_size);
            let units = |lots: i64| lots.saturating_mul(lot);
            let order_id = r.order_id.map_or(0, |o| o.0);
            let cl = r.client.num();
            match &r.kind {
                // The binary protocol has no status request (see
                // docs/protocol-binary-order-entry.md), so no status report is ever owed to a
                // binary session.
                ExecKind::Status(_) => return 0,
                ExecKind::New => encode_frame(buf, |mut e: NewOrderAckEncoder| {
                    e.cl_ord_id(cl).order_id(order_id).transact_time_ns(r.ts_ns);
                    e.leaves_qty(units(r.leaves_lots))
                        .account(r.account.0)
                        .instrument_id(r.instrument.0);
                    e
                }),
                ExecKind::Rejected(RejectCause::Gateway(
                    g @ (GatewayReject::SystemBusy | GatewayReject::CoreNoQuorum),
                )) => refusal(
                    buf,
                    cl,
                    NEW_ORDER_TEMPLATE_ID,
                    r.ts_ns,
                    refusal_reason(*g, version),
                ),
                ExecKind::Rejected(cause) => encode_frame(buf, |mut e: OrderRejectEncoder| {
                    e.cl_ord_id(cl)
                        .transact_time_ns(r.ts_ns)
                        .reason(order_reject_reason(*cause));
                    e
                }),
                ExecKind::Trade {
                    trade_id,
                    last_px,
                    last_lots,
                    aggressor,
                } => encode_frame(buf, |mut e: ExecutionReportEncoder| {
                    e.cl_ord_id(cl)
                        .order_id(order_id)
                        .trade_id(trade_id.0)
                        .transact_time_ns(r.ts_ns);
                    e.last_px(last_px.0)
                        .last_qty(units(*last_lots))
                        .leaves_qty(units(r.leaves_lots));
                    e.cum_qty(units(r.cum_lots))
                        .account(r.account.0)
                        .instrument_id(r.instrument.0);
                    e.side(bin_side(r.side));
                    e.aggressor(if *aggressor {
                        AggressorFlag::Aggressor
                    } else {
                        AggressorFlag::Passive
                    });
                    e
                }),
                ExecKind::Canceled {
                    by,
                    reason,
                    qty_lots,
                } => encode_frame(buf, |mut e: CancelAckEncoder| {
                    e.cl_ord_id_opt(by.as_ref().map(|b| b.num()))
                        .orig_cl_ord_id(cl)
                        .order_id(order_id);
                    e.transact_time_ns(r.ts_ns)
                        .canceled_qty(units(*qty_lots))
                        .account(r.account.0);
                    e.instrument_id(r.instrument.0)
                        .reason(cancel_reason(*reason));
                    e
                }),
                ExecKind::Expired => encode_frame(buf, |mut e: CancelAckEncoder| {
                    e.cl_ord_id_opt(None).orig_cl_ord_id(cl).order_id(order_id);
                    e.transact_time_ns(r.ts_ns)
                        .canceled_qty(units(r.qty_lots - r.cum_lots))
                        .account(r.account.0);
                    e.instrument_id(r.instrument.0)
                        .reason(BinCancelReason::Expired);
                    e
                }),
                ExecKind::Replaced { orig } => encode_frame(buf, |mut e: ReplaceAckEncoder| {
                    e.cl_ord_id(cl)
                        .orig_cl_ord_id(orig.num())
                        .order_id(order_id)
                        .transact_time_ns(r.ts_ns);
                    e.price(r.price.0)
                        .qty(units(r.qty_lots))
                        .leaves_qty(units(r.leaves_lots));
                    e.account(r.account.0).instrument_id(r.instrument.0);
                    e
                }),
            }
        }
        Report::CancelReject {
            client,
            to,
            cause:
                RejectCause::Gateway(g @ (GatewayReject::SystemBusy | GatewayReject::CoreNoQuorum)),
            ts_ns,
            ..
        } => {
            let template = match to {
                CancelRejectTo::Cancel => CANCEL_ORDER_TEMPLATE_ID,
                CancelRejectTo::Replace => REPLACE_ORDER_TEMPLATE_ID,
            };
            refusal(
                buf,
                client.num(),
                template,
                *ts_ns,
                refusal_reason(*g, version),
            )
        }
        Report::CancelReject {
            client,
            order_id,
            to,
            cause,
            ts_ns,
            ..
        } => match to {
            CancelRejectTo::Cancel => encode_frame(buf, |mut e: CancelRejectEncoder| {
                e.cl_ord_id(client.num())
                    .order_id_opt(order_id.map(|o| o.0))
                    .transact_time_ns(*ts_ns);
                e.reason(cancel_reject_reason(*cause));
                e
            }),
            CancelRejectTo::Replace => encode_frame(buf, |mut e: ReplaceRejectEncoder| {
                e.cl_ord_id(client.num())
                    .order_id_opt(order_id.map(|o| o.0))
                    .transact_time_ns(*ts_ns);
                e.reason(order_reject_reason(*cause));
                e
            }),
        },
        Report::MassCancel {
            client,
            total,
            reject,
            ts_ns,
            ..
        } => encode_frame(buf, |mut e: MassCancelAckEncoder| {
            let result = mass_cancel_result(*reject, version);
            e.cl_ord_id(client.num()).transact_time_ns(*ts_ns);
            e.canceled_count(u32::try_from(*total).unwrap_or(u32::MAX))
                .result(result);
            e
        }),
        Report::StatusUnknown { .. } => return 0,
        Report::BusinessReject {
            ref_id,
            ref_template_id,
            throttled_retry_ms,
            text,
            ts_ns,
            ..
        } => {
            let reason = if throttled_retry_ms.is_some() {
                BinBizReason::Throttled
            } else if text == GatewayReject::CoreNoQuorum.text() {
                refusal_reason(GatewayReject::CoreNoQuorum, version)
            } else if text.starts_with("system busy") || text.starts_with("trading core") {
                BinBizReason::SystemUnavailable
            } else if text.starts_with("unsupported") {
                BinBizReason::UnsupportedMessage
            } else {
                BinBizReason::InvalidField
            };
            encode_frame(buf, |mut e: BusinessRejectEncoder| {
                e.ref_cl_ord_id_opt(ref_id.as_ref().map(|c| c.num()))
                    .transact_time_ns(*ts_ns);
                e.retry_after_ms(throttled_retry_ms.unwrap_or(0))
                    .ref_template_id(*ref_template_id);
                e.reason(reason);
                e
            })
        }
    };
    result.unwrap_or(0)
}

/// A request the gateway refused without processing it, because its core is overloaded (the
/// core's queue or its in-flight bound is full, or the order table is: SystemUnavailable) or
/// has no quorum (CoreNoQuorum): the protocol's BusinessReject naming the request's client
/// order id and template (docs/protocol-binary-order-entry.md, 6.7), rather than an
/// OrderReject or CancelReject whose reasons all describe the order itself.
fn refusal(
    buf: &mut [u8; FRAME_BYTES_MAX],
    cl_ord_id: u64,
    ref_template_id: u16,
    ts_ns: u64,
    reason: BinBizReason,
) -> Result<usize, bourse_wire::Error> {
    encode_frame(buf, |mut e: BusinessRejectEncoder| {
        e.ref_cl_ord_id_opt(Some(cl_ord_id)).transact_time_ns(ts_ns);
        e.retry_after_ms(0).ref_template_id(ref_template_id);
        e.reason(reason);
        e
    })
}

const NEW_ORDER_TEMPLATE_ID: u16 =
    bourse_wire::order_entry::codec::new_order_codec::SBE_TEMPLATE_ID;
const CANCEL_ORDER_TEMPLATE_ID: u16 =
    bourse_wire::order_entry::codec::cancel_order_codec::SBE_TEMPLATE_ID;
const REPLACE_ORDER_TEMPLATE_ID: u16 =
    bourse_wire::order_entry::codec::replace_order_codec::SBE_TEMPLATE_ID;

/// What a binary client request becomes once decoded: a request for the router, or the
/// reject a malformed one gets at once.
#[derive(Debug)]
pub enum Parsed {
    Request(Request),
    /// A new order refused before routing, with its fields as far as they could be read.
    RejectNew(NewOrderRequest, GatewayReject),
    /// Another request refused before routing.
    Reject(Report),
}

fn side_of(side: BinSide) -> Option<Side> {
    match side {
        BinSide::Buy => Some(Side::Buy),
        BinSide::Sell => Some(Side::Sell),
        _ => None,
    }
}

/// Decodes an order-entry request (new order, cancel, replace, mass cancel) into a
/// [`Request`], reading quantities in the instrument's lots; `None` for any other message.
pub fn parse_request(router: &Router, message: &Message<'_>, ts_ns: u64) -> Option<Parsed> {
    Some(match message {
        Message::NewOrder(m) => parse_new_order(router, m),
        Message::CancelOrder(m) => Parsed::Request(Request::Cancel {
            client: ClientId::Num(m.cl_ord_id()),
            orig: ClientId::Num(m.orig_cl_ord_id().unwrap_or(u64::MAX)),
            order_id: m.order_id().map(OrderId),
        }),
        Message::ReplaceOrder(m) => {
            let orig = ClientId::Num(m.orig_cl_ord_id().unwrap_or(u64::MAX));
            let lots = router
                .instrument(InstrumentId(m.instrument_id()))
                .and_then(|i| i.lots(m.qty()));
            let client = ClientId::Num(m.cl_ord_id());
            match lots {
                Some(lots) => Parsed::Request(Request::Replace {
                    client,
                    orig,
                    order_id: m.order_id().map(OrderId),
                    price: Some(Price(m.price())),
                    qty_lots: Some(lots),
                }),
                None => Parsed::Reject(Report::CancelReject {
                    client,
                    orig,
                    order_id: m.order_id().map(OrderId),
                    to: CancelRejectTo::Replace,
                    cause: RejectCause::Gateway(GatewayReject::InvalidQty),
                    ts_ns,
                }),
            }
        }
        Message::MassCancel(m) => {
            let Some(scope) = mass_cancel_scope(m) else {
                return Some(Parsed::Reject(Report::MassCancel {
                    client: ClientId::Num(m.cl_ord_id()),
                    request_type: b'7',
                    total: 0,
                    reject: Some(RejectCause::Gateway(GatewayReject::UnsupportedScope)),
                    ts_ns,
                }));
            };
            Parsed::Request(Request::MassCancel {
                client: ClientId::Num(m.cl_ord_id()),
                request_type: b'7',
                scope,
                account: m.account().map(AccountId),
                instrument: m.instrument_id().map(InstrumentId),
                side: side_of(m.side()),
            })
        }
        _ => return None,
    })
}

/// A MassCancel's scope: versions 1 and 2 have none (the session's own orders, the default of
/// both protocols); in version 3 a value outside the enum is refused (None).
fn mass_cancel_scope(m: &MassCancelDecoder<'_>) -> Option<MassCancelScope> {
    if m.acting_version < 3 {
        return Some(MassCancelScope::Session);
    }
    match m.scope() {
        WireScope::Session => Some(MassCancelScope::Session),
        WireScope::Account => Some(MassCancelScope::Account),
        WireScope::Firm => Some(MassCancelScope::Firm),
        WireScope::NullVal => None,
    }
}

fn parse_new_order(router: &Router, m: &NewOrderDecoder<'_>) -> Parsed {
    let instrument = InstrumentId(m.instrument_id());
    let info = router.instrument(instrument);
    let side = side_of(m.side());
    let ord_type = match m.ord_type() {
        BinOrdType::Limit => Some(OrdType::Limit),
        BinOrdType::Market => Some(OrdType::Market),
        _ => None,
    };
    let tif = match m.time_in_force() {
        BinTif::Day => Some(TimeInForce::Day),
        BinTif::GoodTillCancel => Some(TimeInForce::Gtc),
        BinTif::ImmediateOrCancel => Some(TimeInForce::Ioc),
        BinTif::FillOrKill => Some(TimeInForce::Fok),
        BinTif::GoodTillDate => Some(TimeInForce::Gtd),
        BinTif::AtTheOpening => Some(TimeInForce::AtOpening),
        BinTif::AtTheClose => Some(TimeInForce::AtClose),
        BinTif::GoodForAuction => Some(TimeInForce::GoodForAuction),
        _ => None,
    };
    let mut req = NewOrderRequest {
        client: ClientId::Num(m.cl_ord_id()),
        account: Some(AccountId(m.account())),
        instrument,
        side: side.unwrap_or(Side::Buy),
        ord_type: ord_type.unwrap_or(OrdType::Limit),
        price: Price(m.price().unwrap_or(0)),
        qty_lots: 0,
        tif: tif.unwrap_or(TimeInForce::Day),
        expire_ts_ns: m.expire_time_ns().unwrap_or(0),
        display_lots: 0,
    };
    let cause = if info.is_none() {
        Some(GatewayReject::UnknownSymbol)
    } else if side.is_none() || ord_type.is_none() || tif.is_none() {
        Some(GatewayReject::UnsupportedValue)
    } else {
        None
    };
    if let Some(info) = info {
        req.qty_lots = info.lots(m.qty()).unwrap_or(0);
        if let Some(d) = m.display_qty() {
            req.display_lots = info.lots(d).unwrap_or(-1);
        }
    }
    let cause = cause.or(if req.qty_lots <= 0 || req.display_lots < 0 {
        Some(GatewayReject::InvalidQty)
    } else if req.ord_type == OrdType::Limit && m.price().is_none() {
        Some(GatewayReject::InvalidPrice)
    } else {
        None
    });
    match cause {
        Some(g) => Parsed::RejectNew(req, g),
        None => Parsed::Request(Request::New(req)),
    }
}
