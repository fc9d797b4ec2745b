//! The replay driver: the exchange's side of the seed's stand, on 127.0.0.1.
//!
//! It holds the capture in memory, accepts the client's FIX connection and answers its Logon,
//! then sends the packets strictly one at a time: send one UDP packet, take the time when
//! `send` returns (the last byte has left: on loopback the datagram is then in the client's
//! socket queue), wait for the client's orders or a timeout, take the time when the first
//! bytes arrive, and only then send the next. The wait spins on a non-blocking socket, so
//! the driver's own wake-up is not added to the client's latency.
//!
//! The driver knows what a correct client must send: its reference model (the market data
//! library's own [`OrderBook`], applied to the same order-log updates) gives, for every
//! packet, the instruments whose best ask moved and to which price. So it waits for exactly
//! that many orders (up to `timeout_ms`), waits only `quiet_us` after packets that should
//! cause none (to catch an unexpected answer without the seed's full timeout), and after the
//! run checks every order it received: instrument, price, nothing missing, nothing extra.

use crate::capture::Capture;
use crate::client::{read_frame, session_message, FIX_MESSAGE_BYTES_MAX};
use crate::itch::{item_of, Admit, ItchMessage, Item, Sequencer};
use crate::order::parse_price;
use crate::reactor::{order_log_update, Update};
use crate::stats::{
    seed_rows, size_table, table_header, table_row, text_histogram, BySize, SizeRow, Summary,
};
use crate::FeedFormat;
use bourse_core::Side;
use bourse_fix::codec::{decode, FrameBuffer};
use bourse_marketdata::book::{BookOrder, OrderBook};
use bourse_marketdata::pcap::PcapWriter;
use bourse_marketdata::wire::market_data::{PacketParser, MESSAGES_PER_PACKET_MAX};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The packets to replay with what a correct client answers to each.
#[derive(Clone, Debug, Default)]
pub struct Replay {
    pub feed: FeedFormat,
    /// UDP destination port the packets were taken from.
    pub port: u16,
    pub packets: Vec<Vec<u8>>,
    /// Order-log updates per packet (0 for a packet the decoder refuses).
    pub updates: Vec<u16>,
    /// Per packet, the orders a correct client sends: (security id, price), sorted.
    pub expected: Vec<Vec<(u32, i64)>>,
}

impl Replay {
    pub fn orders_expected(&self) -> usize {
        self.expected.iter().map(Vec::len).sum()
    }
}

/// Whether a datagram is a valid packet carrying order-log messages.
fn carries_order_log(parser: &PacketParser, payload: &[u8]) -> bool {
    parser
        .parse(payload)
        .is_ok_and(|p| p.messages().any(|m| order_log_update(&m).is_some()))
}

/// Whether a datagram is a MoldUDP64 packet with an ITCH message that updates a book.
fn carries_itch(payload: &[u8]) -> bool {
    bourse_itch::mold::Packet::parse(payload).is_ok_and(|p| {
        p.messages().any(|(_, m)| {
            matches!(
                ItchMessage::decode(m).map(|m| item_of(&m)),
                Ok(Item::Update(_))
            )
        })
    })
}

