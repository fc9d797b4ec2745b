//! Build packets holding every market data message, parse them back, and check every field,
//! the packet headers, and the replay framing.

use bourse_wire::frame::{encode_frame, write_frame_header, Encoding, FRAME_HEADER_BYTES};
use bourse_wire::market_data::codec::{
    aggregated_book_codec::{self, *},
    best_prices_codec::{self, *},
    empty_book_codec::*,
    heartbeat_codec::*,
    market::Market,
    md_update_action::MdUpdateAction,
    order_book_snapshot_codec::{self, *},
    order_execution_codec::*,
    order_update_codec::*,
    replay_request_codec::*,
    replay_response_codec::*,
    replay_status::ReplayStatus,
    security_definition_codec::*,
    security_status_codec::*,
    security_trading_status::SecurityTradingStatus,
    sequence_reset_codec::*,
    side::Side,
    statistics_codec::*,
    trade_codec::*,
    trading_session_state::TradingSessionState,
    trading_session_status_codec::*,
};
use bourse_wire::market_data::{
    parse_packet, IncrementalHeader, Message, MsgFlags, PacketHeader, PacketWriter, ReplayFrame,
    ReplayFrameDecoder, TemplateId, INCREMENTAL_HEADER_BYTES, PACKET_BYTES_MAX,
    PACKET_HEADER_BYTES,
};
use bourse_wire::sbe::MESSAGE_HEADER_BYTES;
use bourse_wire::Error;

const T0: u64 = 1_763_700_000_123_456_789;

fn header(seq: u32, flags: u16) -> PacketHeader {
    PacketHeader {
        msg_seq_num: seq,
        msg_size: 0,
        msg_flags: MsgFlags(flags),
        sending_time_ns: T0 + 1,
    }
}

const INC: IncrementalHeader = IncrementalHeader {
    transact_time_ns: T0,
    exchange_trading_session_id: 7,
};

/// An incremental packet with one message of each order-log and status kind.
fn incremental_packet() -> Vec<u8> {
    let mut buf = vec![0u8; PACKET_BYTES_MAX];
    let mut w =
        PacketWriter::new(&mut buf, header(10, MsgFlags::LAST_FRAGMENT), Some(INC)).unwrap();
    w.append(|mut e: OrderUpdateEncoder| {
        e.md_entry_id(1_000_001)
            .md_entry_px(-5)
            .md_entry_size(30)
            .security_id(42);
        e.rpt_seq(9)
            .md_update_action(MdUpdateAction::New)
            .side(Side::Sell);
        e
    })
    .unwrap();
    w.append(|mut e: OrderExecutionEncoder| {
        e.md_entry_id(1_000_001)
            .trade_id(555)
            .md_entry_px(-5)
            .md_entry_size(0);
        e.last_px(-5).last_qty(30).security_id(42).rpt_seq(10);
        e.md_update_action(MdUpdateAction::Delete).side(Side::Sell);
        e
    })
    .unwrap();
    w.append(|mut e: EmptyBookEncoder| {
        e.security_id_opt(None).rpt_seq(0);
        e
    })
    .unwrap();
    w.append(|mut e: TradeEncoder| {
        e.trade_id(555)
            .price(-5)
            .qty(30)
            .security_id(42)
            .aggressor_side(Side::Buy);
        e
    })
    .unwrap();
    w.append(|mut e: SecurityStatusEncoder| {
        e.security_id(42)
            .low_limit_px_opt(Some(-100))
            .high_limit_px_opt(None);
        e.trading_status(SecurityTradingStatus::Halted);
        e
    })
    .unwrap();
    w.append(|mut e: TradingSessionStatusEncoder| {
        e.exchange_trading_session_id(7).market(Market::Derivatives);
        e.state(TradingSessionState::IntermediateClearing);
        e
    })
    .unwrap();
    w.append(|mut e: StatisticsEncoder| {
        e.last_px_opt(Some(-5))
            .last_qty_opt(Some(30))
            .volume(300)
            .turnover(-1_500);
        e.open_px_opt(Some(-4))
            .high_px_opt(Some(-3))
            .low_px_opt(Some(-6));
        e.vwap_px_opt(Some(-5))
            .best_bid_px_opt(None)
            .best_bid_qty_opt(None);
        e.best_ask_px_opt(Some(-2))
            .best_ask_qty_opt(Some(8))
            .security_id(42);
        e.number_of_trades(12);
        e
    })
    .unwrap();
    let n = w.finish().unwrap();
    buf.truncate(n);
    buf
}

