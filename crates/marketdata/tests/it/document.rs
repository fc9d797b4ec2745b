//! A subscriber written from `docs/protocol-market-data.md` alone, run against the feed.
//!
//! The packet and message layouts are read from the document's tables when the test runs, the
//! book rules are section 4's, and every claim a client would build on is checked against a
//! seeded run of the publisher: the books built from the order log equal the core's, order by
//! order; `rptSeq` grows by one per order-log message; a transaction is one committed batch,
//! with `LastFragment` on its last packet and `transactTimeNs` the batch's time; quantities
//! count lots; heartbeats repeat the last data packet's number; each channel carries only
//! the messages the document's channel table lists; trades, statistics and the top-20 book line
//! up with the order log as the document says; snapshots and definitions agree with the book
//! and the instruments. A feed that leaves the document, or a document that leaves the feed,
//! fails here. It shares no decoding code with the crate (it does not use `bourse_wire`).

use crate::common;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use bourse_core::{Command, CommandBody, Event, InstrumentId, Phase, Side};
use bourse_marketdata::{Channel, VecSink};
use common::*;

const DOC: &str = include_str!("../../../../docs/protocol-market-data.md");

/// One field of a table: where it is and how to read it.
#[derive(Clone, Debug)]
struct Field {
    offset: usize,
    size: usize,
    name: String,
    signed: bool,
    chars: bool,
}

/// A message's root block and, if it has one, its repeating group's entry.
#[derive(Clone, Debug, Default)]
struct Layout {
    name: String,
    fields: Vec<Field>,
    group_entry_bytes: Option<usize>,
    group: Vec<Field>,
}

/// What the document says, in the form a decoder needs.
#[derive(Debug, Default)]
struct Doc {
    packet_header: Vec<Field>,
    incremental_header: Vec<Field>,
    sbe_header: Vec<Field>,
    messages: BTreeMap<u64, Layout>,
    /// MsgFlags bit masks by name.
    flags: BTreeMap<String, u64>,
    /// Enum values: (enum, name) -> value.
    enums: BTreeMap<(String, String), u64>,
    /// Channel name (first word of the channel table's first column) -> message names.
    channels: BTreeMap<String, BTreeSet<String>>,
    /// Messages every channel may carry besides its own.
    every_channel: BTreeSet<String>,
}

fn cells(line: &str) -> Vec<String> {
    line.trim()
        .trim_matches('|')
        .split('|')
        .map(|c| c.trim().trim_matches('`').to_string())
        .collect()
}

fn field_of(cells: &[String]) -> Option<Field> {
    let offset = cells.first()?.parse().ok()?;
    let size = cells.get(1)?.parse().ok()?;
    let ty = cells.get(3)?.clone();
    Some(Field {
        offset,
        size,
        name: cells.get(2)?.clone(),
        signed: ty.starts_with("int"),
        chars: ty.starts_with("char"),
    })
}

