//! The binary (SBE) front end: requests decoded into router calls, reports encoded as
//! sequenced server responses (docs/protocol-binary-order-entry.md).

use crate::router::{ExecKind, GatewayReject, RejectCause, Report, Router};
use bourse_core::*;
use bourse_wire::frame::encode_frame;
use bourse_wire::order_entry::codec::{
    aggressor_flag::AggressorFlag, business_reject_codec::BusinessRejectEncoder,
    business_reject_reason::BusinessRejectReason as BinBizReason,
    cancel_ack_codec::CancelAckEncoder, cancel_reason::CancelReason as BinCancelReason,
    cancel_reject_codec::CancelRejectEncoder, cancel_reject_reason::CancelRejectReason,
    execution_report_codec::ExecutionReportEncoder, mass_cancel_ack_codec::MassCancelAckEncoder,
    mass_cancel_result::MassCancelResult, new_order_ack_codec::NewOrderAckEncoder,
    order_reject_codec::OrderRejectEncoder, order_reject_reason::OrderRejectReason,
    replace_ack_codec::ReplaceAckEncoder, replace_reject_codec::ReplaceRejectEncoder,
    side::Side as BinSide,
};
use bourse_wire::order_entry::FRAME_BYTES_MAX;

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
            InvalidTimeInForce => OrderRejectReason::InvalidTimeInForce,
            ExpireTimeMissing | ExpireTimeInPast | ExpireTimeUnexpected => {
                OrderRejectReason::InvalidExpireTime
            }
            DisplayQtyInvalid => OrderRejectReason::InvalidDisplayQty,
            InstrumentHalted | InstrumentClosed => OrderRejectReason::InstrumentNotTrading,
            InsufficientCollateral | InsufficientPosition => {
                OrderRejectReason::InsufficientCollateral
            }
            CapacityExceeded => OrderRejectReason::TooManyOpenOrders,
            ReplaceQtyNotAboveFilled => OrderRejectReason::TooLateToReplace,
            _ => OrderRejectReason::Other,
        },
        RejectCause::Gateway(g) => match g {
            GatewayReject::NotAuthorized => OrderRejectReason::NotAuthorized,
            GatewayReject::UnknownSymbol => OrderRejectReason::UnknownInstrument,
            GatewayReject::InvalidPrice => OrderRejectReason::InvalidPrice,
            GatewayReject::InvalidQty => OrderRejectReason::QtyNotMultipleOfLot,
            GatewayReject::DuplicateClOrdId => OrderRejectReason::DuplicateClOrdId,
            GatewayReject::UnknownOrder => OrderRejectReason::UnknownOrder,
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
        RejectCause::Core(RejectReason::InstrumentHalted | RejectReason::InstrumentClosed) => {
            CancelRejectReason::InstrumentNotTrading
        }
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
    }
}

/// Encodes a report as one frame into `buf`; returns its length. Never fails for the
/// fixed-size messages of version 1 (the buffer is the protocol's frame limit).
pub fn render(router: &Router, report: &Report, buf: &mut [u8; FRAME_BYTES_MAX]) -> usize {
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
            let result = match reject {
                None => MassCancelResult::Done,
                Some(RejectCause::Gateway(GatewayReject::NotAuthorized)) => {
                    MassCancelResult::NotAuthorized
                }
                Some(RejectCause::Core(RejectReason::UnknownAccount)) => {
                    MassCancelResult::UnknownAccount
                }
                Some(RejectCause::Core(RejectReason::UnknownInstrument)) => {
                    MassCancelResult::UnknownInstrument
                }
                Some(_) => MassCancelResult::Other,
            };
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
