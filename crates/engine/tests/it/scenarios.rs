//! Hand-written scenarios, one behaviour each, with the expected figures worked out by hand.

use bourse_core::*;
use bourse_engine::fixtures::{self, accepted_id, reject_reason, trades, Driver};
use bourse_engine::EngineConfig;

const EQ: u32 = 1;
const FUT: u32 = 2;
const FX: u32 = 3;
/// Plenty of cash: 100,000,000.0000.
const RICH: i128 = 100_000_000_0000;

fn driver() -> Driver {
    let mut d = Driver::new(EngineConfig {
        orders_max: 10_000,
        ..EngineConfig::default()
    });
    d.add_instrument(fixtures::equity(EQ, "SBER", 10_000));
    d.add_instrument(fixtures::future(FUT, "RIZ6", 100_000));
    d.add_instrument(fixtures::fx(FX, "EURUSD", 108_000));
    // Accounts 1 to 4 may sell short, so scenarios can sell without buying first; their
    // uncovered sells reserve cash, of which they have plenty.
    for account in 1..=4 {
        d.add_account_spec(
            AccountSpec {
                account: AccountId(account),
                firm: FirmId(if account <= 2 { 1 } else { 2 }),
                may_short: true,
                stp: StpMode::None,
                stp_scope: StpScope::Account,
            },
            RICH,
        );
    }
    d
}

fn give_shares(d: &mut Driver, account: u32, lots: i64) {
    // Account 99 sells nothing; we hand out shares by trading them from a short-allowed house.
    if d.engine.account(AccountId(99)).is_none() {
        d.add_account_spec(
            AccountSpec {
                account: AccountId(99),
                firm: FirmId(99),
                may_short: true,
                stp: StpMode::None,
                stp_scope: StpScope::Account,
            },
            RICH,
        );
    }
    let cl = d.ts_ns;
    d.limit(99, cl, EQ, Side::Sell, 10_000, lots);
    let ev = d.limit(account, cl, EQ, Side::Buy, 10_000, lots);
    assert_eq!(trades(&ev), vec![(10_000, lots)]);
}

#[test]
fn orders_match_in_price_then_time_priority() {
    let mut d = driver();
    d.limit(1, 1, EQ, Side::Sell, 10_010, 5);
    d.limit(2, 1, EQ, Side::Sell, 10_005, 5);
    d.limit(3, 1, EQ, Side::Sell, 10_005, 5);
    let ev = d.limit(4, 1, EQ, Side::Buy, 10_010, 12);
    // Best price first (10_005), and at that price the older order (account 2) first.
    assert_eq!(trades(&ev), vec![(10_005, 5), (10_005, 5), (10_010, 2)]);
    let sellers: Vec<u32> = ev
        .iter()
        .filter_map(|e| match e {
            Event::Trade { sell, .. } => Some(sell.account.0),
            _ => None,
        })
        .collect();
    assert_eq!(sellers, vec![2, 3, 1]);
    let asks = d.engine.depth(InstrumentId(EQ), Side::Sell, 20);
    assert_eq!(asks, vec![(Price(10_010), Qty(3), 1)]);
    d.engine.check_invariants().unwrap();
}

#[test]
fn a_partial_fill_rests_the_remainder_at_its_limit() {
    let mut d = driver();
    d.limit(1, 1, EQ, Side::Sell, 10_000, 3);
    let ev = d.limit(2, 1, EQ, Side::Buy, 10_002, 10);
    assert_eq!(trades(&ev), vec![(10_000, 3)]);
    assert_eq!(
        d.engine.depth(InstrumentId(EQ), Side::Buy, 5),
        vec![(Price(10_002), Qty(7), 1)]
    );
    let log = ev
        .iter()
        .rev()
        .find_map(|e| match e {
            Event::OrderLog(l) => Some(*l),
            _ => None,
        })
        .unwrap();
    assert_eq!(log.action, OrderLogAction::New);
    assert_eq!(log.status, OrderStatus::PartiallyFilled);
    assert_eq!(log.qty_leaves, Qty(7));
}