/// The number after `key` in `text` (`templateId 5` -> 5).
fn number_after(text: &str, key: &str) -> Option<usize> {
    let rest = &text[text.find(key)? + key.len()..];
    let digits: String = rest
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

impl Doc {
    fn parse(text: &str) -> Doc {
        #[derive(PartialEq)]
        enum Target {
            None,
            PacketHeader,
            Incremental,
            Sbe,
            Flags,
            Message(u64),
            Group(u64),
            Channels,
        }
        let mut doc = Doc::default();
        let mut target = Target::None;
        for line in text.lines() {
            if let Some(h) = line.strip_prefix("### ") {
                target = if h.contains("MarketDataPacketHeader") {
                    Target::PacketHeader
                } else if h.contains("IncrementalPacketHeader") {
                    Target::Incremental
                } else if h.contains("SBE message header") {
                    Target::Sbe
                } else if h.contains("MsgFlags") {
                    Target::Flags
                } else {
                    Target::None
                };
                continue;
            }
            if let Some(h) = line.strip_prefix("#### ") {
                target = match number_after(h, "templateId") {
                    Some(id) => {
                        let name = h.split_whitespace().next().unwrap().to_string();
                        doc.messages.insert(
                            id as u64,
                            Layout {
                                name,
                                ..Layout::default()
                            },
                        );
                        Target::Message(id as u64)
                    }
                    None => Target::None,
                };
                continue;
            }
            if line.starts_with("## ") {
                target = if line.contains("Channels and feeds") {
                    Target::Channels
                } else {
                    Target::None
                };
                continue;
            }
            if let Target::Message(id) = target {
                if line.starts_with("Repeating group") {
                    let bytes = number_after(line, "blockLength =").expect("group blockLength");
                    doc.messages.get_mut(&id).unwrap().group_entry_bytes = Some(bytes);
                    target = Target::Group(id);
                    continue;
                }
            }
            if let Some(rest) = line.strip_prefix("- **") {
                doc.parse_enum(rest);
                continue;
            }
            if target == Target::Channels && line.starts_with("Every channel may also carry") {
                for w in line.split(|c: char| !c.is_ascii_alphanumeric()) {
                    if w.chars().next().is_some_and(|c| c.is_ascii_uppercase()) && w != "Every" {
                        doc.every_channel.insert(w.to_string());
                    }
                }
                continue;
            }
            if !line.starts_with('|') {
                continue;
            }
            let c = cells(line);
            match target {
                Target::PacketHeader => doc.packet_header.extend(field_of(&c)),
                Target::Incremental => doc.incremental_header.extend(field_of(&c)),
                Target::Sbe => {
                    // offset | size | field | value, the value naming its type first.
                    if let (Ok(offset), Ok(size)) = (c[0].parse(), c[1].parse()) {
                        doc.sbe_header.push(Field {
                            offset,
                            size,
                            name: c[2].clone(),
                            signed: false,
                            chars: false,
                        });
                    }
                }
                Target::Flags => {
                    if let Some(mask) = c.get(1).and_then(|m| m.strip_prefix("0x")) {
                        doc.flags
                            .insert(c[2].clone(), u64::from_str_radix(mask, 16).unwrap());
                    }
                }
                Target::Message(id) => {
                    let f = field_of(&c);
                    doc.messages.get_mut(&id).unwrap().fields.extend(f);
                }
                Target::Group(id) => {
                    let f = field_of(&c);
                    doc.messages.get_mut(&id).unwrap().group.extend(f);
                }
                Target::Channels => {
                    let name = c[0].split_whitespace().next().unwrap_or("").to_string();
                    if c.len() == 3 && name != "channel" && !name.starts_with("---") {
                        let msgs = c[2]
                            .split(',')
                            .filter_map(|m| m.split_whitespace().next())
                            .map(str::to_string)
                            .collect();
                        doc.channels.insert(name, msgs);
                    }
                }
                Target::None => {}
            }
        }
        doc
    }

    /// `Side** (uint8): Buy = 1, Sell = 2. Any other value: ...`
    fn parse_enum(&mut self, rest: &str) {
        let Some((name, values)) = rest.split_once("**") else {
            return;
        };
        let Some((_, values)) = values.split_once("):") else {
            return;
        };
        let values = values.split('.').next().unwrap_or("");
        for pair in values.split(',') {
            if let Some((k, v)) = pair.split_once('=') {
                if let Ok(v) = v.trim().parse() {
                    self.enums
                        .insert((name.to_string(), k.trim().to_string()), v);
                }
            }
        }
    }

    fn value(&self, enumeration: &str, name: &str) -> u64 {
        *self
            .enums
            .get(&(enumeration.to_string(), name.to_string()))
            .unwrap_or_else(|| panic!("the document has no {enumeration}::{name}"))
    }

    fn flag(&self, name: &str) -> u64 {
        *self
            .flags
            .get(name)
            .unwrap_or_else(|| panic!("the document has no flag {name}"))
    }
}

/// Field values by name: integers (sign-extended where the document says `int`) or text.
#[derive(Clone, Debug, Default)]
struct Values {
    ints: HashMap<String, i128>,
    text: HashMap<String, String>,
}

impl Values {
    fn get(&self, name: &str) -> i128 {
        *self
            .ints
            .get(name)
            .unwrap_or_else(|| panic!("no field {name} in {self:?}"))
    }
}

fn read(fields: &[Field], bytes: &[u8]) -> Values {
    let mut v = Values::default();
    for f in fields {
        let raw = &bytes[f.offset..f.offset + f.size];
        if f.chars {
            let s: String = raw
                .iter()
                .take_while(|&&b| b != 0)
                .map(|&b| b as char)
                .collect();
            v.text.insert(f.name.clone(), s);
            continue;
        }
        let mut x: u128 = 0;
        for (i, b) in raw.iter().enumerate() {
            x |= (*b as u128) << (8 * i);
        }
        let mut value = x as i128;
        if f.signed && raw[f.size - 1] & 0x80 != 0 {
            value -= 1i128 << (8 * f.size);
        }
        v.ints.insert(f.name.clone(), value);
    }
    v
}

fn bytes_of(fields: &[Field]) -> usize {
    fields.iter().map(|f| f.offset + f.size).max().unwrap_or(0)
}

/// One decoded message: its template's name, root fields, group entries.
#[derive(Debug)]
struct Message {
    name: String,
    root: Values,
    entries: Vec<Values>,
}

/// One decoded packet.
#[derive(Debug)]
struct Packet {
    header: Values,
    incremental: Option<Values>,
    messages: Vec<Message>,
}

fn decode(doc: &Doc, bytes: &[u8]) -> Packet {
    let header = read(&doc.packet_header, bytes);
    assert_eq!(
        header.get("msgSize") as usize,
        bytes.len(),
        "msgSize is the datagram's length"
    );
    let mut at = bytes_of(&doc.packet_header);
    let incremental = if header.get("msgFlags") as u64 & doc.flag("IncrementalPacket") != 0 {
        let v = read(&doc.incremental_header, &bytes[at..]);
        at += bytes_of(&doc.incremental_header);
        Some(v)
    } else {
        None
    };
    let mut messages = Vec::new();
    while at < bytes.len() {
        let sbe = read(&doc.sbe_header, &bytes[at..]);
        at += bytes_of(&doc.sbe_header);
        assert_eq!(sbe.get("schemaId"), 2, "schemaId");
        let block = sbe.get("blockLength") as usize;
        let layout = doc
            .messages
            .get(&(sbe.get("templateId") as u64))
            .unwrap_or_else(|| panic!("templateId {} not in the document", sbe.get("templateId")));
        assert!(
            block >= bytes_of(&layout.fields),
            "{} root block",
            layout.name
        );
        let root = read(&layout.fields, &bytes[at..at + block]);
        at += block;
        let mut entries = Vec::new();
        if layout.group_entry_bytes.is_some() {
            // The group header: u16 blockLength, u8 numInGroup (section 5).
            let entry = u16::from_le_bytes([bytes[at], bytes[at + 1]]) as usize;
            let count = bytes[at + 2] as usize;
            at += 3;
            for _ in 0..count {
                entries.push(read(&layout.group, &bytes[at..at + entry]));
                at += entry;
            }
        }
        messages.push(Message {
            name: layout.name.clone(),
            root,
            entries,
        });
    }
    assert_eq!(at, bytes.len(), "messages fill the packet exactly");
    Packet {
        header,
        incremental,
        messages,
    }
}

/// One instrument's book as section 4 builds it.
#[derive(Default)]
struct DocBook {
    /// id -> (side, price, visible qty).
    orders: HashMap<i128, (i128, i128, i128)>,
    /// (side, price) -> queue of ids, front first.
    queues: BTreeMap<(i128, i128), VecDeque<i128>>,
    rpt_seq: i128,
}

impl DocBook {
    fn add(&mut self, id: i128, side: i128, px: i128, qty: i128) {
        assert!(
            self.orders.insert(id, (side, px, qty)).is_none(),
            "New of a known order {id}"
        );
        self.queues.entry((side, px)).or_default().push_back(id);
    }

    fn remove(&mut self, id: i128) {
        let (side, px, _) = self.orders.remove(&id).expect("Delete of an unknown order");
        let q = self.queues.get_mut(&(side, px)).unwrap();
        q.retain(|&o| o != id);
        if q.is_empty() {
            self.queues.remove(&(side, px));
        }
    }

    /// Orders in priority order: bids best (highest) first, then asks best (lowest) first.
    fn in_priority(&self, buy: i128) -> Vec<(u64, bool, i64, i64)> {
        let mut out = Vec::new();
        let bids = self.queues.iter().filter(|((s, _), _)| *s == buy).rev();
        let asks = self.queues.iter().filter(|((s, _), _)| *s != buy);
        for (_, q) in bids.chain(asks) {
            for id in q {
                let (side, px, qty) = self.orders[id];
                out.push((*id as u64, side == buy, px as i64, qty as i64));
            }
        }
        out
    }

    /// Top `n` levels of one side: (price, qty, count), best first.
    fn levels(&self, side: i128, buy: i128, n: usize) -> Vec<(i128, i128, i128)> {
        let level = |((_, px), q): (&(i128, i128), &VecDeque<i128>)| {
            (
                *px,
                q.iter().map(|id| self.orders[id].2).sum(),
                q.len() as i128,
            )
        };
        let of_side = self.queues.iter().filter(|((s, _), _)| *s == side);
        if side == buy {
            of_side.rev().take(n).map(level).collect()
        } else {
            of_side.take(n).map(level).collect()
        }
    }
}

/// Everything the document's client keeps, and what it checked.
#[derive(Default)]
struct Client {
    books: BTreeMap<i128, DocBook>,
    expected: HashMap<usize, i128>,
    trades: BTreeMap<i128, (i128, i128, i128)>,
    executions: BTreeMap<i128, (i128, i128, i128)>,
    volume: BTreeMap<i128, i128>,
    statistics: BTreeMap<i128, Values>,
    definitions: BTreeMap<i128, Values>,
    statuses: Vec<(i128, i128)>,
    /// The price band each instrument's latest SecurityStatus or SecurityDefinition states.
    limits: BTreeMap<i128, (i128, i128)>,
    top20_checked: u64,
    /// The snapshot being collected: its first message's root and every entry so far.
    snapshot: Option<(Values, Vec<Values>)>,
    snapshots_checked: u64,
    seen: BTreeMap<String, BTreeSet<String>>,
    /// Trade ids of the trades whose `tradeType` is Auction.
    auction_trades: BTreeSet<i128>,
    /// Every AuctionIndicative's root, in order.
    indicative: Vec<Values>,
}

impl Client {
    fn on_packet(&mut self, doc: &Doc, channel: Channel, bytes: &[u8]) -> Packet {
        let p = decode(doc, bytes);
        let name = channel_name(channel);
        for m in &p.messages {
            self.seen
                .entry(name.to_string())
                .or_default()
                .insert(m.name.clone());
        }
        let seq = p.header.get("msgSeqNum");
        let expected = self.expected.entry(channel.index()).or_insert(1);
        if p.messages.len() == 1 && p.messages[0].name == "Heartbeat" {
            // A heartbeat repeats the last data packet's number (section 3.1).
            assert_eq!(seq, *expected - 1, "{name}: heartbeat's msgSeqNum");
            assert_eq!(p.messages[0].root.get("lastMsgSeqNum"), seq);
            return p;
        }
        assert_eq!(
            seq, *expected,
            "{name}: data packets are numbered one by one"
        );
        *expected += 1;
        let flags = p.header.get("msgFlags") as u64;
        if flags & doc.flag("StartOfSnapshot") != 0 {
            self.snapshot = Some((p.messages[0].root.clone(), Vec::new()));
        }
        for m in &p.messages {
            self.on_message(doc, m);
        }
        if flags & doc.flag("EndOfSnapshot") != 0 {
            let (root, entries) = self.snapshot.take().expect("EndOfSnapshot after a start");
            self.check_snapshot(doc, &root, &entries);
        }
        p
    }

    fn on_message(&mut self, doc: &Doc, m: &Message) {
        let r = &m.root;
        let action = |name| doc.value("MdUpdateAction", name) as i128;
        match m.name.as_str() {
            "OrderUpdate" | "OrderExecution" | "EmptyBook" => {
                let book = self.books.entry(r.get("securityId")).or_default();
                assert_eq!(
                    r.get("rptSeq"),
                    book.rpt_seq + 1,
                    "rptSeq grows by one per order-log message of the instrument"
                );
                book.rpt_seq += 1;
                if m.name == "EmptyBook" {
                    book.orders.clear();
                    book.queues.clear();
                    return;
                }
                let (id, a) = (r.get("mdEntryId"), r.get("mdUpdateAction"));
                if m.name == "OrderExecution" {
                    let t = (r.get("securityId"), r.get("lastPx"), r.get("lastQty"));
                    assert!(self.executions.insert(r.get("tradeId"), t).is_none());
                }
                if a == action("New") {
                    book.add(id, r.get("side"), r.get("mdEntryPx"), r.get("mdEntrySize"));
                } else if a == action("Change") {
                    let o = book
                        .orders
                        .get_mut(&id)
                        .expect("Change of an unknown order");
                    assert_eq!(o.1, r.get("mdEntryPx"), "a Change keeps the price");
                    o.2 = r.get("mdEntrySize");
                } else {
                    assert_eq!(a, action("Delete"));
                    book.remove(id);
                }
            }
            "Trade" => {
                let (sid, qty) = (r.get("securityId"), r.get("qty"));
                if r.get("tradeType") == doc.value("TradeType", "Auction") as i128 {
                    self.auction_trades.insert(r.get("tradeId"));
                }
                *self.volume.entry(sid).or_default() += qty;
                self.trades
                    .insert(r.get("tradeId"), (sid, r.get("price"), qty));
            }
            "Statistics" => {
                self.statistics.insert(r.get("securityId"), r.clone());
            }
            "AggregatedBook" => self.check_top20(doc, m),
            "OrderBookSnapshot" => {
                let (first, entries) = self.snapshot.as_mut().expect("StartOfSnapshot first");
                for key in ["securityId", "rptSeq", "lastMsgSeqNumProcessed"] {
                    assert_eq!(m.root.get(key), first.get(key), "{key} in one snapshot");
                }
                entries.extend(m.entries.iter().cloned());
            }
            "SecurityDefinition" => {
                let mut v = r.clone();
                v.text.extend(r.text.clone());
                self.definitions.insert(r.get("securityId"), v);
                let band = (r.get("lowLimitPx"), r.get("highLimitPx"));
                self.limits.insert(r.get("securityId"), band);
            }
            "SecurityStatus" => {
                self.statuses
                    .push((r.get("securityId"), r.get("tradingStatus")));
                let band = (r.get("lowLimitPx"), r.get("highLimitPx"));
                self.limits.insert(r.get("securityId"), band);
            }
            "AuctionIndicative" => self.indicative.push(r.clone()),
            _ => {}
        }
    }

    /// An AggregatedBook equals the order log's book at the rptSeq it names.
    fn check_top20(&mut self, doc: &Doc, m: &Message) {
        let buy = doc.value("Side", "Buy") as i128;
        let sell = doc.value("Side", "Sell") as i128;
        let Some(book) = self.books.get(&m.root.get("securityId")) else {
            return;
        };
        if book.rpt_seq != m.root.get("rptSeq") {
            return;
        }
        for side in [buy, sell] {
            let got: Vec<_> = m
                .entries
                .iter()
                .filter(|e| e.get("side") == side)
                .map(|e| (e.get("price"), e.get("qty"), e.get("orderCount")))
                .collect();
            assert_eq!(got, book.levels(side, buy, 20), "top 20 of side {side}");
        }
        self.top20_checked += 1;
    }

    /// A whole snapshot equals the order log's book at its rptSeq, in queue order.
    fn check_snapshot(&mut self, doc: &Doc, root: &Values, entries: &[Values]) {
        let buy = doc.value("Side", "Buy") as i128;
        let Some(book) = self.books.get(&root.get("securityId")) else {
            return;
        };
        if book.rpt_seq != root.get("rptSeq") {
            return;
        }
        let mut got: Vec<_> = entries
            .iter()
            .map(|e| {
                (
                    e.get("mdEntryId") as u64,
                    e.get("side") == buy,
                    e.get("mdEntryPx") as i64,
                    e.get("mdEntrySize") as i64,
                )
            })
            .collect();
        let mut want = book.in_priority(buy);
        // Per side in queue order; the document does not order the two sides.
        got.sort_by_key(|o| !o.1);
        want.sort_by_key(|o| !o.1);
        assert_eq!(got, want, "snapshot of {}", root.get("securityId"));
        self.snapshots_checked += 1;
    }
}

fn channel_name(c: Channel) -> &'static str {
    match c {
        Channel::Orders => "orders",
        Channel::Trades => "trades",
        Channel::Book => "book",
        Channel::Statistics => "statistics",
        Channel::Instruments => "instruments",
        Channel::Snapshot => "snapshot",
    }
}