#[test]
fn incremental_packet_roundtrip() {
    let buf = incremental_packet();
    let packet = parse_packet(&buf).unwrap();
    assert_eq!(packet.header.msg_seq_num, 10);
    assert_eq!(usize::from(packet.header.msg_size), buf.len());
    assert_eq!(packet.header.sending_time_ns, T0 + 1);
    assert!(packet
        .header
        .msg_flags
        .contains(MsgFlags::LAST_FRAGMENT | MsgFlags::INCREMENTAL_PACKET));
    assert_eq!(packet.incremental, Some(INC));
    assert_eq!(packet.message_count(), 7);

    let mut messages = packet.messages();
    let Some(Message::OrderUpdate(d)) = messages.next() else {
        panic!()
    };
    assert_eq!(
        (d.md_entry_id(), d.md_entry_px(), d.md_entry_size()),
        (1_000_001, -5, 30)
    );
    assert_eq!((d.security_id(), d.rpt_seq()), (42, 9));
    assert_eq!(
        (d.md_update_action(), d.side()),
        (MdUpdateAction::New, Side::Sell)
    );

    let Some(Message::OrderExecution(d)) = messages.next() else {
        panic!()
    };
    assert_eq!(
        (
            d.md_entry_id(),
            d.trade_id(),
            d.md_entry_px(),
            d.md_entry_size()
        ),
        (1_000_001, 555, -5, 0)
    );
    assert_eq!(
        (d.last_px(), d.last_qty(), d.security_id(), d.rpt_seq()),
        (-5, 30, 42, 10)
    );
    assert_eq!(
        (d.md_update_action(), d.side()),
        (MdUpdateAction::Delete, Side::Sell)
    );

    let Some(Message::EmptyBook(d)) = messages.next() else {
        panic!()
    };
    assert_eq!((d.security_id(), d.rpt_seq()), (None, 0));

    let Some(Message::Trade(d)) = messages.next() else {
        panic!()
    };
    assert_eq!(
        (d.trade_id(), d.price(), d.qty(), d.security_id()),
        (555, -5, 30, 42)
    );
    assert_eq!(d.aggressor_side(), Side::Buy);

    let Some(Message::SecurityStatus(d)) = messages.next() else {
        panic!()
    };
    assert_eq!(
        (d.security_id(), d.low_limit_px(), d.high_limit_px()),
        (42, Some(-100), None)
    );
    assert_eq!(d.trading_status(), SecurityTradingStatus::Halted);

    let Some(Message::TradingSessionStatus(d)) = messages.next() else {
        panic!()
    };
    assert_eq!(
        (d.exchange_trading_session_id(), d.market()),
        (7, Market::Derivatives)
    );
    assert_eq!(d.state(), TradingSessionState::IntermediateClearing);

    let Some(Message::Statistics(d)) = messages.next() else {
        panic!()
    };
    assert_eq!(
        (d.last_px(), d.last_qty(), d.volume(), d.turnover()),
        (Some(-5), Some(30), 300, -1_500)
    );
    assert_eq!(
        (d.open_px(), d.high_px(), d.low_px(), d.vwap_px()),
        (Some(-4), Some(-3), Some(-6), Some(-5))
    );
    assert_eq!((d.best_bid_px(), d.best_bid_qty()), (None, None));
    assert_eq!((d.best_ask_px(), d.best_ask_qty()), (Some(-2), Some(8)));
    assert_eq!((d.security_id(), d.number_of_trades()), (42, 12));

    assert!(messages.next().is_none());
}

