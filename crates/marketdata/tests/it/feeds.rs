//! Late join, publisher failover, and hostile datagrams.

use crate::common;

use bourse_engine::workload::Rng;
use bourse_marketdata::{Channel, Feed, Publisher, Subscriber, SubscriberConfig, VecSink};
use common::*;

#[test]
fn late_joiner_builds_every_book_from_snapshots_and_stays_in_step() {
    let mut h = Harness::new(11, test_publisher_config());
    let mut sink = VecSink::default();
    for _ in 0..1_500 {
        h.step(20, &mut sink);
    }
    sink.packets.clear();
    let mut late = Subscriber::new(SubscriberConfig::default());
    let mut link = LossyLink::new(3, 0);
    for _ in 0..1_500 {
        h.step(20, &mut sink);
        link.deliver(&sink.packets, &mut late, h.now_ns);
        sink.packets.clear();
        serve_recovery(&h.publisher, &mut late, h.now_ns);
    }
    let rounds = settle(&mut h, &mut late, &mut link, 1_000);
    assert!(rounds < 1_000, "{:?}", late.stats());
    let s = late.stats();
    assert!(s.snapshots_applied >= h.defs.len() as u64, "{s:?}");
    assert_eq!(s.book_errors, 0, "{s:?}");
    assert_books_equal(&h.engine, &late, &h.defs);
}

#[test]
fn standby_publisher_takes_over_mid_stream_and_continues_the_sequence() {
    let config = test_publisher_config();
    let mut h = Harness::new(23, config.clone());
    let mut standby = Publisher::new(config.clone(), &h.defs);
    standby.set_active(false);
    let mut sub = Subscriber::new(SubscriberConfig::default());
    let mut link = LossyLink::new(5, 1_000);
    let mut sink = VecSink::default();
    let mut nowhere = VecSink::default();
    for _ in 0..1_500 {
        h.batch(20);
        let events = std::mem::take(&mut h.events);
        h.publisher.publish(&events, h.now_ns, &mut sink);
        standby.publish(&events, h.now_ns, &mut nowhere);
        h.events = events;
        link.deliver(&sink.packets, &mut sub, h.now_ns);
        sink.packets.clear();
        serve_recovery(&h.publisher, &mut sub, h.now_ns);
    }
    assert!(nowhere.packets.is_empty(), "a standby sends nothing");
    assert_eq!(
        standby.next_seq(Channel::Orders),
        h.publisher.next_seq(Channel::Orders),
        "in online mode the standby numbers packets exactly as the leader"
    );
    // The leader dies in the middle of sending a batch: only the first half of its packets
    // leave. The standby saw the same committed batch.
    h.batch(40);
    let events = std::mem::take(&mut h.events);
    h.publisher.publish(&events, h.now_ns, &mut sink);
    standby.publish(&events, h.now_ns, &mut nowhere);
    h.events = events;
    let half = sink.packets.len() / 2;
    link.deliver(&sink.packets[..half], &mut sub, h.now_ns);
    sink.packets.clear();
    let seq_at_failover = standby.next_seq(Channel::Orders);
    standby.set_active(true);
    h.publisher = standby;
    for _ in 0..1_500 {
        h.step(20, &mut sink);
        link.deliver(&sink.packets, &mut sub, h.now_ns);
        sink.packets.clear();
        serve_recovery(&h.publisher, &mut sub, h.now_ns);
    }
    // A second handover, this time by rebuilding a publisher from a checkpoint of the state.
    let state = h.publisher.state();
    let next = state.next_seq(Channel::Orders);
    h.publisher = Publisher::from_state(config, state);
    assert_eq!(h.publisher.next_seq(Channel::Orders), next);
    for _ in 0..500 {
        h.step(20, &mut sink);
        link.deliver(&sink.packets, &mut sub, h.now_ns);
        sink.packets.clear();
        serve_recovery(&h.publisher, &mut sub, h.now_ns);
    }
    let rounds = settle(&mut h, &mut sub, &mut link, 2_000);
    assert!(rounds < 2_000, "{:?}", sub.stats());
    assert!(h.publisher.next_seq(Channel::Orders) > seq_at_failover);
    assert_eq!(
        sub.stats().sequence_resets,
        0,
        "the incremental numbering continued"
    );
    assert!(
        sub.stats().loop_resets >= 2,
        "the new leader announced its loops' numbering: {:?}",
        sub.stats()
    );
    assert_eq!(sub.stats().book_errors, 0, "{:?}", sub.stats());
    assert_books_equal(&h.engine, &sub, &h.defs);
}