/// Picks the datagrams to replay: those sent to `port`, or, when none is given, to the port of
/// the first order-log packet (feed A of the orders channel in a `bourse md record` capture;
/// the feed's port in a `bourse itch tail --pcap` capture, whose retransmitted packets are
/// recorded to the same port and replay as copies or gap fills).
/// Invalid datagrams to that port stay in: the client must count and skip them.
pub fn prepare(
    capture: &Capture,
    feed: FeedFormat,
    port: Option<u16>,
    packets_max: usize,
    packet_bytes_max: usize,
) -> Result<Replay, String> {
    let parser = PacketParser::new(packet_bytes_max, MESSAGES_PER_PACKET_MAX);
    let port = match port {
        Some(p) => p,
        None => capture
            .datagrams
            .iter()
            .find(|d| match feed {
                FeedFormat::Sbe => carries_order_log(&parser, &d.payload),
                FeedFormat::Itch => carries_itch(&d.payload),
            })
            .map(|d| d.dst.port())
            .ok_or(match feed {
                FeedFormat::Sbe => "the capture holds no order-log packet (OrderUpdate, OrderExecution, EmptyBook); an ITCH capture needs --feed itch",
                FeedFormat::Itch => "the capture holds no MoldUDP64 packet of ITCH book messages (Add, Executed, Cancel, Delete, Replace)",
            })?,
    };
    let packets: Vec<Vec<u8>> = capture
        .datagrams
        .iter()
        .filter(|d| d.dst.port() == port)
        .take(packets_max)
        .map(|d| d.payload.clone())
        .collect();
    if packets.is_empty() {
        return Err(format!("the capture holds no datagram to UDP port {port}"));
    }
    let (updates, expected) = match feed {
        FeedFormat::Sbe => reference_orders(&packets, &parser),
        FeedFormat::Itch => reference_orders_itch(&packets, packet_bytes_max),
    };
    Ok(Replay {
        feed,
        port,
        packets,
        updates,
        expected,
    })
}

/// The reference model: per packet, its updates and the orders a correct client sends.
pub fn reference_orders(
    packets: &[Vec<u8>],
    parser: &PacketParser,
) -> (Vec<u16>, Vec<Vec<(u32, i64)>>) {
    let mut books: BTreeMap<u32, OrderBook> = BTreeMap::new();
    let mut last_seq: Option<u32> = None;
    let mut updates = Vec::with_capacity(packets.len());
    let mut expected = Vec::with_capacity(packets.len());
    for payload in packets {
        let mut n = 0u16;
        let mut touched: Vec<(u32, Option<i64>)> = Vec::new();
        if let Ok(p) = parser.parse(payload) {
            let seq = p.header.msg_seq_num;
            if last_seq.is_none_or(|l| seq > l) {
                last_seq = Some(seq);
                for m in p.messages() {
                    let Some(u) = order_log_update(&m) else {
                        continue;
                    };
                    n += 1;
                    let Ok(u) = u else { continue };
                    apply_reference(&mut books, &mut touched, u);
                }
            }
        }
        updates.push(n);
        expected.push(ask_changes(&books, &touched));
    }
    (updates, expected)
}

/// The orders a correct client sends after a packet: one per touched book whose best ask
/// moved to a price, sorted.
fn ask_changes(
    books: &BTreeMap<u32, OrderBook>,
    touched: &[(u32, Option<i64>)],
) -> Vec<(u32, i64)> {
    let mut orders: Vec<(u32, i64)> = touched
        .iter()
        .filter_map(|&(sid, before)| {
            let now = books
                .get(&sid)
                .and_then(|b| b.best(Side::Sell))
                .map(|l| l.price);
            now.filter(|&p| before != Some(p)).map(|p| (sid, p))
        })
        .collect();
    orders.sort_unstable();
    orders
}

/// The reference model of an ITCH replay: the client's reading of the sequence numbers and
/// messages ([`Sequencer`], [`item_of`]) applied to the market data library's own books.
pub fn reference_orders_itch(
    packets: &[Vec<u8>],
    packet_bytes_max: usize,
) -> (Vec<u16>, Vec<Vec<(u32, i64)>>) {
    let mut books: BTreeMap<u32, OrderBook> = BTreeMap::new();
    let mut sequencer = Sequencer::default();
    let mut updates = Vec::with_capacity(packets.len());
    let mut expected = Vec::with_capacity(packets.len());
    for payload in packets {
        let mut n = 0u16;
        let mut touched: Vec<(u32, Option<i64>)> = Vec::new();
        let packet = (payload.len() <= packet_bytes_max)
            .then(|| bourse_itch::mold::Packet::parse(payload).ok())
            .flatten();
        if let Some(p) = packet {
            if let Admit::Apply { from, .. } = sequencer.admit(&p.header) {
                for (seq, bytes) in p.messages() {
                    let item = ItchMessage::decode(bytes).map(|m| item_of(&m));
                    if let (true, Ok(Item::Update(u))) = (seq >= from, item) {
                        n += 1;
                        apply_reference(&mut books, &mut touched, u);
                    }
                }
            }
        }
        updates.push(n);
        expected.push(ask_changes(&books, &touched));
    }
    (updates, expected)
}

