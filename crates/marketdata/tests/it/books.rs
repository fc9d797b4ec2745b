//! After a seeded load run, the subscriber's books equal the core's; with loss injected between
//! publisher and subscriber they equal it again after recovery.

use crate::common;

use bourse_core::Side;
use bourse_marketdata::{
    Channel, Feed, PublicationMode, Subscriber, SubscriberConfig, VecSink, CHANNEL_COUNT,
};
use common::*;

#[test]
fn books_equal_the_engine_after_a_load_run_without_loss() {
    let mut h = Harness::new(7, test_publisher_config());
    let mut sub = Subscriber::new(SubscriberConfig::default());
    let mut sink = VecSink::default();
    for _ in 0..20_000 {
        h.step(20, &mut sink);
        for (c, p) in &sink.packets {
            sub.on_packet(*c, Feed::A, p, h.now_ns);
            sub.on_packet(*c, Feed::B, p, h.now_ns);
        }
        sink.packets.clear();
    }
    assert!(h.engine.counters().trades > 100, "the flow traded");
    assert_eq!(h.publisher.anomalies().book_errors, 0);
    let s = *sub.stats();
    assert_eq!(s.gaps_detected, 0, "{s:?}");
    assert_eq!(s.book_errors + s.rpt_gaps + s.skipped(), 0, "{s:?}");
    assert!(s.duplicates > 0, "feed B's copies are dropped");
    assert_books_equal(&h.engine, &sub, &h.defs);
    // The aggregated book channel carries the same top 20.
    for def in &h.defs {
        let inst = sub.instrument(def.instrument.0).unwrap();
        let bids: Vec<_> = inst.book.levels(Side::Buy).take(20).collect();
        let asks: Vec<_> = inst.book.levels(Side::Sell).take(20).collect();
        assert_eq!(
            inst.published_bids, bids,
            "published bids of {}",
            def.symbol
        );
        assert_eq!(
            inst.published_asks, asks,
            "published asks of {}",
            def.symbol
        );
        assert_eq!(inst.symbol, def.symbol);
        // The band the subscriber read is the one the core will check the next order against.
        let band = h.engine.instrument(def.instrument).unwrap().band();
        assert_eq!(
            inst.band,
            Some((band.0 .0, band.1 .0)),
            "band of {}",
            def.symbol
        );
    }
    // Publisher's own view equals the engine too.
    for def in &h.defs {
        let pb: Vec<_> = h
            .publisher
            .book(def.instrument.0)
            .unwrap()
            .orders()
            .map(|o| (o.order_id, o.side, o.price, o.qty))
            .collect();
        assert_eq!(pb, engine_orders(&h.engine, def.instrument));
    }
    assert!(h.publisher.counters(Channel::Orders).packets_sent > 0);
}

fn lossy_run(seed: u64, loss_ppm: u64, replay: bool) -> bourse_marketdata::SubscriberStats {
    let mut h = Harness::new(seed, test_publisher_config());
    let mut sub = Subscriber::new(SubscriberConfig {
        replay,
        ..SubscriberConfig::default()
    });
    let mut link = LossyLink::new(seed ^ 0x5EED, loss_ppm);
    link.burst_ppm = 1_000;
    link.burst_packets = 8;
    let mut sink = VecSink::default();
    for _ in 0..8_000 {
        h.step(20, &mut sink);
        link.deliver(&sink.packets, &mut sub, h.now_ns);
        sink.packets.clear();
        serve_recovery(&h.publisher, &mut sub, h.now_ns);
    }
    let rounds_max = 4_000;
    let rounds = settle(&mut h, &mut sub, &mut link, rounds_max);
    let s = *sub.stats();
    assert!(
        rounds < rounds_max,
        "seed {seed} loss {loss_ppm} ppm: not in step after {rounds_max} rounds: {s:?}"
    );
    assert_books_equal(&h.engine, &sub, &h.defs);
    eprintln!("seed {seed} loss {loss_ppm} ppm replay {replay}: settled in {rounds} rounds, {s:?}");
    s
}

#[test]
fn books_recover_from_drop_reorder_duplicate_and_bursts_on_both_feeds() {
    // BOURSE_MD_SEEDS raises the number of seeds per loss rate for a longer soak.
    let seeds: u64 = std::env::var("BOURSE_MD_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    for loss_ppm in [1_000, 10_000, 100_000] {
        for seed in 1..=seeds {
            let s = lossy_run(seed * 31 + loss_ppm, loss_ppm, true);
            assert!(s.gaps_detected > 0, "bursts make gaps: {s:?}");
            assert!(s.replays_requested > 0, "{s:?}");
        }
    }
}

#[test]
fn books_recover_from_snapshots_alone_when_replay_is_off() {
    for loss_ppm in [10_000, 100_000] {
        let s = lossy_run(99 + loss_ppm, loss_ppm, false);
        assert_eq!(s.replays_requested, 0);
        assert!(s.gaps_skipped > 0 && s.snapshots_applied > 0, "{s:?}");
    }
}