/// A copy of `p` with the first message's SBE header field at `field_offset` set to `value`.
fn with_header_field(p: &[u8], field_offset: usize, value: u16) -> Vec<u8> {
    let mut q = p.to_vec();
    let flags = u16::from_le_bytes([q[6], q[7]]);
    let first = if flags & 0x08 != 0 { 28 } else { 16 };
    q[first + field_offset..first + field_offset + 2].copy_from_slice(&value.to_le_bytes());
    q
}

#[test]
fn malformed_truncated_unknown_template_and_future_version_are_counted_and_skipped() {
    let mut h = Harness::new(41, test_publisher_config());
    let mut sub = Subscriber::new(SubscriberConfig::default());
    let mut sink = VecSink::default();
    let mut rng = Rng::new(77);
    let (mut truncated, mut unknown, mut future, mut garbage) = (0u64, 0u64, 0u64, 0u64);
    for step in 0..2_000u64 {
        h.step(10, &mut sink);
        for (c, p) in &sink.packets {
            // Feed A carries a damaged copy now and then; feed B is intact.
            let damaged = match (step + rng.below(7)) % 9 {
                0 => {
                    truncated += 1;
                    Some(p[..p.len() - 1 - rng.below(p.len() as u64 - 1) as usize].to_vec())
                }
                1 => {
                    unknown += 1;
                    Some(with_header_field(p, 2, 999))
                }
                2 => {
                    future += 1;
                    let from_the_future = bourse_wire::market_data::SCHEMA_VERSION + 1;
                    Some(with_header_field(p, 6, from_the_future))
                }
                3 => {
                    garbage += 1;
                    let n = rng.below(1_500) as usize;
                    Some((0..n).map(|_| rng.next_u64() as u8).collect())
                }
                _ => None,
            };
            match damaged {
                Some(d) => sub.on_packet(*c, Feed::A, &d, h.now_ns),
                None => sub.on_packet(*c, Feed::A, p, h.now_ns),
            }
            sub.on_packet(*c, Feed::B, p, h.now_ns);
        }
        sink.packets.clear();
    }
    let s = *sub.stats();
    assert_eq!(s.unknown_template, unknown, "{s:?}");
    assert_eq!(s.future_version, future, "{s:?}");
    assert_eq!(s.truncated + s.malformed, truncated + garbage, "{s:?}");
    assert!(sub.last_skipped().is_some());
    assert_eq!(s.gaps_skipped, 0, "feed B filled every hole: {s:?}");
    assert_books_equal(&h.engine, &sub, &h.defs);
}

#[test]
fn random_mutations_of_real_packets_never_panic() {
    let mut h = Harness::new(43, test_publisher_config());
    let mut sink = VecSink::default();
    for _ in 0..300 {
        h.step(20, &mut sink);
    }
    let mut sub = Subscriber::new(SubscriberConfig::default());
    let mut rng = Rng::new(1);
    for i in 0..50_000u64 {
        let (c, p) = &sink.packets[(i % sink.packets.len() as u64) as usize];
        let mut q = p.clone();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(q.len() as u64) as usize;
            q[at] = rng.next_u64() as u8;
        }
        sub.on_packet(*c, Feed::A, &q, i);
        let _ = sub.poll(i);
    }
    assert!(sub.stats().skipped() > 0);
}