fn apply_reference(
    books: &mut BTreeMap<u32, OrderBook>,
    touched: &mut Vec<(u32, Option<i64>)>,
    u: Update,
) {
    let mut touch = |books: &mut BTreeMap<u32, OrderBook>, sid: u32| {
        if !touched.iter().any(|t| t.0 == sid) {
            let best = books
                .get(&sid)
                .and_then(|b| b.best(Side::Sell))
                .map(|l| l.price);
            touched.push((sid, best));
        }
    };
    match u {
        Update::New {
            security_id,
            order_id,
            side,
            price,
            qty,
        } => {
            touch(books, security_id);
            let _ = books.entry(security_id).or_default().add(BookOrder {
                order_id,
                side,
                price,
                qty,
                ts_ns: 0,
            });
        }
        Update::Change {
            security_id,
            order_id,
            qty,
        } => {
            touch(books, security_id);
            let _ = books
                .entry(security_id)
                .or_default()
                .change_qty(order_id, qty);
        }
        Update::Delete {
            security_id,
            order_id,
        } => {
            touch(books, security_id);
            let _ = books.entry(security_id).or_default().remove(order_id);
        }
        Update::Reduce {
            security_id,
            order_id,
            by,
        } => {
            touch(books, security_id);
            let book = books.entry(security_id).or_default();
            match book.get(order_id).map(|o| o.qty - by) {
                Some(0) => {
                    let _ = book.remove(order_id);
                }
                Some(left) if left > 0 && by > 0 => {
                    let _ = book.change_qty(order_id, left);
                }
                _ => {}
            }
        }
        Update::Replace {
            security_id,
            order_id,
            new_order_id,
            price,
            qty,
        } => {
            touch(books, security_id);
            let book = books.entry(security_id).or_default();
            let fresh = new_order_id == order_id || book.get(new_order_id).is_none();
            if let (Some(old), true, true) = (book.get(order_id).copied(), fresh, qty > 0) {
                let _ = book.remove(order_id);
                let _ = book.add(BookOrder {
                    order_id: new_order_id,
                    side: old.side,
                    price,
                    qty,
                    ts_ns: 0,
                });
            }
        }
        Update::Empty {
            security_id: Some(security_id),
        } => {
            touch(books, security_id);
            books.entry(security_id).or_default().clear();
        }
        Update::Empty { security_id: None } => {
            let ids: Vec<u32> = books.keys().copied().collect();
            for sid in ids {
                touch(books, sid);
                books.entry(sid).or_default().clear();
            }
        }
    }
}

/// Settings of a drive.
#[derive(Clone, Debug)]
pub struct DriveConfig {
    /// The client's feed address.
    pub target: SocketAddrV4,
    /// Wait this long for the expected orders of a packet.
    pub timeout_ms: u64,
    /// Wait this long after a packet that should cause no order.
    pub quiet_us: u64,
    /// Decimal places of prices in the client's orders (SBE; ITCH prices have four).
    pub price_scale: u8,
    /// How long to wait for the client to connect and log on.
    pub accept_timeout_ms: u64,
    /// Keep what was sent and received, for [`write_pcap`].
    pub keep_traffic: bool,
    /// Pin the driver's thread to this CPU.
    pub cpu: Option<usize>,
}

impl DriveConfig {
    pub fn new(target: SocketAddrV4) -> DriveConfig {
        DriveConfig {
            target,
            timeout_ms: 100,
            quiet_us: 50,
            price_scale: 0,
            accept_timeout_ms: 60_000,
            keep_traffic: false,
            cpu: None,
        }
    }
}