#[test]
fn rec_numbers_records_and_seq_numbers_changes() {
    let mut d = driver();
    let a = d.limit(1, 1, EQ, Side::Sell, 10_000, 5);
    let b = d.limit(2, 1, EQ, Side::Buy, 10_000, 2);
    let logs: Vec<OrderLog> = a
        .iter()
        .chain(b.iter())
        .filter_map(|e| match e {
            Event::OrderLog(l) => Some(*l),
            _ => None,
        })
        .collect();
    // Sell rests (rec 1), buy trades against it: the sell changes, the buy is gone.
    assert_eq!(logs.len(), 3);
    assert_eq!((logs[0].rec, logs[0].seq), (1, 1));
    assert_eq!((logs[1].rec, logs[1].seq), (1, 2));
    assert_eq!((logs[2].rec, logs[2].seq), (2, 3));
    assert_eq!(logs[2].status, OrderStatus::Filled);
}

#[test]
fn market_orders_trade_within_the_band_and_cancel_the_rest() {
    let mut d = driver();
    d.limit(1, 1, EQ, Side::Sell, 10_100, 2);
    // Band is ±20% around 10_000: 12_000 is inside, a resting order can't be beyond it.
    d.limit(1, 2, EQ, Side::Sell, 11_900, 2);
    let ev = d.order(NewOrder {
        firm: None,
        account: AccountId(2),
        cl_ord_id: ClOrdId(1),
        instrument: InstrumentId(EQ),
        side: Side::Buy,
        ord_type: OrdType::Market,
        price: Price(0),
        qty: Qty(10),
        tif: TimeInForce::Day,
        expire_ts_ns: 0,
        display_qty: Qty(0),
    });
    assert_eq!(trades(&ev), vec![(10_100, 2), (11_900, 2)]);
    assert!(ev.iter().any(|e| matches!(
        e,
        Event::OrderCancelled {
            reason: CancelReason::MarketRemainder,
            qty_cancelled: Qty(6),
            ..
        }
    )));
    assert!(d.engine.depth(InstrumentId(EQ), Side::Buy, 5).is_empty());
    d.engine.check_invariants().unwrap();
}

#[test]
fn ioc_cancels_what_does_not_trade_at_once() {
    let mut d = driver();
    d.limit(1, 1, EQ, Side::Sell, 10_000, 4);
    let mut o = ioc(2, 1, Side::Buy, 10_000, 10);
    o.tif = TimeInForce::Ioc;
    let ev = d.order(o);
    assert_eq!(trades(&ev), vec![(10_000, 4)]);
    assert!(ev.iter().any(|e| matches!(
        e,
        Event::OrderCancelled {
            reason: CancelReason::ImmediateOrCancelRemainder,
            qty_cancelled: Qty(6),
            ..
        }
    )));
    assert_eq!(d.engine.live_orders(), 0);
}

fn ioc(account: u32, cl: u64, side: Side, price: i64, qty: i64) -> NewOrder {
    NewOrder {
        firm: None,
        account: AccountId(account),
        cl_ord_id: ClOrdId(cl),
        instrument: InstrumentId(EQ),
        side,
        ord_type: OrdType::Limit,
        price: Price(price),
        qty: Qty(qty),
        tif: TimeInForce::Ioc,
        expire_ts_ns: 0,
        display_qty: Qty(0),
    }
}

#[test]
fn fok_fills_in_full_or_not_at_all() {
    let mut d = driver();
    d.limit(1, 1, EQ, Side::Sell, 10_000, 4);
    d.limit(1, 2, EQ, Side::Sell, 10_001, 4);
    let mut o = ioc(2, 1, Side::Buy, 10_001, 9);
    o.tif = TimeInForce::Fok;
    let ev = d.order(o);
    assert!(trades(&ev).is_empty());
    assert!(ev.iter().any(|e| matches!(
        e,
        Event::OrderCancelled {
            reason: CancelReason::FillOrKillUnfilled,
            ..
        }
    )));
    o.cl_ord_id = ClOrdId(2);
    o.qty = Qty(8);
    let ev = d.order(o);
    assert_eq!(trades(&ev), vec![(10_000, 4), (10_001, 4)]);
}