#[test]
fn snapshot_packet_with_groups() {
    let mut buf = vec![0u8; PACKET_BYTES_MAX];
    let flags = MsgFlags::START_OF_SNAPSHOT | MsgFlags::END_OF_SNAPSHOT | MsgFlags::LAST_FRAGMENT;
    let mut w = PacketWriter::new(&mut buf, header(3, flags), None).unwrap();
    w.append(|mut e: OrderBookSnapshotEncoder| {
        e.security_id(42).last_msg_seq_num_processed(9).rpt_seq(8);
        e.exchange_trading_session_id(7).tot_num_reports(2);
        let mut g = e.entries_encoder(
            3,
            order_book_snapshot_codec::encoder::EntriesEncoder::default(),
        );
        let mut i = 0i64;
        while g.advance().unwrap().is_some() {
            i += 1;
            g.md_entry_id(i as u64)
                .transact_time_ns(T0 + i as u64)
                .md_entry_px(100 + i);
            g.md_entry_size(10 * i)
                .side(if i % 2 == 0 { Side::Buy } else { Side::Sell });
        }
        g.parent().unwrap()
    })
    .unwrap();
    let n = w.finish().unwrap();
    let packet = parse_packet(&buf[..n]).unwrap();
    assert_eq!(packet.incremental, None);
    assert!(packet.header.msg_flags.contains(flags));
    assert!(!packet
        .header
        .msg_flags
        .contains(MsgFlags::INCREMENTAL_PACKET));
    let Some(Message::OrderBookSnapshot(d)) = packet.messages().next() else {
        panic!()
    };
    assert_eq!(
        (d.security_id(), d.last_msg_seq_num_processed(), d.rpt_seq()),
        (42, 9, 8)
    );
    assert_eq!(
        (d.exchange_trading_session_id(), d.tot_num_reports()),
        (7, 2)
    );
    let mut g = d.entries_decoder();
    assert_eq!(g.count(), 3);
    let mut seen = 0i64;
    while let Ok(Some(_)) = g.advance() {
        seen += 1;
        assert_eq!(
            (g.md_entry_id(), g.transact_time_ns()),
            (seen as u64, T0 + seen as u64)
        );
        assert_eq!(
            (g.md_entry_px(), g.md_entry_size()),
            (100 + seen, 10 * seen)
        );
        assert_eq!(g.side(), if seen % 2 == 0 { Side::Buy } else { Side::Sell });
    }
    assert_eq!(seen, 3);
    // Header + root block + group header + 3 entries of 33 bytes.
    let expected = PACKET_HEADER_BYTES + MESSAGE_HEADER_BYTES + 20 + 3 + 3 * 33;
    assert_eq!(n, expected);
}

