//! Decoded messages as text, one line each, for `bourse md listen` and logs.

use crate::{Channel, Feed};
use bourse_wire::market_data::{parse_packet, Message, Packet};
use std::fmt::Write;

/// One line for the packet header, then one indented line per message. A datagram that does
/// not parse is described by the error instead.
pub fn datagram(channel: Channel, feed: Feed, datagram: &[u8]) -> String {
    match parse_packet(datagram) {
        Ok(p) => packet(channel, feed, &p),
        Err(e) => format!(
            "{} {:?} INVALID ({} bytes): {e}",
            channel.name(),
            feed,
            datagram.len()
        ),
    }
}

pub fn packet(channel: Channel, feed: Feed, p: &Packet<'_>) -> String {
    let mut s = String::with_capacity(128 * p.message_count());
    let _ = write!(
        s,
        "{} {:?} seq={} size={} {:?}",
        channel.name(),
        feed,
        p.header.msg_seq_num,
        p.header.msg_size,
        p.header.msg_flags
    );
    if let Some(i) = p.incremental {
        let _ = write!(
            s,
            " transact={} session={}",
            i.transact_time_ns, i.exchange_trading_session_id
        );
    }
    for m in p.messages() {
        s.push_str("\n  ");
        s.push_str(&message(&m));
    }
    s
}

pub fn message(m: &Message<'_>) -> String {
    match m {
        Message::Heartbeat(d) => format!("Heartbeat last={}", d.last_msg_seq_num()),
        Message::SequenceReset(d) => format!("SequenceReset new={}", d.new_seq_no()),
        Message::BestPrices(d) => {
            let g = d.entries_decoder();
            format!("BestPrices entries={}", g.count())
        }
        Message::EmptyBook(d) => format!("EmptyBook sec={:?} rpt={}", d.security_id(), d.rpt_seq()),
        Message::OrderUpdate(d) => format!(
            "OrderUpdate {:?} sec={} rpt={} id={} {:?} px={} size={}",
            d.md_update_action(),
            d.security_id(),
            d.rpt_seq(),
            d.md_entry_id(),
            d.side(),
            d.md_entry_px(),
            d.md_entry_size()
        ),
        Message::OrderExecution(d) => format!(
            "OrderExecution {:?} sec={} rpt={} id={} {:?} px={} size={} trade={} last={}x{}",
            d.md_update_action(),
            d.security_id(),
            d.rpt_seq(),
            d.md_entry_id(),
            d.side(),
            d.md_entry_px(),
            d.md_entry_size(),
            d.trade_id(),
            d.last_qty(),
            d.last_px()
        ),
        Message::OrderBookSnapshot(d) => format!(
            "OrderBookSnapshot sec={} rpt={} lastSeq={} total={} orders={}",
            d.security_id(),
            d.rpt_seq(),
            d.last_msg_seq_num_processed(),
            d.tot_num_reports(),
            d.entries_decoder().count()
        ),
        Message::SecurityDefinition(d) => format!(
            "SecurityDefinition sec={} symbol={} scale={} tick={} lot={} {:?}",
            d.security_id(),
            bourse_wire::ascii_field(&d.symbol()).unwrap_or("?"),
            d.price_scale(),
            d.tick_size(),
            d.lot_size(),
            d.market()
        ),
        Message::SecurityStatus(d) => format!(
            "SecurityStatus sec={} {:?}",
            d.security_id(),
            d.trading_status()
        ),
        Message::TradingSessionStatus(d) => format!(
            "TradingSessionStatus session={} {:?} {:?}",
            d.exchange_trading_session_id(),
            d.market(),
            d.state()
        ),
        Message::AggregatedBook(d) => format!(
            "AggregatedBook sec={} rpt={} levels={}",
            d.security_id(),
            d.rpt_seq(),
            d.levels_decoder().count()
        ),
        Message::Statistics(d) => format!(
            "Statistics sec={} last={:?}x{:?} vol={} turnover={} o/h/l={:?}/{:?}/{:?} vwap={:?} bid={:?}x{:?} ask={:?}x{:?} trades={}",
            d.security_id(),
            d.last_qty(),
            d.last_px(),
            d.volume(),
            d.turnover(),
            d.open_px(),
            d.high_px(),
            d.low_px(),
            d.vwap_px(),
            d.best_bid_qty(),
            d.best_bid_px(),
            d.best_ask_qty(),
            d.best_ask_px(),
            d.number_of_trades()
        ),
        Message::Trade(d) => format!(
            "Trade sec={} id={} {}x{} aggressor={:?} {:?}",
            d.security_id(),
            d.trade_id(),
            d.qty(),
            d.price(),
            d.aggressor_side(),
            d.trade_type()
        ),
        Message::AuctionIndicative(d) => format!(
            "AuctionIndicative sec={} {}x{:?} surplus={} {:?}",
            d.security_id(),
            d.qty(),
            d.price(),
            d.surplus(),
            d.surplus_side()
        ),
        Message::ReplayRequest(d) => format!(
            "ReplayRequest from={} count={}",
            d.from_msg_seq_num(),
            d.count()
        ),
        Message::ReplayResponse(d) => format!(
            "ReplayResponse from={} count={} {:?}",
            d.from_msg_seq_num(),
            d.count(),
            d.status()
        ),
    }
}