#[test]
fn best_prices_and_loop_sequence_resets_are_understood() {
    use bourse_wire::market_data::codec::{best_prices_codec, sequence_reset_codec};
    use bourse_wire::market_data::{IncrementalHeader, MsgFlags, PacketHeader, PacketWriter};
    let mut sub = Subscriber::new(SubscriberConfig::default());
    let mut buf = [0u8; 1472];
    let header = |seq, flags| PacketHeader {
        msg_seq_num: seq,
        msg_size: 0,
        msg_flags: MsgFlags(flags),
        sending_time_ns: 1,
    };
    let inc = IncrementalHeader {
        transact_time_ns: 1,
        exchange_trading_session_id: 1,
    };
    let mut w = PacketWriter::new(
        &mut buf,
        header(1, MsgFlags::LAST_FRAGMENT | MsgFlags::INCREMENTAL_PACKET),
        Some(inc),
    )
    .unwrap();
    w.append(|e: best_prices_codec::BestPricesEncoder| {
        let mut g = e.entries_encoder(2, best_prices_codec::encoder::EntriesEncoder::default());
        let mut k = 0;
        while let Ok(Some(_)) = g.advance() {
            if k == 0 {
                g.bid_px_opt(Some(1000)).bid_qty_opt(Some(5));
                g.ask_px_opt(None).ask_qty_opt(None).security_id(7);
            } else {
                g.bid_px_opt(None).bid_qty_opt(None);
                g.ask_px_opt(Some(2000)).ask_qty_opt(Some(3)).security_id(8);
            }
            k += 1;
        }
        g.parent().unwrap()
    })
    .unwrap();
    let n = w.finish().unwrap();
    sub.on_packet(Channel::Statistics, Feed::A, &buf[..n], 1);
    let s7 = sub.instrument(7).and_then(|i| i.stats).unwrap();
    assert_eq!((s7.best_bid, s7.best_ask), (Some((1000, 5)), None));
    let s8 = sub.instrument(8).and_then(|i| i.stats).unwrap();
    assert_eq!((s8.best_bid, s8.best_ask), (None, Some((2000, 3))));

    // A loop renumbered by a new leader: later packets from the new numbering are taken,
    // and the second feed's copy of the reset changes nothing.
    let mut reset = [0u8; 64];
    let mut w = PacketWriter::new(&mut reset, header(0, MsgFlags::LAST_FRAGMENT), None).unwrap();
    w.append(|mut e: sequence_reset_codec::SequenceResetEncoder| {
        e.new_seq_no(3);
        e
    })
    .unwrap();
    let r = w.finish().unwrap();
    sub.on_packet(Channel::Snapshot, Feed::A, &reset[..r], 2);
    sub.on_packet(Channel::Snapshot, Feed::B, &reset[..r], 2);
    assert_eq!(sub.stats().loop_resets, 1);
    assert_eq!(sub.expected(Channel::Snapshot), Some(3));
    assert_eq!(sub.stats().sequence_resets, 0);
    assert_eq!(sub.stats().skipped(), 0, "{:?}", sub.last_skipped());
}

#[test]
fn an_instrument_added_at_run_time_is_defined_from_its_event() {
    use bourse_core::{Cash, Command, CommandBody, Instrument, InstrumentId, Market, Price};
    let mut h = Harness::new(5, test_publisher_config());
    let mut sink = VecSink::default();
    h.step(20, &mut sink);
    // The publisher was built with the flow's instruments only; this one reaches it as an
    // event of the committed stream, as an operator's addition does.
    let added = Instrument {
        instrument: InstrumentId(900),
        symbol: "RTS-3.27".into(),
        market: Market::Futures,
        price_scale: 0,
        tick: Price(10),
        lot_size: 1,
        multiplier: 2,
        initial_margin: Cash(15_000),
        band_bps: 500,
        reference_price: Price(110_000),
        volatility: Default::default(),
    };
    h.now_ns += 1_000;
    let mut events = Vec::new();
    h.engine.apply(
        &Command::new(h.now_ns, CommandBody::AddInstrument(added)),
        &mut events,
    );
    h.publisher.publish(&events, h.now_ns, &mut sink);
    h.publisher.send_definitions(h.now_ns, &mut sink);
    let mut sub = Subscriber::new(SubscriberConfig::default());
    for (channel, p) in &sink.packets {
        sub.on_packet(*channel, Feed::A, p, h.now_ns);
    }
    let view = sub
        .by_symbol("RTS-3.27")
        .expect("the added instrument is defined");
    assert_eq!((view.id, view.price_scale, view.tick), (900, 0, 10));
}
