//! The worked examples of `docs/engine-jsonl.md`, "Call auctions": one test per example,
//! named for the behaviour it shows. The instrument is the fixture equity EQA (id 1): tick 1,
//! reference 10000, band ±20%; accounts 1 to 4 have ample cash and may go short.

use bourse_core::*;
use bourse_engine::fixtures::{self, accepted_id, reject_reason, Driver};
use bourse_engine::{Engine, EngineConfig};

fn config() -> EngineConfig {
    EngineConfig {
        orders_max: 1 << 12,
        instruments_max: 4,
        accounts_max: 16,
        levels_per_side_hint: 16,
        first_order_id: 1,
    }
}

fn market_with(guard: VolatilityGuard) -> Driver {
    let mut d = Driver::new(config());
    let mut def = fixtures::equity(1, "EQA", 10_000);
    def.volatility = guard;
    d.add_instrument(def);
    for account in 1..=4 {
        d.add_account_spec(
            AccountSpec {
                account: AccountId(account),
                firm: FirmId(account),
                may_short: true,
                stp: StpMode::CancelBoth,
                stp_scope: StpScope::Account,
            },
            1_000_000_000_000_000,
        );
    }
    d
}

fn market() -> Driver {
    market_with(VolatilityGuard::default())
}

fn phase(d: &mut Driver, phase: Phase) -> Vec<Event> {
    d.run(CommandBody::SetPhase {
        instrument: Some(InstrumentId(1)),
        phase,
    })
    .to_vec()
}

fn new_order(
    account: u32,
    side: Side,
    ord_type: OrdType,
    price: i64,
    qty: i64,
    tif: TimeInForce,
) -> NewOrder {
    static NEXT_CL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NewOrder {
        firm: None,
        account: AccountId(account),
        cl_ord_id: ClOrdId(NEXT_CL.fetch_add(1, std::sync::atomic::Ordering::Relaxed)),
        instrument: InstrumentId(1),
        side,
        ord_type,
        price: Price(price),
        qty: Qty(qty),
        tif,
        expire_ts_ns: 0,
        display_qty: Qty(0),
    }
}

/// A Day limit order that must be accepted; its id.
fn limit(d: &mut Driver, account: u32, side: Side, price: i64, qty: i64) -> u64 {
    let ev = d.order(new_order(
        account,
        side,
        OrdType::Limit,
        price,
        qty,
        TimeInForce::Day,
    ));
    accepted_id(&ev)
        .unwrap_or_else(|| panic!("refused: {ev:?}"))
        .0
}

/// A Day market order that must be accepted; its id.
fn market_order(d: &mut Driver, account: u32, side: Side, qty: i64) -> u64 {
    let ev = d.order(new_order(
        account,
        side,
        OrdType::Market,
        0,
        qty,
        TimeInForce::Day,
    ));
    accepted_id(&ev)
        .unwrap_or_else(|| panic!("refused: {ev:?}"))
        .0
}

/// The trades among `events` as (price, qty, buy order, sell order, auction).
fn trades(events: &[Event]) -> Vec<(i64, i64, u64, u64, bool)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Trade {
                price,
                qty,
                buy,
                sell,
                auction,
                ..
            } => Some((price.0, qty.0, buy.order_id.0, sell.order_id.0, *auction)),
            _ => None,
        })
        .collect()
}

/// The `AuctionUncrossed` event among `events` as (auction, price, qty).
fn uncrossed(events: &[Event]) -> (Phase, i64, i64) {
    events
        .iter()
        .find_map(|e| match e {
            Event::AuctionUncrossed {
                auction,
                price,
                qty,
                ..
            } => Some((*auction, price.0, qty.0)),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no uncrossing in {events:?}"))
}

/// The indicative events among `events` as (price, qty, surplus, side).
fn indicative(events: &[Event]) -> Vec<(i64, i64, i64, Option<Side>)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::AuctionIndicative {
                price,
                qty,
                surplus,
                surplus_side,
                ..
            } => Some((price.0, qty.0, surplus.0, *surplus_side)),
            _ => None,
        })
        .collect()
}

fn cancels(events: &[Event]) -> Vec<(u64, i64, CancelReason)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::OrderCancelled {
                order_id,
                qty_cancelled,
                reason,
                ..
            } => Some((order_id.0, qty_cancelled.0, *reason)),
            _ => None,
        })
        .collect()
}

