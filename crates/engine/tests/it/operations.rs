//! The engine's side of market operations: the kill switch (per firm or account: resting
//! orders cancelled, new orders and replaces refused until released, cancels still taken; part
//! of the snapshot and the digest) and the paused phase (a scheduled clearing pause: new
//! orders refused with a reason of its own, resting orders stay), and the margin call
//! (clearing's: orders that would increase the account's exposure refused with a reason of
//! their own, reducing orders and cancels taken, a covering deposit or a call of 0 closes it;
//! part of the snapshot and the digest).

use bourse_core::*;
use bourse_engine::fixtures::{accepted_id, equity, reject_reason, Driver};
use bourse_engine::{Engine, EngineConfig};

const SBER: u32 = 1;
const GAZP: u32 = 2;
const REF: i64 = 10_000;

fn driver() -> Driver {
    let mut d = Driver::new(EngineConfig {
        orders_max: 1024,
        instruments_max: 4,
        accounts_max: 16,
        levels_per_side_hint: 8,
        first_order_id: 1,
    });
    d.add_instrument(equity(SBER, "SBER", REF));
    d.add_instrument(equity(GAZP, "GAZP", REF));
    // Accounts 1 and 2 belong to firm 7, account 3 to firm 8; all may sell short.
    for (account, firm) in [(1, 7), (2, 7), (3, 8)] {
        let spec = AccountSpec {
            account: AccountId(account),
            firm: FirmId(firm),
            may_short: true,
            stp: StpMode::None,
            stp_scope: StpScope::Account,
        };
        d.add_account_spec(spec, 1_000_000_000_0000);
    }
    d
}

fn kill(firm: Option<u32>, account: Option<u32>, engaged: bool) -> CommandBody {
    CommandBody::KillSwitch {
        firm: firm.map(FirmId),
        account: account.map(AccountId),
        engaged,
    }
}

fn cancelled(events: &[Event]) -> Vec<OrderId> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::OrderCancelled { order_id, .. } => Some(*order_id),
            _ => None,
        })
        .collect()
}

fn check(d: &Driver) {
    let restored = Engine::restore(&d.engine.snapshot()).expect("restores");
    assert_eq!(restored.state_hash(), d.engine.state_hash());
    assert_eq!(restored.state_digest(), d.engine.state_digest());
    assert_eq!(d.engine.recompute_state_digest(), d.engine.state_digest());
}

#[test]
fn a_firm_kill_switch_cancels_its_orders_in_every_book_and_refuses_new_ones_until_released() {
    let mut d = driver();
    let a = accepted_id(&d.limit(1, 1, SBER, Side::Buy, 9_900, 5)).unwrap();
    let b = accepted_id(&d.limit(2, 1, GAZP, Side::Sell, 10_100, 5)).unwrap();
    let other = accepted_id(&d.limit(3, 1, SBER, Side::Buy, 9_900, 5)).unwrap();
    let before = d.engine.state_digest();

    let ev = d.run(kill(Some(7), None, true)).to_vec();
    let mut gone = cancelled(&ev);
    gone.sort();
    assert_eq!(gone, vec![a, b]);
    assert!(ev.iter().any(|e| matches!(
        e,
        Event::KillSwitchSet {
            firm: Some(FirmId(7)),
            engaged: true,
            orders_cancelled: 2,
            ..
        }
    )));
    assert!(
        d.engine.order(other).is_some(),
        "another firm's order stays"
    );
    assert_ne!(d.engine.state_digest(), before);
    check(&d);

    for account in [1, 2] {
        let ev = d.limit(account, 2, SBER, Side::Buy, 9_900, 1);
        assert_eq!(reject_reason(&ev), Some(RejectReason::TradingSuspended));
    }
    assert!(accepted_id(&d.limit(3, 2, SBER, Side::Buy, 9_900, 1)).is_some());

    let ev = d.run(kill(Some(7), None, false)).to_vec();
    assert!(ev
        .iter()
        .any(|e| matches!(e, Event::KillSwitchSet { engaged: false, .. })));
    assert!(accepted_id(&d.limit(1, 3, SBER, Side::Buy, 9_900, 1)).is_some());
    check(&d);
}