#[test]
fn the_document_parses_into_every_layout_a_client_needs() {
    let doc = Doc::parse(DOC);
    assert_eq!(bytes_of(&doc.packet_header), 16);
    assert_eq!(bytes_of(&doc.incremental_header), 12);
    assert_eq!(bytes_of(&doc.sbe_header), 8);
    for name in [
        "OrderUpdate",
        "OrderExecution",
        "EmptyBook",
        "OrderBookSnapshot",
        "SecurityDefinition",
        "SecurityStatus",
        "TradingSessionStatus",
        "AggregatedBook",
        "Statistics",
        "Trade",
        "Heartbeat",
        "SequenceReset",
    ] {
        assert!(
            doc.messages.values().any(|l| l.name == name),
            "{name} has a table"
        );
    }
    assert_eq!(doc.channels.len(), 6, "{:?}", doc.channels);
    assert!(doc.every_channel.contains("Heartbeat"));
    assert_eq!(doc.flag("LastFragment"), 1);
}

/// A seeded run through the publisher, read by the document's client.
#[test]
fn a_client_written_from_the_document_builds_the_cores_books() {
    let doc = Doc::parse(DOC);
    let mut h = Harness::new(11, test_publisher_config());
    let mut client = Client::default();
    let mut sink = VecSink::default();
    let last_fragment = doc.flag("LastFragment") as i128;
    let mut bands_checked = 0u64;
    for _ in 0..6_000 {
        // The first command of the batch takes the next 2 µs step (see `Harness::batch`).
        let batch_ts = h.now_ns + 2_000;
        h.step(20, &mut sink);
        let mut orders = Vec::new();
        for (c, bytes) in &sink.packets {
            let p = client.on_packet(&doc, *c, bytes);
            if *c == Channel::Orders && p.incremental.is_some() {
                orders.push(p);
            }
        }
        // One committed batch is one transaction: its order-log packets carry the batch's
        // time, and only the last has LastFragment (online mode).
        for (i, p) in orders.iter().enumerate() {
            let inc = p.incremental.as_ref().unwrap();
            assert_eq!(inc.get("transactTimeNs") as u64, batch_ts, "transactTimeNs");
            let last = p.header.get("msgFlags") & last_fragment != 0;
            assert_eq!(
                last,
                i + 1 == orders.len(),
                "LastFragment on the batch's last packet"
            );
        }
        sink.packets.clear();
        bands_checked += check_bands(&client, &h);
    }
    assert!(h.engine.counters().trades > 100, "the flow traded");
    // The band moves with the last trade's price; a feed that stated only the band of the
    // morning's reference would have been caught above as soon as a trade moved it.
    assert!(
        client.statuses.len() > 10,
        "SecurityStatus when trades moved the band"
    );
    assert!(bands_checked > 1_000, "bands compared: {bands_checked}");

    // The books, order by order, in lots (the core counts quantities in lots).
    for def in &h.defs {
        let book = client
            .books
            .get(&(def.instrument.0 as i128))
            .expect("a book");
        let want: Vec<_> = engine_orders(&h.engine, def.instrument)
            .into_iter()
            .map(|(id, side, px, qty)| (id, side == Side::Buy, px, qty))
            .collect();
        assert_eq!(
            book.in_priority(doc.value("Side", "Buy") as i128),
            want,
            "{}",
            def.symbol
        );
    }
    // Every trade once on the trades channel and once as the resting order's execution.
    assert_eq!(client.trades, client.executions);
    // The statistics channel's volume is the trades channel's.
    for (sid, volume) in &client.volume {
        assert_eq!(client.statistics[sid].get("volume"), *volume);
    }
    assert!(client.top20_checked > 100, "top-20 books compared");
    // Definitions: lotSize is the units per lot, priceScale the decimals.
    for def in &h.defs {
        let d = &client.definitions[&(def.instrument.0 as i128)];
        assert_eq!(d.get("lotSize"), def.lot_size as i128);
        assert_eq!(d.get("priceScale"), def.price_scale as i128);
        assert_eq!(d.get("tickSize"), def.tick.0 as i128);
        assert_eq!(d.text["symbol"], def.symbol);
    }

    // A halt: SecurityStatus on the orders channel, no rptSeq taken.
    let halted = h.defs[0].instrument;
    let rpt_before = client.books[&(halted.0 as i128)].rpt_seq;
    publish_command(&mut h, halted, Phase::Halted, &mut sink);
    for (c, bytes) in std::mem::take(&mut sink.packets) {
        client.on_packet(&doc, c, &bytes);
    }
    let halted_value = doc.value("SecurityTradingStatus", "Halted") as i128;
    assert_eq!(
        client.statuses.last(),
        Some(&(halted.0 as i128, halted_value))
    );
    assert_eq!(client.books[&(halted.0 as i128)].rpt_seq, rpt_before);

    // A call auction: its status, the indicative uncrossing on the orders channel as orders
    // arrive, the uncrossing's trades marked Auction on the trades channel with no
    // OrderExecution, and the book order by order as the core's after it.
    let called = h.defs[1].instrument;
    let sid = called.0 as i128;
    let feed = |client: &mut Client, sink: &mut VecSink| {
        for (c, bytes) in std::mem::take(&mut sink.packets) {
            client.on_packet(&doc, c, &bytes);
        }
    };
    publish_command(&mut h, called, Phase::OpeningAuction, &mut sink);
    feed(&mut client, &mut sink);
    assert_eq!(
        client.statuses.last(),
        Some(&(
            sid,
            doc.value("SecurityTradingStatus", "OpeningAuction") as i128
        ))
    );
    for _ in 0..1_000 {
        h.step(20, &mut sink);
        feed(&mut client, &mut sink);
    }
    let last = client
        .indicative
        .iter()
        .rev()
        .find(|r| r.get("securityId") == sid)
        .expect("an indicative uncrossing of the called instrument");
    let (price, qty) = (last.get("price"), last.get("qty"));
    assert!(qty > 0, "its book crossed: {qty}");
    let (want_price, want_qty, _) = h.engine.indicative_uncross(called).unwrap();
    assert_eq!((price, qty), (want_price.0 as i128, want_qty.0 as i128));
    let executions_before = client.executions.len();
    publish_command(&mut h, called, Phase::Open, &mut sink);
    feed(&mut client, &mut sink);
    assert!(!client.auction_trades.is_empty(), "the uncrossing traded");
    for id in &client.auction_trades {
        let (t_sid, t_price, _) = client.trades[id];
        assert_eq!(
            (t_sid, t_price),
            (sid, price),
            "at the one indicative price"
        );
        assert!(!client.executions.contains_key(id));
    }
    assert_eq!(client.executions.len(), executions_before);
    let want: Vec<_> = engine_orders(&h.engine, called)
        .into_iter()
        .map(|(id, side, px, qty)| (id, side == Side::Buy, px, qty))
        .collect();
    assert_eq!(
        client.books[&sid].in_priority(doc.value("Side", "Buy") as i128),
        want,
        "the book after the uncrossing"
    );

    // The snapshot loop agrees with the order log.
    for _ in 0..200 {
        h.now_ns += 1_000_000;
        h.publisher.tick(h.now_ns, &mut sink);
        for (c, bytes) in std::mem::take(&mut sink.packets) {
            client.on_packet(&doc, c, &bytes);
        }
    }
    assert!(client.snapshots_checked >= h.defs.len() as u64);

    // Each channel carries only what the document's channel table lists for it.
    for (channel, names) in &client.seen {
        let listed = &doc.channels[channel];
        for n in names {
            assert!(
                listed.contains(n) || doc.every_channel.contains(n),
                "{n} on the {channel} channel, which the document does not list"
            );
        }
    }
    // Last, as it changes the core's book behind the client (the first instrument is halted).
    the_stated_band_is_the_band_the_core_enforces(&client, &mut h, 1);
}

