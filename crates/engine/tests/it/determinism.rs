//! Determinism: the engine is a pure function of its command stream, and its snapshots are a
//! faithful, canonical and tamper-evident picture of its state.
//!
//! - The same stream applied twice gives identical events and identical state hashes after
//!   every command.
//! - Snapshot at random points, restore into a fresh engine, continue: the events and the final
//!   hash are those of the uninterrupted run.
//! - `restore(snapshot())` snapshots to the very same bytes.
//! - Damaged snapshot bytes (truncated, bits flipped, random bytes, spliced) never panic: they
//!   give `Err`, or, where the damage happens to describe another valid state (a flipped bit
//!   of a cash balance), an engine that passes `check_invariants`, snapshots back to exactly
//!   the bytes it was given, and keeps working.
//!
//! Streams come from the differential test's generator (`reference/gen.rs`): realistic flow
//! with every order type, icebergs, self-trade prevention, replaces, cancels, phases and ends
//! of day.

use crate::reference;

use bourse_core::*;
use bourse_engine::Engine;
use reference::gen::{stream, test_config, Rng};
use std::panic::{catch_unwind, AssertUnwindSafe};

fn apply_all(e: &mut Engine, cmds: &[Command]) -> Vec<Vec<Event>> {
    cmds.iter()
        .map(|c| {
            let mut ev = Vec::new();
            e.apply(c, &mut ev);
            ev
        })
        .collect()
}

#[test]
fn the_same_stream_gives_the_same_events_and_hashes() {
    for seed in 0..4u64 {
        let cmds = stream(seed, 5_000);
        let (mut a, mut b) = (Engine::new(test_config()), Engine::new(test_config()));
        let (mut ea, mut eb) = (Vec::new(), Vec::new());
        let mut trades = 0;
        for (i, c) in cmds.iter().enumerate() {
            ea.clear();
            eb.clear();
            a.apply(c, &mut ea);
            b.apply(c, &mut eb);
            assert_eq!(ea, eb, "seed {seed} command #{i}: events differ");
            trades += ea
                .iter()
                .filter(|e| matches!(e, Event::Trade { .. }))
                .count();
            if i % 97 == 0 {
                assert_eq!(
                    a.state_hash(),
                    b.state_hash(),
                    "seed {seed} command #{i}: hashes differ"
                );
            }
        }
        assert_eq!(a.snapshot(), b.snapshot());
        assert!(trades > 1_000, "the stream should trade ({trades} trades)");
    }
}

/// The hash must see the state: two streams that differ in one order give different hashes
/// (otherwise the comparisons above could not fail).
#[test]
fn the_state_hash_changes_when_the_state_does() {
    let cmds = stream(7, 2_000);
    let mut e = Engine::new(test_config());
    let mut seen = std::collections::HashSet::new();
    let mut ev = Vec::new();
    let mut changes = 0;
    for c in &cmds {
        let before = e.snapshot();
        ev.clear();
        e.apply(c, &mut ev);
        let after = e.snapshot();
        // The command counter alone makes every state distinct.
        assert_ne!(before, after);
        if seen.insert(e.state_hash()) {
            changes += 1;
        }
    }
    assert_eq!(changes, cmds.len(), "every state has its own hash");
}

#[test]
fn snapshot_and_restore_mid_stream_continue_exactly_as_the_uninterrupted_run() {
    let mut rng = Rng::new(0xD373);
    for seed in 10..14u64 {
        let cmds = stream(seed, 6_000);
        let mut straight = Engine::new(test_config());
        let expected = apply_all(&mut straight, &cmds);

        // Restore at a handful of random points, each time continuing in the restored copy.
        let mut cuts: Vec<usize> = (0..6)
            .map(|_| rng.below(cmds.len() as u64) as usize)
            .collect();
        cuts.sort_unstable();
        let mut e = Engine::new(test_config());
        let mut ev = Vec::new();
        for (i, c) in cmds.iter().enumerate() {
            if cuts.contains(&i) {
                let bytes = e.snapshot();
                let restored = Engine::restore(&bytes).expect("a snapshot restores");
                assert_eq!(
                    restored.snapshot(),
                    bytes,
                    "seed {seed} at #{i}: restore changed the bytes"
                );
                assert_eq!(restored.state_hash(), e.state_hash());
                restored.check_invariants().unwrap();
                e = restored;
            }
            ev.clear();
            e.apply(c, &mut ev);
            assert_eq!(
                ev, expected[i],
                "seed {seed} command #{i} after restores at {cuts:?}"
            );
        }
        assert_eq!(e.state_hash(), straight.state_hash());
        assert_eq!(e.snapshot(), straight.snapshot());
    }
}

