//! Captures to replay: packets of a chosen number of order-log updates (1 to 128), for the
//! size curve.
//!
//! - [`synthetic`]: an order log of its own (adds, quantity changes, executions, deletes over
//!   several instruments, each book opened by EmptyBook so a subscriber can follow it from
//!   the first packet), with valid RptSeqs and MsgSeqNums.
//! - [`repack`]: the order-log messages of a recording (`bourse md record` during a demo or a
//!   load test), byte for byte, in packets of the chosen sizes.
//!
//! A packet holds at most 21 order-log messages of the largest kind (OrderExecution, 66
//! bytes) within the feed's 1472-byte limit
//! (`PACKET_BYTES_MAX`); larger sizes need a larger `packet_bytes_max`, which only a loopback
//! run with a client configured for it accepts. Asking for a size that does not fit is an
//! error that says so, not a silently smaller packet.

use crate::capture::Capture;
use crate::reactor::order_log_update;
use bourse_marketdata::pcap::PcapWriter;
use bourse_marketdata::wire::market_data::codec::{
    empty_book_codec::EmptyBookEncoder, md_update_action::MdUpdateAction,
    order_execution_codec::OrderExecutionEncoder, order_update_codec::OrderUpdateEncoder,
    side::Side as WireSide,
};
use bourse_marketdata::wire::market_data::{
    decode_message, IncrementalHeader, MsgFlags, PacketHeader, PacketParser,
    INCREMENTAL_HEADER_BYTES, MESSAGES_PER_PACKET_MAX, PACKET_HEADER_BYTES,
};
use bourse_marketdata::wire::sbe::encode_message;
use std::net::{Ipv4Addr, SocketAddrV4};

/// How many updates each packet carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sizes {
    /// Uniformly at random in `min..=max`.
    Uniform { min: u16, max: u16 },
    /// These sizes in turn.
    Cycle(Vec<u16>),
}

impl Sizes {
    /// Parses `A-B` (uniform) or `A,B,C` (in turn) or `A` (fixed).
    pub fn parse(text: &str) -> Result<Sizes, String> {
        let num = |t: &str| -> Result<u16, String> {
            let v: u16 = t
                .trim()
                .parse()
                .map_err(|_| format!("updates per packet: {t:?} is not a number"))?;
            if v == 0 || usize::from(v) > MESSAGES_PER_PACKET_MAX {
                return Err(format!(
                    "updates per packet: {v} is outside 1..={MESSAGES_PER_PACKET_MAX}"
                ));
            }
            Ok(v)
        };
        if let Some((a, b)) = text.split_once('-') {
            let (min, max) = (num(a)?, num(b)?);
            if min > max {
                return Err(format!("updates per packet: {min}-{max} is an empty range"));
            }
            return Ok(Sizes::Uniform { min, max });
        }
        Ok(Sizes::Cycle(
            text.split(',').map(num).collect::<Result<_, _>>()?,
        ))
    }

    /// The largest size asked for.
    pub fn max(&self) -> u16 {
        match self {
            Sizes::Uniform { max, .. } => *max,
            Sizes::Cycle(v) => v.iter().copied().max().unwrap_or(1),
        }
    }

    /// The size of packet `k`.
    pub fn next_size(&self, k: usize, rng: &mut Rng) -> usize {
        match self {
            Sizes::Uniform { min, max } => {
                usize::from(*min) + rng.below(u64::from(max - min) + 1) as usize
            }
            Sizes::Cycle(v) => usize::from(v[k % v.len()]),
        }
    }
}

/// splitmix64: a small deterministic generator, so a seed names a capture.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Settings of a synthetic capture.
#[derive(Clone, Debug)]
pub struct GenConfig {
    pub packets: usize,
    pub instruments: u32,
    pub first_security_id: u32,
    pub sizes: Sizes,
    pub seed: u64,
    /// Price mantissa around which the books are built.
    pub mid_price: i64,
    /// Resting orders per book the flow keeps under.
    pub orders_per_book_max: usize,
    pub packet_bytes_max: usize,
    /// SendingTime of the first packet, ns since the epoch.
    pub start_ns: u64,
}