fn check(d: &Driver) {
    d.engine.check_invariants().unwrap();
    assert_eq!(
        d.engine.state_digest(),
        d.engine.recompute_state_digest(),
        "the digest follows the auction state"
    );
    let restored = Engine::restore(&d.engine.snapshot()).unwrap();
    assert_eq!(restored.snapshot(), d.engine.snapshot());
    assert_eq!(restored.state_digest(), d.engine.state_digest());
}

// ----- orders in a call -----

#[test]
fn orders_rest_without_matching_during_a_call() {
    let mut d = market();
    phase(&mut d, Phase::OpeningAuction);
    let buy = limit(&mut d, 1, Side::Buy, 10_010, 100);
    let ev = d
        .order(new_order(
            2,
            Side::Sell,
            OrdType::Limit,
            9_990,
            100,
            TimeInForce::Day,
        ))
        .to_vec();
    assert!(trades(&ev).is_empty(), "{ev:?}");
    // The book is crossed and says at what price it would uncross.
    assert_eq!(indicative(&ev), vec![(10_000, 100, 0, None)]);
    assert_eq!(d.engine.order(OrderId(buy)).unwrap().qty_leaves, Qty(100));
    check(&d);
}

#[test]
fn the_indicative_price_is_published_only_when_it_changes() {
    let mut d = market();
    phase(&mut d, Phase::OpeningAuction);
    // No cross: nothing to publish (the call starts with no cross).
    let ev = d.limit(1, 1, 1, Side::Buy, 10_010, 100);
    assert!(indicative(&ev).is_empty(), "{ev:?}");
    // A cross: published.
    let ev = d.limit(2, 2, 1, Side::Sell, 10_010, 40);
    assert_eq!(indicative(&ev), vec![(10_010, 40, 60, Some(Side::Buy))]);
    // A bid far below changes nothing at the uncrossing price: not published.
    let ev = d.limit(3, 3, 1, Side::Buy, 9_000, 10);
    assert!(indicative(&ev).is_empty(), "{ev:?}");
    // Cancelling the ask removes the cross: "no cross" is published.
    let ev = d
        .run(CommandBody::Cancel(Cancel {
            account: AccountId(2),
            cl_ord_id: ClOrdId(9),
            target: OrderRef {
                order_id: None,
                orig_cl_ord_id: Some(ClOrdId(2)),
            },
        }))
        .to_vec();
    assert_eq!(indicative(&ev), vec![(0, 0, 0, None)]);
    check(&d);
}

#[test]
fn immediate_orders_and_other_auctions_times_in_force_are_refused() {
    let mut d = market();
    // At the opening, outside the opening auction.
    let ev = d.order(new_order(
        1,
        Side::Buy,
        OrdType::Limit,
        10_000,
        1,
        TimeInForce::AtOpening,
    ));
    assert_eq!(
        reject_reason(&ev),
        Some(RejectReason::TimeInForceNotInPhase)
    );
    phase(&mut d, Phase::OpeningAuction);
    for tif in [TimeInForce::Ioc, TimeInForce::Fok, TimeInForce::AtClose] {
        let ev = d.order(new_order(1, Side::Buy, OrdType::Limit, 10_000, 1, tif));
        assert_eq!(
            reject_reason(&ev),
            Some(RejectReason::TimeInForceNotInPhase),
            "{tif:?}"
        );
    }
    for tif in [TimeInForce::AtOpening, TimeInForce::GoodForAuction] {
        let ev = d.order(new_order(1, Side::Buy, OrdType::Limit, 10_000, 1, tif));
        assert!(accepted_id(&ev).is_some(), "{tif:?}: {ev:?}");
    }
    check(&d);
}

// ----- the price rule -----