#[test]
fn restore_of_a_snapshot_snapshots_to_identical_bytes_at_every_step() {
    let cmds = stream(21, 1_500);
    let mut e = Engine::new(test_config());
    let mut ev = Vec::new();
    for (i, c) in cmds.iter().enumerate() {
        ev.clear();
        e.apply(c, &mut ev);
        let bytes = e.snapshot();
        let r = Engine::restore(&bytes).unwrap_or_else(|err| panic!("#{i}: {err}"));
        assert_eq!(r.snapshot(), bytes, "#{i}");
        // The restored engine answers queries as the original does.
        for def in e.instruments() {
            assert_eq!(
                r.resting_orders(def.instrument),
                e.resting_orders(def.instrument)
            );
        }
        assert_eq!(
            r.positions().collect::<Vec<_>>(),
            e.positions().collect::<Vec<_>>()
        );
    }
}

/// A snapshot with a mix of everything: orders on every instrument, icebergs, positions,
/// futures margin, phases other than open.
fn rich_snapshot() -> Vec<u8> {
    let cmds = stream(33, 3_000);
    let mut e = Engine::new(test_config());
    let mut ev = Vec::new();
    // Take the snapshot when the books are fullest.
    let mut best = (0, Vec::new());
    for c in &cmds {
        ev.clear();
        e.apply(c, &mut ev);
        if e.live_orders() > best.0 {
            best = (e.live_orders(), e.snapshot());
        }
    }
    assert!(best.0 > 50, "the snapshot should hold orders ({})", best.0);
    best.1
}

/// Restores damaged bytes; must not panic. If it succeeds, the result must be a valid engine
/// that snapshots back to the same bytes and survives more commands.
fn restore_damaged(bytes: &[u8], what: &str, more: &[Command]) -> bool {
    let result = catch_unwind(AssertUnwindSafe(|| Engine::restore(bytes)));
    match result {
        Err(_) => panic!("restore panicked on {what}"),
        Ok(Err(_)) => false,
        Ok(Ok(e)) => {
            e.check_invariants()
                .unwrap_or_else(|w| panic!("{what}: restored an inconsistent state: {w}"));
            assert_eq!(
                e.snapshot(),
                bytes,
                "{what}: accepted bytes are not canonical"
            );
            let mut e = e;
            let mut ev = Vec::new();
            let ran = catch_unwind(AssertUnwindSafe(|| {
                for c in more {
                    ev.clear();
                    e.apply(c, &mut ev);
                }
                e.check_invariants()
            }));
            match ran {
                Err(_) => panic!("{what}: the restored engine panicked on later commands"),
                Ok(Err(w)) => panic!("{what}: the restored engine broke an invariant later: {w}"),
                Ok(Ok(())) => true,
            }
        }
    }
}

#[test]
fn truncated_snapshots_are_refused() {
    let bytes = rich_snapshot();
    for len in 0..bytes.len() {
        assert!(
            !restore_damaged(&bytes[..len], &format!("truncated to {len}"), &[]),
            "a snapshot cut to {len} of {} bytes was accepted",
            bytes.len()
        );
    }
    // Extra bytes at the end are damage too.
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(!restore_damaged(&longer, "one trailing byte", &[]));
}

#[test]
fn snapshots_with_flipped_bits_never_panic_and_are_refused_or_valid() {
    let bytes = rich_snapshot();
    let more = &stream(34, 500)[24..]; // commands after the set-up
    let mut refused = 0;
    // Every bit of the snapshot.
    let positions: Vec<usize> = (0..bytes.len() * 8).collect();
    for &bit in &positions {
        let mut damaged = bytes.clone();
        damaged[bit / 8] ^= 1 << (bit % 8);
        if !restore_damaged(&damaged, &format!("bit {bit} flipped"), &more[..10]) {
            refused += 1;
        }
    }
    eprintln!(
        "{refused} of {} single-bit flips refused; the rest are valid states",
        positions.len()
    );
    assert!(
        refused > positions.len() / 4,
        "only {refused} of {} flips refused",
        positions.len()
    );
}