/// After a transaction, the band a client read last for each instrument (SecurityStatus or
/// SecurityDefinition, whichever came later) is the core's band: the one it will check the
/// next order against. Returns how many instruments it compared.
fn check_bands(client: &Client, h: &Harness) -> u64 {
    let mut compared = 0;
    for def in &h.defs {
        let Some(&(low, high)) = client.limits.get(&(def.instrument.0 as i128)) else {
            continue;
        };
        let core = h.engine.instrument(def.instrument).expect("defined").band();
        assert_eq!(
            (low, high),
            (core.0 .0 as i128, core.1 .0 as i128),
            "{}: the feed's band against the core's",
            def.symbol
        );
        compared += 1;
    }
    compared
}

/// The core refuses a limit order a tick below the stated low limit as outside the band and
/// takes one at it (the operator's report: a feed that said 80.00 while the core refused it).
fn the_stated_band_is_the_band_the_core_enforces(client: &Client, h: &mut Harness, k: usize) {
    let account = h
        .flow
        .setup()
        .into_iter()
        .find_map(|b| match b {
            CommandBody::AddAccount(spec) => Some(spec.account),
            _ => None,
        })
        .expect("the flow adds accounts");
    let def = h.defs[k].clone();
    let (low, _) = client.limits[&(def.instrument.0 as i128)];
    for (k, price) in [low as i64 - def.tick.0, low as i64]
        .into_iter()
        .enumerate()
    {
        h.now_ns += 2_000;
        let order = bourse_core::NewOrder {
            account,
            cl_ord_id: bourse_core::ClOrdId(u64::MAX - k as u64),
            instrument: def.instrument,
            side: Side::Buy,
            ord_type: bourse_core::OrdType::Limit,
            price: bourse_core::Price(price),
            qty: bourse_core::Qty(1),
            tif: bourse_core::TimeInForce::Day,
            expire_ts_ns: 0,
            display_qty: bourse_core::Qty(0),
            firm: None,
        };
        let mut events = Vec::new();
        let command = Command::new(h.now_ns, CommandBody::NewOrder(order));
        h.engine.apply(&command, &mut events);
        let outside = events.iter().any(|e| {
            matches!(
                e,
                Event::OrderRejected {
                    reason: bourse_core::RejectReason::PriceOutsideBand,
                    ..
                }
            )
        });
        assert_eq!(
            outside,
            k == 0,
            "order at {price} (stated low {low}): {events:?}"
        );
    }
}

/// Applies one phase change to the core and publishes its events as one batch.
fn publish_command(h: &mut Harness, instrument: InstrumentId, phase: Phase, sink: &mut VecSink) {
    h.now_ns += 2_000;
    let mut events: Vec<Event> = Vec::new();
    h.engine.apply(
        &Command::new(
            h.now_ns,
            CommandBody::SetPhase {
                instrument: Some(instrument),
                phase,
            },
        ),
        &mut events,
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::PhaseChanged { .. })),
        "{events:?}"
    );
    h.publisher.publish(&events, h.now_ns, sink);
}
