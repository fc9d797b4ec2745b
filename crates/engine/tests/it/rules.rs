//! The engine's rules that `docs/engine-jsonl.md` ("Rules in detail") writes down, one test
//! each: a replace that keeps its price is not checked against a band that moved since; when
//! several reasons apply, the first check in the documented order decides; `display_qty: 0`
//! means "no iceberg" on every kind of order, while any other display size on a market, IOC
//! or FOK order is refused.

use bourse_core::*;
use bourse_engine::fixtures::{accepted_id, equity, Driver};
use bourse_engine::EngineConfig;

const SBER: u32 = 1;
const REF: i64 = 10_000; // 100.00, band ±20%: 80.00..=120.00

fn driver() -> Driver {
    let mut d = Driver::new(EngineConfig {
        orders_max: 1024,
        instruments_max: 4,
        accounts_max: 16,
        levels_per_side_hint: 8,
        first_order_id: 1,
    });
    d.add_instrument(equity(SBER, "SBER", REF));
    d.add_account(1, 1, 1_000_000_000_0000);
    // The seller of the trades that move the band sells short.
    d.add_account_spec(
        AccountSpec {
            account: AccountId(2),
            firm: FirmId(2),
            may_short: true,
            stp: StpMode::None,
            stp_scope: StpScope::Account,
        },
        1_000_000_000_0000,
    );
    d.add_account(3, 3, 1_000_000_000_0000);
    d
}

fn reject_reason(events: &[Event]) -> Option<RejectReason> {
    events.iter().find_map(|e| match e {
        Event::OrderRejected { reason, .. } | Event::CancelRejected { reason, .. } => Some(*reason),
        _ => None,
    })
}

fn replace(
    account: u32,
    cl_ord_id: u64,
    order_id: OrderId,
    price: Option<i64>,
    qty: i64,
) -> CommandBody {
    CommandBody::Replace(Replace {
        account: AccountId(account),
        cl_ord_id: ClOrdId(cl_ord_id),
        target: OrderRef {
            order_id: Some(order_id),
            orig_cl_ord_id: None,
        },
        price: price.map(Price),
        qty: Some(Qty(qty)),
    })
}

#[test]
fn a_replace_that_keeps_its_price_is_not_checked_against_a_band_that_moved() {
    let mut d = driver();
    // A bid at the band's low edge, 80.00.
    let bid = accepted_id(&d.limit(1, 1, SBER, Side::Buy, 8_000, 5)).expect("accepted");
    // Trades at 110.00 and then 120.00 move the reference, and the band to 96.00..=144.00.
    for (k, price) in [(0u64, 11_000), (2, 12_000)] {
        d.limit(2, 10 + k, SBER, Side::Sell, price, 1);
        let events = d.limit(3, 11 + k, SBER, Side::Buy, price, 1);
        assert!(
            events.iter().any(|e| matches!(e, Event::Trade { .. })),
            "{events:?}"
        );
    }
    // A new order at the old price is outside the band now.
    let events = d.limit(1, 2, SBER, Side::Buy, 8_000, 5);
    assert_eq!(reject_reason(&events), Some(RejectReason::PriceOutsideBand));
    // The resting bid may still change its quantity, with or without naming its price.
    let events = d.run(replace(1, 3, bid, None, 7)).to_vec();
    assert_eq!(reject_reason(&events), None, "{events:?}");
    let events = d.run(replace(1, 4, bid, Some(8_000), 6)).to_vec();
    assert_eq!(reject_reason(&events), None, "{events:?}");
    // A new price is checked.
    let events = d.run(replace(1, 5, bid, Some(8_100), 6)).to_vec();
    assert_eq!(reject_reason(&events), Some(RejectReason::PriceOutsideBand));
}

#[test]
fn the_first_check_in_the_documented_order_decides_the_reason() {
    let mut d = driver();
    let bad = |instrument: u32, account: u32, price: i64, qty: i64, display: i64| NewOrder {
        firm: None,
        account: AccountId(account),
        cl_ord_id: ClOrdId(99),
        instrument: InstrumentId(instrument),
        side: Side::Buy,
        ord_type: OrdType::Limit,
        price: Price(price),
        qty: Qty(qty),
        tif: TimeInForce::Day,
        expire_ts_ns: 0,
        display_qty: Qty(display),
    };
    // Everything wrong at once: instrument first.
    let events = d.order(bad(9, 9, 0, 0, -1));
    assert_eq!(
        reject_reason(&events),
        Some(RejectReason::UnknownInstrument)
    );
    // Then the account.
    let events = d.order(bad(SBER, 9, 0, 0, -1));
    assert_eq!(reject_reason(&events), Some(RejectReason::UnknownAccount));
    // Then the quantity, before the price.
    let events = d.order(bad(SBER, 1, 0, 0, -1));
    assert_eq!(reject_reason(&events), Some(RejectReason::QtyNotPositive));
    // Then the price, before the display size.
    let events = d.order(bad(SBER, 1, 0, 10, -1));
    assert_eq!(reject_reason(&events), Some(RejectReason::PriceNotPositive));
    let events = d.order(bad(SBER, 1, 10_000, 10, -1));
    assert_eq!(
        reject_reason(&events),
        Some(RejectReason::DisplayQtyInvalid)
    );
    // A halted instrument refuses before looking at the order itself.
    d.run(CommandBody::SetPhase {
        instrument: Some(InstrumentId(SBER)),
        phase: Phase::Halted,
    });
    let events = d.order(bad(SBER, 1, 0, 0, -1));
    assert_eq!(reject_reason(&events), Some(RejectReason::InstrumentHalted));
}

#[test]
fn display_qty_zero_means_no_iceberg_on_every_order_and_any_other_is_refused_where_it_cannot_rest()
{
    for tif in [TimeInForce::Day, TimeInForce::Ioc, TimeInForce::Fok] {
        for (ord_type, price) in [(OrdType::Limit, REF), (OrdType::Market, 0)] {
            let mut d = driver();
            let order = |display: i64| NewOrder {
                firm: None,
                account: AccountId(1),
                cl_ord_id: ClOrdId(1 + display as u64),
                instrument: InstrumentId(SBER),
                side: Side::Buy,
                ord_type,
                price: Price(price),
                qty: Qty(10),
                tif,
                expire_ts_ns: 0,
                display_qty: Qty(display),
            };
            let events = d.order(order(0));
            assert!(
                events
                    .iter()
                    .any(|e| matches!(e, Event::OrderAccepted { .. })),
                "{tif:?} {ord_type:?} display 0: {events:?}"
            );
            let events = d.order(order(5));
            let can_rest = tif == TimeInForce::Day && ord_type == OrdType::Limit;
            assert_eq!(
                reject_reason(&events),
                (!can_rest).then_some(RejectReason::DisplayQtyInvalid),
                "{tif:?} {ord_type:?} display 5: {events:?}"
            );
        }
    }
}