#[test]
fn an_iceberg_shows_its_display_size_and_refills_at_the_back() {
    let mut d = driver();
    let ev = d.order(NewOrder {
        display_qty: Qty(2),
        tif: TimeInForce::Day,
        ..ioc(1, 1, Side::Sell, 10_000, 6)
    });
    assert!(accepted_id(&ev).is_some());
    d.limit(2, 1, EQ, Side::Sell, 10_000, 3);
    assert_eq!(
        d.engine.depth(InstrumentId(EQ), Side::Sell, 1),
        vec![(Price(10_000), Qty(5), 2)]
    );
    // Takes the iceberg's 2, then account 2's 3 (the refill went behind it), then 1 more.
    let ev = d.limit(3, 1, EQ, Side::Buy, 10_000, 6);
    let sellers: Vec<(u32, i64)> = ev
        .iter()
        .filter_map(|e| match e {
            Event::Trade { sell, qty, .. } => Some((sell.account.0, qty.0)),
            _ => None,
        })
        .collect();
    assert_eq!(sellers, vec![(1, 2), (2, 3), (1, 1)]);
    assert_eq!(
        d.engine.depth(InstrumentId(EQ), Side::Sell, 1),
        vec![(Price(10_000), Qty(1), 1)]
    );
    d.engine.check_invariants().unwrap();
}

fn stp_account(account: u32, firm: u32, stp: StpMode, scope: StpScope) -> AccountSpec {
    AccountSpec {
        account: AccountId(account),
        firm: FirmId(firm),
        may_short: false,
        stp,
        stp_scope: scope,
    }
}

#[test]
fn self_trade_prevention_cancels_resting_incoming_or_both() {
    for (mode, resting_left, incoming_rests) in [
        (StpMode::CancelResting, false, true),
        (StpMode::CancelIncoming, true, false),
        (StpMode::CancelBoth, false, false),
    ] {
        let mut d = driver();
        d.add_account_spec(stp_account(10, 5, mode, StpScope::Account), RICH);
        give_shares(&mut d, 10, 5);
        d.limit(10, 1, EQ, Side::Sell, 10_000, 5);
        let ev = d.limit(10, 2, EQ, Side::Buy, 10_000, 5);
        assert!(trades(&ev).is_empty(), "{mode:?} must not self-trade");
        assert_eq!(
            !d.engine.depth(InstrumentId(EQ), Side::Sell, 1).is_empty(),
            resting_left,
            "{mode:?}"
        );
        assert_eq!(
            !d.engine.depth(InstrumentId(EQ), Side::Buy, 1).is_empty(),
            incoming_rests,
            "{mode:?}"
        );
        d.engine.check_invariants().unwrap();
    }
}

#[test]
fn self_trade_prevention_by_firm_spans_the_firms_accounts() {
    let mut d = driver();
    d.add_account_spec(
        stp_account(10, 7, StpMode::CancelIncoming, StpScope::Firm),
        RICH,
    );
    d.add_account_spec(stp_account(11, 7, StpMode::None, StpScope::Account), RICH);
    give_shares(&mut d, 11, 5);
    d.limit(11, 1, EQ, Side::Sell, 10_000, 5);
    let ev = d.limit(10, 1, EQ, Side::Buy, 10_000, 5);
    assert!(trades(&ev).is_empty());
    assert!(ev.iter().any(|e| matches!(
        e,
        Event::OrderCancelled {
            reason: CancelReason::SelfTradePrevention,
            ..
        }
    )));
}

