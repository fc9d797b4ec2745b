//! Clearing runs on the events of a real engine fed random orders: variation margin sums to
//! zero per instrument (rounding kept apart) and the movements conserve cash; margin, P&L and
//! obligations equal an independent recomputation from the trade list; the state and the
//! plan are deterministic; a second run pays only what the first did not.

use std::collections::BTreeMap;

use bourse_clearing::{
    compute_run, compute_run_with_fees, run_client_id, ClearingState, FeeRate, FeeSchedule,
    RunKind, RunPlan, SettlementRule,
};
use bourse_core::*;
use bourse_engine::fixtures::{equity, future, Driver};
use bourse_engine::EngineConfig;
use proptest::prelude::*;

const ACCOUNTS: u32 = 6;
const FUT: u32 = 1;
/// A future with 6 price decimals and a multiplier: its margin must be rounded to cash.
const FUT_FINE: u32 = 2;
const EQ: u32 = 3;

fn fine_future() -> Instrument {
    Instrument {
        instrument: InstrumentId(FUT_FINE),
        symbol: "FINE".into(),
        market: Market::Futures,
        price_scale: 6,
        tick: Price(7),
        lot_size: 1,
        multiplier: 3,
        initial_margin: Cash(10_0000),
        band_bps: 1000,
        reference_price: Price(1_000_006),
        volatility: Default::default(),
    }
}

fn definitions() -> Vec<Instrument> {
    vec![
        future(FUT, "FUT", 100_000),
        fine_future(),
        equity(EQ, "EQ", 10_000),
    ]
}

/// One random order: (account, instrument index, buy?, ticks from the reference, lots).
type Order = (u32, usize, bool, i64, i64);

fn orders() -> impl Strategy<Value = Vec<Order>> {
    prop::collection::vec(
        (0..ACCOUNTS, 0..3usize, any::<bool>(), -5i64..=5, 1i64..=20),
        1..120,
    )
}

/// Runs the orders through an engine; returns every event.
fn trade(orders: &[Order]) -> Vec<Event> {
    let mut d = Driver::new(EngineConfig {
        orders_max: 4096,
        accounts_max: 64,
        ..EngineConfig::default()
    });
    let mut events = Vec::new();
    for def in definitions() {
        d.add_instrument(def);
    }
    for a in 0..ACCOUNTS {
        d.add_account_spec(
            AccountSpec {
                account: AccountId(a),
                firm: FirmId(a % 2),
                may_short: true,
                stp: StpMode::None,
                stp_scope: StpScope::Account,
            },
            1_000_000_000_0000,
        );
        events.extend_from_slice(&d.events);
    }
    let defs = definitions();
    for (i, &(account, inst, buy, ticks, lots)) in orders.iter().enumerate() {
        let def = &defs[inst];
        let price = def.reference_price.0 + ticks * def.tick.0;
        let side = if buy { Side::Buy } else { Side::Sell };
        events.extend(d.limit(account, i as u64 + 1, def.instrument.0, side, price, lots));
    }
    events
}

fn fed(events: &[Event]) -> ClearingState {
    let mut s = ClearingState::new(1, definitions());
    for e in events {
        s.apply_event(0, e).unwrap();
    }
    s
}

/// Independently: every account's P&L on the whole-point future at `settle`, in cash units,
/// from the trade list alone (Σ side × lots × (settle − price)).
fn pnl_from_trades(events: &[Event], settle: i64) -> BTreeMap<AccountId, i128> {
    let mut pnl = BTreeMap::new();
    for e in events {
        if let Event::Trade {
            instrument,
            price,
            qty,
            buy,
            sell,
            ..
        } = e
        {
            if instrument.0 != FUT {
                continue;
            }
            let per_lot = (settle - price.0) as i128 * 1_0000;
            *pnl.entry(buy.account).or_insert(0) += qty.0 as i128 * per_lot;
            *pnl.entry(sell.account).or_insert(0) -= qty.0 as i128 * per_lot;
        }
    }
    pnl
}