#[test]
fn the_price_executes_the_largest_quantity() {
    let mut d = market();
    phase(&mut d, Phase::OpeningAuction);
    let a = limit(&mut d, 1, Side::Buy, 10_020, 300);
    let b = limit(&mut d, 2, Side::Buy, 10_010, 200);
    let c = limit(&mut d, 3, Side::Sell, 9_990, 100);
    let e = limit(&mut d, 4, Side::Sell, 10_010, 300);
    let ev = phase(&mut d, Phase::Open);
    // 9990: 100, 10000: 100, 10010: 400, 10020: 300 executable.
    assert_eq!(uncrossed(&ev), (Phase::OpeningAuction, 10_010, 400));
    assert_eq!(
        trades(&ev),
        vec![
            (10_010, 100, a, c, true),
            (10_010, 200, a, e, true),
            (10_010, 100, b, e, true),
        ]
    );
    // B's other 100 stays in the continuous book, which is no longer crossed.
    assert_eq!(d.engine.order(OrderId(b)).unwrap().qty_leaves, Qty(100));
    assert_eq!(d.engine.phase(InstrumentId(1)), Some(Phase::Open));
    assert_eq!(
        d.engine
            .instrument(InstrumentId(1))
            .unwrap()
            .reference_price,
        Price(10_010)
    );
    check(&d);
}

#[test]
fn of_equal_quantities_the_least_surplus_wins() {
    let mut d = market();
    phase(&mut d, Phase::OpeningAuction);
    limit(&mut d, 1, Side::Buy, 10_010, 300);
    limit(&mut d, 1, Side::Buy, 10_000, 100);
    limit(&mut d, 2, Side::Sell, 9_990, 300);
    // 300 everywhere; surplus 100 at 9990 and 10000, none at 10010.
    let ev = phase(&mut d, Phase::Open);
    assert_eq!(uncrossed(&ev), (Phase::OpeningAuction, 10_010, 300));
    check(&d);
}

#[test]
fn a_surplus_of_buys_at_every_tied_price_takes_the_highest() {
    let mut d = market();
    phase(&mut d, Phase::OpeningAuction);
    limit(&mut d, 1, Side::Buy, 10_010, 300);
    limit(&mut d, 2, Side::Sell, 9_990, 100);
    limit(&mut d, 2, Side::Sell, 10_000, 100);
    // 200 at 10000 and 10010, each leaving 100 buys.
    assert_eq!(
        d.engine.indicative_uncross(InstrumentId(1)),
        Some((Price(10_010), Qty(200), 100))
    );
    let ev = phase(&mut d, Phase::Open);
    assert_eq!(uncrossed(&ev), (Phase::OpeningAuction, 10_010, 200));
    check(&d);
}

#[test]
fn a_surplus_of_sells_at_every_tied_price_takes_the_lowest() {
    let mut d = market();
    phase(&mut d, Phase::OpeningAuction);
    limit(&mut d, 1, Side::Sell, 9_990, 300);
    limit(&mut d, 2, Side::Buy, 10_010, 100);
    limit(&mut d, 2, Side::Buy, 10_000, 100);
    // 200 at 9990 and 10000, each leaving 100 sells.
    let ev = phase(&mut d, Phase::Open);
    assert_eq!(uncrossed(&ev), (Phase::OpeningAuction, 9_990, 200));
    check(&d);
}

#[test]
fn with_no_surplus_the_price_nearest_the_reference_wins() {
    let mut d = market();
    phase(&mut d, Phase::OpeningAuction);
    limit(&mut d, 1, Side::Buy, 10_010, 200);
    limit(&mut d, 2, Side::Sell, 9_990, 100);
    limit(&mut d, 2, Side::Sell, 9_995, 100);
    // 200 and no surplus at 9995, 10000 (the reference) and 10010.
    let ev = phase(&mut d, Phase::Open);
    assert_eq!(uncrossed(&ev), (Phase::OpeningAuction, 10_000, 200));
    check(&d);
}

#[test]
fn the_nearest_price_is_the_nearest_to_the_last_trade() {
    let mut d = market();
    // A trade at 10004 makes it the reference.
    limit(&mut d, 1, Side::Sell, 10_004, 1);
    limit(&mut d, 2, Side::Buy, 10_004, 1);
    phase(&mut d, Phase::OpeningAuction);
    limit(&mut d, 1, Side::Buy, 10_010, 100);
    limit(&mut d, 2, Side::Sell, 10_000, 100);
    // 100 and no surplus at 10000, 10004 and 10010: 10004 is the reference.
    let ev = phase(&mut d, Phase::Open);
    assert_eq!(uncrossed(&ev), (Phase::OpeningAuction, 10_004, 100));
    check(&d);
}