#[test]
fn an_account_kill_switch_stops_that_account_only() {
    let mut d = driver();
    let resting = accepted_id(&d.limit(1, 1, SBER, Side::Buy, 9_900, 5)).unwrap();
    // Engaging on account 2 leaves account 1 (same firm) alone.
    d.run(kill(None, Some(2), true));
    assert!(d.engine.order(resting).is_some());
    assert_eq!(
        reject_reason(&d.limit(2, 1, SBER, Side::Buy, 9_900, 1)),
        Some(RejectReason::TradingSuspended)
    );
    // Account 1's own switch: its order goes; a new one is refused.
    let ev = d.run(kill(None, Some(1), true)).to_vec();
    assert_eq!(cancelled(&ev), vec![resting]);
    let ev = d.limit(1, 2, SBER, Side::Buy, 9_900, 1);
    assert_eq!(reject_reason(&ev), Some(RejectReason::TradingSuspended));
    check(&d);
    // Released, it trades again.
    d.run(kill(None, Some(1), false));
    assert!(accepted_id(&d.limit(1, 3, SBER, Side::Buy, 9_900, 5)).is_some());
    check(&d);
}

#[test]
fn a_kill_switch_names_exactly_one_target() {
    let mut d = driver();
    let ev = d.run(kill(None, None, true)).to_vec();
    assert_eq!(
        reject_reason(&ev),
        Some(RejectReason::KillSwitchTargetInvalid)
    );
    let ev = d.run(kill(Some(7), Some(1), true)).to_vec();
    assert_eq!(
        reject_reason(&ev),
        Some(RejectReason::KillSwitchTargetInvalid)
    );
    assert_eq!(d.engine.suspended(), (&[][..], &[][..]));
}

#[test]
fn a_paused_instrument_refuses_new_orders_with_its_own_reason_and_keeps_resting_ones() {
    let mut d = driver();
    let resting = accepted_id(&d.limit(1, 1, SBER, Side::Buy, 9_900, 5)).unwrap();
    d.run(CommandBody::SetPhase {
        instrument: Some(InstrumentId(SBER)),
        phase: Phase::Paused,
    });
    assert_eq!(
        reject_reason(&d.limit(3, 1, SBER, Side::Sell, 9_900, 1)),
        Some(RejectReason::InstrumentPaused)
    );
    assert!(d.engine.order(resting).is_some(), "resting orders stay");
    // The other instrument trades on.
    assert!(accepted_id(&d.limit(3, 2, GAZP, Side::Buy, 9_900, 1)).is_some());
    check(&d);
    d.run(CommandBody::SetPhase {
        instrument: Some(InstrumentId(SBER)),
        phase: Phase::Open,
    });
    let ev = d.limit(3, 3, SBER, Side::Sell, 9_900, 1);
    assert!(
        ev.iter().any(|e| matches!(e, Event::Trade { .. })),
        "{ev:?}"
    );
}

#[test]
fn a_funded_addition_adds_and_deposits_in_one_command_or_does_nothing() {
    let mut d = driver();
    let spec = |account| AccountSpec {
        account: AccountId(account),
        firm: FirmId(9),
        may_short: false,
        stp: StpMode::None,
        stp_scope: StpScope::Account,
    };
    let funded = |account, cash| CommandBody::AddFundedAccount {
        spec: spec(account),
        cash: Cash(cash),
    };
    // Added and funded: both events, in that order, under one command.
    let ev = d.run(funded(10, 5_000_0000)).to_vec();
    assert!(
        matches!(
            ev[..],
            [
                Event::AccountAdded {
                    account: AccountId(10),
                    firm: FirmId(9),
                    ..
                },
                Event::CashChanged {
                    account: AccountId(10),
                    reason: CashReason::Deposit,
                    amount: Cash(5_000_0000),
                    cash: Cash(5_000_0000),
                    ..
                },
            ]
        ),
        "{ev:?}"
    );
    // Cash 0 adds the account without a deposit.
    let ev = d.run(funded(11, 0)).to_vec();
    assert!(matches!(ev[..], [Event::AccountAdded { .. }]), "{ev:?}");
    // A duplicate is refused and deposits nothing; the first account keeps its cash.
    let ev = d.run(funded(10, 7)).to_vec();
    assert_eq!(reject_reason(&ev), Some(RejectReason::DuplicateAccount));
    assert_eq!(ev.len(), 1);
    // A negative or too large amount refuses the whole command: the account is not added.
    let ev = d.run(funded(12, -1)).to_vec();
    assert_eq!(reject_reason(&ev), Some(RejectReason::AmountNotPositive));
    let ev = d.run(funded(12, CASH_AMOUNT_MAX + 1)).to_vec();
    assert_eq!(reject_reason(&ev), Some(RejectReason::Overflow));
    let ev = d.run(CommandBody::Deposit {
        account: AccountId(12),
        amount: Cash(1),
    });
    assert_eq!(reject_reason(ev), Some(RejectReason::UnknownAccount));
    check(&d);
}