fn rule() -> SettlementRule {
    SettlementRule {
        last_trades: 5,
        window_ns: None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn variation_margin_sums_to_zero_per_instrument_and_cash_is_conserved(o in orders()) {
        let state = fed(&trade(&o));
        let plan = compute_run(&state, 1, RunKind::Intermediate, &rule());
        let mut per_instrument: BTreeMap<InstrumentId, i128> = BTreeMap::new();
        for l in &plan.margin {
            *per_instrument.entry(l.instrument).or_default() += l.vm.0;
        }
        for (i, r) in &plan.rounding {
            let vm = per_instrument.get(i).copied().unwrap_or(0);
            prop_assert_eq!(vm + r.0, 0, "instrument {}", i);
            // Rounding down per account leaves the house less than one cash unit each.
            prop_assert!(r.0 >= 0 && r.0 < ACCOUNTS as i128);
        }
        prop_assert_eq!(plan.rounding.get(&InstrumentId(FUT)).map_or(0, |c| c.0), 0);
        let moved: i128 = plan.movements.iter().map(|m| m.amount.0).sum();
        let rounding: i128 = plan.rounding.values().map(|c| c.0).sum();
        prop_assert_eq!(moved + rounding, 0);
        let mut securities: BTreeMap<InstrumentId, (i64, i128)> = BTreeMap::new();
        for l in &plan.obligations {
            let s = securities.entry(l.instrument).or_default();
            s.0 += l.securities;
            s.1 += l.cash.0;
        }
        for (i, (units, _cash)) in &securities {
            prop_assert_eq!(*units, 0, "securities of {} conserved", i);
        }
    }

    #[test]
    fn margin_and_pnl_equal_a_recomputation_from_the_trade_list(o in orders()) {
        let events = trade(&o);
        let state = fed(&events);
        let plan = compute_run(&state, 1, RunKind::Intermediate, &rule());
        let Some(&settle) = plan.prices.get(&InstrumentId(FUT)) else {
            return Ok(());
        };
        let expected = pnl_from_trades(&events, settle.0);
        for (account, pnl) in &expected {
            let vm = plan
                .margin
                .iter()
                .find(|l| l.account == *account && l.instrument.0 == FUT)
                .map_or(0, |l| l.vm.0);
            prop_assert_eq!(vm, *pnl, "account {}", account);
            let p = state.positions().get(&(*account, InstrumentId(FUT))).unwrap();
            // Realised plus unrealised (against the average cost) is the whole P&L.
            let unrealised = p.qty as i128 * settle.0 as i128 * 1_0000 - p.cost_value;
            prop_assert_eq!(p.realised_value + unrealised, *pnl);
        }
        // The equity's obligations are what the core paid and received, trade by trade.
        let mut cash: BTreeMap<AccountId, i128> = BTreeMap::new();
        for e in &events {
            if let Event::Trade { instrument, price, qty, buy, sell, .. } = e {
                if instrument.0 == EQ {
                    let v = equity(EQ, "EQ", 1).notional_floor(*price, *qty).unwrap();
                    *cash.entry(buy.account).or_default() -= v;
                    *cash.entry(sell.account).or_default() += v;
                }
            }
        }
        for (account, c) in cash {
            let line = plan.obligations.iter().find(|l| l.account == account && l.instrument.0 == EQ);
            prop_assert_eq!(line.map_or(0, |l| l.cash.0), c);
        }
    }

    #[test]
    fn a_second_run_pays_only_the_change_since_the_first(o in orders(), split in 0usize..120) {
        let events = trade(&o);
        let split = split.min(events.len());
        let mut state = ClearingState::new(1, definitions());
        for e in &events[..split] {
            state.apply_event(0, e).unwrap();
        }
        let first = compute_run(&state, 1, RunKind::Intermediate, &rule());
        state.settle(&first);
        for e in &events[split..] {
            state.apply_event(0, e).unwrap();
        }
        let second = compute_run(&state, 2, RunKind::EndOfDay, &rule());
        let once = compute_run(&fed(&events), 1, RunKind::EndOfDay, &rule());
        // Paid in two runs = paid in one run at the end, account by account.
        let total = |plans: &[&bourse_clearing::RunPlan]| {
            let mut t: BTreeMap<(AccountId, InstrumentId), i128> = BTreeMap::new();
            for p in plans {
                for l in &p.margin {
                    *t.entry((l.account, l.instrument)).or_default() += l.vm.0;
                }
            }
            t.retain(|_, v| *v != 0);
            t
        };
        prop_assert_eq!(total(&[&first, &second]), total(&[&once]));
        // And nothing more is due at the same prices.
        state.settle(&second);
        let third = compute_run(&state, 3, RunKind::EndOfDay, &rule());
        prop_assert!(third.margin.iter().all(|l| l.vm.0 == 0) && third.movements.is_empty());
        prop_assert!(third.obligations.is_empty());
    }

    /// What a standby relies on when it learns a run after its feed passed the run's cut:
    /// settling a run later, after more trades, gives the state settling it at its cut gives.
    #[test]
    fn settling_a_run_after_later_trades_gives_the_same_state(
        o in orders(),
        split in 0usize..120,
    ) {
        let events = trade(&o);
        let split = split.min(events.len());
        let mut at_cut = ClearingState::new(1, definitions());
        for e in &events[..split] {
            at_cut.apply_event(0, e).unwrap();
        }
        let plan = compute_run(&at_cut, 1, RunKind::Intermediate, &rule());
        let mut late = at_cut.clone();
        at_cut.settle(&plan);
        for e in &events[split..] {
            at_cut.apply_event(0, e).unwrap();
            late.apply_event(0, e).unwrap();
        }
        late.settle(&plan);
        prop_assert_eq!(late.state_hash(), at_cut.state_hash());
    }

    /// The snapshot decoder gives back the state that wrote it, and refuses cut or damaged
    /// bytes with an error (never a panic).
    #[test]
    fn a_snapshot_decodes_to_the_state_that_wrote_it(
        o in orders(),
        cut_at in any::<prop::sample::Index>(),
        flip_at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let mut state = fed(&trade(&o));
        let plan = compute_run(&state, 1, RunKind::Intermediate, &rule());
        state.settle(&plan);
        let bytes = state.encode();
        let decoded = ClearingState::decode(1, definitions(), &bytes).unwrap();
        prop_assert_eq!(decoded.state_hash(), state.state_hash());
        prop_assert_eq!(
            compute_run(&decoded, 2, RunKind::EndOfDay, &rule()),
            compute_run(&state, 2, RunKind::EndOfDay, &rule())
        );
        prop_assert!(ClearingState::decode(2, definitions(), &bytes).is_err());
        let short = cut_at.index(bytes.len());
        prop_assert!(ClearingState::decode(1, definitions(), &bytes[..short]).is_err());
        let mut damaged = bytes.clone();
        damaged[flip_at.index(bytes.len())] ^= flip;
        // A flipped byte inside a value decodes to another state; anywhere else it is
        // refused. Either way the decoder returns.
        let _ = ClearingState::decode(1, definitions(), &damaged);
    }
}

/// The core's answers to a plan's commands on core 0 (a simulated core): each debit of an
/// account in `refuse` is refused for want of free cash and its amount added to the
/// account's margin call, as the engine does; everything else is applied. Feeds them to
/// `state` as the requests of the run's client id and returns them (for a standby to see
/// the same) with the cash the applied movements moved.
fn answer_run(
    state: &mut ClearingState,
    plan: &RunPlan,
    refuse: &dyn Fn(AccountId) -> bool,
) -> (Vec<Vec<Event>>, i128) {
    let client = run_client_id(plan.run_id, 0);
    let mut requests = Vec::new();
    let mut applied = 0;
    for (_, command) in plan.commands(0) {
        let at =
            |s: &ClearingState, a: AccountId| s.cash().get(&(0, a)).copied().unwrap_or_default();
        let events = match command.body {
            CommandBody::ClearingDebit { account, amount } if refuse(account) => vec![
                Event::CommandRejected {
                    reason: RejectReason::InsufficientFreeCash,
                    ts_ns: 0,
                },
                Event::MarginCallSet {
                    account,
                    amount: Cash(at(state, account).margin_called.0 + amount.0),
                    ts_ns: 0,
                },
            ],
            CommandBody::ClearingDebit { account, amount } => {
                applied -= amount.0;
                let cash = Cash(at(state, account).cash.0 - amount.0);
                vec![Event::CashChanged {
                    account,
                    reason: CashReason::Withdraw,
                    amount,
                    cash,
                    cash_free: cash,
                    ts_ns: 0,
                }]
            }
            CommandBody::Deposit { account, amount } => {
                applied += amount.0;
                let before = at(state, account);
                let cash = Cash(before.cash.0 + amount.0);
                let mut v = vec![Event::CashChanged {
                    account,
                    reason: CashReason::Deposit,
                    amount,
                    cash,
                    cash_free: cash,
                    ts_ns: 0,
                }];
                if before.margin_called.0 > 0 {
                    let left = (before.margin_called.0 - amount.0).max(0);
                    v.push(Event::MarginCallSet {
                        account,
                        amount: Cash(left),
                        ts_ns: 0,
                    });
                }
                v
            }
            CommandBody::MarginCall { account, amount } => {
                vec![Event::MarginCallSet {
                    account,
                    amount,
                    ts_ns: 0,
                }]
            }
            ref other => panic!("an intermediate run sends no {other:?}"),
        };
        state.apply_request(0, client, &events).unwrap();
        requests.push(events);
    }
    (requests, applied)
}

fn debts_total(state: &ClearingState) -> i128 {
    state.debts().values().map(|d| d.0).sum()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A debit the core refuses becomes the account's debt (and its margin call); per run
    /// the movements applied, the rounding kept and the change of the debts outstanding sum
    /// to zero; a standby that sees the core's answers before settling the run, and a state
    /// decoded from the snapshot, agree; after the accounts deposit, the next run collects
    /// every debt once and the run after it collects nothing.
    #[test]
    fn unpaid_variation_margin_is_carried_as_a_debt_and_collected_once_by_the_next_run(
        o in orders(),
        refuse in prop::collection::vec(any::<bool>(), ACCOUNTS as usize),
    ) {
        let mut state = fed(&trade(&o));
        let mut late = state.clone();
        let first = compute_run(&state, 1, RunKind::Intermediate, &rule());
        prop_assert!(first.debts.is_empty());
        state.settle(&first);
        let refused = |a: AccountId| refuse[a.0 as usize];
        let (requests, applied) = answer_run(&mut state, &first, &refused);
        let rounding: i128 = first.rounding.values().map(|c| c.0).sum();
        prop_assert_eq!(applied + rounding - debts_total(&state), 0, "run 1 conserves cash");
        for m in &first.movements {
            let debt = state.debts().get(&(0, m.account)).map_or(0, |d| d.0);
            let unpaid = if m.amount.0 < 0 && refused(m.account) { -m.amount.0 } else { 0 };
            prop_assert_eq!(debt, unpaid, "account {}", m.account.0);
            if unpaid > 0 {
                // Called for at least the unpaid amount, unless the run's own call set it.
                let called = state.cash()[&(0, m.account)].margin_called.0;
                let line = first.initial_margin.iter().find(|l| l.account == m.account && l.seq != 0);
                prop_assert_eq!(called, line.map_or(unpaid, |l| l.call.0));
            }
        }
        // A standby reading the core's answers before it settles the run agrees.
        for r in &requests {
            late.apply_request(0, run_client_id(1, 0), r).unwrap();
        }
        late.settle(&first);
        prop_assert_eq!(late.state_hash(), state.state_hash(), "settled late");
        let back = ClearingState::decode(1, definitions(), &state.encode()).unwrap();
        prop_assert_eq!(back.state_hash(), state.state_hash());
        prop_assert_eq!(back.debts(), state.debts());

        // The debtors deposit what they owe; the next run (no new trades: no margin)
        // debits exactly the debts, and settling and applying it leaves none.
        let owed = state.debts().clone();
        for (&(_, account), &d) in &owed {
            let cash = Cash(state.cash()[&(0, account)].cash.0 + d.0);
            state
                .apply_event(0, &Event::CashChanged {
                    account,
                    reason: CashReason::Deposit,
                    amount: d,
                    cash,
                    cash_free: cash,
                    ts_ns: 0,
                })
                .unwrap();
            // As the core does, the deposit goes towards the call.
            let called = state.cash()[&(0, account)].margin_called.0;
            let left = Cash((called - d.0).max(0));
            state
                .apply_event(0, &Event::MarginCallSet { account, amount: left, ts_ns: 0 })
                .unwrap();
        }
        let second = compute_run(&state, 2, RunKind::Intermediate, &rule());
        let collected: BTreeMap<(usize, AccountId), Cash> =
            second.debts.iter().map(|d| ((d.core, d.account), d.amount)).collect();
        prop_assert_eq!(&collected, &owed);
        let moved: BTreeMap<(usize, AccountId), Cash> = second
            .movements
            .iter()
            .map(|m| ((m.core, m.account), Cash(-m.amount.0)))
            .collect();
        prop_assert_eq!(&moved, &owed);
        state.settle(&second);
        let (_, applied) = answer_run(&mut state, &second, &|_| false);
        let rounding: i128 = second.rounding.values().map(|c| c.0).sum();
        let before: i128 = owed.values().map(|d| d.0).sum();
        prop_assert_eq!(applied + rounding - (debts_total(&state) - before), 0, "run 2 conserves cash");
        prop_assert!(state.debts().is_empty());
        let third = compute_run(&state, 3, RunKind::Intermediate, &rule());
        prop_assert!(third.debts.is_empty() && third.movements.is_empty());
    }
}

#[test]
fn the_same_events_give_the_same_state_and_plan() {
    let o: Vec<Order> = (0..200)
        .map(|i| {
            (
                (i * 7 % 6) as u32,
                i % 3,
                i % 2 == 0,
                (i as i64 * 3) % 11 - 5,
                1 + i as i64 % 9,
            )
        })
        .collect();
    let events = trade(&o);
    let (a, b) = (fed(&events), fed(&events));
    assert!(a.trades() > 20, "the flow trades");
    assert_eq!(a.state_hash(), b.state_hash());
    let (pa, pb) = (
        compute_run(&a, 9, RunKind::Intermediate, &rule()),
        compute_run(&b, 9, RunKind::Intermediate, &rule()),
    );
    assert_eq!(pa, pb);
    // Leaving out the last trade changes the hash; feeding it again restores it.
    let last_trade = events
        .iter()
        .rposition(|e| matches!(e, Event::Trade { .. }))
        .unwrap();
    let mut c = fed(&events[..last_trade]);
    assert_ne!(
        c.state_hash(),
        a.state_hash(),
        "the hash covers the last trade"
    );
    for e in &events[last_trade..] {
        c.apply_event(0, e).unwrap();
    }
    assert_eq!(c.state_hash(), a.state_hash());
}

#[test]
fn the_settlement_price_is_the_vwap_of_the_last_trades_on_the_tick() {
    let def = future(FUT, "FUT", 100_000);
    let mut s = ClearingState::new(1, [def]);
    let fill = |account| Fill {
        order_id: OrderId(1),
        account: AccountId(account),
        cl_ord_id: ClOrdId(1),
        qty_leaves: Qty(0),
        qty_filled: Qty(1),
    };
    for (ts, price, qty) in [(1, 90_000, 100), (2, 100_000, 1), (3, 100_020, 3)] {
        s.apply_event(
            0,
            &Event::Trade {
                trade_id: TradeId(ts),
                instrument: InstrumentId(FUT),
                price: Price(price),
                qty: Qty(qty),
                aggressor: Side::Buy,
                buy: fill(1),
                sell: fill(2),
                auction: false,
                ts_ns: ts * 1_000_000_000,
            },
        )
        .unwrap();
    }
    let price = |last_trades, window_ns| {
        bourse_clearing::settlement_prices(
            &s,
            &SettlementRule {
                last_trades,
                window_ns,
            },
        )[&InstrumentId(FUT)]
    };
    // (100,000 + 3 × 100,020) / 4 = 100,015, to the nearest tick of 10 (halves up).
    assert_eq!(price(2, None), Price(100_020));
    assert_eq!(price(1, None), Price(100_020));
    // All three: (9,000,000 + 100,000 + 300,060) / 104 = 90,385.2 → 90,390.
    assert_eq!(price(3, None), Price(90_390));
    // A window of 1.5 s before the newest trade leaves the first trade out.
    assert_eq!(price(3, Some(1_500_000_000)), Price(100_020));
}

/// The instruments' definitions from their `InstrumentAdded` events, as an operator's
/// addition at run time gives them (the engine's events for `definitions()`).
fn added_events() -> Vec<Event> {
    let mut d = Driver::new(EngineConfig::default());
    let mut events = Vec::new();
    for def in definitions() {
        events.extend_from_slice(d.run(CommandBody::AddInstrument(def)));
    }
    events
}

#[test]
fn definitions_are_learned_from_the_stream_kept_in_the_snapshot_and_required() {
    let o: Vec<Order> = (0..40)
        .map(|k| {
            (
                k % ACCOUNTS,
                (k % 3) as usize,
                k % 2 == 0,
                0,
                1 + i64::from(k % 4),
            )
        })
        .collect();
    let traded = trade(&o);
    assert!(traded.iter().any(|e| matches!(e, Event::Trade { .. })));
    // Given no instruments file, a trade with no definition on the stream stops clearing,
    // naming the instrument.
    let mut blind = ClearingState::new(1, Vec::new());
    let err = traded
        .iter()
        .try_for_each(|e| blind.apply_event(0, e))
        .unwrap_err();
    assert!(err.to_string().contains("never given"), "{err}");
    // With the stream's definitions first, it clears as if it had been given the file.
    let mut learned = ClearingState::new(1, Vec::new());
    for e in added_events().iter().chain(&traded) {
        learned.apply_event(0, e).unwrap();
    }
    let configured = fed(&traded);
    assert_eq!(learned.positions(), configured.positions());
    // The same run, but for the state hash (the learned definitions are part of the state).
    let mut from_stream = compute_run(&learned, 1, RunKind::EndOfDay, &rule());
    let mut from_file = compute_run(&configured, 1, RunKind::EndOfDay, &rule());
    assert_ne!(from_stream.state_hash, from_file.state_hash);
    (from_stream.state_hash, from_file.state_hash) = (0, 0);
    assert_eq!(from_stream, from_file);
    // A clearing restarted from the snapshot, with no file either, still knows them.
    let decoded = ClearingState::decode(1, Vec::new(), &learned.encode()).unwrap();
    assert_eq!(decoded.state_hash(), learned.state_hash());
    assert_eq!(
        decoded.definition(InstrumentId(FUT_FINE)),
        Some(&fine_future())
    );
}

/// The venue's account in the fee tests (no trader uses it).
const VENUE: u32 = 99;

/// Futures pay by value and per lot (the fine future its own rate), equities by value.
fn fee_schedule() -> FeeSchedule {
    FeeSchedule {
        venue_account: VENUE,
        rates: vec![
            FeeRate {
                instrument: Some(FUT_FINE),
                taker_ppm: 333,
                maker_per_lot: "0.0007".into(),
                ..FeeRate::default()
            },
            FeeRate {
                market: Some(Market::Futures),
                maker_ppm: 50,
                taker_ppm: 200,
                taker_per_lot: "0.25".into(),
                ..FeeRate::default()
            },
            FeeRate {
                maker_ppm: 100,
                taker_ppm: 300,
                ..FeeRate::default()
            },
        ],
    }
}

/// Independently, from the trade list: each account's fee per instrument, in cash units
/// (value traded × rate, rounded down once, plus lots × the amount per lot).
fn fees_from_trades(events: &[Event]) -> BTreeMap<(AccountId, InstrumentId), i128> {
    // (maker value, taker value, maker lots, taker lots) in value units.
    let mut base: BTreeMap<(AccountId, InstrumentId), (i128, i128, i128, i128)> = BTreeMap::new();
    let defs = definitions();
    for e in events {
        let Event::Trade {
            instrument,
            price,
            qty,
            aggressor,
            buy,
            sell,
            ..
        } = e
        else {
            continue;
        };
        let def = defs.iter().find(|d| d.instrument == *instrument).unwrap();
        let up = 10i128.pow(u32::from(def.price_scale.max(4) - def.price_scale));
        let value = i128::from(price.0)
            * i128::from(qty.0)
            * i128::from(def.lot_size)
            * i128::from(def.multiplier)
            * up;
        let (taker, maker) = if *aggressor == Side::Buy {
            (buy.account, sell.account)
        } else {
            (sell.account, buy.account)
        };
        let t = base.entry((taker, *instrument)).or_default();
        t.1 += value;
        t.3 += i128::from(qty.0);
        let m = base.entry((maker, *instrument)).or_default();
        m.0 += value;
        m.2 += i128::from(qty.0);
    }
    let mut out = BTreeMap::new();
    for ((account, instrument), (mv, tv, ml, tl)) in base {
        let def = defs.iter().find(|d| d.instrument == instrument).unwrap();
        // (maker ppm, taker ppm, maker per lot, taker per lot in cash units), as scheduled.
        let (mp, tp, mpl, tpl) = match (instrument.0, def.market) {
            (FUT_FINE, _) => (0, 333, 7, 0),
            (_, Market::Futures) => (50, 200, 0, 2_500),
            _ => (100, 300, 0, 0),
        };
        let down = 10i128.pow(u32::from(def.price_scale.max(4) - 4)) * 1_000_000;
        let fee = (mv * mp + tv * tp).div_euclid(down) + ml * mpl + tl * tpl;
        if fee != 0 {
            out.insert((account, instrument), fee);
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn fees_equal_a_recomputation_from_the_trades_go_to_the_venue_and_conserve_cash(
        o in orders(),
        split in 0usize..1000,
    ) {
        let events = trade(&o);
        let state = fed(&events);
        let schedule = fee_schedule();
        let plan = compute_run_with_fees(&state, 1, RunKind::Intermediate, &rule(), Some(&schedule));
        // Each account's fee per instrument is the recomputation's.
        let charged: BTreeMap<(AccountId, InstrumentId), i128> = plan
            .fees
            .iter()
            .map(|l| ((l.account, l.instrument), l.fee.0))
            .collect();
        prop_assert_eq!(&charged, &fees_from_trades(&events));
        // The venue receives them all; the movements and the rounding still sum to zero.
        let to_venue: i128 = plan
            .movements
            .iter()
            .filter(|m| m.account == AccountId(VENUE))
            .map(|m| m.amount.0)
            .sum();
        prop_assert_eq!(to_venue, charged.values().sum::<i128>());
        let moved: i128 = plan.movements.iter().map(|m| m.amount.0).sum();
        let rounding: i128 = plan.rounding.values().map(|c| c.0).sum();
        prop_assert_eq!(moved + rounding, 0);
        // Each account moves its margin less its fees.
        let mut net: BTreeMap<AccountId, i128> = BTreeMap::new();
        for l in &plan.margin {
            *net.entry(l.account).or_default() += l.vm.0;
        }
        for l in &plan.fees {
            *net.entry(l.account).or_default() -= l.fee.0;
        }
        for m in plan.movements.iter().filter(|m| m.account != AccountId(VENUE)) {
            prop_assert_eq!(m.amount.0, net[&m.account], "account {}", m.account);
        }

        // Settled, a run charges nothing again, even settled after later trades: the trades
        // after its cut are charged by the next run (what was under a cash unit waits too).
        let k = split % (events.len() + 1);
        let mut late = fed(&events[..k]);
        let first = compute_run_with_fees(&late, 1, RunKind::Intermediate, &rule(), Some(&schedule));
        let bases = |s: &ClearingState| -> BTreeMap<_, _> {
            s.fee_bases().iter().map(|(k, b)| (*k, b)).collect()
        };
        let before = bases(&late);
        for e in &events[k..] {
            late.apply_event(0, e).unwrap();
        }
        late.settle(&first);
        let after = fed(&events[k..]);
        let mut expected = bases(&after);
        for (key, b) in &before {
            if !first.fees.iter().any(|l| (l.account, l.instrument) == *key) {
                let e = expected.entry(*key).or_default();
                e.maker_value += b.maker_value;
                e.taker_value += b.taker_value;
                e.maker_lots += b.maker_lots;
                e.taker_lots += b.taker_lots;
            }
        }
        prop_assert_eq!(bases(&late), expected);
        for l in &first.fees {
            prop_assert!(late.fees_paid(l.account).0 >= l.fee.0);
        }
        let mut all = fed(&events);
        all.settle(&plan);
        let again = compute_run_with_fees(&all, 2, RunKind::EndOfDay, &rule(), Some(&schedule));
        prop_assert!(again.fees.is_empty());
        prop_assert!(again.movements.iter().all(|m| m.account != AccountId(VENUE)));
        // The paid fees are in the snapshot.
        let decoded = ClearingState::decode(1, definitions(), &all.encode()).unwrap();
        prop_assert_eq!(decoded.state_hash(), all.state_hash());
        for a in 0..ACCOUNTS {
            let paid: i128 = plan.fees.iter().filter(|l| l.account == AccountId(a)).map(|l| l.fee.0).sum();
            prop_assert_eq!(decoded.fees_paid(AccountId(a)).0, paid);
        }
    }
}

/// Per account and instrument, independently from the trade list: the net lots of `trades`.
fn net_lots(events: &[Event]) -> BTreeMap<(AccountId, InstrumentId), i64> {
    let mut out = BTreeMap::new();
    for e in events {
        if let Event::Trade {
            instrument,
            qty,
            buy,
            sell,
            ..
        } = e
        {
            *out.entry((buy.account, *instrument)).or_insert(0) += qty.0;
            *out.entry((sell.account, *instrument)).or_insert(0) -= qty.0;
        }
    }
    out
}

/// An end-of-day plan as the node dates it, rolling to `next` (`YYYY-MM-DD`).
fn end_of_day(state: &ClearingState, run_id: u32, next: &str) -> bourse_clearing::RunPlan {
    let mut plan = compute_run(state, run_id, RunKind::EndOfDay, &rule());
    plan.next_business_date = Some(next.into());
    plan
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Three business days, two ends of day: each day starts from the day before's closing
    /// position (as recomputed from the trade list), its traded lots and realised and
    /// variation figures start again at zero, its opening position is marked from the end of
    /// day's settlement price (SMTM) and its trades from their prices (TVAR), which together
    /// are the day's variation; the business date moves on; and a standby settling the end
    /// of day after the next day's trades, or a node restarted from a snapshot, has the
    /// same state.
    #[test]
    fn end_of_day_rolls_positions_to_the_next_business_day_as_the_trades_say(
        o in orders(),
        first in 0usize..400,
        second in 0usize..400,
    ) {
        let events = trade(&o);
        let (a, b) = (first.min(second).min(events.len()), first.max(second).min(events.len()));
        let mut state = ClearingState::new(1, definitions());
        for e in &events[..a] {
            state.apply_event(0, e).unwrap();
        }
        let day1 = end_of_day(&state, 1, "2026-11-27");
        state.settle(&day1);
        prop_assert_eq!(state.business_date(), Some(20261127));
        // Nothing traded yet on the new day: every figure of the day is zero.
        // A position the first end of day left flat is gone, unless its instrument rounds
        // margin to cash and a sub-cash credit is left (FINE): the whole-point future and
        // the equity keep exactly the open positions.
        let open_at_first = net_lots(&events[..a]);
        for (&(account, instrument), p) in state.positions() {
            if instrument.0 != FUT_FINE {
                prop_assert!(p.qty != 0, "flat {} {} kept", account, instrument);
            }
        }
        for (&(account, instrument), &lots) in &open_at_first {
            if lots != 0 {
                prop_assert!(state.positions().contains_key(&(account, instrument)));
            }
        }
        for p in state.positions().values() {
            prop_assert_eq!(p.sod.qty, p.qty);
            prop_assert_eq!((p.day_lots_bought(), p.day_lots_sold()), (0, 0));
            prop_assert_eq!(p.day_realised_value(), 0);
            prop_assert_eq!(p.day_paid_value(), 0);
            prop_assert_eq!(p.day_vm_paid().0, 0);
        }
        for e in &events[a..b] {
            state.apply_event(0, e).unwrap();
        }
        let before_roll = state.clone();
        let day2 = end_of_day(&state, 2, "2026-11-30");
        state.settle(&day2);
        prop_assert_eq!(state.business_date(), Some(20261130));
        let mut late = before_roll;
        for e in &events[b..] {
            state.apply_event(0, e).unwrap();
            late.apply_event(0, e).unwrap();
        }
        late.settle(&day2);
        prop_assert_eq!(late.state_hash(), state.state_hash(), "settled late");
        let decoded = ClearingState::decode(1, definitions(), &state.encode()).unwrap();
        prop_assert_eq!(decoded.state_hash(), state.state_hash(), "from a snapshot");

        // The third day's opening positions are the trades up to the second end of day.
        let opening = net_lots(&events[..b]);
        let day3 = &events[b..];
        let closing = net_lots(&events);
        for (&(account, instrument), p) in state.positions() {
            let sod = opening.get(&(account, instrument)).copied().unwrap_or(0);
            prop_assert_eq!(p.sod.qty, sod, "account {} {}", account, instrument);
            prop_assert_eq!(p.qty, closing.get(&(account, instrument)).copied().unwrap_or(0));
            let (mut bought, mut sold) = (0, 0);
            for e in day3 {
                if let Event::Trade { instrument: i, qty, buy, sell, .. } = e {
                    if *i == instrument && buy.account == account { bought += qty.0; }
                    if *i == instrument && sell.account == account { sold += qty.0; }
                }
            }
            prop_assert_eq!((p.day_lots_bought(), p.day_lots_sold()), (bought, sold));
        }

        // The whole-point future: SMTM and TVAR against a recomputation, and their sum is
        // the day's variation (no rounding at whole points).
        let fut = InstrumentId(FUT);
        let Some(inst) = state.instruments().get(&fut) else { return Ok(()); };
        let mark = inst.recent.back().unwrap().price;
        let def = state.definition(fut).unwrap().clone();
        // The day's trades marked to the mark: their trade variation.
        let tvar = pnl_from_trades(day3, mark.0);
        for (&(account, instrument), p) in state.positions() {
            if instrument != fut {
                continue;
            }
            let amounts: BTreeMap<&str, i128> =
                bourse_clearing::fix::futures_amounts(&def, &p, mark, inst.sod_settlement)
                    .into_iter()
                    .collect();
            let smtm = match inst.sod_settlement {
                Some(s) => p.sod.qty as i128 * (mark.0 - s.0) as i128 * 1_0000,
                None => 0,
            };
            prop_assert_eq!(inst.sod_settlement, day2.prices.get(&fut).copied());
            prop_assert_eq!(amounts["SMTM"], smtm, "account {}", account);
            prop_assert_eq!(amounts["TVAR"], tvar.get(&account).copied().unwrap_or(0));
            prop_assert_eq!(
                amounts["SMTM"] + amounts["TVAR"],
                amounts["IMTM"] + p.day_vm_paid().0,
                "the day's variation, account {}", account
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Initial margin per account is |lots| × the margin per lot over its futures, recomputed
    /// from the trade list; the call is what the collateral after the movements lacks; an
    /// account is sent a `MarginCall` exactly when it is short or has a call open (which a
    /// call of 0 then closes); the run's commands are numbered 1, 2, 3 with the calls after
    /// the movements; the open call survives the snapshot.
    #[test]
    fn initial_margin_and_margin_calls_follow_the_positions_and_the_collateral(
        orders in orders(),
        thin in 0..ACCOUNTS,
    ) {
        let events = trade(&orders);
        let mut state = fed(&events);
        // Account `thin` is left with one unit of cash on the core; the next one has a call
        // open from an earlier run.
        state
            .apply_event(0, &Event::CashChanged {
                account: AccountId(thin),
                reason: CashReason::SetCollateral,
                amount: Cash(1_0000),
                cash: Cash(1_0000),
                cash_free: Cash(0),
                ts_ns: 0,
            })
            .unwrap();
        let open = AccountId((thin + 1) % ACCOUNTS);
        state
            .apply_event(0, &Event::MarginCallSet { account: open, amount: Cash(5), ts_ns: 0 })
            .unwrap();
        let plan = compute_run(&state, 1, RunKind::Intermediate, &rule());

        let defs = definitions();
        let mut im: BTreeMap<AccountId, i128> = BTreeMap::new();
        for ((account, instrument), lots) in net_lots(&events) {
            let def = defs.iter().find(|d| d.instrument == instrument).unwrap();
            if def.market == Market::Futures {
                *im.entry(account).or_default() += (lots as i128).abs() * def.initial_margin.0;
            }
        }
        let mut net: BTreeMap<AccountId, i128> = BTreeMap::new();
        for m in &plan.movements {
            *net.entry(m.account).or_default() += m.amount.0;
        }
        for l in &plan.initial_margin {
            let want_im = im.get(&l.account).copied().unwrap_or(0);
            prop_assert_eq!(l.initial_margin.0, want_im, "account {}", l.account.0);
            let cash = state.cash().get(&(0, l.account)).map_or(0, |c| c.cash.0);
            let collateral = cash + net.get(&l.account).copied().unwrap_or(0);
            prop_assert_eq!(l.collateral.0, collateral);
            prop_assert_eq!(l.call.0, (want_im - collateral).max(0));
            prop_assert_eq!(l.seq != 0, l.call.0 != 0 || l.account == open);
        }
        for (account, v) in &im {
            prop_assert_eq!(
                plan.initial_margin.iter().any(|l| l.account == *account),
                *v != 0 || *account == open
            );
        }
        prop_assert!(plan.initial_margin.iter().any(|l| l.account == open && l.seq != 0));
        let commands = plan.commands(0);
        let seqs: Vec<u64> = commands.iter().map(|c| c.0).collect();
        prop_assert_eq!(&seqs, &(1..=seqs.len() as u64).collect::<Vec<_>>());
        let first_call = plan.movements.len();
        for (i, (_, c)) in commands.iter().enumerate() {
            let is_call = matches!(c.body, CommandBody::MarginCall { .. });
            prop_assert_eq!(is_call, i >= first_call);
        }

        let back = ClearingState::decode(1, definitions(), &state.encode()).unwrap();
        prop_assert_eq!(back.state_hash(), state.state_hash());
        prop_assert_eq!(back.cash()[&(0, open)].margin_called.0, 5);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The roll's rebase of flat positions changes no money: after an end of day that rolls
    /// (and drops what it left flat) and after the same run settled without a roll, the
    /// next run pays every position the same margin, with the same rounding and movements,
    /// the fine-priced future's sub-cash remainders included.
    #[test]
    fn rebasing_flat_positions_at_the_roll_leaves_every_later_margin_as_it_was(
        o in orders(),
        split in 0usize..400,
    ) {
        rolled_and_unrolled_agree(&o, split)?;
    }
}

/// A case the property once found: an instrument traded to flat before the cut had a
/// rounding entry of zero in the unrolled state's next run and none in the rolled one's.
#[test]
fn an_instrument_left_flat_before_the_roll_has_no_rounding_entry_either_way() {
    let o = vec![(2, 0, true, 2, 1), (2, 0, false, 0, 1)];
    rolled_and_unrolled_agree(&o, 10).unwrap();
}

/// The body of the rebase property: the next run after a rolling end of day equals the
/// next run after the same end of day settled without a roll.
fn rolled_and_unrolled_agree(o: &[Order], split: usize) -> Result<(), TestCaseError> {
    let events = trade(o);
    let split = split.min(events.len());
    let mut rolled = fed(&events[..split]);
    let plan = end_of_day(&rolled, 1, "2026-11-27");
    let mut unrolled = rolled.clone();
    rolled.settle(&plan);
    let mut no_roll = plan.clone();
    no_roll.kind = RunKind::Intermediate;
    unrolled.settle(&no_roll);
    for e in &events[split..] {
        rolled.apply_event(0, e).unwrap();
        unrolled.apply_event(0, e).unwrap();
    }
    let next = |s: &ClearingState| {
        let p = compute_run(s, 2, RunKind::Intermediate, &rule());
        let vm: Vec<_> = p
            .margin
            .iter()
            .filter(|l| l.vm.0 != 0)
            .map(|l| (l.account, l.instrument, l.vm))
            .collect();
        (vm, p.rounding, p.movements, p.obligations)
    };
    prop_assert_eq!(next(&rolled), next(&unrolled));
    Ok(())
}

/// One crossing pair of orders on the fixture engine: `buyer` rests a bid, `seller` hits it.
fn cross(
    d: &mut Driver,
    ids: &mut u64,
    instrument: u32,
    buyer: u32,
    seller: u32,
    ticks: i64,
    lots: i64,
) -> Vec<Event> {
    let def = definitions()
        .into_iter()
        .find(|d| d.instrument.0 == instrument)
        .unwrap();
    let price = def.reference_price.0 + ticks * def.tick.0;
    *ids += 2;
    let mut out = d.limit(buyer, *ids - 1, instrument, Side::Buy, price, lots);
    out.extend(d.limit(seller, *ids, instrument, Side::Sell, price, lots));
    out
}

/// A position closed during a day is rolled once (the day's own plan and report show its
/// trades) and is then gone: the next day's plan has no line for it, the report and the FIX
/// answer no account line or position, while the open positions carry on.
#[test]
fn a_position_closed_during_a_day_is_absent_from_the_next_days_plan_and_reports() {
    let mut d = Driver::new(EngineConfig {
        orders_max: 4096,
        accounts_max: 64,
        ..EngineConfig::default()
    });
    for def in definitions() {
        d.add_instrument(def);
    }
    let mut events = Vec::new();
    for a in 0..ACCOUNTS {
        d.add_account_spec(
            AccountSpec {
                account: AccountId(a),
                firm: FirmId(a % 2),
                may_short: true,
                stp: StpMode::None,
                stp_scope: StpScope::Account,
            },
            1_000_000_000_0000,
        );
        events.extend_from_slice(&d.events);
    }
    let mut ids = 0;
    // Day 1: account 0 buys 3 futures from 1 and sells them on to 2 a tick higher; account
    // 3 buys 5 shares from 4 and sells them on to 5. Accounts 0 and 3 end the day flat.
    events.extend(cross(&mut d, &mut ids, FUT, 0, 1, 0, 3));
    events.extend(cross(&mut d, &mut ids, FUT, 2, 0, 1, 3));
    events.extend(cross(&mut d, &mut ids, EQ, 3, 4, 0, 5));
    events.extend(cross(&mut d, &mut ids, EQ, 5, 3, 1, 5));
    let mut state = fed(&events);
    let day1 = end_of_day(&state, 1, "2026-11-27");
    let flat = [
        (AccountId(0), InstrumentId(FUT)),
        (AccountId(3), InstrumentId(EQ)),
    ];
    for (account, instrument) in flat {
        assert!(day1
            .roll
            .iter()
            .any(|l| l.account == account && l.instrument == instrument && l.qty == 0));
    }
    let report1 = bourse_clearing::Report::new(&state, &day1, &BTreeMap::new());
    assert!(
        report1.accounts.iter().any(|l| l.account == 0),
        "day 1 reports the realised profit"
    );
    state.settle(&day1);
    for key in flat {
        assert!(
            !state.positions().contains_key(&key),
            "{key:?} dropped at the roll"
        );
    }
    assert_eq!(
        state
            .positions()
            .get(&(AccountId(1), InstrumentId(FUT)))
            .unwrap()
            .sod
            .qty,
        -3
    );
    assert_eq!(
        state
            .positions()
            .get(&(AccountId(2), InstrumentId(FUT)))
            .unwrap()
            .sod
            .qty,
        3
    );

    // Day 2: accounts 1 and 2 trade; 0 and 3 do not.
    let mut day2_events = Vec::new();
    for e in cross(&mut d, &mut ids, FUT, 1, 2, 2, 1) {
        state.apply_event(0, &e).unwrap();
        day2_events.push(e);
    }
    let day2 = end_of_day(&state, 2, "2026-11-30");
    for (account, instrument) in flat {
        let about = |a: AccountId, i: InstrumentId| a == account && i == instrument;
        assert!(!day2.roll.iter().any(|l| about(l.account, l.instrument)));
        assert!(!day2.margin.iter().any(|l| about(l.account, l.instrument)));
        assert!(!day2
            .obligations
            .iter()
            .any(|l| about(l.account, l.instrument)));
        assert!(bourse_clearing::fix::intraday(&state, None, account).is_empty());
    }
    // Only the open positions are rolled again.
    let rolled: Vec<(u32, u32, i64)> = day2
        .roll
        .iter()
        .map(|l| (l.account.0, l.instrument.0, l.qty))
        .collect();
    assert_eq!(
        rolled,
        vec![(1, FUT, -2), (2, FUT, 2), (4, EQ, -5), (5, EQ, 5)]
    );
    let report2 = bourse_clearing::Report::new(&state, &day2, &BTreeMap::new());
    let listed: Vec<u32> = report2.accounts.iter().map(|l| l.account).collect();
    assert!(!listed.contains(&0) && !listed.contains(&3), "{listed:?}");
    assert!(listed.contains(&1) && listed.contains(&2), "{listed:?}");

    // A standby that settles the first end of day after day 2's trades agrees.
    let mut late = fed(&events);
    for e in &day2_events {
        late.apply_event(0, e).unwrap();
    }
    late.settle(&day1);
    assert_eq!(late.state_hash(), state.state_hash());
}

/// A future whose trade values exceed 64 bits: a price of 10^15 at a multiplier of 10^4.
fn huge_future() -> Instrument {
    Instrument {
        instrument: InstrumentId(9),
        symbol: "HUGE".into(),
        market: Market::Futures,
        price_scale: 0,
        tick: Price(1),
        lot_size: 1,
        multiplier: 10_000,
        initial_margin: Cash(1),
        band_bps: 1000,
        reference_price: Price(1_000_000_000_000_000),
        volatility: Default::default(),
    }
}

fn trade_of(instrument: u32, n: u64, buyer: u32, seller: u32, price: i64, lots: i64) -> Event {
    let fill = |account| Fill {
        order_id: OrderId(n),
        account: AccountId(account),
        cl_ord_id: ClOrdId(n),
        qty_leaves: Qty(0),
        qty_filled: Qty(lots),
    };
    Event::Trade {
        trade_id: TradeId(n),
        instrument: InstrumentId(instrument),
        price: Price(price),
        qty: Qty(lots),
        aggressor: Side::Buy,
        buy: fill(buyer),
        sell: fill(seller),
        auction: false,
        ts_ns: n,
    }
}

#[test]
fn a_position_beyond_64_bits_is_kept_exact_through_a_run_and_the_snapshot() {
    let mut state = ClearingState::new(1, vec![huge_future(), future(FUT, "FUT", 100_000)]);
    let price = 1_000_000_000_000_000i64;
    state
        .apply_event(0, &trade_of(9, 1, 1, 2, price, 3))
        .unwrap();
    state
        .apply_event(0, &trade_of(9, 2, 3, 4, price + 1, 1))
        .unwrap();
    // A small position beside them stays packed.
    state
        .apply_event(0, &trade_of(FUT, 3, 1, 2, 100_000, 2))
        .unwrap();
    assert_eq!(state.positions().len(), 6);
    assert_eq!(
        state.positions().wide_len(),
        4,
        "the HUGE positions are held whole"
    );
    // Value units: the price × lots × multiplier × 10^4 (cash scale), beyond i64::MAX.
    let value = price as i128 * 3 * 10_000 * 10_000;
    assert!(value > i64::MAX as i128);
    let p = state
        .positions()
        .get(&(AccountId(1), InstrumentId(9)))
        .unwrap();
    assert_eq!((p.qty, p.paid_value, p.cost_value), (3, value, value));
    let keys: Vec<_> = state.positions().iter().map(|(k, _)| *k).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted, "iteration is in key order");

    let plan = compute_run(&state, 1, RunKind::Intermediate, &rule());
    // Account 1's margin, recomputed in 128 bits: 3 lots marked at the settlement price
    // less what it paid (value units are cash units here: price scale 0).
    let settle = plan.prices[&InstrumentId(9)].0 as i128;
    let vm_of = |account| {
        plan.margin
            .iter()
            .find(|l| (l.account, l.instrument) == (AccountId(account), InstrumentId(9)))
            .map(|l| l.vm.0)
    };
    assert_eq!(vm_of(1), Some(3 * settle * 10_000 * 10_000 - value));
    assert_eq!(vm_of(2), Some(value - 3 * settle * 10_000 * 10_000));
    state.settle(&plan);
    let bytes = state.encode();
    assert_eq!(bytes.len() as u64, state.encoded_len());
    let back =
        ClearingState::decode(1, vec![huge_future(), future(FUT, "FUT", 100_000)], &bytes).unwrap();
    assert_eq!(back.state_hash(), state.state_hash());
    assert_eq!(back.positions(), state.positions());
    assert_eq!(back.positions().wide_len(), 4);
}

#[test]
fn a_snapshot_of_the_older_format_is_refused_naming_it() {
    let events = trade(&[(0, 0, true, 0, 5), (1, 0, false, 0, 5)]);
    let state = fed(&events);
    let mut bytes = state.encode();
    bytes[..8].copy_from_slice(b"BCLEAR06");
    let err = ClearingState::decode(1, definitions(), &bytes)
        .unwrap_err()
        .to_string();
    assert!(err.contains("format 06 (magic BCLEAR06)"), "{err}");
    assert!(err.contains("reads only format 07"), "{err}");
    bytes[..8].copy_from_slice(b"NOTCLEAR");
    let err = ClearingState::decode(1, definitions(), &bytes)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a clearing snapshot"), "{err}");
}
