//! tshark reads an ITCH capture of a recorded run: its MoldUDP64 dissector (Wireshark's own)
//! frames every packet (session, sequence numbers, message lengths), and the message bytes it
//! extracts, read by an independent ITCH 5.0 parser, match the core's events field by field
//! and rebuild the core's books. Wireshark's built-in `nasdaq_itch` dissector decodes the
//! ASCII TotalView-ITCH 2.0/3.0 only (its fields are decimal text: a 9-digit order reference,
//! a 6-character stock), so it cannot read ITCH 5.0's binary messages; the test checks the
//! fields through tshark's MoldUDP64 fields instead. Skipped, with a message, without tshark.

use crate::common;

use bourse_core::{Event, OrderLogAction};
use bourse_itch::feed::FeedLimits;
use bourse_itch::project::REPLACEMENT_REF_BASE;
use bourse_marketdata::pcap::PcapWriter;
use common::*;
use std::collections::BTreeMap;
use std::net::SocketAddrV4;

const PORT: u16 = 26_400;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn tshark_frames_the_capture_and_its_messages_match_the_core_events() {
    let rec = record(5, 1_500);
    let (feed, packets) = itch_packets(&rec, FeedLimits::default());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("itch.pcap");
    let mut w = PcapWriter::new(std::fs::File::create(&path).unwrap()).unwrap();
    let src: SocketAddrV4 = "127.0.0.1:40000".parse().unwrap();
    let dst = SocketAddrV4::new("127.0.0.1".parse().unwrap(), PORT);
    for (k, p) in packets.iter().enumerate() {
        w.write_udp(T0_NS + k as u64 * 1_000, src, dst, p).unwrap();
    }
    w.flush().unwrap();
    drop(w);
    let out = std::process::Command::new("tshark")
        .args([
            "-r",
            path.to_str().unwrap(),
            "-d",
            &format!("udp.port=={PORT},moldudp64"),
        ])
        .args([
            "-T",
            "fields",
            "-E",
            "separator=/t",
            "-E",
            "occurrence=a",
            "-E",
            "aggregator=;",
        ])
        .args([
            "-e",
            "moldudp64.session",
            "-e",
            "moldudp64.sequence",
            "-e",
            "moldudp64.count",
        ])
        .args([
            "-e",
            "moldudp64.msgseq",
            "-e",
            "moldudp64.msglen",
            "-e",
            "moldudp64.msgdata",
        ])
        .output();
    let out = match out {
        Ok(o) => o,
        Err(_) => {
            eprintln!("tshark is not installed (scripts/install-test-tools.sh installs it): ITCH decode check skipped");
            return;
        }
    };
    assert!(
        out.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), packets.len(), "one line per packet");
    let mut next_seq = 1u64;
    let mut books = IndependentBooks::default();
    let mut adds: BTreeMap<u64, (u16, itchy::AddOrder, u64)> = BTreeMap::new();
    for line in &lines {
        let f: Vec<&str> = line.split('\t').collect();
        assert_eq!(f[0], "TEST1     ", "session, space-padded to ten bytes");
        assert_eq!(
            f[1].parse::<u64>().unwrap(),
            next_seq,
            "packet sequence number"
        );
        let count: usize = f[2].parse().unwrap();
        let seqs: Vec<u64> = f[3]
            .split(';')
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().unwrap())
            .collect();
        let lens: Vec<usize> = f[4]
            .split(';')
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().unwrap())
            .collect();
        let data: Vec<Vec<u8>> = f[5].split(';').filter(|s| !s.is_empty()).map(hex).collect();
        if count == 0xFFFF {
            continue; // end of session
        }
        assert_eq!(
            (seqs.len(), lens.len(), data.len()),
            (count, count, count),
            "{line}"
        );
        for ((seq, len), m) in seqs.iter().zip(&lens).zip(&data) {
            assert_eq!(*seq, next_seq, "message sequence number");
            assert_eq!(*len, m.len(), "message length");
            next_seq += 1;
            let m = itchy_decode(m);
            if let itchy::Body::AddOrder(a) = &m.body {
                adds.insert(a.reference, (m.stock_locate, a.clone(), m.timestamp));
            }
            books.apply(&m);
        }
    }
    assert_eq!(next_seq, feed.next_sequence(), "tshark saw every message");

    // Field by field against the core: every order that rested has its Add Order with its id,
    // side, price and quantity; every trade its executions under its trade id.
    let defs: BTreeMap<u32, _> = rec.defs.iter().map(|d| (d.instrument.0, d)).collect();
    let mut checked = 0;
    let mut traded = BTreeMap::new();
    for e in rec.batches.iter().flatten() {
        match e {
            Event::OrderLog(l) if l.action == OrderLogAction::New && l.qty_display.0 > 0 => {
                let def = defs[&l.instrument.0];
                if def.price_scale > 4 {
                    assert!(
                        !adds.contains_key(&l.order_id.0),
                        "refused instruments stay out"
                    );
                    continue;
                }
                let (locate, a, ts) = adds
                    .get(&l.order_id.0)
                    .expect("every resting order was added");
                assert_eq!(*locate, feed.projection().locate(def.instrument.0).unwrap());
                assert_eq!(a.stock.trim_end(), def.symbol);
                assert_eq!(a.side == itchy::Side::Buy, l.side == bourse_core::Side::Buy);
                assert_eq!(a.price.raw(), itch_price(l.price.0, def.price_scale));
                assert_eq!(i64::from(a.shares), l.qty_display.0);
                assert_eq!(*ts, l.ts_ns % 86_400_000_000_000);
                checked += 1;
            }
            Event::Trade {
                trade_id,
                instrument,
                qty,
                ..
            } if defs[&instrument.0].price_scale <= 4 => {
                traded.insert(trade_id.0, qty.0 as u64);
            }
            _ => {}
        }
    }
    assert!(checked > 500, "{checked} orders checked");
    assert_eq!(
        adds.keys().filter(|r| **r < REPLACEMENT_REF_BASE).count(),
        checked
    );
    assert_eq!(
        books.executed_by_match, traded,
        "every trade's shares, by trade id"
    );
    for def in rec.defs.iter().filter(|d| d.price_scale <= 4) {
        let locate = feed.projection().locate(def.instrument.0).unwrap();
        let ours: Vec<_> = books
            .sorted(locate)
            .iter()
            .map(|o| (o.1, o.2, o.3))
            .collect();
        let core: Vec<_> = engine_shown(&rec.engine, def)
            .iter()
            .map(|o| (o.1, o.2, o.3))
            .collect();
        assert_eq!(ours, core, "book of {}", def.symbol);
    }
}