#[test]
fn limit_prices_are_checked_against_tick_band_and_range() {
    let mut d = driver();
    assert_eq!(
        reject_reason(&d.limit(1, 1, EQ, Side::Buy, 12_001, 1)),
        Some(RejectReason::PriceOutsideBand)
    );
    assert_eq!(
        reject_reason(&d.limit(1, 1, EQ, Side::Buy, 0, 1)),
        Some(RejectReason::PriceNotPositive)
    );
    assert_eq!(
        reject_reason(&d.limit(1, 1, FUT, Side::Buy, 100_005, 1)),
        Some(RejectReason::PriceOffTick)
    );
    assert_eq!(
        reject_reason(&d.limit(1, 1, EQ, Side::Buy, i64::MAX, 1)),
        Some(RejectReason::PriceTooLarge)
    );
    assert_eq!(
        reject_reason(&d.limit(1, 1, EQ, Side::Buy, 10_000, 0)),
        Some(RejectReason::QtyNotPositive)
    );
    assert_eq!(
        reject_reason(&d.limit(1, 1, EQ, Side::Buy, 10_000, i64::MAX)),
        Some(RejectReason::QtyTooLarge)
    );
    assert_eq!(
        reject_reason(&d.limit(1, 1, 77, Side::Buy, 10_000, 1)),
        Some(RejectReason::UnknownInstrument)
    );
    assert_eq!(
        reject_reason(&d.limit(77, 1, EQ, Side::Buy, 10_000, 1)),
        Some(RejectReason::UnknownAccount)
    );
    assert_eq!(d.engine.live_orders(), 0);
}

#[test]
fn duplicate_client_order_ids_are_refused_while_the_first_is_live() {
    let mut d = driver();
    d.limit(1, 7, EQ, Side::Buy, 9_990, 1);
    assert_eq!(
        reject_reason(&d.limit(1, 7, EQ, Side::Buy, 9_990, 1)),
        Some(RejectReason::DuplicateClOrdId)
    );
    // Another account may use the same id.
    assert!(accepted_id(&d.limit(2, 7, EQ, Side::Buy, 9_990, 1)).is_some());
}

#[test]
fn halted_and_closed_instruments_refuse_orders_but_accept_cancels() {
    let mut d = driver();
    let id = accepted_id(&d.limit(1, 1, EQ, Side::Buy, 9_990, 1)).unwrap();
    d.run(CommandBody::SetPhase {
        instrument: Some(InstrumentId(EQ)),
        phase: Phase::Halted,
    });
    assert_eq!(
        reject_reason(&d.limit(1, 2, EQ, Side::Buy, 9_990, 1)),
        Some(RejectReason::InstrumentHalted)
    );
    d.run(CommandBody::SetPhase {
        instrument: None,
        phase: Phase::Closed,
    });
    assert_eq!(
        reject_reason(&d.limit(1, 2, EQ, Side::Buy, 9_990, 1)),
        Some(RejectReason::InstrumentClosed)
    );
    let ev = d
        .run(CommandBody::Cancel(Cancel {
            account: AccountId(1),
            cl_ord_id: ClOrdId(9),
            target: OrderRef {
                order_id: Some(id),
                orig_cl_ord_id: None,
            },
        }))
        .to_vec();
    assert!(matches!(
        ev[0],
        Event::OrderCancelled {
            reason: CancelReason::Requested,
            ..
        }
    ));
}

fn replace(account: u32, cl: u64, orig: u64, price: Option<i64>, qty: Option<i64>) -> CommandBody {
    CommandBody::Replace(Replace {
        account: AccountId(account),
        cl_ord_id: ClOrdId(cl),
        target: OrderRef {
            order_id: None,
            orig_cl_ord_id: Some(ClOrdId(orig)),
        },
        price: price.map(Price),
        qty: qty.map(Qty),
    })
}

#[test]
fn replace_keeps_priority_on_a_decrease_and_loses_it_otherwise() {
    let mut d = driver();
    d.limit(1, 1, EQ, Side::Buy, 9_990, 5);
    d.limit(2, 1, EQ, Side::Buy, 9_990, 5);
    let ev = d.run(replace(1, 2, 1, None, Some(3))).to_vec();
    assert!(matches!(
        ev[0],
        Event::OrderReplaced {
            priority_kept: true,
            ..
        }
    ));
    let queue: Vec<u32> = d
        .engine
        .resting_orders(InstrumentId(EQ))
        .iter()
        .map(|o| o.account.0)
        .collect();
    assert_eq!(queue, vec![1, 2]);
    let ev = d.run(replace(1, 3, 2, None, Some(4))).to_vec();
    assert!(matches!(
        ev[0],
        Event::OrderReplaced {
            priority_kept: false,
            ..
        }
    ));
    let queue: Vec<u32> = d
        .engine
        .resting_orders(InstrumentId(EQ))
        .iter()
        .map(|o| o.account.0)
        .collect();
    assert_eq!(queue, vec![2, 1]);
    d.engine.check_invariants().unwrap();
}