/// One packet's outcome.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Sample {
    pub updates: u16,
    pub packet_bytes: u16,
    /// Last byte sent → first byte received, when an answer came.
    pub latency_ns: Option<u64>,
    pub orders: u16,
}

/// What a drive measured and checked.
#[derive(Clone, Debug, Serialize)]
pub struct DriveReport {
    pub packets_sent: u64,
    /// Packets answered within their wait.
    pub answered: u64,
    pub orders_expected: u64,
    pub orders_received: u64,
    /// Received orders for the right instrument at the right price.
    pub orders_matching: u64,
    /// Packets whose expected orders did not all come within `timeout_ms`.
    pub timeouts: u64,
    /// Packets whose orders differ from the expected ones (missing, extra, wrong price).
    pub packets_wrong: u64,
    /// Received messages that are not a decodable NewOrderSingle.
    pub undecodable: u64,
    pub t2t_ns: Summary,
    /// The same clock started before the UDP `send` call instead of after it returned: an
    /// upper bound, where the seed's definition can read low when the client runs before the
    /// driver's `send` has returned.
    pub t2t_from_send_call_ns: Summary,
    pub t2t_by_size: Vec<SizeRow>,
    /// `send` call of the UDP packet itself (before the clock starts), for reference.
    pub udp_send_call_ns: Summary,
    pub wall_s: f64,
    #[serde(skip)]
    pub samples: Vec<Sample>,
    #[serde(skip)]
    pub histogram: Histogram<u64>,
    #[serde(skip)]
    pub traffic: Traffic,
}

/// Both directions of a drive, for a pcap.
#[derive(Clone, Debug, Default)]
pub struct Traffic {
    pub udp_src: Option<SocketAddrV4>,
    pub udp_dst: Option<SocketAddrV4>,
    pub client: Option<SocketAddrV4>,
    pub server: Option<SocketAddrV4>,
    /// (time ns since the epoch, from the client, bytes) of the FIX connection.
    pub tcp: Vec<(u64, bool, Vec<u8>)>,
    /// (time, packet index) of every UDP packet sent.
    pub udp: Vec<(u64, usize)>,
}

/// Counts the whole FIX frames at the start of `buf`; returns (frames, bytes they take).
fn count_frames(buf: &[u8]) -> (usize, usize) {
    let mut at = 0;
    let mut frames = 0;
    while at < buf.len() {
        let rest = &buf[at..];
        let Some(end) = frame_end(rest) else { break };
        frames += 1;
        at += end;
    }
    (frames, at)
}

/// The length of the FIX frame at the start of `buf`, if whole.
fn frame_end(buf: &[u8]) -> Option<usize> {
    if !buf.starts_with(b"8=") {
        return None;
    }
    let soh1 = buf.iter().position(|&b| b == 1)?;
    let rest = buf.get(soh1 + 1..)?;
    if !rest.starts_with(b"9=") {
        return None;
    }
    let soh2 = rest.iter().position(|&b| b == 1)?;
    let body_len: usize = std::str::from_utf8(&rest[2..soh2]).ok()?.parse().ok()?;
    let end = soh1 + 1 + soh2 + 1 + body_len + 7;
    (end <= buf.len()).then_some(end)
}

fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Accepts the client and answers its Logon.
fn accept_client(
    listener: &TcpListener,
    cfg: &DriveConfig,
    traffic: &mut Traffic,
) -> Result<TcpStream, String> {
    let deadline = Instant::now() + Duration::from_millis(cfg.accept_timeout_ms);
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let (mut stream, peer) = loop {
        match listener.accept() {
            Ok(s) => break s,
            Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                return Err(format!(
                    "no client connected within {} ms",
                    cfg.accept_timeout_ms
                ))
            }
            Err(e) => return Err(format!("accepting the client: {e}")),
        }
    };
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut frames = FrameBuffer::new(FIX_MESSAGE_BYTES_MAX);
    let logon = read_frame(&mut stream, &mut frames, deadline)?;
    let m = decode(&logon, None, FIX_MESSAGE_BYTES_MAX)
        .map_err(|e| format!("the client's first message does not decode: {e:?}"))?;
    if m.msg_type() != b"A" {
        return Err(format!(
            "the client's first message is MsgType {}, not Logon",
            String::from_utf8_lossy(m.msg_type())
        ));
    }
    let (theirs, ours) = (
        m.get_str(49).unwrap_or("T2T"),
        m.get_str(56).unwrap_or("BOURSE"),
    );
    let hb = m.get_str(108).unwrap_or("30").to_string();
    let answer = session_message("A", 1, ours, theirs, &[(98, "0".into()), (108, hb)]);
    stream
        .write_all(&answer)
        .map_err(|e| format!("answering the Logon: {e}"))?;
    if cfg.keep_traffic {
        traffic.client = match peer {
            SocketAddr::V4(a) => Some(a),
            SocketAddr::V6(_) => None,
        };
        traffic.server = match listener.local_addr() {
            Ok(SocketAddr::V4(a)) => Some(a),
            _ => None,
        };
        traffic.tcp.push((wall_ns(), true, logon));
        traffic.tcp.push((wall_ns(), false, answer));
    }
    if frames.buffered_bytes() > 0 {
        return Err("the client sent more than a Logon before it was answered".into());
    }
    stream.set_nonblocking(true).map_err(|e| e.to_string())?;
    Ok(stream)
}