#[test]
fn aggregated_book_best_prices_and_reference_data() {
    let mut buf = vec![0u8; PACKET_BYTES_MAX];
    let mut w = PacketWriter::new(&mut buf, header(4, MsgFlags::LAST_FRAGMENT), Some(INC)).unwrap();
    w.append(|mut e: AggregatedBookEncoder| {
        e.security_id(42).rpt_seq(11);
        let mut g = e.levels_encoder(40, aggregated_book_codec::encoder::LevelsEncoder::default());
        let mut i = 0i64;
        while g.advance().unwrap().is_some() {
            let side = if i < 20 { Side::Buy } else { Side::Sell };
            g.price(1_000 + i)
                .qty(i + 1)
                .order_count(i as u32)
                .side(side);
            g.level((i % 20 + 1) as u8);
            i += 1;
        }
        g.parent().unwrap()
    })
    .unwrap();
    w.append(|e: BestPricesEncoder| {
        let mut g = e.entries_encoder(2, best_prices_codec::encoder::EntriesEncoder::default());
        let mut i = 0;
        while g.advance().unwrap().is_some() {
            i += 1;
            g.bid_px_opt(Some(99))
                .bid_qty_opt(Some(i))
                .ask_px_opt(None)
                .ask_qty_opt(None);
            g.security_id(i as u32);
        }
        g.parent().unwrap()
    })
    .unwrap();
    w.append(|mut e: SecurityDefinitionEncoder| {
        e.security_id(42)
            .tick_size(5)
            .lot_size(10)
            .contract_multiplier(1);
        e.low_limit_px_opt(None)
            .high_limit_px_opt(Some(2_000))
            .tot_num_reports(1);
        e.maturity_date_opt(Some(20_261_218))
            .symbol_zero_padded(b"SBER");
        e.currency(b"RUB").market(Market::Equities).price_scale(2);
        e
    })
    .unwrap();
    w.append(|mut e: HeartbeatEncoder| {
        e.last_msg_seq_num(3);
        e
    })
    .unwrap();
    w.append(|mut e: SequenceResetEncoder| {
        e.new_seq_no(1);
        e
    })
    .unwrap();
    let n = w.finish().unwrap();
    let packet = parse_packet(&buf[..n]).unwrap();
    let mut messages = packet.messages();

    let Some(Message::AggregatedBook(d)) = messages.next() else {
        panic!()
    };
    assert_eq!((d.security_id(), d.rpt_seq()), (42, 11));
    let mut g = d.levels_decoder();
    let mut i = 0i64;
    while let Ok(Some(_)) = g.advance() {
        assert_eq!(
            (g.price(), g.qty(), g.order_count()),
            (1_000 + i, i + 1, i as u32)
        );
        assert_eq!(g.side(), if i < 20 { Side::Buy } else { Side::Sell });
        assert_eq!(g.level(), (i % 20 + 1) as u8);
        i += 1;
    }
    assert_eq!(i, 40);

    let Some(Message::BestPrices(d)) = messages.next() else {
        panic!()
    };
    let mut g = d.entries_decoder();
    let mut i = 0;
    while let Ok(Some(_)) = g.advance() {
        i += 1;
        assert_eq!(
            (g.bid_px(), g.bid_qty(), g.ask_px(), g.ask_qty()),
            (Some(99), Some(i), None, None)
        );
        assert_eq!(g.security_id(), i as u32);
    }
    assert_eq!(i, 2);

    let Some(Message::SecurityDefinition(d)) = messages.next() else {
        panic!()
    };
    assert_eq!(
        (
            d.security_id(),
            d.tick_size(),
            d.lot_size(),
            d.contract_multiplier()
        ),
        (42, 5, 10, 1)
    );
    assert_eq!(
        (d.low_limit_px(), d.high_limit_px(), d.tot_num_reports()),
        (None, Some(2_000), 1)
    );
    assert_eq!(d.maturity_date(), Some(20_261_218));
    assert_eq!(bourse_wire::ascii_field(&d.symbol()), Some("SBER"));
    assert_eq!(&d.currency(), b"RUB");
    assert_eq!((d.market(), d.price_scale()), (Market::Equities, 2));

    let Some(Message::Heartbeat(d)) = messages.next() else {
        panic!()
    };
    assert_eq!(d.last_msg_seq_num(), 3);
    let Some(Message::SequenceReset(d)) = messages.next() else {
        panic!()
    };
    assert_eq!(d.new_seq_no(), 1);
    assert!(messages.next().is_none());
}

#[test]
fn too_many_levels_is_refused() {
    let mut buf = vec![0u8; PACKET_BYTES_MAX];
    let mut w = PacketWriter::new(&mut buf, header(4, 0), None).unwrap();
    w.append(|mut e: AggregatedBookEncoder| {
        e.security_id(42).rpt_seq(11);
        let mut g = e.levels_encoder(41, aggregated_book_codec::encoder::LevelsEncoder::default());
        while g.advance().unwrap().is_some() {
            g.price(1).qty(1).order_count(1).side(Side::Buy).level(1);
        }
        g.parent().unwrap()
    })
    .unwrap();
    let n = w.finish().unwrap();
    assert_eq!(
        parse_packet(&buf[..n]).unwrap_err(),
        Error::GroupCountTooLarge {
            template_id: TemplateId::AggregatedBook as u16,
            count: 41,
            count_max: 40
        }
    );
}