#[test]
fn replace_to_a_crossing_price_trades() {
    let mut d = driver();
    d.limit(1, 1, EQ, Side::Sell, 10_010, 5);
    d.limit(2, 1, EQ, Side::Buy, 9_990, 5);
    let ev = d.run(replace(2, 2, 1, Some(10_010), None)).to_vec();
    assert_eq!(trades(&ev), vec![(10_010, 5)]);
    assert_eq!(d.engine.live_orders(), 0);
}

#[test]
fn replace_below_the_filled_quantity_or_of_a_filled_order_is_refused() {
    let mut d = driver();
    d.limit(1, 1, EQ, Side::Sell, 10_000, 2);
    d.limit(2, 1, EQ, Side::Buy, 10_000, 2);
    let ev = d.run(replace(2, 2, 1, None, Some(3))).to_vec();
    assert_eq!(
        reject_reason(&ev),
        Some(RejectReason::UnknownOrder),
        "filled"
    );
    d.limit(1, 5, EQ, Side::Sell, 10_050, 5);
    d.limit(2, 3, EQ, Side::Buy, 10_050, 3);
    // Order 5 of account 1 is now 3 filled of 5.
    let ev = d.run(replace(1, 6, 5, None, Some(3))).to_vec();
    assert_eq!(
        reject_reason(&ev),
        Some(RejectReason::ReplaceQtyNotAboveFilled)
    );
    let ev = d.run(replace(1, 6, 5, None, None)).to_vec();
    assert_eq!(reject_reason(&ev), Some(RejectReason::ReplaceNoChange));
}

#[test]
fn mass_cancel_by_firm_takes_only_that_firms_orders() {
    let mut d = driver();
    d.limit(1, 1, EQ, Side::Buy, 9_990, 1);
    d.limit(2, 1, EQ, Side::Buy, 9_991, 1);
    d.limit(3, 1, EQ, Side::Buy, 9_992, 1);
    let ev = d
        .run(CommandBody::MassCancel(MassCancel {
            firm: Some(FirmId(1)),
            ..MassCancel::default()
        }))
        .to_vec();
    assert!(matches!(
        ev.last(),
        Some(Event::MassCancelDone {
            orders_cancelled: 2,
            ..
        })
    ));
    assert_eq!(d.engine.live_orders(), 1);
    let ev = d
        .run(CommandBody::MassCancel(MassCancel::default()))
        .to_vec();
    assert_eq!(reject_reason(&ev), Some(RejectReason::MassCancelUnfiltered));
}

#[test]
fn end_of_day_expires_day_orders_and_due_gtd_orders_only() {
    let mut d = driver();
    d.limit(1, 1, EQ, Side::Buy, 9_990, 1);
    let gtc = NewOrder {
        tif: TimeInForce::Gtc,
        ..ioc(1, 2, Side::Buy, 9_991, 1)
    };
    d.order(gtc);
    let far = d.ts_ns + 1_000_000_000_000;
    d.order(NewOrder {
        tif: TimeInForce::Gtd,
        expire_ts_ns: far,
        ..ioc(1, 3, Side::Buy, 9_992, 1)
    });
    d.order(NewOrder {
        tif: TimeInForce::Gtd,
        expire_ts_ns: d.ts_ns + 5_000,
        ..ioc(1, 4, Side::Buy, 9_993, 1)
    });
    d.ts_ns += 1_000_000;
    let ev = d.run(CommandBody::EndOfDay).to_vec();
    assert!(matches!(
        ev.last(),
        Some(Event::EndOfDayDone {
            orders_expired: 2,
            ..
        })
    ));
    let left: Vec<u64> = d
        .engine
        .resting_orders(InstrumentId(EQ))
        .iter()
        .map(|o| o.cl_ord_id.0)
        .collect();
    assert_eq!(left, vec![3, 2]);
}