fn margin_call(account: u32, amount: i128) -> CommandBody {
    CommandBody::MarginCall {
        account: AccountId(account),
        amount: Cash(amount),
    }
}

fn margin_call_set(events: &[Event]) -> Option<(AccountId, i128)> {
    events.iter().find_map(|e| match e {
        Event::MarginCallSet {
            account, amount, ..
        } => Some((*account, amount.0)),
        _ => None,
    })
}

#[test]
fn a_margin_call_refuses_exposure_increasing_orders_until_a_deposit_covers_it() {
    let mut d = driver();
    // Account 1 buys 10 SBER from account 3: long 10.
    accepted_id(&d.limit(3, 1, SBER, Side::Sell, REF, 10)).unwrap();
    let ev = d.limit(1, 1, SBER, Side::Buy, REF, 10);
    assert!(ev.iter().any(|e| matches!(e, Event::Trade { .. })));
    let resting = accepted_id(&d.limit(1, 2, GAZP, Side::Buy, 9_900, 5)).unwrap();
    let before = d.engine.state_digest();

    let ev = d.run(margin_call(1, 700)).to_vec();
    assert_eq!(margin_call_set(&ev), Some((AccountId(1), 700)));
    assert_eq!(d.engine.margin_called(AccountId(1)), 700);
    assert_ne!(d.engine.state_digest(), before, "the call is in the digest");
    check(&d);

    // More of the long, a new short elsewhere, a sell past flat: refused with the reason.
    for (cl, instrument, side, qty) in [
        (3, SBER, Side::Buy, 1),
        (4, GAZP, Side::Sell, 1),
        (5, SBER, Side::Sell, 11),
    ] {
        let ev = d.limit(1, cl, instrument, side, REF, qty);
        assert_eq!(
            reject_reason(&ev),
            Some(RejectReason::MarginCallOpen),
            "{side:?} {qty} of {instrument}"
        );
    }
    // A sell that reduces the long passes; a second one that, with it, would cross zero
    // does not.
    let reducing = accepted_id(&d.limit(1, 6, SBER, Side::Sell, 10_100, 6)).unwrap();
    let ev = d.limit(1, 7, SBER, Side::Sell, 10_100, 5);
    assert_eq!(reject_reason(&ev), Some(RejectReason::MarginCallOpen));
    // Growing the reducing order past the position is refused; shrinking it is taken.
    let grow = CommandBody::Replace(Replace {
        account: AccountId(1),
        cl_ord_id: ClOrdId(8),
        target: OrderRef {
            order_id: Some(reducing),
            orig_cl_ord_id: None,
        },
        price: None,
        qty: Some(Qty(11)),
    });
    assert_eq!(
        reject_reason(d.run(grow)),
        Some(RejectReason::MarginCallOpen)
    );
    let shrink = CommandBody::Replace(Replace {
        account: AccountId(1),
        cl_ord_id: ClOrdId(9),
        target: OrderRef {
            order_id: Some(reducing),
            orig_cl_ord_id: None,
        },
        price: None,
        qty: Some(Qty(4)),
    });
    assert!(d
        .run(shrink)
        .iter()
        .any(|e| matches!(e, Event::OrderReplaced { .. })));
    // Cancels pass; another account is not touched.
    let cancel = CommandBody::Cancel(Cancel {
        account: AccountId(1),
        cl_ord_id: ClOrdId(10),
        target: OrderRef {
            order_id: Some(resting),
            orig_cl_ord_id: None,
        },
    });
    assert_eq!(cancelled(d.run(cancel)), vec![resting]);
    assert!(accepted_id(&d.limit(2, 1, SBER, Side::Buy, 9_900, 1)).is_some());
    check(&d);

    // A deposit below the call reduces it; one that covers the rest closes it.
    let ev = d
        .run(CommandBody::Deposit {
            account: AccountId(1),
            amount: Cash(500),
        })
        .to_vec();
    assert_eq!(margin_call_set(&ev), Some((AccountId(1), 200)));
    assert_eq!(
        reject_reason(&d.limit(1, 11, SBER, Side::Buy, 9_900, 1)),
        Some(RejectReason::MarginCallOpen)
    );
    let ev = d
        .run(CommandBody::Deposit {
            account: AccountId(1),
            amount: Cash(300),
        })
        .to_vec();
    assert_eq!(margin_call_set(&ev), Some((AccountId(1), 0)));
    assert_eq!(d.engine.margin_called(AccountId(1)), 0);
    assert!(d.engine.margin_calls().is_empty());
    assert!(accepted_id(&d.limit(1, 12, SBER, Side::Buy, 9_900, 1)).is_some());
    // With no call open a deposit says nothing of calls.
    let ev = d
        .run(CommandBody::Deposit {
            account: AccountId(1),
            amount: Cash(1),
        })
        .to_vec();
    assert_eq!(margin_call_set(&ev), None);
    check(&d);
}