#[test]
fn replay_frames() {
    // Client request: one SBE message in a frame.
    let mut req = vec![0u8; 64];
    let n = encode_frame(&mut req, |mut e: ReplayRequestEncoder| {
        e.from_msg_seq_num(10).count(2);
        e
    })
    .unwrap();
    req.truncate(n);
    let decoded = ReplayFrameDecoder::default().decode(&req).unwrap().unwrap();
    let ReplayFrame::Message(Message::ReplayRequest(d)) = decoded.frame else {
        panic!()
    };
    assert_eq!((d.from_msg_seq_num(), d.count()), (10, 2));

    // Server: a resent packet, then the closing response.
    let packet = incremental_packet();
    let mut stream = vec![0u8; FRAME_HEADER_BYTES];
    write_frame_header(&mut stream, Encoding::MarketDataPacket, packet.len()).unwrap();
    stream.extend_from_slice(&packet);
    let mut resp = vec![0u8; 64];
    let n = encode_frame(&mut resp, |mut e: ReplayResponseEncoder| {
        e.from_msg_seq_num(10)
            .count(1)
            .status(ReplayStatus::Complete);
        e
    })
    .unwrap();
    stream.extend_from_slice(&resp[..n]);

    let decoder = ReplayFrameDecoder::default();
    let first = decoder.decode(&stream).unwrap().unwrap();
    let ReplayFrame::Packet(p) = first.frame else {
        panic!()
    };
    assert_eq!(p.header.msg_seq_num, 10);
    assert_eq!(p.message_count(), 7);
    let second = decoder
        .decode(&stream[first.frame_bytes..])
        .unwrap()
        .unwrap();
    let ReplayFrame::Message(Message::ReplayResponse(d)) = second.frame else {
        panic!()
    };
    assert_eq!(
        (d.from_msg_seq_num(), d.count(), d.status()),
        (10, 1, ReplayStatus::Complete)
    );
    assert_eq!(first.frame_bytes + second.frame_bytes, stream.len());
}

#[test]
fn header_errors_are_specific() {
    let mut buf = incremental_packet();
    assert_eq!(
        parse_packet(&buf[..buf.len() - 1]).unwrap_err(),
        Error::PacketSizeMismatch {
            msg_size: buf.len() as u16,
            datagram_bytes: buf.len() - 1
        }
    );
    assert_eq!(
        parse_packet(&buf[..10]).unwrap_err(),
        Error::Truncated {
            needed_bytes: PACKET_HEADER_BYTES,
            available_bytes: 10
        }
    );
    // Version from the future in the first message.
    let at = PACKET_HEADER_BYTES + INCREMENTAL_HEADER_BYTES + 6;
    buf[at..at + 2].copy_from_slice(&3u16.to_le_bytes());
    assert_eq!(
        parse_packet(&buf).unwrap_err(),
        Error::VersionFromFuture {
            version: 3,
            supported: 2
        }
    );
    // Wrong schema id.
    buf[at - 2..at].copy_from_slice(&1u16.to_le_bytes());
    assert_eq!(
        parse_packet(&buf).unwrap_err(),
        Error::WrongSchemaId {
            schema_id: 1,
            expected: 2
        }
    );

    let mut empty = vec![0u8; 64];
    let n = PacketWriter::new(&mut empty, header(1, 0), None)
        .unwrap()
        .finish();
    assert_eq!(n, Err(Error::EmptyPacket));
    let too_big = vec![0u8; PACKET_BYTES_MAX + 1];
    assert!(matches!(
        parse_packet(&too_big),
        Err(Error::PacketTooLarge { .. })
    ));
}