#[test]
fn a_buy_reserves_its_notional_and_settles_at_the_trade_price() {
    let mut d = driver();
    d.add_account(20, 3, 1_000_0000); // 1,000.0000
                                      // 100.00 × 1 lot × 10 shares = 1,000.00: exactly the account's cash.
    assert!(accepted_id(&d.limit(20, 1, EQ, Side::Buy, 10_000, 1)).is_some());
    let acc = d.engine.account(AccountId(20)).unwrap();
    assert_eq!(acc.cash_reserved, Cash(1_000_0000));
    assert_eq!(acc.cash_free, Cash(0));
    assert_eq!(
        reject_reason(&d.limit(20, 2, EQ, Side::Buy, 9_000, 1)),
        Some(RejectReason::InsufficientCollateral)
    );
    d.engine.check_invariants().unwrap();
}

#[test]
fn trades_settle_at_the_resting_price() {
    let mut d = driver();
    d.add_account(20, 3, 1_000_0000);
    give_shares(&mut d, 3, 1);
    d.limit(3, 9, EQ, Side::Sell, 9_900, 1);
    let ev = d.limit(20, 1, EQ, Side::Buy, 10_000, 1);
    assert_eq!(trades(&ev), vec![(9_900, 1)]);
    let acc = d.engine.account(AccountId(20)).unwrap();
    assert_eq!(acc.cash, Cash(10_0000), "paid 990.00, kept 10.00");
    assert_eq!(acc.cash_reserved, Cash(0));
    assert_eq!(
        d.engine.position(AccountId(20), InstrumentId(EQ)),
        Some((Qty(1), Cash(990_0000)))
    );
}

#[test]
fn a_sell_needs_a_free_position_unless_the_account_may_short() {
    let mut d = driver();
    d.add_account(20, 3, RICH);
    assert_eq!(
        reject_reason(&d.limit(20, 1, EQ, Side::Sell, 10_000, 1)),
        Some(RejectReason::InsufficientPosition)
    );
    give_shares(&mut d, 20, 3);
    assert!(accepted_id(&d.limit(20, 2, EQ, Side::Sell, 10_050, 2)).is_some());
    // Two of three lots are held back by the first sell.
    assert_eq!(
        reject_reason(&d.limit(20, 3, EQ, Side::Sell, 10_050, 2)),
        Some(RejectReason::InsufficientPosition)
    );
    assert!(accepted_id(&d.limit(20, 4, EQ, Side::Sell, 10_050, 1)).is_some());
    // An account that may short sells what it does not hold, reserving cash for it.
    assert!(accepted_id(&d.limit(1, 1, EQ, Side::Sell, 10_050, 1)).is_some());
    assert_eq!(
        d.engine.account(AccountId(1)).unwrap().cash_reserved,
        Cash(1_005_0000)
    );
    d.engine.check_invariants().unwrap();
}

#[test]
fn futures_lock_initial_margin_per_contract() {
    let mut d = driver();
    d.add_account(30, 4, 10_000_0000); // 10,000.0000: two contracts of margin
    d.add_account(31, 4, 10_000_0000);
    assert!(accepted_id(&d.limit(30, 1, FUT, Side::Buy, 100_000, 2)).is_some());
    assert_eq!(
        reject_reason(&d.limit(30, 2, FUT, Side::Buy, 100_000, 1)),
        Some(RejectReason::InsufficientCollateral)
    );
    let ev = d.limit(31, 1, FUT, Side::Sell, 100_000, 2);
    assert_eq!(trades(&ev), vec![(100_000, 2)]);
    let acc = d.engine.account(AccountId(30)).unwrap();
    assert_eq!(acc.margin_locked, Cash(10_000_0000));
    assert_eq!(acc.cash, Cash(10_000_0000), "no premium changes hands");
    assert_eq!(
        d.engine
            .position(AccountId(31), InstrumentId(FUT))
            .unwrap()
            .0,
        Qty(-2)
    );
    // Closing the position needs no extra margin, and frees it all once done.
    d.limit(31, 2, FUT, Side::Buy, 100_000, 2);
    assert!(accepted_id(&d.limit(30, 3, FUT, Side::Sell, 100_000, 2)).is_some());
    assert_eq!(
        d.engine.account(AccountId(30)).unwrap().margin_locked,
        Cash(0)
    );
    d.engine.check_invariants().unwrap();
}