impl Default for GenConfig {
    fn default() -> Self {
        GenConfig {
            packets: 90_000,
            instruments: 4,
            first_security_id: 1001,
            sizes: Sizes::Uniform { min: 1, max: 20 },
            seed: 4,
            mid_price: 10_000,
            orders_per_book_max: 40,
            packet_bytes_max: bourse_marketdata::wire::market_data::PACKET_BYTES_MAX,
            start_ns: 1_700_000_000_000_000_000,
        }
    }
}

/// Size of the largest order-log message (OrderExecution with its SBE header).
const MESSAGE_BYTES_MAX: usize = 8 + 58;

/// Packet bytes `updates` messages of `message_bytes` need.
fn packet_bytes(updates: usize, message_bytes: usize) -> usize {
    PACKET_HEADER_BYTES + INCREMENTAL_HEADER_BYTES + updates * message_bytes
}

/// Assembles one incremental packet from encoded messages.
fn assemble(
    seq: u32,
    sending_ns: u64,
    incremental: IncrementalHeader,
    messages: &[&[u8]],
) -> Vec<u8> {
    let len = PACKET_HEADER_BYTES
        + INCREMENTAL_HEADER_BYTES
        + messages.iter().map(|m| m.len()).sum::<usize>();
    let mut out = vec![0u8; len];
    let header = PacketHeader {
        msg_seq_num: seq,
        msg_size: len as u16,
        msg_flags: MsgFlags(MsgFlags::LAST_FRAGMENT | MsgFlags::INCREMENTAL_PACKET),
        sending_time_ns: sending_ns,
    };
    // The buffer is exactly as long as the headers need: these writes cannot fail.
    let _ = header.write(&mut out);
    let _ = incremental.write(&mut out[PACKET_HEADER_BYTES..]);
    let mut at = PACKET_HEADER_BYTES + INCREMENTAL_HEADER_BYTES;
    for m in messages {
        out[at..at + m.len()].copy_from_slice(m);
        at += m.len();
    }
    out
}

struct Book {
    security_id: u32,
    rpt: u32,
    /// (order id, side, price, qty)
    orders: Vec<(u64, WireSide, i64, i64)>,
}

/// The next message of the synthetic flow for one book.
fn next_message(
    b: &mut Book,
    rng: &mut Rng,
    cfg: &GenConfig,
    next_id: &mut u64,
    next_trade: &mut u64,
) -> Vec<u8> {
    let mut scratch = [0u8; 128];
    b.rpt += 1;
    let (sid, rpt) = (b.security_id, b.rpt);
    let roll = rng.below(100);
    let n = b.orders.len();
    if n < 8 || (n < cfg.orders_per_book_max && roll < 45) {
        let side = if rng.below(2) == 0 {
            WireSide::Buy
        } else {
            WireSide::Sell
        };
        let offset = 1 + rng.below(10) as i64;
        let price = if side == WireSide::Buy {
            cfg.mid_price - offset
        } else {
            cfg.mid_price + offset
        };
        let qty = 1 + rng.below(100) as i64;
        let id = *next_id;
        *next_id += 1;
        b.orders.push((id, side, price, qty));
        let len = encode_message::<OrderUpdateEncoder, _>(&mut scratch, |mut e| {
            e.md_entry_id(id)
                .md_entry_px(price)
                .md_entry_size(qty)
                .security_id(sid);
            e.rpt_seq(rpt)
                .md_update_action(MdUpdateAction::New)
                .side(side);
            e
        });
        return scratch[..len.unwrap_or(0)].to_vec();
    }
    let k = rng.below(n as u64) as usize;
    let (id, side, price, qty) = b.orders[k];
    if roll < 60 {
        let new_qty = 1 + rng.below(100) as i64;
        b.orders[k].3 = new_qty;
        let len = encode_message::<OrderUpdateEncoder, _>(&mut scratch, |mut e| {
            e.md_entry_id(id)
                .md_entry_px(price)
                .md_entry_size(new_qty)
                .security_id(sid);
            e.rpt_seq(rpt)
                .md_update_action(MdUpdateAction::Change)
                .side(side);
            e
        });
        return scratch[..len.unwrap_or(0)].to_vec();
    }
    if roll < 75 {
        let traded = if qty > 1 && rng.below(2) == 0 {
            1 + rng.below(qty as u64 - 1) as i64
        } else {
            qty
        };
        let left = qty - traded;
        let action = if left > 0 {
            b.orders[k].3 = left;
            MdUpdateAction::Change
        } else {
            b.orders.swap_remove(k);
            MdUpdateAction::Delete
        };
        let trade_id = *next_trade;
        *next_trade += 1;
        let len = encode_message::<OrderExecutionEncoder, _>(&mut scratch, |mut e| {
            e.md_entry_id(id)
                .trade_id(trade_id)
                .md_entry_px(price)
                .md_entry_size(left);
            e.last_px(price)
                .last_qty(traded)
                .security_id(sid)
                .rpt_seq(rpt);
            e.md_update_action(action).side(side);
            e
        });
        return scratch[..len.unwrap_or(0)].to_vec();
    }
    b.orders.swap_remove(k);
    let len = encode_message::<OrderUpdateEncoder, _>(&mut scratch, |mut e| {
        e.md_entry_id(id)
            .md_entry_px(price)
            .md_entry_size(0)
            .security_id(sid);
        e.rpt_seq(rpt)
            .md_update_action(MdUpdateAction::Delete)
            .side(side);
        e
    });
    scratch[..len.unwrap_or(0)].to_vec()
}