#[test]
fn every_template_decodes() {
    assert_eq!(TemplateId::ALL.len(), 16);
    for &t in TemplateId::ALL {
        assert_eq!(TemplateId::from_u16(t as u16), Some(t));
    }
}

/// The worked example in docs/protocol-market-data.md; if this test changes, the document
/// must change with it.
#[test]
fn order_update_packet_golden_bytes() {
    let mut buf = vec![0u8; PACKET_BYTES_MAX];
    let header = PacketHeader {
        msg_seq_num: 1_000,
        msg_size: 0,
        msg_flags: MsgFlags(MsgFlags::LAST_FRAGMENT),
        sending_time_ns: 0x0102_0304_0506_0708,
    };
    let inc = IncrementalHeader {
        transact_time_ns: 0x0102_0304_0506_0700,
        exchange_trading_session_id: 5,
    };
    let mut w = PacketWriter::new(&mut buf, header, Some(inc)).unwrap();
    w.append(|mut e: OrderUpdateEncoder| {
        e.md_entry_id(77)
            .md_entry_px(10_050)
            .md_entry_size(10)
            .security_id(1001);
        e.rpt_seq(3)
            .md_update_action(MdUpdateAction::New)
            .side(Side::Buy);
        e
    })
    .unwrap();
    let n = w.finish().unwrap();
    let hex: Vec<String> = buf[..n].iter().map(|b| format!("{b:02x}")).collect();
    let expected = "e8 03 00 00 46 00 09 00 08 07 06 05 04 03 02 01 \
                    00 07 06 05 04 03 02 01 05 00 00 00 \
                    22 00 05 00 02 00 02 00 \
                    4d 00 00 00 00 00 00 00 \
                    42 27 00 00 00 00 00 00 \
                    0a 00 00 00 00 00 00 00 \
                    e9 03 00 00 \
                    03 00 00 00 \
                    00 01";
    assert_eq!(
        hex.join(" "),
        expected.split_whitespace().collect::<Vec<_>>().join(" ")
    );
}

#[test]
fn a_version_1_trade_without_its_trade_type_is_read_by_its_own_block_length() {
    let mut buf = vec![0u8; PACKET_BYTES_MAX];
    let mut w = PacketWriter::new(&mut buf, header(5, MsgFlags::LAST_FRAGMENT), None).unwrap();
    w.append(|mut e: TradeEncoder| {
        e.trade_id(7)
            .price(100)
            .qty(3)
            .security_id(42)
            .aggressor_side(Side::Sell)
            .trade_type(bourse_wire::market_data::codec::trade_type::TradeType::Auction);
        e
    })
    .unwrap();
    let n = w.finish().unwrap();
    // The same message as a version 1 publisher wrote it: blockLength 29, version 1, the
    // trailing tradeType byte gone, the packet one byte shorter.
    let mut v1 = buf[..n - 1].to_vec();
    let at = PACKET_HEADER_BYTES;
    v1[at..at + 2].copy_from_slice(&29u16.to_le_bytes());
    v1[at + 6..at + 8].copy_from_slice(&1u16.to_le_bytes());
    v1[4..6].copy_from_slice(&((n - 1) as u16).to_le_bytes());
    let p = parse_packet(&v1).unwrap();
    let Some(Message::Trade(t)) = p.messages().next() else {
        panic!("a trade")
    };
    assert_eq!((t.trade_id(), t.price(), t.qty()), (7, 100, 3));
    // Not an auction trade: a version 1 feed had none.
    assert_ne!(
        t.trade_type(),
        bourse_wire::market_data::codec::trade_type::TradeType::Auction
    );
    // And the version 2 message says Auction.
    let Some(Message::Trade(t)) = parse_packet(&buf[..n]).unwrap().messages().next() else {
        panic!("a trade")
    };
    assert_eq!(
        t.trade_type(),
        bourse_wire::market_data::codec::trade_type::TradeType::Auction
    );
}
