//! Differential test: the engine against the deliberately simple reference model
//! (`reference/mod.rs`) on seeded random flow.
//!
//! After every command the two must report the same outcomes (accepts, rejects with the same
//! reason, trades with the same price, quantity and orders, cancels, replaces, expiries), and
//! the instruments the command touched must hold the same resting orders in the same priority
//! order with the same open and visible quantities. Every `CHECK_EVERY` commands all books,
//! the aggregated depth, reference prices and phases are compared and `check_invariants()` runs.
//!
//! Knobs (environment):
//! - `BOURSE_DIFF_COMMANDS`: total random commands (default 1,000,000: about 4 s in the test
//!   profile, 2 s in `--release`; raise it for a longer soak).
//! - `BOURSE_DIFF_SEED`: base seed (default below); run `i` uses `base + i`. A failure prints
//!   the seed and the command index, so that it can be replayed with `BOURSE_DIFF_SEED=<seed>`.

use crate::reference;

use bourse_core::*;
use bourse_engine::Engine;
use reference::gen::{setup, test_config, Gen};
use reference::{project, Model, ROrder};
use std::panic::{catch_unwind, AssertUnwindSafe};

const DEFAULT_SEED: u64 = 0x00B0_0125_0000_0000;
const DEFAULT_COMMANDS: u64 = 1_000_000;
/// Commands per run; each run starts from a fresh engine and model with its own seed.
const RUN_LEN: u64 = 100_000;
const CHECK_EVERY: u64 = 1_000;

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    let parsed = match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => v.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={v} is not a number")))
}

/// The fields of a resting order both sides can state.
type Row = (u64, u64, u32, Side, i64, i64, i64, i64, i64, TimeInForce);

fn engine_rows(e: &Engine, instrument: u32) -> Vec<Row> {
    e.resting_orders(InstrumentId(instrument))
        .iter()
        .map(|v| {
            (
                v.order_id.0,
                v.cl_ord_id.0,
                v.account.0,
                v.side,
                v.price.0,
                v.qty_total.0,
                v.qty_filled.0,
                v.qty_leaves.0,
                v.qty_display.0,
                v.tif,
            )
        })
        .collect()
}