fn check_fits(sizes: &Sizes, packet_bytes_max: usize, message_bytes: usize) -> Result<(), String> {
    let need = packet_bytes(usize::from(sizes.max()), message_bytes);
    if need > packet_bytes_max {
        return Err(format!(
            "{} updates per packet may take {need} bytes, above the packet limit of {packet_bytes_max} (the feed's is 1472, so at most {} updates of the largest message fit); raise --packet-bytes-max for a loopback-only capture and give the client and driver the same",
            sizes.max(),
            (packet_bytes_max.saturating_sub(PACKET_HEADER_BYTES + INCREMENTAL_HEADER_BYTES)) / message_bytes
        ));
    }
    Ok(())
}

/// A synthetic order log in packets of the configured sizes.
pub fn synthetic(cfg: &GenConfig) -> Result<Vec<Vec<u8>>, String> {
    check_fits(&cfg.sizes, cfg.packet_bytes_max, MESSAGE_BYTES_MAX)?;
    if cfg.instruments == 0 {
        return Err("at least one instrument".into());
    }
    let mut rng = Rng::new(cfg.seed);
    let mut books: Vec<Book> = (0..cfg.instruments)
        .map(|i| Book {
            security_id: cfg.first_security_id + i,
            rpt: 0,
            orders: Vec::new(),
        })
        .collect();
    let (mut next_id, mut next_trade) = (1u64, 1u64);
    let mut pending: std::collections::VecDeque<Vec<u8>> = std::collections::VecDeque::new();
    // Every book opens with EmptyBook (RptSeq 1): a complete statement a subscriber can
    // follow from.
    for b in &mut books {
        b.rpt = 1;
        let mut scratch = [0u8; 64];
        let sid = b.security_id;
        let len = encode_message::<EmptyBookEncoder, _>(&mut scratch, |mut e| {
            e.security_id_opt(Some(sid)).rpt_seq(1);
            e
        })
        .map_err(|e| e.to_string())?;
        pending.push_back(scratch[..len].to_vec());
    }
    let mut packets = Vec::with_capacity(cfg.packets);
    for k in 0..cfg.packets {
        let size = cfg.sizes.next_size(k, &mut rng);
        let mut messages = Vec::with_capacity(size);
        while messages.len() < size {
            match pending.pop_front() {
                Some(m) => messages.push(m),
                None => {
                    let i = rng.below(books.len() as u64) as usize;
                    messages.push(next_message(
                        &mut books[i],
                        &mut rng,
                        cfg,
                        &mut next_id,
                        &mut next_trade,
                    ));
                }
            }
        }
        let sending = cfg.start_ns + k as u64 * 10_000;
        let inc = IncrementalHeader {
            transact_time_ns: sending,
            exchange_trading_session_id: 1,
        };
        let refs: Vec<&[u8]> = messages.iter().map(Vec::as_slice).collect();
        packets.push(assemble(k as u32 + 1, sending, inc, &refs));
    }
    Ok(packets)
}