#[test]
fn a_margin_call_of_zero_closes_it_and_bad_calls_are_refused() {
    let mut d = driver();
    d.run(margin_call(2, 50));
    assert_eq!(
        reject_reason(&d.limit(2, 1, SBER, Side::Buy, 9_900, 1)),
        Some(RejectReason::MarginCallOpen)
    );
    check(&d);
    let ev = d.run(margin_call(2, 0)).to_vec();
    assert_eq!(margin_call_set(&ev), Some((AccountId(2), 0)));
    assert!(accepted_id(&d.limit(2, 2, SBER, Side::Buy, 9_900, 1)).is_some());
    for (account, amount, reason) in [
        (99, 1, RejectReason::UnknownAccount),
        (2, -1, RejectReason::AmountNotPositive),
        (2, CASH_AMOUNT_MAX + 1, RejectReason::Overflow),
    ] {
        let ev = d.run(margin_call(account, amount)).to_vec();
        assert_eq!(reject_reason(&ev), Some(reason), "{account} {amount}");
    }
    assert!(d.engine.margin_calls().is_empty());
    check(&d);
}

fn withdraw(account: u32, amount: i128) -> CommandBody {
    CommandBody::Withdraw {
        account: AccountId(account),
        amount: Cash(amount),
    }
}

fn clearing_debit(account: u32, amount: i128) -> CommandBody {
    CommandBody::ClearingDebit {
        account: AccountId(account),
        amount: Cash(amount),
    }
}

fn cash_of(d: &Driver, account: u32) -> i128 {
    d.engine.account(AccountId(account)).expect("known").cash.0
}

#[test]
fn a_withdrawal_is_refused_while_a_margin_call_is_open_and_a_clearing_debit_is_not() {
    let mut d = driver();
    d.run(margin_call(1, 700));
    let cash = cash_of(&d, 1);
    // The account's own withdrawal, however small, waits for the call to close.
    let ev = d.run(withdraw(1, 1)).to_vec();
    assert_eq!(reject_reason(&ev), Some(RejectReason::MarginCallOpen));
    assert_eq!(cash_of(&d, 1), cash);
    // Bad amounts keep their own reasons.
    assert_eq!(
        reject_reason(d.run(withdraw(1, 0))),
        Some(RejectReason::AmountNotPositive)
    );
    // The clearing house's debit goes through and leaves the call as it is.
    let ev = d.run(clearing_debit(1, 40)).to_vec();
    assert!(matches!(
        ev.as_slice(),
        [Event::CashChanged {
            reason: CashReason::Withdraw,
            amount: Cash(40),
            ..
        }]
    ));
    assert_eq!(cash_of(&d, 1), cash - 40);
    assert_eq!(d.engine.margin_called(AccountId(1)), 700);
    check(&d);
    // A deposit still goes towards the call; once it is closed, withdrawals pass again.
    let ev = d.run(CommandBody::Deposit {
        account: AccountId(1),
        amount: Cash(700),
    });
    assert_eq!(margin_call_set(ev), Some((AccountId(1), 0)));
    let ev = d.run(withdraw(1, 1)).to_vec();
    assert!(matches!(ev.as_slice(), [Event::CashChanged { .. }]));
    // Another account was never stopped.
    d.run(margin_call(1, 5));
    assert!(matches!(d.run(withdraw(2, 1)), [Event::CashChanged { .. }]));
    check(&d);
}