/// Replays `replay` to the client that connects to `listener`.
pub fn drive(
    replay: &Replay,
    listener: &TcpListener,
    cfg: &DriveConfig,
) -> Result<DriveReport, String> {
    if let Some(cpu) = cfg.cpu {
        crate::pin_to_cpu(cpu)?;
    }
    let mut traffic = Traffic::default();
    let mut tcp = accept_client(listener, cfg, &mut traffic)?;
    let udp = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    udp.connect(cfg.target)
        .map_err(|e| format!("UDP to {}: {e}", cfg.target))?;
    if cfg.keep_traffic {
        traffic.udp_src = match udp.local_addr() {
            Ok(SocketAddr::V4(a)) => Some(a),
            _ => None,
        };
        traffic.udp_dst = Some(cfg.target);
    }
    let timeout = Duration::from_millis(cfg.timeout_ms);
    let quiet = Duration::from_micros(cfg.quiet_us);
    let mut inbuf = vec![0u8; 1 << 20];
    let mut carried = 0usize;
    let mut by_size = BySize::default();
    let mut send_call = bourse_latency::histogram();
    let mut from_send_call = bourse_latency::histogram();
    let mut samples = Vec::with_capacity(replay.packets.len());
    let mut received: Vec<Vec<u8>> = Vec::with_capacity(replay.packets.len());
    let (mut answered, mut timeouts) = (0u64, 0u64);
    let started = Instant::now();
    let wall_base = wall_ns();
    let wall_of = |t: Instant| wall_base + t.saturating_duration_since(started).as_nanos() as u64;
    for (i, payload) in replay.packets.iter().enumerate() {
        let expect = replay.expected[i].len();
        let before = Instant::now();
        udp.send(payload)
            .map_err(|e| format!("sending packet {i}: {e}"))?;
        let t1 = Instant::now();
        bourse_latency::record(
            &mut send_call,
            t1.saturating_duration_since(before).as_nanos() as u64,
        );
        let mut got = carried;
        // Bytes carried over from a late answer to the previous packet do not start the clock.
        let mut first: Option<Instant> = None;
        let (mut frames, mut framed) = count_frames(&inbuf[..got]);
        loop {
            if expect > 0 && frames >= expect {
                break;
            }
            match tcp.read(&mut inbuf[got..]) {
                Ok(0) => {
                    return Err(format!(
                        "the client closed the FIX connection at packet {i}"
                    ))
                }
                Ok(n) => {
                    first.get_or_insert_with(Instant::now);
                    got += n;
                    (frames, framed) = count_frames(&inbuf[..got]);
                    if got == inbuf.len() {
                        return Err("the client sent more than 1 MiB for one packet".into());
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    let waited = t1.elapsed();
                    if (expect == 0 && waited >= quiet) || waited >= timeout {
                        if expect > 0 {
                            timeouts += 1;
                        }
                        break;
                    }
                    std::hint::spin_loop();
                }
                Err(e) => return Err(format!("reading the client's orders: {e}")),
            }
        }
        let latency_ns = first.map(|t2| t2.saturating_duration_since(t1).as_nanos() as u64);
        let updates = replay.updates[i];
        if let Some(ns) = latency_ns {
            answered += 1;
            by_size.record(updates, ns);
            let t2 = first.unwrap_or(t1);
            bourse_latency::record(
                &mut from_send_call,
                t2.saturating_duration_since(before).as_nanos() as u64,
            );
        }
        samples.push(Sample {
            updates,
            packet_bytes: payload.len() as u16,
            latency_ns,
            orders: frames as u16,
        });
        received.push(inbuf[..framed].to_vec());
        if cfg.keep_traffic {
            traffic.udp.push((wall_of(t1), i));
            if framed > 0 {
                traffic
                    .tcp
                    .push((wall_of(first.unwrap_or(t1)), true, inbuf[..framed].to_vec()));
            }
        }
        inbuf.copy_within(framed..got, 0);
        carried = got - framed;
    }
    let wall_s = started.elapsed().as_secs_f64();
    drop(tcp);
    let price_scale = match replay.feed {
        FeedFormat::Sbe => cfg.price_scale,
        FeedFormat::Itch => crate::itch::PRICE_SCALE,
    };
    let check = check_orders(replay, &received, price_scale);
    Ok(DriveReport {
        packets_sent: replay.packets.len() as u64,
        answered,
        orders_expected: replay.orders_expected() as u64,
        orders_received: check.received,
        orders_matching: check.matching,
        timeouts,
        packets_wrong: check.packets_wrong,
        undecodable: check.undecodable,
        t2t_ns: Summary::of(&by_size.all),
        t2t_from_send_call_ns: Summary::of(&from_send_call),
        t2t_by_size: by_size.rows(),
        udp_send_call_ns: Summary::of(&send_call),
        wall_s,
        samples,
        histogram: by_size.all,
        traffic,
    })
}

#[derive(Default)]
struct Check {
    received: u64,
    matching: u64,
    packets_wrong: u64,
    undecodable: u64,
}

/// Compares the orders received for every packet with the reference model's.
fn check_orders(replay: &Replay, received: &[Vec<u8>], price_scale: u8) -> Check {
    let mut c = Check::default();
    for (want, bytes) in replay.expected.iter().zip(received) {
        let mut got = Vec::new();
        let mut at = 0;
        while let Some(end) = frame_end(&bytes[at..]) {
            let frame = &bytes[at..at + end];
            at += end;
            c.received += 1;
            let order = decode(frame, None, FIX_MESSAGE_BYTES_MAX)
                .ok()
                .and_then(|m| {
                    let sid: u32 = m.get_str(48)?.parse().ok()?;
                    let px = parse_price(m.get(44)?, price_scale)?;
                    (m.msg_type() == b"D").then_some((sid, px))
                });
            match order {
                Some(o) => got.push(o),
                None => c.undecodable += 1,
            }
        }
        got.sort_unstable();
        let mut wi = 0;
        for o in &got {
            while wi < want.len() && want[wi] < *o {
                wi += 1;
            }
            if wi < want.len() && want[wi] == *o {
                c.matching += 1;
                wi += 1;
            }
        }
        if got != *want {
            c.packets_wrong += 1;
        }
    }
    c
}

/// The report as text: the seed's table with this run's row, the histogram, the size curve
/// and the checks.
pub fn report_text(r: &DriveReport, title: &str) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{} packets in {:.2} s; {} answered; orders: {} expected, {} received, {} right; {} packets wrong, {} timeouts, {} undecodable\n\n",
        r.packets_sent, r.wall_s, r.answered, r.orders_expected, r.orders_received, r.orders_matching, r.packets_wrong, r.timeouts, r.undecodable
    ));
    out.push_str(
        "tick-to-trade, ns (last byte of the packet sent -> first byte of the order received):\n",
    );
    out.push_str(&table_header());
    out.push('\n');
    out.push_str(&seed_rows());
    out.push('\n');
    out.push_str(&table_row(title, &r.t2t_ns));
    out.push('\n');
    out.push_str(&table_row(
        &format!("{title}, clock from the send call"),
        &r.t2t_from_send_call_ns,
    ));
    out.push_str("\n\n");
    out.push_str(&size_table("t2t", &r.t2t_by_size));
    out.push('\n');
    out.push_str(&text_histogram(&r.histogram, 50));
    out
}

