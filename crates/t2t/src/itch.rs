//! The ITCH side of tick-to-trade: MoldUDP64 packets of ITCH 5.0 messages, as `bourse itch
//! serve` sends them and `bourse itch tail --pcap` records them.
//!
//! The client reads them with `bourse_itch`'s own decoders, which fit the hot path as they
//! are: [`mold::Packet::parse`] checks every block against the datagram before a message is
//! read and only borrows it, and [`msg::Message::decode`] returns a plain `Copy` value; neither
//! allocates, locks or calls the system. What this module adds is the client's reading:
//!
//! - [`Sequencer`]: which messages of a packet are new. A packet wholly below the next
//!   sequence number is a copy (a retransmission, the other feed); one that overlaps is
//!   applied from the next number on; one past it is a gap, counted and applied anyway (the
//!   seed's client does not recover, it follows).
//! - [`item_of`]: what a message does to a book, as the [`Update`] the SBE path also makes
//!   (the stock locate code stands for the security id).
//! - [`synthetic`]: a capture of MoldUDP64 packets of exactly N ITCH messages each (1..=128),
//!   for the size curve.
//!
//! The driver's reference model reads packets with the same [`Sequencer`] and [`item_of`]
//! and keeps its own books (`bourse_marketdata::OrderBook`); the tests compare the client's
//! books with `bourse_itch`'s gap-filling consumer.

use crate::gen::{GenConfig, Rng};
use crate::reactor::Update;
use bourse_core::Side;
use bourse_itch::mold::{PacketBuilder, PacketHeader, Session, HEADER_BYTES};
use bourse_itch::msg::{self, event_code, stock_of, Body, Header, Message, StockDirectory};

pub use bourse_itch::mold;
pub use bourse_itch::msg::Message as ItchMessage;

/// Bytes one message takes in a packet at most: its length prefix and the largest message.
pub const BLOCK_BYTES_MAX: usize = 2 + msg::MESSAGE_BYTES_MAX;
/// The largest message the synthetic generator writes (Stock Directory, 39 bytes; its order
/// flow is Add Order, Order Executed, Order Cancel, Order Delete, Order Replace), with its
/// length prefix: a call auction's Cross Trade, the largest of the feed's, is never generated.
pub const GENERATED_BLOCK_BYTES_MAX: usize = 2 + 39;
/// ITCH prices carry four decimals.
pub const PRICE_SCALE: u8 = 4;
/// The session name the generator writes.
pub const SESSION: Session = *b"BOURSET2T ";

/// What to do with a packet, given the sequence numbers already applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// A packet of another session than the first one seen: skipped.
    OtherSession,
    Heartbeat,
    EndOfSession,
    /// Every message was applied already.
    Duplicate,
    /// Apply the messages numbered `from` and up; `gap` when some before them never came.
    Apply {
        from: u64,
        gap: bool,
    },
}

/// The next sequence number due, and the session followed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sequencer {
    session: Option<Session>,
    next: Option<u64>,
}

impl Sequencer {
    /// Decides about a packet and, when it is applied, moves past its messages.
    #[inline]
    pub fn admit(&mut self, h: &PacketHeader) -> Admit {
        match self.session {
            None => self.session = Some(h.session),
            Some(s) if s != h.session => return Admit::OtherSession,
            Some(_) => {}
        }
        if h.is_end_of_session() {
            return Admit::EndOfSession;
        }
        if h.is_heartbeat() {
            return Admit::Heartbeat;
        }
        let end = h.sequence.saturating_add(u64::from(h.count));
        match self.next {
            Some(next) if end <= next => Admit::Duplicate,
            Some(next) => {
                self.next = Some(end);
                Admit::Apply {
                    from: next.max(h.sequence),
                    gap: h.sequence > next,
                }
            }
            None => {
                self.next = Some(end);
                Admit::Apply {
                    from: h.sequence,
                    gap: false,
                }
            }
        }
    }
}

/// What a message means to a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Item {
    /// A book update (Add, Executed, Cancel, Delete, Replace).
    Update(Update),
    /// A stock directory entry: the symbol of a stock locate code.
    Directory { locate: u16, stock: [u8; 8] },
    /// System events and Trade (an execution the book never showed) change no book.
    Other,
}

/// What a message means to a client.
#[inline]
pub fn item_of(m: &Message) -> Item {
    let security_id = u32::from(m.header.stock_locate);
    Item::Update(match m.body {
        Body::AddOrder {
            order_ref,
            side,
            shares,
            price,
            ..
        } => Update::New {
            security_id,
            order_id: order_ref,
            side: if side == b'B' { Side::Buy } else { Side::Sell },
            price: i64::from(price),
            qty: i64::from(shares),
        },
        Body::OrderExecuted {
            order_ref,
            executed_shares: by,
            ..
        }
        | Body::OrderExecutedWithPrice {
            order_ref,
            executed_shares: by,
            ..
        }
        | Body::OrderCancel {
            order_ref,
            cancelled_shares: by,
        } => Update::Reduce {
            security_id,
            order_id: order_ref,
            by: i64::from(by),
        },
        Body::OrderDelete { order_ref } => Update::Delete {
            security_id,
            order_id: order_ref,
        },
        Body::OrderReplace {
            original_ref,
            new_ref,
            shares,
            price,
        } => Update::Replace {
            security_id,
            order_id: original_ref,
            new_order_id: new_ref,
            price: i64::from(price),
            qty: i64::from(shares),
        },
        Body::StockDirectory(d) => {
            return Item::Directory {
                locate: m.header.stock_locate,
                stock: d.stock,
            }
        }
        Body::SystemEvent { .. }
        | Body::Trade { .. }
        | Body::CrossTrade { .. }
        | Body::Noii { .. } => return Item::Other,
    })
}