#[test]
fn random_and_spliced_bytes_never_panic() {
    let bytes = rich_snapshot();
    let more = &stream(35, 100)[24..];
    let mut rng = Rng::new(0xBAD5);
    for n in 0..2_000 {
        // Pure noise, with and without a valid header.
        let len = rng.below(600) as usize;
        let mut noise: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        assert!(
            !restore_damaged(&noise, "noise", &[]),
            "noise #{n} was accepted"
        );
        let header = 12.min(bytes.len());
        noise.splice(0..0, bytes[..header].iter().copied());
        restore_damaged(&noise, "noise after a valid header", &[]);
        // A valid snapshot with a stretch overwritten by noise.
        let mut spliced = bytes.clone();
        let at = rng.below(bytes.len() as u64) as usize;
        let run = (rng.below(16) as usize + 1).min(bytes.len() - at);
        for b in &mut spliced[at..at + run] {
            *b = rng.next_u64() as u8;
        }
        restore_damaged(
            &spliced,
            &format!("{run} bytes of noise at {at}"),
            &more[..20],
        );
    }
}

/// The configuration fields come first; damage there must not make restore reserve absurd
/// amounts of memory (an allocation failure aborts the process, which no `Err` can report).
#[test]
fn damaged_limits_do_not_make_restore_reserve_huge_tables() {
    let bytes = rich_snapshot();
    // orders_max is the u32 right after the 8-byte magic and the u32 version.
    for value in [u32::MAX, u32::MAX - 1, 1 << 28, (1 << 28) + 1, 1 << 31] {
        let mut damaged = bytes.clone();
        damaged[12..16].copy_from_slice(&value.to_le_bytes());
        restore_damaged(&damaged, &format!("orders_max {value}"), &[]);
    }
}

/// Replaces the one occurrence of `from` in `bytes` by `to` (same length).
fn patch(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let at: Vec<usize> = (0..=bytes.len() - from.len())
        .filter(|&i| &bytes[i..i + from.len()] == from)
        .collect();
    assert_eq!(at.len(), 1, "the pattern must occur exactly once");
    let mut out = bytes.to_vec();
    out[at[0]..at[0] + to.len()].copy_from_slice(to);
    out
}

/// Regression: restore did unchecked arithmetic on the numbers it read, so damaged values
/// panicked with an arithmetic overflow (in debug builds; release builds wrapped silently)
/// instead of giving an error: an order whose filled and open quantities add past i64, an
/// account whose balances make free cash overflow. And a buy order holding position back
/// (impossible, but unchecked) was accepted and tripped an assertion at its next fill.
#[test]
fn restore_refuses_numbers_that_would_overflow_or_break_assumptions() {
    let mut d = bourse_engine::fixtures::Driver::new(test_config());
    d.add_instrument(bourse_engine::fixtures::equity(1, "EQ", 10_000));
    d.add_account_spec(
        AccountSpec {
            account: AccountId(1),
            firm: FirmId(1),
            may_short: true,
            stp: StpMode::None,
            stp_scope: StpScope::Account,
        },
        987_654_321_987,
    );
    d.limit(1, 4242, 1, Side::Sell, 10_000, 7_777);
    d.limit(1, 4243, 1, Side::Buy, 9_990, 7);
    let bytes = d.engine.snapshot();
    assert!(Engine::restore(&bytes).is_ok());

    // qty_total, qty_filled, qty_leaves, display_size, qty_display are written one after the
    // other.
    let quantities = |total: i64, filled: i64, leaves: i64| {
        [total, filled, leaves, 0, leaves]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>()
    };
    let damaged = patch(
        &bytes,
        &quantities(7_777, 0, 7_777),
        &quantities(7_777, i64::MAX, 7_777),
    );
    assert!(!restore_damaged(
        &damaged,
        "filled quantity at i64::MAX",
        &[]
    ));

    let cash = 987_654_321_987i128.to_le_bytes();
    for bad in [i128::MAX, i128::MIN, i128::MIN + 1] {
        let damaged = patch(&bytes, &cash, &bad.to_le_bytes());
        assert!(!restore_damaged(&damaged, &format!("cash {bad}"), &[]));
    }

    // The buy's reservation (7 lots at 99.90: 69,930,000 cash units) is followed by the
    // position it holds back, which must be zero for a buy.
    let reservation = |pos: i64| {
        let mut v = 69_930_000i128.to_le_bytes().to_vec();
        v.extend(pos.to_le_bytes());
        v
    };
    let damaged = patch(&bytes, &reservation(0), &reservation(3));
    assert!(!restore_damaged(
        &damaged,
        "a buy holding position back",
        &[]
    ));
}