#[test]
fn fx_notional_is_rounded_up_for_reservations() {
    let mut d = driver();
    // 1.08001 × 1,000 = 1,080.01 per lot.
    let ev = d.limit(1, 1, FX, Side::Buy, 108_001, 1);
    assert!(accepted_id(&ev).is_some());
    assert_eq!(
        d.engine.account(AccountId(1)).unwrap().cash_reserved,
        Cash(1_080_0100)
    );
}

#[test]
fn cash_movements_never_take_free_cash_below_zero() {
    let mut d = driver();
    d.add_account(20, 3, 1_000_0000);
    d.limit(20, 1, EQ, Side::Buy, 9_000, 1); // reserves 900.00
    let ev = d
        .run(CommandBody::Withdraw {
            account: AccountId(20),
            amount: Cash(200_0000),
        })
        .to_vec();
    assert_eq!(reject_reason(&ev), Some(RejectReason::InsufficientFreeCash));
    let ev = d
        .run(CommandBody::SetCollateral {
            account: AccountId(20),
            amount: Cash(800_0000),
        })
        .to_vec();
    assert_eq!(
        reject_reason(&ev),
        Some(RejectReason::CollateralBelowLocked)
    );
    let ev = d
        .run(CommandBody::Withdraw {
            account: AccountId(20),
            amount: Cash(100_0000),
        })
        .to_vec();
    assert!(matches!(
        ev[0],
        Event::CashChanged {
            cash_free: Cash(0),
            ..
        }
    ));
    let ev = d
        .run(CommandBody::Deposit {
            account: AccountId(20),
            amount: Cash(-1),
        })
        .to_vec();
    assert_eq!(reject_reason(&ev), Some(RejectReason::AmountNotPositive));
}

#[test]
fn snapshot_and_restore_give_the_same_hash_and_behaviour() {
    let mut d = driver();
    give_shares(&mut d, 1, 10);
    d.limit(1, 1, EQ, Side::Sell, 10_010, 4);
    d.order(NewOrder {
        display_qty: Qty(1),
        tif: TimeInForce::Gtc,
        ..ioc(2, 1, Side::Buy, 9_990, 5)
    });
    d.limit(3, 1, FUT, Side::Buy, 100_000, 1);
    let bytes = d.engine.snapshot();
    let restored = bourse_engine::Engine::restore(&bytes).unwrap();
    assert_eq!(restored.state_hash(), d.engine.state_hash());
    assert_eq!(restored.snapshot(), bytes);

    let mut twin = Driver {
        engine: restored,
        events: Vec::new(),
        ts_ns: d.ts_ns,
    };
    let a = d.limit(4, 1, EQ, Side::Buy, 10_010, 4);
    let b = twin.limit(4, 1, EQ, Side::Buy, 10_010, 4);
    assert_eq!(a, b);
    assert_eq!(d.engine.state_hash(), twin.engine.state_hash());
}

#[test]
fn a_core_numbers_its_orders_from_its_configured_base() {
    let base = 3u64 << bourse_engine::ORDER_ID_CORE_SHIFT;
    let mut d = Driver::new(EngineConfig {
        orders_max: 100,
        first_order_id: base,
        ..EngineConfig::default()
    });
    d.add_instrument(fixtures::equity(EQ, "SBER", 10_000));
    d.add_account(1, 1, RICH);
    let first = fixtures::accepted_id(&d.limit(1, 1, EQ, Side::Buy, 10_000, 1));
    let second = fixtures::accepted_id(&d.limit(1, 2, EQ, Side::Buy, 10_000, 1));
    assert_eq!(first, Some(bourse_core::OrderId(base)));
    assert_eq!(second, Some(bourse_core::OrderId(base + 1)));
    // The base survives a snapshot: the restored core goes on from where it was.
    let bytes = d.engine.snapshot();
    let restored = bourse_engine::Engine::restore(&bytes).unwrap();
    assert_eq!(restored.config().first_order_id, base);
    assert_eq!(restored.state_hash(), d.engine.state_hash());
}