/// A stock as text: the eight bytes without their padding.
pub fn stock_text(stock: &[u8; 8]) -> &str {
    std::str::from_utf8(stock).map_or("", |s| s.trim_end())
}

/// Packet bytes `messages` blocks of the largest message the synthetic generator writes need.
pub fn packet_bytes(messages: usize) -> usize {
    HEADER_BYTES + messages * GENERATED_BLOCK_BYTES_MAX
}

struct Book {
    locate: u16,
    /// (order reference, side, price, shares)
    orders: Vec<(u64, u8, u32, u32)>,
}

fn header(locate: u16, ts_ns: u64) -> Header {
    Header {
        stock_locate: locate,
        tracking_number: 0,
        timestamp_ns: ts_ns % msg::DAY_NS,
    }
}

fn directory(symbol: &str) -> StockDirectory {
    StockDirectory {
        stock: stock_of(symbol),
        market_category: b' ',
        financial_status: b' ',
        round_lot_size: 1,
        round_lots_only: b'N',
        issue_classification: b'Q',
        issue_subtype: *b"Z ",
        authenticity: b'P',
        short_sale_threshold: b' ',
        ipo_flag: b' ',
        luld_tier: b' ',
        etp_flag: b' ',
        etp_leverage_factor: 0,
        inverse: b'N',
    }
}

/// The next message of the synthetic flow for one book: adds until it holds a few orders,
/// then adds, partial cancels, replaces (a new price and reference), executions and deletes.
fn next_message(b: &mut Book, rng: &mut Rng, cfg: &GenConfig, next_ref: &mut u64) -> Body {
    let roll = rng.below(100);
    let n = b.orders.len();
    let new_price = |side: u8, rng: &mut Rng| {
        let offset = 1 + rng.below(10) as i64;
        let p = if side == b'B' {
            cfg.mid_price - offset
        } else {
            cfg.mid_price + offset
        };
        p.clamp(1, i64::from(u32::MAX)) as u32
    };
    if n < 8 || (n < cfg.orders_per_book_max && roll < 45) {
        let side = if rng.below(2) == 0 { b'B' } else { b'S' };
        let price = new_price(side, rng);
        let shares = 1 + rng.below(100) as u32;
        let order_ref = *next_ref;
        *next_ref += 1;
        b.orders.push((order_ref, side, price, shares));
        return Body::AddOrder {
            order_ref,
            side,
            shares,
            stock: [b' '; 8],
            price,
        };
    }
    let k = rng.below(n as u64) as usize;
    let (order_ref, side, _, shares) = b.orders[k];
    if roll < 52 && shares > 1 {
        let cancelled = 1 + rng.below(u64::from(shares - 1)) as u32;
        b.orders[k].3 -= cancelled;
        return Body::OrderCancel {
            order_ref,
            cancelled_shares: cancelled,
        };
    }
    if roll < 60 {
        let new_ref = *next_ref;
        *next_ref += 1;
        let price = new_price(side, rng);
        let shares = 1 + rng.below(100) as u32;
        b.orders[k] = (new_ref, side, price, shares);
        return Body::OrderReplace {
            original_ref: order_ref,
            new_ref,
            shares,
            price,
        };
    }
    if roll < 75 {
        let executed = if shares > 1 && rng.below(2) == 0 {
            1 + rng.below(u64::from(shares - 1)) as u32
        } else {
            shares
        };
        if executed == shares {
            b.orders.swap_remove(k);
        } else {
            b.orders[k].3 -= executed;
        }
        return Body::OrderExecuted {
            order_ref,
            executed_shares: executed,
            match_number: *next_ref,
        };
    }
    b.orders.swap_remove(k);
    Body::OrderDelete { order_ref }
}