// ----- market orders and icebergs -----

#[test]
fn market_orders_alone_uncross_at_the_reference_price() {
    let mut d = market();
    phase(&mut d, Phase::OpeningAuction);
    let buy = market_order(&mut d, 1, Side::Buy, 150);
    let sell = market_order(&mut d, 2, Side::Sell, 100);
    let ev = phase(&mut d, Phase::Open);
    assert_eq!(uncrossed(&ev), (Phase::OpeningAuction, 10_000, 100));
    assert_eq!(trades(&ev), vec![(10_000, 100, buy, sell, true)]);
    // What a market order does not execute is cancelled.
    assert_eq!(cancels(&ev), vec![(buy, 50, CancelReason::MarketRemainder)]);
    check(&d);
}

#[test]
fn a_market_order_takes_part_at_any_price_in_the_band() {
    let mut d = market();
    phase(&mut d, Phase::OpeningAuction);
    let buy = market_order(&mut d, 1, Side::Buy, 100);
    let s1 = limit(&mut d, 2, Side::Sell, 10_010, 60);
    let s2 = limit(&mut d, 3, Side::Sell, 10_020, 60);
    // 60 at 10010, 100 at 10020 (the market order's band edge, 12000, is no candidate).
    let ev = phase(&mut d, Phase::Open);
    assert_eq!(uncrossed(&ev), (Phase::OpeningAuction, 10_020, 100));
    assert_eq!(
        trades(&ev),
        vec![(10_020, 60, buy, s1, true), (10_020, 40, buy, s2, true)]
    );
    check(&d);
}

#[test]
fn an_iceberg_takes_part_with_its_whole_quantity() {
    let mut d = market();
    phase(&mut d, Phase::OpeningAuction);
    let mut iceberg = new_order(1, Side::Sell, OrdType::Limit, 10_000, 100, TimeInForce::Day);
    iceberg.display_qty = Qty(10);
    let sell = accepted_id(&d.order(iceberg)).unwrap().0;
    let buy = limit(&mut d, 2, Side::Buy, 10_000, 80);
    let ev = phase(&mut d, Phase::Open);
    assert_eq!(trades(&ev), vec![(10_000, 80, buy, sell, true)]);
    // Its visible part was used up: it shows its next part (10 of the 20 left).
    let o = d.engine.order(OrderId(sell)).unwrap();
    assert_eq!((o.qty_leaves, o.qty_display), (Qty(20), Qty(10)));
    check(&d);
}

#[test]
fn orders_execute_in_price_then_time_priority() {
    let mut d = market();
    phase(&mut d, Phase::OpeningAuction);
    let a = limit(&mut d, 1, Side::Buy, 10_010, 100);
    let b = limit(&mut d, 2, Side::Buy, 10_020, 100);
    let c = limit(&mut d, 3, Side::Buy, 10_010, 100);
    let s = limit(&mut d, 4, Side::Sell, 10_000, 150);
    // 150 at 10000 and 10010, each leaving 150 buys: the highest, 10010.
    let ev = phase(&mut d, Phase::Open);
    assert_eq!(uncrossed(&ev), (Phase::OpeningAuction, 10_010, 150));
    // B has the better price, A arrived before C.
    assert_eq!(
        trades(&ev),
        vec![(10_010, 100, b, s, true), (10_010, 50, a, s, true)]
    );
    assert_eq!(d.engine.order(OrderId(c)).unwrap().qty_filled, Qty(0));
    check(&d);
}

// ----- the end of an auction -----

#[test]
fn orders_for_one_auction_are_cancelled_after_its_uncrossing() {
    let mut d = market();
    phase(&mut d, Phase::OpeningAuction);
    let opg = accepted_id(&d.order(new_order(
        1,
        Side::Buy,
        OrdType::Limit,
        9_000,
        10,
        TimeInForce::AtOpening,
    )))
    .unwrap()
    .0;
    let gfa = accepted_id(&d.order(new_order(
        1,
        Side::Buy,
        OrdType::Limit,
        9_001,
        10,
        TimeInForce::GoodForAuction,
    )))
    .unwrap()
    .0;
    let day = limit(&mut d, 1, Side::Buy, 9_002, 10);
    let ev = phase(&mut d, Phase::Open);
    assert_eq!(uncrossed(&ev), (Phase::OpeningAuction, 10_000, 0));
    assert_eq!(
        cancels(&ev),
        vec![
            (gfa, 10, CancelReason::AuctionUnexecuted),
            (opg, 10, CancelReason::AuctionUnexecuted)
        ]
    );
    assert!(d.engine.order(OrderId(day)).is_some(), "a Day order stays");
    check(&d);
}