fn model_rows(m: &Model, instrument: u32) -> Vec<Row> {
    m.book(instrument)
        .map(|b| {
            b.in_priority()
                .into_iter()
                .map(|o: &ROrder| {
                    (
                        o.id, o.cl, o.account, o.side, o.price, o.total, o.filled, o.leaves,
                        o.display, o.tif,
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Aggregated levels of the model, best first, as `Engine::depth` reports them.
fn model_depth(m: &Model, instrument: u32, side: Side, depth: usize) -> Vec<(Price, Qty, u32)> {
    let mut levels: Vec<(Price, Qty, u32)> = Vec::new();
    for o in m.book(instrument).unwrap().in_priority() {
        if o.side != side {
            continue;
        }
        match levels.last_mut() {
            Some(l) if l.0 .0 == o.price => {
                l.1 .0 += o.display;
                l.2 += 1;
            }
            _ => levels.push((Price(o.price), Qty(o.display), 1)),
        }
    }
    levels.truncate(depth);
    levels
}

/// Compares everything observable about the books of the model and the engine.
fn compare_all(e: &Engine, m: &Model) -> Result<(), String> {
    e.check_invariants()
        .map_err(|why| format!("invariant broken: {why}"))?;
    if e.live_orders() != m.live_count() {
        return Err(format!(
            "engine has {} live orders, model {}",
            e.live_orders(),
            m.live_count()
        ));
    }
    for b in &m.books {
        let id = InstrumentId(b.id);
        let def = e.instrument(id).ok_or("instrument missing")?;
        if def.reference_price.0 != b.reference {
            return Err(format!(
                "instrument {}: reference {} vs model {}",
                b.id, def.reference_price, b.reference
            ));
        }
        if e.phase(id) != Some(b.phase) {
            return Err(format!(
                "instrument {}: phase {:?} vs model {:?}",
                b.id,
                e.phase(id),
                b.phase
            ));
        }
        let (got, want) = (engine_rows(e, b.id), model_rows(m, b.id));
        if got != want {
            return Err(format!(
                "instrument {}: resting orders differ\nengine {got:?}\nmodel  {want:?}",
                b.id
            ));
        }
        for side in [Side::Buy, Side::Sell] {
            let (got, want) = (e.depth(id, side, 5), model_depth(m, b.id, side, 5));
            if got != want {
                return Err(format!(
                    "instrument {} {side:?}: depth {got:?} vs model {want:?}",
                    b.id
                ));
            }
        }
    }
    Ok(())
}

/// What the flow did, printed so that a drift of the generator shows.
#[derive(Default, Debug)]
struct Stats {
    commands: u64,
    accepted: u64,
    rejected: u64,
    trades: u64,
    cancels: u64,
    live_sum: u64,
    live_max: usize,
    reasons: std::collections::BTreeMap<String, u64>,
}

impl Stats {
    fn count(&mut self, outs: &[reference::Out], live: usize) {
        use reference::Out;
        self.commands += 1;
        self.live_sum += live as u64;
        self.live_max = self.live_max.max(live);
        for o in outs {
            match o {
                Out::Accepted { .. } => self.accepted += 1,
                Out::Rejected { reason }
                | Out::CancelRejected { reason, .. }
                | Out::CommandRejected { reason } => {
                    self.rejected += 1;
                    *self.reasons.entry(format!("{reason:?}")).or_default() += 1;
                }
                Out::Trade { .. } => self.trades += 1,
                Out::Cancelled { .. } => self.cancels += 1,
                _ => {}
            }
        }
    }
}

/// Runs `n` random commands from `seed` through both; returns a description of the first
/// disagreement.
fn run(seed: u64, n: u64, stats: &mut Stats) -> Result<(), String> {
    let mut engine = Engine::new(test_config());
    let mut model = Model::new();
    let mut gen = Gen::new(seed);
    let mut events = Vec::new();
    for body in setup() {
        let cmd = gen.stamp(body);
        events.clear();
        engine.apply(&cmd, &mut events);
        let want = model.apply(&cmd);
        assert_eq!(project(&events), want, "set-up command {cmd:?}");
    }
    let mut touched: Vec<u32> = Vec::new();
    for i in 0..n {
        let cmd = gen.next(&model);
        events.clear();
        engine.apply(&cmd, &mut events);
        let want = model.apply(&cmd);
        let got = project(&events);
        stats.count(&got, model.live_count());
        let at = || format!("seed {seed:#x} command #{i} {cmd:?}");
        if got != want {
            return Err(format!(
                "{}: outcomes differ\nengine {got:?}\nmodel  {want:?}",
                at()
            ));
        }
        // The books the command changed (every change of an order writes an order-log
        // record naming its instrument), plus the one a new order named.
        touched.clear();
        for ev in &events {
            if let Event::OrderLog(l) = ev {
                if !touched.contains(&l.instrument.0) {
                    touched.push(l.instrument.0);
                }
            }
        }
        for &b in &touched {
            let (got, want) = (engine_rows(&engine, b), model_rows(&model, b));
            if got != want {
                return Err(format!(
                    "{}: instrument {b} resting orders differ\nengine {got:?}\nmodel  {want:?}",
                    at()
                ));
            }
        }
        if (i + 1) % CHECK_EVERY == 0 || i + 1 == n {
            compare_all(&engine, &model).map_err(|why| format!("{}: {why}", at()))?;
        }
    }
    Ok(())
}

#[test]
fn engine_agrees_with_the_reference_model_on_random_flow() {
    let base = env_u64("BOURSE_DIFF_SEED").unwrap_or(DEFAULT_SEED);
    let total = env_u64("BOURSE_DIFF_COMMANDS").unwrap_or(DEFAULT_COMMANDS);
    let runs = total.div_ceil(RUN_LEN).max(1);
    let started = std::time::Instant::now();
    let mut done = 0;
    let mut stats = Stats::default();
    for r in 0..runs {
        let seed = base + r;
        let n = RUN_LEN.min(total - done);
        done += n;
        // An engine panic is a failure too: report its seed before passing it on.
        match catch_unwind(AssertUnwindSafe(|| run(seed, n, &mut stats))) {
            Ok(Ok(())) => {}
            Ok(Err(why)) => {
                panic!("{why}\nreplay: BOURSE_DIFF_SEED={seed:#x} BOURSE_DIFF_COMMANDS={n}")
            }
            Err(panic) => {
                eprintln!(
                    "engine panicked; replay: BOURSE_DIFF_SEED={seed:#x} BOURSE_DIFF_COMMANDS={n}"
                );
                std::panic::resume_unwind(panic);
            }
        }
    }
    eprintln!(
        "{done} random commands in {runs} runs agreed in {:.1?}",
        started.elapsed()
    );
    eprintln!(
        "{} accepted, {} rejected, {} trades, {} cancels; live orders {} on average, {} at most",
        stats.accepted,
        stats.rejected,
        stats.trades,
        stats.cancels,
        stats.live_sum / stats.commands.max(1),
        stats.live_max
    );
    eprintln!("rejects by reason: {:?}", stats.reasons);
    assert_eq!(stats.commands, total, "every command was run");
}

/// The generated flow must actually exercise what the model is there to check; a generator
/// that drifted into rejecting everything would make the differential test pass vacuously.
#[test]
fn random_flow_exercises_every_outcome() {
    let mut model = Model::new();
    let mut gen = Gen::new(DEFAULT_SEED);
    for body in setup() {
        let cmd = gen.stamp(body);
        model.apply(&cmd);
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut trades = 0;
    for _ in 0..50_000 {
        let cmd = gen.next(&model);
        for out in model.apply(&cmd) {
            let key = match out {
                reference::Out::Trade { auction: true, .. } => {
                    trades += 1;
                    "auction trade".to_string()
                }
                reference::Out::Trade { .. } => {
                    trades += 1;
                    "trade".to_string()
                }
                reference::Out::Indicative { qty: 0, .. } => "no cross".to_string(),
                reference::Out::Indicative { .. } => "indicative".to_string(),
                reference::Out::Uncrossed { auction, qty, .. } => {
                    format!("uncrossed {auction:?} executed={}", qty > 0)
                }
                reference::Out::Interruption { extended, .. } => {
                    format!("interruption extended={extended}")
                }
                reference::Out::Cancelled { reason, .. } => format!("cancelled {reason:?}"),
                reference::Out::Rejected { reason } => format!("rejected {reason:?}"),
                reference::Out::CancelRejected { reason, .. } => {
                    format!("cancel rejected {reason:?}")
                }
                reference::Out::Replaced { priority_kept, .. } => {
                    format!("replaced kept={priority_kept}")
                }
                reference::Out::Expired { .. } => "expired".to_string(),
                reference::Out::CommandRejected { reason } => {
                    format!("command rejected {reason:?}")
                }
                _ => continue,
            };
            seen.insert(key);
        }
    }
    for want in [
        "trade",
        "cancelled Requested",
        "cancelled MassCancel",
        "cancelled SelfTradePrevention",
        "cancelled ImmediateOrCancelRemainder",
        "cancelled FillOrKillUnfilled",
        "cancelled MarketRemainder",
        "rejected PriceOutsideBand",
        "rejected PriceOffTick",
        "rejected DuplicateClOrdId",
        "rejected InstrumentHalted",
        "rejected InstrumentClosed",
        "rejected DisplayQtyInvalid",
        "rejected ExpireTimeInPast",
        "rejected MarginCallOpen",
        "command rejected MarginCallOpen",
        "cancel rejected UnknownOrder",
        "cancel rejected ReplaceNoChange",
        "cancel rejected ReplaceQtyNotAboveFilled",
        "replaced kept=true",
        "replaced kept=false",
        "expired",
        "auction trade",
        "indicative",
        "no cross",
        "uncrossed OpeningAuction executed=true",
        "uncrossed ClosingAuction executed=true",
        "uncrossed VolatilityAuction executed=true",
        "uncrossed OpeningAuction executed=false",
        "interruption extended=false",
        "interruption extended=true",
        "cancelled AuctionUnexecuted",
        "rejected TimeInForceNotInPhase",
    ] {
        assert!(
            seen.contains(want),
            "the flow never produced '{want}'; seen {seen:?}"
        );
    }
    assert!(trades > 4_000, "only {trades} trades in 50,000 commands");
}

/// Regression (found by the differential test, seed 0xb0012500000001): a FOK order whose
/// account prevents self-trades with CancelIncoming/CancelBoth counted the hidden part of an
/// iceberg that rests ahead of a self order as fillable. But the iceberg trades only its
/// visible part there; its refill goes to the back, behind the self order, where matching
/// stops. The FOK then traded in part and had its remainder cancelled for self-trade
/// prevention, which a fill-or-kill order must never do.
#[test]
fn fill_or_kill_does_not_count_iceberg_refills_behind_a_self_order() {
    let mut engine = Engine::new(test_config());
    let mut model = Model::new();
    let mut gen = Gen::new(1);
    let mut events = Vec::new();
    let mut run = |body: CommandBody, engine: &mut Engine, model: &mut Model| {
        let cmd = gen.stamp(body);
        events.clear();
        engine.apply(&cmd, &mut events);
        let got = project(&events);
        assert_eq!(got, model.apply(&cmd), "{cmd:?}");
        got
    };
    for body in setup() {
        run(body, &mut engine, &mut model);
    }
    let order = |account: u32, cl: u64, side, qty, tif, display| {
        CommandBody::NewOrder(NewOrder {
            firm: None,
            account: AccountId(account),
            cl_ord_id: ClOrdId(cl),
            instrument: InstrumentId(1),
            side,
            ord_type: OrdType::Limit,
            price: Price(10_000),
            qty: Qty(qty),
            tif,
            expire_ts_ns: 0,
            display_qty: Qty(display),
        })
    };
    // Account 6 (firm 3) rests an iceberg of 10 showing 2; account 1 (firm 1) rests 5 behind.
    run(
        order(6, 1, Side::Sell, 10, TimeInForce::Day, 2),
        &mut engine,
        &mut model,
    );
    run(
        order(1, 1, Side::Sell, 5, TimeInForce::Day, 0),
        &mut engine,
        &mut model,
    );
    // Account 3 (firm 1, CancelIncoming by firm) wants 5 at once: only 2 are reachable.
    let out = run(
        order(3, 1, Side::Buy, 5, TimeInForce::Fok, 0),
        &mut engine,
        &mut model,
    );
    assert!(
        matches!(
            out[..],
            [
                reference::Out::Accepted { .. },
                reference::Out::Cancelled {
                    qty: 5,
                    reason: CancelReason::FillOrKillUnfilled,
                    ..
                }
            ]
        ),
        "{out:?}"
    );
    // Wanting only the visible 2, it fills.
    let out = run(
        order(3, 2, Side::Buy, 2, TimeInForce::Fok, 0),
        &mut engine,
        &mut model,
    );
    assert!(
        matches!(out[1], reference::Out::Trade { qty: 2, .. }),
        "{out:?}"
    );
    engine.check_invariants().unwrap();
}