/// The order-log messages of a capture (datagrams to `port`, or to the port of the first
/// order-log packet), in order, each once (copies with a MsgSeqNum already seen are left out),
/// with the incremental header of the packet each came in.
pub fn order_log_messages(
    capture: &Capture,
    port: Option<u16>,
    packet_bytes_max: usize,
) -> Result<Vec<(IncrementalHeader, Vec<u8>)>, String> {
    let replay = crate::driver::prepare(
        capture,
        crate::FeedFormat::Sbe,
        port,
        usize::MAX,
        packet_bytes_max,
    )?;
    let parser = PacketParser::new(packet_bytes_max, MESSAGES_PER_PACKET_MAX);
    let mut out = Vec::new();
    let mut last_seq: Option<u32> = None;
    for payload in &replay.packets {
        let Ok(p) = parser.parse(payload) else {
            continue;
        };
        let seq = p.header.msg_seq_num;
        if last_seq.is_some_and(|l| seq <= l) {
            continue;
        }
        last_seq = Some(seq);
        let inc = p.incremental.unwrap_or(IncrementalHeader {
            transact_time_ns: 0,
            exchange_trading_session_id: 0,
        });
        let mut rest = &payload[PACKET_HEADER_BYTES
            + if p.incremental.is_some() {
                INCREMENTAL_HEADER_BYTES
            } else {
                0
            }..];
        while !rest.is_empty() {
            let Ok((m, bytes)) = decode_message(rest) else {
                break;
            };
            if order_log_update(&m).is_some() {
                out.push((inc, rest[..bytes].to_vec()));
            }
            rest = &rest[bytes..];
        }
    }
    if out.is_empty() {
        return Err("the capture holds no order-log message".into());
    }
    Ok(out)
}

/// A recording's order-log messages in packets of the configured sizes (renumbered from 1).
pub fn repack(
    messages: &[(IncrementalHeader, Vec<u8>)],
    sizes: &Sizes,
    seed: u64,
    packet_bytes_max: usize,
    packets_max: usize,
) -> Result<Vec<Vec<u8>>, String> {
    let largest = messages
        .iter()
        .map(|m| m.1.len())
        .max()
        .unwrap_or(MESSAGE_BYTES_MAX);
    check_fits(sizes, packet_bytes_max, largest)?;
    let mut rng = Rng::new(seed);
    let mut packets = Vec::new();
    let mut at = 0;
    while at < messages.len() && packets.len() < packets_max {
        let size = sizes
            .next_size(packets.len(), &mut rng)
            .min(messages.len() - at);
        let chunk = &messages[at..at + size];
        let refs: Vec<&[u8]> = chunk.iter().map(|m| m.1.as_slice()).collect();
        let inc = chunk[0].0;
        packets.push(assemble(
            packets.len() as u32 + 1,
            inc.transact_time_ns,
            inc,
            &refs,
        ));
        at += size;
    }
    Ok(packets)
}

/// Writes packets as a capture, each a datagram to 127.0.0.1:`port`, 10 µs apart.
pub fn write_capture(
    path: &std::path::Path,
    packets: &[Vec<u8>],
    port: u16,
    start_ns: u64,
) -> Result<(), String> {
    let file =
        std::fs::File::create(path).map_err(|e| format!("creating {}: {e}", path.display()))?;
    let mut w = PcapWriter::new(std::io::BufWriter::new(file)).map_err(|e| e.to_string())?;
    let src = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 40_000);
    let dst = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
    for (k, p) in packets.iter().enumerate() {
        w.write_udp(start_ns + k as u64 * 10_000, src, dst, p)
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    w.flush()
        .map_err(|e| format!("writing {}: {e}", path.display()))
}