#[test]
fn leaving_a_call_for_any_phase_uncrosses_first() {
    let mut d = market();
    phase(&mut d, Phase::ClosingAuction);
    limit(&mut d, 1, Side::Buy, 10_005, 10);
    limit(&mut d, 2, Side::Sell, 10_005, 10);
    let ev = phase(&mut d, Phase::Closed);
    assert_eq!(trades(&ev).len(), 1);
    assert!(
        matches!(
            ev.last(),
            Some(Event::PhaseChanged {
                phase: Phase::Closed,
                ..
            })
        ),
        "{ev:?}"
    );
    check(&d);
}

#[test]
fn the_closing_auction_price_is_the_official_close() {
    let mut d = market();
    assert_eq!(d.engine.closing_price(InstrumentId(1)), None);
    phase(&mut d, Phase::ClosingAuction);
    limit(&mut d, 1, Side::Buy, 10_030, 10);
    limit(&mut d, 2, Side::Sell, 10_030, 10);
    let ev = phase(&mut d, Phase::Closed);
    assert_eq!(uncrossed(&ev), (Phase::ClosingAuction, 10_030, 10));
    assert_eq!(d.engine.closing_price(InstrumentId(1)), Some(Price(10_030)));
    // With nothing executed the close is the reference price (the last trade's).
    phase(&mut d, Phase::ClosingAuction);
    let ev = phase(&mut d, Phase::Closed);
    assert_eq!(uncrossed(&ev), (Phase::ClosingAuction, 10_030, 0));
    assert_eq!(d.engine.closing_price(InstrumentId(1)), Some(Price(10_030)));
    check(&d);
}

#[test]
fn self_trade_prevention_does_not_apply_at_the_uncrossing() {
    let mut d = market();
    phase(&mut d, Phase::OpeningAuction);
    // Account 1 prevents self-trades (CancelBoth) in continuous trading.
    let buy = limit(&mut d, 1, Side::Buy, 10_000, 10);
    let sell = limit(&mut d, 1, Side::Sell, 10_000, 10);
    let ev = phase(&mut d, Phase::Open);
    assert_eq!(trades(&ev), vec![(10_000, 10, buy, sell, true)]);
    check(&d);
}

// ----- the volatility interruption -----

fn guarded() -> Driver {
    market_with(VolatilityGuard {
        dynamic_bps: 100, // ±1% of the last trade price: 9900 to 10100 at first
        static_bps: 0,
        auction_ns: 1_000_000, // 1 ms
    })
}

#[test]
fn a_trade_outside_the_band_starts_a_volatility_auction() {
    let mut d = guarded();
    let s1 = limit(&mut d, 2, Side::Sell, 10_050, 10);
    limit(&mut d, 3, Side::Sell, 10_150, 10);
    let buy = limit(&mut d, 1, Side::Buy, 10_200, 20);
    let ev = d.events.clone();
    let ts = d.ts_ns;
    // 10050 is inside the band and trades; 10150 is not: the instrument goes into a call.
    assert_eq!(trades(&ev), vec![(10_050, 10, buy, s1, false)]);
    assert!(ev.contains(&Event::PhaseChanged {
        instrument: InstrumentId(1),
        phase: Phase::VolatilityAuction,
        ts_ns: ts,
    }));
    assert!(ev.contains(&Event::VolatilityInterruption {
        instrument: InstrumentId(1),
        price: Price(10_150),
        end_ns: ts + 1_000_000,
        extended: false,
        ts_ns: ts,
    }));
    // The rest of the order rests in the call book, crossed with the ask.
    assert_eq!(d.engine.order(OrderId(buy)).unwrap().qty_leaves, Qty(10));
    assert_eq!(indicative(&ev), vec![(10_150, 10, 0, None)]);
    assert_eq!(
        d.engine.volatility_auction_end(InstrumentId(1)),
        Some(ts + 1_000_000)
    );
    check(&d);
}