/// A synthetic ITCH day in MoldUDP64 packets of exactly the configured numbers of messages:
/// Start of Messages and one stock directory entry per instrument (symbol `T2T<locate>`)
/// first, then the order flow; prices are Price(4) around `cfg.mid_price`.
pub fn synthetic(cfg: &GenConfig) -> Result<Vec<Vec<u8>>, String> {
    let largest = usize::from(cfg.sizes.max());
    if packet_bytes(largest) > cfg.packet_bytes_max {
        return Err(format!(
            "{largest} ITCH messages per packet may take {} bytes, above the packet limit of {} (the feed's is 1472, so at most {} messages fit); raise --packet-bytes-max for a loopback-only capture and give the client and driver the same",
            packet_bytes(largest),
            cfg.packet_bytes_max,
            cfg.packet_bytes_max.saturating_sub(HEADER_BYTES) / GENERATED_BLOCK_BYTES_MAX
        ));
    }
    let instruments = u16::try_from(cfg.instruments)
        .ok()
        .filter(|&n| n > 0 && n < u16::MAX)
        .ok_or_else(|| format!("{} instruments: ITCH takes 1 to 65,534", cfg.instruments))?;
    let mut builder = PacketBuilder::new(SESSION, cfg.packet_bytes_max.max(HEADER_BYTES + 46))?;
    let mut rng = Rng::new(cfg.seed);
    let mut books: Vec<Book> = (1..=instruments)
        .map(|locate| Book {
            locate,
            orders: Vec::new(),
        })
        .collect();
    let mut pending: std::collections::VecDeque<(u16, Body)> = std::collections::VecDeque::new();
    pending.push_back((
        0,
        Body::SystemEvent {
            event_code: event_code::START_OF_MESSAGES,
        },
    ));
    for b in &books {
        let symbol = format!("T2T{}", b.locate);
        pending.push_back((b.locate, Body::StockDirectory(directory(&symbol))));
    }
    let mut next_ref = 1u64;
    let mut sequence = 1u64;
    let mut encoded = Vec::with_capacity(msg::MESSAGE_BYTES_MAX);
    let mut packets = Vec::with_capacity(cfg.packets);
    for k in 0..cfg.packets {
        let size = cfg.sizes.next_size(k, &mut rng);
        let ts = cfg.start_ns + k as u64 * 10_000;
        for _ in 0..size {
            let (locate, body) = match pending.pop_front() {
                Some(m) => m,
                None => {
                    let i = rng.below(books.len() as u64) as usize;
                    let mut body = next_message(&mut books[i], &mut rng, cfg, &mut next_ref);
                    if let Body::AddOrder { stock, .. } = &mut body {
                        *stock = stock_of(&format!("T2T{}", books[i].locate));
                    }
                    (books[i].locate, body)
                }
            };
            encoded.clear();
            Message {
                header: header(locate, ts),
                body,
            }
            .encode(&mut encoded);
            assert!(
                2 + encoded.len() <= GENERATED_BLOCK_BYTES_MAX,
                "a generated message of {} bytes is beyond the packet budget",
                encoded.len()
            );
            builder.push(sequence, &encoded);
            sequence += 1;
        }
        packets.push(builder.take().map(<[u8]>::to_vec).unwrap_or_default());
    }
    Ok(packets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::Sizes;

    fn h(sequence: u64, count: u16) -> PacketHeader {
        PacketHeader {
            session: SESSION,
            sequence,
            count,
        }
    }

    #[test]
    fn copies_are_skipped_overlaps_applied_from_the_next_number_and_gaps_followed() {
        let mut s = Sequencer::default();
        assert_eq!(
            s.admit(&h(1, 3)),
            Admit::Apply {
                from: 1,
                gap: false
            }
        );
        assert_eq!(s.admit(&h(1, 3)), Admit::Duplicate);
        assert_eq!(s.admit(&h(2, 1)), Admit::Duplicate);
        assert_eq!(
            s.admit(&h(3, 3)),
            Admit::Apply {
                from: 4,
                gap: false
            }
        );
        assert_eq!(s.admit(&h(9, 1)), Admit::Apply { from: 9, gap: true });
        assert_eq!(s.admit(&h(10, 0)), Admit::Heartbeat);
        let mut other = h(10, 1);
        other.session = *b"OTHER     ";
        assert_eq!(s.admit(&other), Admit::OtherSession);
        assert_eq!(s.admit(&h(10, u16::MAX)), Admit::EndOfSession);
    }

    #[test]
    fn generated_packets_hold_exactly_the_sizes_asked_for() {
        let cfg = GenConfig {
            packets: 50,
            sizes: Sizes::parse("1,7,31").unwrap(),
            ..GenConfig::default()
        };
        let packets = synthetic(&cfg).unwrap();
        let mut next = 1;
        for (k, p) in packets.iter().enumerate() {
            assert!(p.len() <= 1472);
            let parsed = mold::Packet::parse(p).unwrap();
            assert_eq!(usize::from(parsed.header.count), [1, 7, 31][k % 3]);
            for (seq, m) in parsed.messages() {
                assert_eq!(seq, next);
                next += 1;
                Message::decode(m).unwrap();
            }
        }
        // One message more than the feed's packet holds of the generator's largest.
        let fit = (1472 - HEADER_BYTES) / GENERATED_BLOCK_BYTES_MAX;
        let too_big = GenConfig {
            sizes: Sizes::parse(&(fit + 1).to_string()).unwrap(),
            ..cfg
        };
        assert!(synthetic(&too_big)
            .unwrap_err()
            .contains(&format!("{fit} messages fit")));
    }
}