#[test]
fn an_unpaid_clearing_debit_is_refused_and_added_to_the_margin_call() {
    let mut d = driver();
    let cash = cash_of(&d, 3);
    let before = d.engine.state_digest();
    // More than the account has: refused, nothing moves, and the unpaid amount is called.
    let ev = d.run(clearing_debit(3, cash + 10)).to_vec();
    assert_eq!(reject_reason(&ev), Some(RejectReason::InsufficientFreeCash));
    assert_eq!(margin_call_set(&ev), Some((AccountId(3), cash + 10)));
    assert_eq!(cash_of(&d, 3), cash);
    assert_ne!(d.engine.state_digest(), before, "the call is in the digest");
    // A second one adds to the call open.
    let ev = d.run(clearing_debit(3, cash + 1)).to_vec();
    assert_eq!(margin_call_set(&ev), Some((AccountId(3), 2 * cash + 11)));
    // Exposure-increasing orders are refused until deposits cover it.
    assert_eq!(
        reject_reason(&d.limit(3, 1, SBER, Side::Buy, 9_900, 1)),
        Some(RejectReason::MarginCallOpen)
    );
    check(&d);
    // Refused for another reason (a bad amount, an unknown account), nothing is called.
    let ev = d.run(clearing_debit(2, 0)).to_vec();
    assert_eq!(reject_reason(&ev), Some(RejectReason::AmountNotPositive));
    assert_eq!(margin_call_set(&ev), None);
    assert_eq!(
        reject_reason(d.run(clearing_debit(99, 1))),
        Some(RejectReason::UnknownAccount)
    );
    assert_eq!(d.engine.margin_calls(), &[(AccountId(3), 2 * cash + 11)]);
    // The call survives a snapshot.
    let restored = Engine::restore(&d.engine.snapshot()).expect("restores");
    assert_eq!(restored.margin_called(AccountId(3)), 2 * cash + 11);
    check(&d);
}

/// A limit buy of account `account` on SBER sent for `firm` (a session entitled by firm).
fn order_for_firm(account: u32, cl_ord_id: u64, firm: Option<u32>) -> NewOrder {
    NewOrder {
        account: AccountId(account),
        cl_ord_id: ClOrdId(cl_ord_id),
        instrument: InstrumentId(SBER),
        side: Side::Buy,
        ord_type: OrdType::Limit,
        price: Price(9_900),
        qty: Qty(5),
        tif: TimeInForce::Day,
        expire_ts_ns: 0,
        display_qty: Qty(0),
        firm: firm.map(FirmId),
    }
}

#[test]
fn an_order_sent_for_a_firm_is_refused_for_another_firm_s_account() {
    let mut d = driver();
    let ev = d.order(order_for_firm(3, 1, Some(7)));
    assert_eq!(reject_reason(&ev), Some(RejectReason::AccountNotOfFirm));
    assert_eq!(accepted_id(&ev), None);
    // The firm's own accounts, and any account when no firm is named, are taken.
    assert!(accepted_id(&d.order(order_for_firm(2, 2, Some(7)))).is_some());
    assert!(accepted_id(&d.order(order_for_firm(3, 3, Some(8)))).is_some());
    assert!(accepted_id(&d.order(order_for_firm(3, 4, None))).is_some());
    check(&d);
}