#[test]
fn a_volatility_auction_is_extended_while_its_price_is_outside_the_band() {
    let mut d = guarded();
    limit(&mut d, 2, Side::Sell, 10_050, 10);
    limit(&mut d, 3, Side::Sell, 10_150, 10);
    limit(&mut d, 1, Side::Buy, 10_200, 20);
    let end = d.engine.volatility_auction_end(InstrumentId(1)).unwrap();
    // The last trade was at 10050, so the band is now 9950 to 10150 and the call's price,
    // 10150, is inside it. Move the cross outside: the ask at 10150 makes way for one at 10200.
    d.run(CommandBody::MassCancel(MassCancel {
        account: Some(AccountId(3)),
        ..MassCancel::default()
    }));
    limit(&mut d, 3, Side::Sell, 10_200, 10);
    // The first command at or after the end acts on it: 10200 is outside, so it extends.
    d.ts_ns = end - 1_000;
    let ev = d
        .run(CommandBody::Deposit {
            account: AccountId(1),
            amount: Cash(1),
        })
        .to_vec();
    assert_eq!(
        ev[0],
        Event::VolatilityInterruption {
            instrument: InstrumentId(1),
            price: Price(10_200),
            end_ns: end + 1_000_000,
            extended: true,
            ts_ns: end,
        }
    );
    assert_eq!(
        d.engine.phase(InstrumentId(1)),
        Some(Phase::VolatilityAuction)
    );
    check(&d);
}

#[test]
fn a_volatility_auction_ends_at_its_time_when_its_price_is_inside_the_band() {
    let mut d = guarded();
    limit(&mut d, 2, Side::Sell, 10_050, 10);
    let sell = limit(&mut d, 3, Side::Sell, 10_150, 10);
    let buy = limit(&mut d, 1, Side::Buy, 10_200, 20);
    let end = d.engine.volatility_auction_end(InstrumentId(1)).unwrap();
    // The last trade (10050) moved the band to 9950..10150: the call's price, 10150, is in.
    d.ts_ns = end - 1_000;
    let ev = d
        .run(CommandBody::Deposit {
            account: AccountId(1),
            amount: Cash(1),
        })
        .to_vec();
    assert_eq!(trades(&ev), vec![(10_150, 10, buy, sell, true)]);
    assert_eq!(uncrossed(&ev), (Phase::VolatilityAuction, 10_150, 10));
    assert_eq!(d.engine.phase(InstrumentId(1)), Some(Phase::Open));
    // The deposit itself is answered after the uncrossing.
    assert!(
        matches!(ev.last(), Some(Event::CashChanged { .. })),
        "{ev:?}"
    );
    // The static reference is now the auction's price.
    assert_eq!(
        d.engine.static_reference(InstrumentId(1)),
        Some(Price(10_150))
    );
    check(&d);
}

#[test]
fn a_market_order_that_interrupts_has_its_remainder_cancelled() {
    let mut d = guarded();
    limit(&mut d, 2, Side::Sell, 10_050, 10);
    limit(&mut d, 3, Side::Sell, 10_150, 10);
    let buy = market_order(&mut d, 1, Side::Buy, 20);
    let ev = d.events.clone();
    assert_eq!(trades(&ev).len(), 1);
    assert_eq!(cancels(&ev), vec![(buy, 10, CancelReason::MarketRemainder)]);
    assert_eq!(
        d.engine.phase(InstrumentId(1)),
        Some(Phase::VolatilityAuction)
    );
    check(&d);
}

#[test]
fn an_instrument_without_a_guard_trades_as_before() {
    let mut d = market();
    limit(&mut d, 2, Side::Sell, 10_050, 10);
    limit(&mut d, 3, Side::Sell, 11_500, 10);
    let buy = limit(&mut d, 1, Side::Buy, 11_500, 20);
    assert_eq!(trades(&d.events.clone()).len(), 2);
    assert!(d.engine.order(OrderId(buy)).is_none());
    assert_eq!(d.engine.phase(InstrumentId(1)), Some(Phase::Open));
}