/// Writes the samples as CSV: packet index, updates, packet bytes, latency (empty when no
/// answer), orders received.
pub fn samples_csv(r: &DriveReport) -> String {
    let mut out = String::from("packet,updates,packet_bytes,latency_ns,orders\n");
    for (i, s) in r.samples.iter().enumerate() {
        let lat = s.latency_ns.map(|v| v.to_string()).unwrap_or_default();
        out.push_str(&format!(
            "{i},{},{},{lat},{}\n",
            s.updates, s.packet_bytes, s.orders
        ));
    }
    out
}

/// Writes both directions of a drive as a pcap: the UDP feed as sent, the FIX connection as
/// TCP segments with running sequence numbers (so tshark reassembles and dissects the FIX).
pub fn write_pcap(
    path: &std::path::Path,
    replay: &Replay,
    traffic: &Traffic,
) -> Result<u64, String> {
    let file =
        std::fs::File::create(path).map_err(|e| format!("creating {}: {e}", path.display()))?;
    let mut w = PcapWriter::new(std::io::BufWriter::new(file)).map_err(|e| e.to_string())?;
    let unknown = SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 0);
    let (usrc, udst) = (
        traffic.udp_src.unwrap_or(unknown),
        traffic.udp_dst.unwrap_or(unknown),
    );
    let (client, server) = (
        traffic.client.unwrap_or(unknown),
        traffic.server.unwrap_or(unknown),
    );
    // Merge the two directions by time.
    let mut events: Vec<(u64, Option<usize>, Option<usize>)> = traffic
        .udp
        .iter()
        .map(|&(t, i)| (t, Some(i), None))
        .chain(
            traffic
                .tcp
                .iter()
                .enumerate()
                .map(|(k, t)| (t.0, None, Some(k))),
        )
        .collect();
    events.sort_by_key(|e| e.0);
    let (mut c2s, mut s2c) = (1u32, 1u32);
    for (t, udp, tcp) in events {
        let r = match (udp, tcp) {
            (Some(i), _) => w.write_udp(t, usrc, udst, &replay.packets[i]),
            (_, Some(k)) => {
                let (_, from_client, bytes) = &traffic.tcp[k];
                if *from_client {
                    let r = w.write_tcp(t, client, server, c2s, s2c, bytes);
                    c2s = c2s.wrapping_add(bytes.len() as u32);
                    r
                } else {
                    let r = w.write_tcp(t, server, client, s2c, c2s, bytes);
                    s2c = s2c.wrapping_add(bytes.len() as u32);
                    r
                }
            }
            _ => Ok(()),
        };
        r.map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    w.flush().map_err(|e| e.to_string())?;
    Ok(w.packets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_counted_only_when_whole() {
        let m = crate::client::session_message("0", 2, "A", "B", &[]);
        let mut two = m.clone();
        two.extend_from_slice(&m);
        assert_eq!(count_frames(&two), (2, two.len()));
        assert_eq!(count_frames(&two[..two.len() - 1]), (1, m.len()));
        assert_eq!(count_frames(b"garbage"), (0, 0));
    }
}