#[test]
fn books_equal_the_engine_in_the_1ms_and_15ms_publication_modes() {
    for mode in [PublicationMode::Every1Ms, PublicationMode::Every15Ms] {
        let config = bourse_marketdata::PublisherConfig {
            modes: [mode; CHANNEL_COUNT],
            ..test_publisher_config()
        };
        let mut h = Harness::new(17, config);
        let mut sub = Subscriber::new(SubscriberConfig::default());
        let mut link = LossyLink::new(19, 10_000);
        let mut sink = VecSink::default();
        let mut flushes = 0;
        for _ in 0..5_000 {
            h.step(20, &mut sink);
            if !sink.packets.is_empty() {
                flushes += 1;
            }
            link.deliver(&sink.packets, &mut sub, h.now_ns);
            sink.packets.clear();
            serve_recovery(&h.publisher, &mut sub, h.now_ns);
        }
        // Batches come every ~20 µs of simulated time; packets leave only at the interval.
        let interval_ms = mode.interval_ns() / 1_000_000;
        assert!(flushes < 5_000 / 2, "{mode:?}: {flushes} flushes");
        let rounds = settle(&mut h, &mut sub, &mut link, 2_000);
        assert!(
            rounds < 2_000,
            "{mode:?} ({interval_ms} ms): {:?}",
            sub.stats()
        );
        assert_books_equal(&h.engine, &sub, &h.defs);
        for def in &h.defs {
            let inst = sub.instrument(def.instrument.0).unwrap();
            let bids: Vec<_> = inst.book.levels(Side::Buy).take(20).collect();
            assert_eq!(
                inst.published_bids, bids,
                "{mode:?}: coalesced top 20 of {}",
                def.symbol
            );
        }
    }
}

#[test]
fn books_equal_the_engine_across_a_call_auction_and_its_uncrossing() {
    let mut h = Harness::new(23, test_publisher_config());
    let mut sub = Subscriber::new(SubscriberConfig::default());
    let mut sink = VecSink::default();
    let deliver = |sub: &mut Subscriber, sink: &mut VecSink, now_ns: u64| {
        for (c, p) in std::mem::take(&mut sink.packets) {
            sub.on_packet(c, Feed::A, &p, now_ns);
        }
    };
    let set_phase = |h: &mut Harness, sink: &mut VecSink, phase: bourse_core::Phase| {
        let mut events = Vec::new();
        for def in &h.defs {
            h.now_ns += 2_000;
            let body = bourse_core::CommandBody::SetPhase {
                instrument: Some(def.instrument),
                phase,
            };
            h.engine
                .apply(&bourse_core::Command::new(h.now_ns, body), &mut events);
        }
        h.publisher.publish(&events, h.now_ns, sink);
        h.publisher.tick(h.now_ns, sink);
    };
    for _ in 0..2_000 {
        h.step(20, &mut sink);
        deliver(&mut sub, &mut sink, h.now_ns);
    }
    // Every instrument into its opening auction; the flow goes on, and the books cross.
    set_phase(&mut h, &mut sink, bourse_core::Phase::OpeningAuction);
    for _ in 0..2_000 {
        h.step(20, &mut sink);
        deliver(&mut sub, &mut sink, h.now_ns);
    }
    assert_books_equal(&h.engine, &sub, &h.defs);
    let mut crossed = 0;
    for def in &h.defs {
        let view = sub.instrument(def.instrument.0).unwrap();
        let want = h.engine.indicative_uncross(def.instrument);
        // A call starts with no cross and nothing published until the book crosses.
        let got = view.indicative.map(|i| (i.price, i.qty, i.surplus));
        match want {
            Some((price, qty, surplus)) => {
                crossed += 1;
                assert_eq!(
                    got,
                    Some((Some(price.0), qty.0, surplus.abs())),
                    "{}",
                    def.symbol
                );
            }
            None => assert!(
                matches!(got, None | Some((None, 0, _))),
                "{}: {got:?}",
                def.symbol
            ),
        }
    }
    assert!(crossed > 0, "some book crossed in the call");
    // The uncrossing: the subscriber's books are the core's again, queue places included.
    let trades_before = h.engine.counters().trades;
    set_phase(&mut h, &mut sink, bourse_core::Phase::Open);
    deliver(&mut sub, &mut sink, h.now_ns);
    assert!(
        h.engine.counters().trades > trades_before,
        "the uncrossing traded"
    );
    assert_books_equal(&h.engine, &sub, &h.defs);
    let auction_trades: u32 = h
        .defs
        .iter()
        .map(|d| sub.instrument(d.instrument.0).unwrap().auction_trades)
        .sum();
    assert_eq!(
        u64::from(auction_trades),
        h.engine.counters().trades - trades_before
    );
    for def in &h.defs {
        assert_eq!(sub.instrument(def.instrument.0).unwrap().indicative, None);
    }
    let s = *sub.stats();
    assert_eq!(s.book_errors + s.rpt_gaps + s.skipped(), 0, "{s:?}");
    // And continuous trading goes on from there.
    for _ in 0..500 {
        h.step(20, &mut sink);
        deliver(&mut sub, &mut sink, h.now_ns);
    }
    assert_books_equal(&h.engine, &sub, &h.defs);
}
