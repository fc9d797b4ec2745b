//! The market data publisher of a node: each replica runs its core's
//! [`bourse_marketdata::Publisher`], fed from its own committed stream, and sends only while
//! it leads.
//!
//! # Numbering is a function of the log
//!
//! [`NodeFeed`] (sans-I/O) takes the committed entries in log order, through a
//! [`StreamConsumer`], and calls [`Publisher::publish`] once per entry that applied at least
//! one command, with the events of the requests applied in that entry
//! (`OutcomeKind::Applied`; a duplicate's events were published when it was first applied,
//! and stale or refused requests have none). Packets close in three ways, all decided by the
//! log: online channels at the end of each such entry; 1 ms / 15 ms channels when a batch's
//! time (the `ts_ns` the core took from the command) enters a new interval; and the idle
//! flush, which is a log entry too. No replica reads a clock to decide a packet boundary.
//!
//! The idle flush: a 1 ms / 15 ms channel whose unsent messages belong to an interval that
//! ended at least one interval ago, with no later batch to close it, must still go out. The
//! leader's feed sees that on its duty cycle and proposes a
//! [`crate::batch::LogCommand::MarketDataFlush`] entry carrying its clock reading (one at a
//! time; another only if the first was not applied within `FLUSH_REPROPOSE_NS`), as it
//! proposes hash checks. Every replica applies it at the same log index with the same time
//! ([`Publisher::idle_flush`]), so every packet boundary, MsgSeqNum and RptSeq is the same
//! on every replica in every mode: a follower's publisher is a standby (it builds the
//! packets and its replay history and sends nothing) and a new leader continues the
//! sequence exactly where the old one stopped. A flush proposed by a leader that loses
//! office before it commits is simply proposed again by the next one; a flush that commits
//! after a later batch already closed the interval closes nothing. The price is that an idle
//! interval's last packet leaves one commit round trip later than a clock could send it.
//! Packets carry the sender's clock only in SendingTime, which no numbering reads.
//!
//! The instrument and snapshot loops and the heartbeats follow each node's wall clock (they
//! carry no incremental numbering); a publisher that becomes active announces the loops'
//! numbering with SequenceReset, which costs the subscriber nothing.
//!
//! # Numbering survives snapshots
//!
//! A publisher must know what was published up to the entry it starts after. The replicated
//! state keeps it: [`FeedNumbering`] is a standby publisher inside
//! [`crate::ReplicatedState`], fed by the state machine with the events of every applied
//! request and every idle flush entry, exactly as [`NodeFeed`] is fed from the stream. Its
//! state (next MsgSeqNum per channel, RptSeq, books, statistics and last published top 20 per
//! instrument) is part of the state's snapshot and hash. So a node that restarted from a
//! snapshot, installed one from the leader, or whose consumer lost entries it could not catch
//! up (see [`crate::consumer`]) starts its feed from the state's numbering at index N and
//! consumes the stream from N + 1 (both under the state machine's lock, so nothing falls
//! between them); from there it numbers every packet as the others do and can take over as
//! publisher, in every mode. After a restart of every node the new leader continues the same
//! sequences. What a restarted feed lacks is the replay history of packets published before
//! it started: a subscriber that needs those is refused by the replay service and recovers
//! from the snapshot loop.
//!
//! The numbering settings (`packet_bytes_max`, `modes`, `session_id`) must be the same on
//! every node and across restarts; a state restored from a snapshot taken without
//! `[marketdata]` keeps no numbering, and such a node's feed follows the stream from index 1
//! or, if it cannot, stays standby-only ([`FeedStatus::detached`] says why).
//!
//! Each node still runs the publisher twice, the state's numbering and the feed, doing the
//! same work on the same entries: the feed's loops and heartbeats run on the wall clock and
//! would otherwise have to run under the state machine's lock, between applies.
//!
//! # Replay
//!
//! Every replica keeps the replay history of every incremental channel, but only the leader
//! listens on the replay ports (`replay_base_port + channel index`): it binds them when it
//! becomes active and closes them when it stops leading, so subscribers always reach the
//! publisher whose packets they are receiving.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bourse_core::codec::{DecodeError, Reader, Writer};
use bourse_core::{Event, Instrument, InstrumentId};
use bourse_marketdata::replay::ReplayServer;
use bourse_marketdata::udp::{
    ChannelAddrs, FeedAddrs, SendRoutes, UdpSink, BASE_PORT_DEFAULT, REPLAY_PORT_OFFSET,
};
use bourse_marketdata::{
    Channel, PacketSink, PublicationMode, Publisher, PublisherConfig, PublisherState,
    CHANNEL_COUNT, PACKET_BYTES_DEFAULT, REPLAY_HISTORY_PACKETS_DEFAULT,
};
use serde::{Deserialize, Serialize};

use crate::archive::StreamArchive;
use crate::consumer::{RequestView, StreamConsumer};
use crate::stream::{CommittedEntry, StreamError};

fn d_base_port() -> u16 {
    BASE_PORT_DEFAULT
}
fn d_packet_bytes() -> usize {
    PACKET_BYTES_DEFAULT
}
fn d_localhost() -> Ipv4Addr {
    Ipv4Addr::LOCALHOST
}
fn d_feed_host() -> Ipv4Addr {
    bourse_marketdata::udp::LOOPBACK_BROADCAST
}
fn d_multicast_ttl() -> u32 {
    1
}
fn d_multicast_loop() -> bool {
    true
}
fn d_session_id() -> u32 {
    1
}
fn d_replay_history() -> usize {
    REPLAY_HISTORY_PACKETS_DEFAULT
}
fn d_replay_history_bytes() -> usize {
    bourse_marketdata::REPLAY_HISTORY_BYTES_DEFAULT
}
fn d_snapshot_cycle_ms() -> u64 {
    bourse_marketdata::SNAPSHOT_CYCLE_NS_DEFAULT / 1_000_000
}
fn d_instruments_interval_ms() -> u64 {
    100
}

/// Most packets of replay history per channel a node may be asked to keep.
pub const REPLAY_HISTORY_PACKETS_LIMIT: usize = 1_000_000;
/// Most bytes of replay history per channel a node may be asked to keep.
pub const REPLAY_HISTORY_BYTES_LIMIT: usize = 1 << 30;
/// How often an active publisher whose replay ports are taken tries to bind them again.
const REPLAY_BIND_RETRY_MS: u64 = 100;
/// Smallest pause between two duty cycles ([`Publisher::tick`]) while entries stream in.
const TICK_INTERVAL_NS: u64 = 200_000;
/// How often an idle standby feed wakes up: it sends nothing and closes no packet by its
/// clock (idle flushes are log entries), so only its status needs refreshing.
const STANDBY_WAKE_MS: u64 = 100;

/// How long the feed's loop may sleep when no entry comes: the leader runs its duty cycle
/// (idle flush proposals, heartbeats, the loops) every millisecond.
fn idle_wake_ms(feed: &NodeFeed) -> u64 {
    if feed.is_active() {
        1
    } else {
        STANDBY_WAKE_MS
    }
}

/// A leader whose idle flush entry was not applied within this long proposes another.
const FLUSH_REPROPOSE_NS: u64 = 50_000_000;

/// The `[marketdata]` section of the cluster configuration.
///
/// ```toml
/// [marketdata]
/// base_port = 31400          # channel i: feed A on base+2i, feed B on base+2i+1 (127.0.0.1)
/// replay_base_port = 31420   # TCP replay of incremental channel i on this port + i
/// packet_bytes_max = 1400
/// session_id = 1
/// replay_history_packets = 100000
/// replay_history_bytes = 16777216
/// snapshot_cycle_ms = 1000   # every instrument's snapshot once per cycle
/// modes = { orders = "online", trades = "online", book = "1ms", statistics = "15ms" }
/// ports = { statistics = [31500, 31501] }   # optional: feed A and B ports of one channel
/// # Across hosts (see docs/deploy.md): feeds A and B to two multicast groups, each node
/// # sending feed A from its address on one network and feed B from its address on another.
/// feed_a_host = "239.192.10.1"
/// feed_b_host = "239.192.20.1"
/// multicast_ttl = 1
/// multicast_loop = false
/// replay_listen = "0.0.0.0"
/// interfaces = { 1 = ["10.1.0.11", "10.2.0.11"], 2 = ["10.1.0.12", "10.2.0.12"], 3 = ["10.1.0.13", "10.2.0.13"] }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarketDataSection {
    #[serde(default = "d_base_port")]
    pub base_port: u16,
    /// Feed A and B ports of a channel, by channel name, instead of the `base_port` layout.
    #[serde(default)]
    pub ports: BTreeMap<String, [u16; 2]>,
    /// First TCP replay port (the order log's); `base_port + 20` when absent.
    #[serde(default)]
    pub replay_base_port: Option<u16>,
    #[serde(default = "d_packet_bytes")]
    pub packet_bytes_max: usize,
    /// Publication mode by incremental channel name: "online", "1ms" or "15ms" (online when
    /// absent).
    #[serde(default)]
    pub modes: BTreeMap<String, String>,
    #[serde(default = "d_session_id")]
    pub session_id: u32,
    /// Packets kept for replay, per incremental channel.
    #[serde(default = "d_replay_history")]
    pub replay_history_packets: usize,
    /// Bytes of packets kept for replay, per incremental channel (allocated up front).
    #[serde(default = "d_replay_history_bytes")]
    pub replay_history_bytes: usize,
    /// The snapshot loop sends every instrument's book once per this many ms (one full
    /// cycle, the instruments spread evenly over it).
    #[serde(default = "d_snapshot_cycle_ms")]
    pub snapshot_cycle_ms: u64,
    /// The instrument loop sends every definition every this many ms.
    #[serde(default = "d_instruments_interval_ms")]
    pub instruments_interval_ms: u64,
    /// Where feed A goes: a multicast group, or one host for unicast; by default the
    /// loopback broadcast address 127.255.255.255, which every subscriber on this host
    /// receives whole (see `bourse_marketdata::udp::LOOPBACK_BROADCAST`).
    #[serde(default = "d_feed_host")]
    pub feed_a_host: Ipv4Addr,
    /// Where feed B goes (127.255.255.255 by default).
    #[serde(default = "d_feed_host")]
    pub feed_b_host: Ipv4Addr,
    /// Hops a multicast datagram may take (1: the sender's network; 0: this host only).
    #[serde(default = "d_multicast_ttl")]
    pub multicast_ttl: u32,
    /// Whether subscribers on the sending host receive its multicast feeds.
    #[serde(default = "d_multicast_loop")]
    pub multicast_loop: bool,
    /// The address the replay services bind (their ports from `replay_base_port`);
    /// 127.0.0.1 by default, 0.0.0.0 serves every interface.
    #[serde(default = "d_localhost")]
    pub replay_listen: Ipv4Addr,
    /// Per node id, the addresses of the interfaces it sends feed A and feed B from. Needed
    /// for every node when a feed goes to a multicast group or another host; a node without
    /// an entry sends from 127.0.0.1.
    #[serde(default)]
    pub interfaces: BTreeMap<String, [Ipv4Addr; 2]>,
}

impl Default for MarketDataSection {
    fn default() -> Self {
        MarketDataSection {
            base_port: d_base_port(),
            ports: BTreeMap::new(),
            replay_base_port: None,
            packet_bytes_max: d_packet_bytes(),
            modes: BTreeMap::new(),
            session_id: d_session_id(),
            replay_history_packets: d_replay_history(),
            replay_history_bytes: d_replay_history_bytes(),
            snapshot_cycle_ms: d_snapshot_cycle_ms(),
            instruments_interval_ms: d_instruments_interval_ms(),
            feed_a_host: d_feed_host(),
            feed_b_host: d_feed_host(),
            multicast_ttl: d_multicast_ttl(),
            multicast_loop: d_multicast_loop(),
            replay_listen: d_localhost(),
            interfaces: BTreeMap::new(),
        }
    }
}

impl MarketDataSection {
    /// Checks every field; the error names the field and the rule.
    pub fn validate(&self) -> Result<(), String> {
        let min = bourse_marketdata::PACKET_BYTES_MIN;
        let max = bourse_marketdata::wire::market_data::PACKET_BYTES_MAX;
        if !(min..=max).contains(&self.packet_bytes_max) {
            return Err(format!(
                "marketdata.packet_bytes_max = {}: must be in {min}..={max}",
                self.packet_bytes_max
            ));
        }
        for name in self.ports.keys() {
            if Channel::from_name(name).is_none() {
                return Err(format!(
                    "marketdata.ports.{name}: unknown channel (orders, trades, book, statistics, instruments, snapshot)"
                ));
            }
        }
        for (name, mode) in &self.modes {
            match Channel::from_name(name) {
                Some(c) if c.is_incremental() => {}
                Some(_) => {
                    return Err(format!(
                        "marketdata.modes.{name}: the loops have no publication mode"
                    ))
                }
                None => {
                    return Err(format!(
                    "marketdata.modes.{name}: unknown channel (orders, trades, book, statistics)"
                ))
                }
            }
            if PublicationMode::parse(mode).is_none() {
                return Err(format!(
                    "marketdata.modes.{name} = {mode:?}: online, 1ms or 15ms"
                ));
            }
        }
        if self.replay_history_packets == 0
            || self.replay_history_packets > REPLAY_HISTORY_PACKETS_LIMIT
        {
            return Err(format!(
                "marketdata.replay_history_packets = {}: must be in 1..={REPLAY_HISTORY_PACKETS_LIMIT}",
                self.replay_history_packets
            ));
        }
        if self.replay_history_bytes < self.packet_bytes_max
            || self.replay_history_bytes > REPLAY_HISTORY_BYTES_LIMIT
        {
            return Err(format!(
                "marketdata.replay_history_bytes = {}: must be in packet_bytes_max..={REPLAY_HISTORY_BYTES_LIMIT}",
                self.replay_history_bytes
            ));
        }
        if self.snapshot_cycle_ms == 0 || self.instruments_interval_ms == 0 {
            return Err(
                "marketdata.snapshot_cycle_ms and instruments_interval_ms must be > 0".into(),
            );
        }
        let addrs = self.feed_addrs()?;
        let replay = self.replay_port()?;
        let mut seen = std::collections::BTreeSet::new();
        for c in &addrs.channels {
            for p in [c.a.port(), c.b.port()] {
                if p == 0 || !seen.insert(p) {
                    return Err(format!("marketdata: UDP port {p} is zero or used twice"));
                }
            }
        }
        if replay == 0 || replay.checked_add(CHANNEL_COUNT as u16).is_none() {
            return Err(format!("marketdata: replay ports from {replay} do not fit"));
        }
        if self.multicast_ttl > 255 {
            return Err(format!(
                "marketdata.multicast_ttl = {}: must be in 0..=255",
                self.multicast_ttl
            ));
        }
        for key in self.interfaces.keys() {
            if key.parse::<crate::NodeId>().is_err() {
                return Err(format!(
                    "marketdata.interfaces.{key}: the keys are node ids (1 = [\"feed A interface\", \"feed B interface\"])"
                ));
            }
        }
        Ok(())
    }

    /// Checks the section against the replica group's node ids: every `interfaces` entry
    /// names a node, and every node can send where the feeds go.
    pub fn validate_for(&self, nodes: &[crate::NodeId]) -> Result<(), String> {
        self.validate()?;
        for key in self.interfaces.keys() {
            if !nodes.iter().any(|id| id.to_string() == *key) {
                return Err(format!(
                    "marketdata.interfaces.{key}: no node {key} in the configuration"
                ));
            }
        }
        for id in nodes {
            self.send_routes(*id)?;
        }
        Ok(())
    }

    /// How node `id` sends the feeds: its interfaces, the multicast TTL and loop. A node
    /// without an `interfaces` entry sends from 127.0.0.1, which only feeds kept on the host
    /// allow.
    pub fn send_routes(&self, id: crate::NodeId) -> Result<SendRoutes, String> {
        let on_host = self.feed_a_host.is_loopback() && self.feed_b_host.is_loopback();
        let [interface_a, interface_b] = match self.interfaces.get(&id.to_string()) {
            Some(pair) => *pair,
            None if on_host => [Ipv4Addr::LOCALHOST; 2],
            None => {
                return Err(format!(
                    "marketdata: the feeds go to {} and {}, so node {id} needs an entry in \
                     marketdata.interfaces (the addresses of its interfaces for feed A and feed B)",
                    self.feed_a_host, self.feed_b_host
                ))
            }
        };
        let routes = SendRoutes {
            interface_a,
            interface_b,
            multicast_ttl: self.multicast_ttl,
            multicast_loop: self.multicast_loop,
        };
        self.feed_addrs()?
            .check_routes(&routes)
            .map_err(|e| format!("marketdata, node {id}: {e}"))?;
        Ok(routes)
    }

    fn replay_port(&self) -> Result<u16, String> {
        match self.replay_base_port {
            Some(p) => Ok(p),
            None => self
                .base_port
                .checked_add(REPLAY_PORT_OFFSET)
                .ok_or_else(|| {
                    format!(
                        "marketdata.base_port = {}: no room for the replay ports",
                        self.base_port
                    )
                }),
        }
    }

    /// Where the feeds go and where the order log's replay service listens.
    pub fn feed_addrs(&self) -> Result<FeedAddrs, String> {
        if self.base_port == 0
            || self
                .base_port
                .checked_add(2 * CHANNEL_COUNT as u16)
                .is_none()
        {
            return Err(format!(
                "marketdata.base_port = {}: the {} feed ports do not fit",
                self.base_port,
                2 * CHANNEL_COUNT
            ));
        }
        let mut addrs = FeedAddrs::on(self.feed_a_host, self.feed_b_host, self.base_port);
        for (name, [a, b]) in &self.ports {
            let c = Channel::from_name(name)
                .ok_or_else(|| format!("marketdata.ports.{name}: unknown channel"))?;
            addrs.channels[c.index()] = ChannelAddrs {
                a: SocketAddrV4::new(self.feed_a_host, *a),
                b: SocketAddrV4::new(self.feed_b_host, *b),
            };
        }
        addrs.replay = SocketAddrV4::new(self.replay_listen, self.replay_port()?);
        Ok(addrs)
    }

    pub fn publisher_config(&self) -> PublisherConfig {
        let mut modes = [PublicationMode::Online; CHANNEL_COUNT];
        for (name, mode) in &self.modes {
            if let (Some(c), Some(m)) = (Channel::from_name(name), PublicationMode::parse(mode)) {
                modes[c.index()] = m;
            }
        }
        PublisherConfig {
            packet_bytes_max: self.packet_bytes_max,
            modes,
            session_id: self.session_id,
            replay_history_packets: self.replay_history_packets,
            replay_history_bytes: self.replay_history_bytes,
            snapshot_cycle_ns: self.snapshot_cycle_ms.saturating_mul(1_000_000),
            instruments_interval_ns: self.instruments_interval_ms * 1_000_000,
            // Idle flushes are log entries the leader proposes (see the module documentation).
            idle_flush_by_clock: false,
            ..PublisherConfig::default()
        }
    }
}

/// What a node's feed is doing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedStatus {
    /// Sending (this node leads and its feed has the whole history).
    pub active: bool,
    /// Why this node's feed can never send (see the module documentation), if so.
    pub detached: Option<String>,
    /// The log index the feed takes next.
    pub next_index: u64,
    /// Entries that applied commands and were published (sent or, as standby, numbered).
    pub entries_published: u64,
    /// The MsgSeqNum the next data packet of each channel takes, by [`Channel::index`].
    pub next_seq: [u32; CHANNEL_COUNT],
    /// Packets sent per channel by this node.
    pub packets_sent: [u64; CHANNEL_COUNT],
    /// Events that did not decode (counted and skipped; the state machine wrote them, so this
    /// stays 0 unless the stream is damaged).
    pub undecodable_events: u64,
    /// The replay services listen (only while active).
    pub replay_listening: bool,
    /// Times the feed lost entries of its stream and restarted from the replicated state.
    pub resyncs: u64,
    /// Idle flush entries applied (see the module documentation).
    pub idle_flushes: u64,
    /// Idle flush entries this node proposed while it led.
    pub idle_flushes_proposed: u64,
}

/// Version byte of [`FeedNumbering`]'s encoding inside the replicated state's snapshot.
const NUMBERING_VERSION: u8 = 1;

/// The feed's numbering as part of the replicated state: a standby [`Publisher`] (no replay
/// history, no sink) that the state machine feeds with the events of every applied request,
/// entry by entry, exactly as [`NodeFeed`] does from the committed stream. Its state (next
/// MsgSeqNum per channel, per instrument RptSeq, books, statistics, last published top 20)
/// is therefore what every full-history publisher has after the same log index; it travels
/// in the state's snapshot, so a node restored from a snapshot at index N (or that installed
/// one) starts its feed from it and numbers every later packet like the others.
///
/// Only the settings that decide numbering (packet size, publication modes, session id) are
/// kept with it; they come from `[marketdata]`, which must be the same on every node.
pub struct FeedNumbering {
    publisher: Publisher,
    /// The last log index applied (0 before the first).
    index: u64,
    events: Vec<Event>,
    added: Vec<InstrumentId>,
}

/// A sink for a publisher that must not send.
struct NoSink;

impl PacketSink for NoSink {
    fn send(&mut self, _channel: Channel, _packet: &[u8]) {}
}

impl FeedNumbering {
    /// Numbering from log index 1 with these settings.
    pub fn new(config: &PublisherConfig) -> FeedNumbering {
        FeedNumbering::with_publisher(Publisher::new(numbering_config(config), &[]), 0)
    }

    fn with_publisher(mut publisher: Publisher, index: u64) -> FeedNumbering {
        publisher.set_active(false);
        FeedNumbering {
            publisher,
            index,
            events: Vec::with_capacity(1024),
            added: Vec::new(),
        }
    }

    /// The events of one request applied in the current entry.
    pub fn push_events(&mut self, events: &[Event]) {
        self.events.extend_from_slice(events);
    }

    /// The current entry's requests are all applied: publish their events (if any) as one
    /// batch, as [`NodeFeed::on_entry`] does, then give the definitions of the instruments it
    /// added from `engine`.
    pub fn end_entry(&mut self, engine: &bourse_engine::Engine) {
        if self.events.is_empty() {
            return;
        }
        self.added.clear();
        for e in &self.events {
            if let Event::InstrumentAdded { instrument, .. } = e {
                self.added.push(*instrument);
            }
        }
        // The time only stamps SendingTime, which nothing keeps; numbering never reads it.
        self.publisher.publish(&self.events, 0, &mut NoSink);
        self.events.clear();
        for id in &self.added {
            if let Some(def) = engine.instrument(*id) {
                self.publisher.add_instrument(def.clone());
            }
        }
    }

    /// A market data idle flush entry: closes what every replica's publisher closes.
    pub fn idle_flush(&mut self, now_ns: u64) {
        self.publisher.idle_flush(now_ns, &mut NoSink);
    }

    /// Every entry, of any kind, once applied.
    pub fn entry_applied(&mut self, index: u64) {
        self.index = index;
    }

    /// The last log index applied.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The publisher state after [`FeedNumbering::index`], to start a feed from.
    pub fn checkpoint(&self) -> (u64, PublisherState) {
        (self.index, self.publisher.state())
    }

    /// The MsgSeqNum the next data packet of `channel` takes.
    pub fn next_seq(&self, channel: Channel) -> u32 {
        self.publisher.next_seq(channel)
    }

    /// Canonical bytes: version, the numbering settings, the index, the publisher state.
    pub fn encode(&self, w: &mut Writer) {
        let c = self.publisher.config();
        w.u8(NUMBERING_VERSION);
        w.u32(c.packet_bytes_max as u32);
        for m in c.modes {
            w.u8(match m {
                PublicationMode::Online => 0,
                PublicationMode::Every1Ms => 1,
                PublicationMode::Every15Ms => 2,
            });
        }
        w.u32(c.session_id);
        w.u64(self.index);
        self.publisher.encode_state(w);
    }

    /// Reads what [`FeedNumbering::encode`] wrote; refuses anything out of range.
    pub fn decode(r: &mut Reader<'_>) -> Result<FeedNumbering, DecodeError> {
        if r.u8()? != NUMBERING_VERSION {
            return Err(r.error("unknown market data numbering version"));
        }
        let packet_bytes_max = r.u32()? as usize;
        let range = bourse_marketdata::PACKET_BYTES_MIN
            ..=bourse_marketdata::wire::market_data::PACKET_BYTES_MAX;
        if !range.contains(&packet_bytes_max) {
            return Err(r.error("market data packet size out of range"));
        }
        let mut modes = [PublicationMode::Online; CHANNEL_COUNT];
        for m in &mut modes {
            *m = match r.u8()? {
                0 => PublicationMode::Online,
                1 => PublicationMode::Every1Ms,
                2 => PublicationMode::Every15Ms,
                _ => return Err(r.error("bad market data publication mode")),
            };
        }
        let session_id = r.u32()?;
        let index = r.u64()?;
        let state = PublisherState::decode(r)?;
        let config = numbering_config(&PublisherConfig {
            packet_bytes_max,
            modes,
            session_id,
            ..PublisherConfig::default()
        });
        Ok(FeedNumbering::with_publisher(
            Publisher::from_state(config, state),
            index,
        ))
    }
}

/// The settings of the state's publisher: numbering ones as given, no replay history.
fn numbering_config(config: &PublisherConfig) -> PublisherConfig {
    PublisherConfig {
        packet_bytes_max: config.packet_bytes_max,
        modes: config.modes,
        session_id: config.session_id,
        replay_history_packets: 0,
        idle_flush_by_clock: false,
        ..PublisherConfig::default()
    }
}

/// The sans-I/O glue between a committed stream and a publisher.
pub struct NodeFeed {
    publisher: Publisher,
    next_index: u64,
    leader: bool,
    detached: Option<String>,
    events: Vec<Event>,
    added: Vec<InstrumentId>,
    status: FeedStatus,
}

impl NodeFeed {
    /// A feed that expects the log from index 1, standby until told it leads.
    pub fn new(config: PublisherConfig) -> NodeFeed {
        let mut publisher = Publisher::new(config, &[]);
        publisher.set_active(false);
        NodeFeed {
            publisher,
            next_index: 1,
            leader: false,
            detached: None,
            events: Vec::with_capacity(4096),
            added: Vec::new(),
            status: FeedStatus {
                next_index: 1,
                ..FeedStatus::default()
            },
        }
    }

    /// A feed that continues from the replicated state's numbering after log index
    /// `last_index` (see [`FeedNumbering::checkpoint`]): it takes `last_index + 1` next and
    /// numbers every packet from there exactly as a feed that saw the whole log.
    pub fn resume(config: PublisherConfig, last_index: u64, state: PublisherState) -> NodeFeed {
        let mut feed = NodeFeed::new(config.clone());
        feed.publisher = Publisher::from_state(config, state);
        feed.publisher.set_active(false);
        feed.next_index = last_index + 1;
        feed.status.next_index = feed.next_index;
        feed
    }

    pub fn publisher(&self) -> &Publisher {
        &self.publisher
    }

    /// The feed can never send again (see the module documentation).
    pub fn detach(&mut self, why: String) {
        if self.detached.is_none() {
            self.detached = Some(why);
        }
        self.apply_activity();
    }

    pub fn detached(&self) -> Option<&str> {
        self.detached.as_deref()
    }

    /// Whether this node leads; the feed sends only while it leads and is not detached.
    pub fn set_leader(&mut self, leader: bool) {
        self.leader = leader;
        self.apply_activity();
    }

    fn apply_activity(&mut self) {
        let active = self.leader && self.detached.is_none();
        if active != self.publisher.is_active() {
            self.publisher.set_active(active);
        }
    }

    pub fn is_active(&self) -> bool {
        self.publisher.is_active()
    }

    /// The log index the feed takes next.
    pub fn next_index(&self) -> u64 {
        self.next_index
    }

    /// Publishes one committed entry, which must be the next index. An entry out of order
    /// detaches the feed (its numbering can no longer match the other replicas'). Returns
    /// the instruments the entry added, whose definitions the caller hands to
    /// [`NodeFeed::define`].
    pub fn on_entry(
        &mut self,
        entry: &CommittedEntry,
        now_ns: u64,
        sink: &mut dyn PacketSink,
    ) -> &[InstrumentId] {
        self.added.clear();
        if self.detached.is_some() {
            return &self.added;
        }
        if entry.index != self.next_index {
            self.detach(format!(
                "the committed stream jumped from index {} to {}: this node's feed has no \
                 history and stays standby-only",
                self.next_index, entry.index
            ));
            return &self.added;
        }
        self.next_index += 1;
        self.status.next_index = self.next_index;
        if let Some(flush_ns) = entry.market_data_flush_ns {
            self.publisher.idle_flush(flush_ns, sink);
            self.status.idle_flushes += 1;
            return &self.added;
        }
        self.events.clear();
        for r in entry.requests.iter().map(RequestView::new) {
            if !r.applied_here() {
                continue;
            }
            let start = self.events.len();
            for e in r.events() {
                match e {
                    Ok(e) => self.events.push(e),
                    Err(_) => {
                        // The whole request's events or none: a half list would number
                        // messages no other replica numbers.
                        self.events.truncate(start);
                        self.status.undecodable_events += 1;
                    }
                }
            }
        }
        if self.events.is_empty() {
            return &self.added;
        }
        for e in &self.events {
            if let Event::InstrumentAdded { instrument, .. } = e {
                self.added.push(*instrument);
            }
        }
        self.publisher.publish(&self.events, now_ns, sink);
        self.status.entries_published += 1;
        &self.added
    }

    /// Gives an instrument's definition (for the instrument loop and SecurityStatus limits).
    pub fn define(&mut self, def: Instrument) {
        self.publisher.add_instrument(def);
    }

    /// The duty cycle: idle flushes, heartbeats, the loops.
    pub fn tick(&mut self, now_ns: u64, sink: &mut dyn PacketSink) {
        self.publisher.tick(now_ns, sink);
    }

    pub fn status(&self) -> FeedStatus {
        let mut s = self.status.clone();
        s.active = self.publisher.is_active();
        s.detached = self.detached.clone();
        for c in Channel::ALL {
            s.next_seq[c.index()] = self.publisher.next_seq(c);
            s.packets_sent[c.index()] = self.publisher.counters(c).packets_sent;
        }
        s
    }
}

/// A node's market data service: a thread that follows the node's committed stream and its
/// leadership and drives a [`NodeFeed`] into UDP feeds A and B. Stop it with
/// [`MarketDataService::stop`] (dropping it stops it too).
pub struct MarketDataService {
    stop: tokio::sync::watch::Sender<bool>,
    status: Arc<Mutex<FeedStatus>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MarketDataService {
    /// Starts publishing for `node` as `section` says. The feed starts from the replicated
    /// state's numbering (see the module documentation), so a node restarted from a snapshot
    /// publishes like the others; `section` must be the one the node was started with.
    pub fn start(
        node: &crate::Node,
        section: &MarketDataSection,
    ) -> Result<MarketDataService, String> {
        section.validate()?;
        let addrs = section.feed_addrs()?;
        let routes = section.send_routes(node.id())?;
        let sink =
            UdpSink::routed(addrs, routes).map_err(|e| format!("marketdata: UDP socket: {e}"))?;
        let config = section.publisher_config();
        let feed = NodeFeed::new(config.clone());
        let id = node.id();
        let metrics = node.raft().metrics();
        let raft = node.raft().clone();
        let sm = node.state_machine().clone();
        let archive = node.archive().cloned();
        // The publication delay (`md_published`) goes into the node's stage histograms.
        let stages = node.stages().clone();
        let status = Arc::new(Mutex::new(feed.status()));
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let status2 = Arc::clone(&status);
        let replay_addr = SocketAddr::V4(addrs.replay);
        let thread = std::thread::Builder::new()
            .name(format!("md-node-{id}"))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        eprintln!("bourse node {id}: market data runtime: {e}");
                        return;
                    }
                };
                rt.block_on(run(
                    id,
                    config,
                    raft,
                    metrics,
                    sm,
                    archive,
                    sink,
                    replay_addr,
                    status2,
                    stop_rx,
                    stages,
                ));
            })
            .map_err(|e| format!("marketdata: thread: {e}"))?;
        Ok(MarketDataService {
            stop,
            status,
            thread: Some(thread),
        })
    }

    pub fn status(&self) -> FeedStatus {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Stops sending and closes the replay ports; returns when the thread has ended.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MarketDataService {
    fn drop(&mut self) {
        self.halt();
    }
}

fn now_ns() -> u64 {
    bourse_marketdata::now_ns()
}

fn is_leader(
    m: &openraft::RaftMetrics<crate::NodeId, openraft::BasicNode>,
    id: crate::NodeId,
) -> bool {
    m.state == openraft::ServerState::Leader && m.current_leader == Some(id)
}

/// Starts (or restarts) a feed where the replicated state's numbering stands, with a
/// consumer of the committed stream right after it. Taken under the state machine's lock
/// (the consumer subscribes at once), so no entry falls between the state and the
/// consumer. A state without the numbering (taken before market data was configured) can
/// only be followed from index 1. The flag says whether the feed starts from the state.
async fn attach(
    sm: &crate::StateMachineStore,
    archive: &Option<StreamArchive>,
    config: &PublisherConfig,
) -> (NodeFeed, Option<StreamConsumer>, bool) {
    let stream = sm.stream().clone();
    let resumed = sm
        .with_state(|s| {
            s.marketdata().map(|md| {
                let (index, state) = md.checkpoint();
                let consumer = StreamConsumer::local(stream.clone(), archive.clone(), index + 1);
                (index, state, consumer)
            })
        })
        .await;
    match resumed {
        Some((index, state, consumer)) => (
            NodeFeed::resume(config.clone(), index, state),
            Some(consumer),
            true,
        ),
        None => (
            NodeFeed::new(config.clone()),
            Some(StreamConsumer::local(stream, archive.clone(), 1)),
            false,
        ),
    }
}

#[allow(clippy::too_many_arguments)]
async fn run(
    id: crate::NodeId,
    config: PublisherConfig,
    raft: crate::Raft,
    mut metrics: tokio::sync::watch::Receiver<
        openraft::RaftMetrics<crate::NodeId, openraft::BasicNode>,
    >,
    sm: crate::StateMachineStore,
    archive: Option<StreamArchive>,
    mut sink: UdpSink,
    replay_addr: SocketAddr,
    status: Arc<Mutex<FeedStatus>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    stages: crate::stages::Stages,
) {
    // In online mode the order log's packet of an entry is sent before `on_entry` returns;
    // in the 1 / 15 ms modes it waits for its interval, so the delay is not timed there.
    let orders_online = config.modes[Channel::Orders.index()] == PublicationMode::Online;
    let mut replay: Option<ReplayServer> = None;
    let mut replay_bind_failures: u64 = 0;
    let mut replay_tried: Option<Instant> = None;
    let mut last_tick_ns = 0u64;
    let mut metrics_open = true;
    let (mut feed, mut subscription, mut from_state) = attach(&sm, &archive, &config).await;
    let mut resyncs: u64 = 0;
    let mut flush_proposed_ns: Option<u64> = None;
    feed.set_leader(is_leader(&metrics.borrow(), id));
    loop {
        if *stop.borrow() {
            break;
        }
        // Wait for the next entry, a change of leadership, the stop signal, or the next duty
        // cycle (the loops and heartbeats run even when nothing commits).
        let entry = tokio::select! {
            r = async {
                match subscription.as_mut() {
                    Some(s) => Some(s.next().await),
                    None => std::future::pending().await,
                }
            } => r,
            changed = metrics.changed(), if metrics_open => {
                if changed.is_err() {
                    // openraft stopped: this node leads nothing any more.
                    metrics_open = false;
                    feed.set_leader(false);
                } else {
                    feed.set_leader(is_leader(&metrics.borrow(), id));
                }
                None
            }
            _ = stop.changed() => None,
            _ = tokio::time::sleep(Duration::from_millis(idle_wake_ms(&feed))) => None,
        };
        match entry {
            Some(Ok(entry)) => {
                if entry.market_data_flush_ns().is_some() {
                    flush_proposed_ns = None;
                }
                let sent_before = feed.publisher().counters(Channel::Orders).packets_sent;
                let added = feed.on_entry(entry.entry(), now_ns(), &mut sink).to_vec();
                if orders_online
                    && feed.publisher().counters(Channel::Orders).packets_sent != sent_before
                {
                    stages.on_md_published(entry.index());
                }
                if !added.is_empty() {
                    let defs: Vec<Instrument> = sm
                        .with_state(|s| {
                            added
                                .iter()
                                .filter_map(|i| s.engine().instrument(*i).cloned())
                                .collect()
                        })
                        .await;
                    for d in defs {
                        feed.define(d);
                    }
                }
            }
            Some(Err(StreamError::Closed)) => {
                feed.detach("the node stopped".to_string());
                subscription = None;
            }
            Some(Err(e)) if !from_state => {
                feed.detach(format!(
                    "the replicated state keeps no market data numbering (its snapshot \
                     predates [marketdata]) and the committed stream cannot be followed from \
                     index 1 ({e}): this node's feed stays standby-only"
                ));
                subscription = None;
            }
            Some(Err(e)) => {
                // Entries were lost to this feed (the node installed a snapshot across its
                // position, or its position is older than the ring and the archive: a
                // consumer that merely lagged caught up by itself): start again from the
                // replicated state's numbering, which continues exactly where every other
                // replica's feed stands. Packets of the skipped entries were never sent by
                // this node; a subscriber recovers them by replay or from the snapshot loop.
                // The replay service restarts with the new publisher's history.
                eprintln!("bourse node {id}: market data: {e}; resuming from the state");
                let leader = feed.leader;
                let (f, sub, state) = attach(&sm, &archive, &config).await;
                feed = f;
                subscription = sub;
                from_state = state;
                resyncs += 1;
                feed.status.resyncs = resyncs;
                feed.set_leader(leader);
                replay = None;
                replay_tried = None;
            }
            None => {}
        }
        let now = now_ns();
        if now.saturating_sub(last_tick_ns) >= TICK_INTERVAL_NS {
            last_tick_ns = now;
            feed.tick(now, &mut sink);
            // The leader proposes the idle flush as a log entry, so that every replica closes
            // the same packets at the same point of the log; one at a time.
            if feed.is_active()
                && feed.publisher().idle_flush_due(now)
                && flush_proposed_ns.is_none_or(|t| now.saturating_sub(t) >= FLUSH_REPROPOSE_NS)
            {
                flush_proposed_ns = Some(now);
                feed.status.idle_flushes_proposed += 1;
                // Fire and forget: if leadership is lost, the next leader proposes its own.
                let _ = raft
                    .client_write_ff(crate::batch::LogCommand::MarketDataFlush { now_ns: now })
                    .await;
            }
            // The replay services listen only while this node's feed sends.
            if feed.is_active() {
                let due = replay_tried
                    .is_none_or(|t| t.elapsed() >= Duration::from_millis(REPLAY_BIND_RETRY_MS));
                if replay.is_none() && due {
                    replay_tried = Some(Instant::now());
                    match ReplayServer::spawn_for(replay_addr, feed.publisher()) {
                        Ok(s) => {
                            if replay_bind_failures > 0 {
                                eprintln!(
                                    "bourse node {id}: market data replay listening on \
                                     {replay_addr} after {replay_bind_failures} failed attempts"
                                );
                            }
                            replay_bind_failures = 0;
                            replay = Some(s);
                        }
                        Err(e) => {
                            // The port is usually still held by the previous leader's service
                            // for a moment; say so once, then only every thousandth attempt.
                            if replay_bind_failures.is_multiple_of(1_000) {
                                eprintln!(
                                    "bourse node {id}: market data replay on {replay_addr}: \
                                     {e} (retrying every {REPLAY_BIND_RETRY_MS} ms)"
                                );
                            }
                            replay_bind_failures += 1;
                        }
                    }
                }
            } else if replay.is_some() {
                replay = None;
                replay_tried = None;
            }
            let mut s = feed.status();
            s.replay_listening = replay.is_some();
            if let Ok(mut shared) = status.lock() {
                *shared = s;
            }
        }
    }
    feed.set_leader(false);
    drop(replay);
    if let Ok(mut shared) = status.lock() {
        *shared = feed.status();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::OutcomeKind;
    use crate::stream::CommittedRequest;
    use bourse_core::Command;
    use bourse_engine::workload::{Flow, FlowConfig};
    use bourse_engine::{Engine, EngineConfig};
    use bourse_marketdata::VecSink;

    /// Committed entries of a seeded flow: `per_entry` commands per entry, each command its own
    /// request; every fifth entry also repeats its first request as a duplicate.
    fn entries(count: usize, per_entry: usize) -> Vec<CommittedEntry> {
        entries_with_idle(count, per_entry, None)
    }

    /// As [`entries`]; with `idle_every: Some(n)`, every n entries the flow pauses for 5 ms
    /// and the log holds the idle flush entry a leader proposes 3 ms into the pause.
    fn entries_with_idle(
        count: usize,
        per_entry: usize,
        idle_every: Option<usize>,
    ) -> Vec<CommittedEntry> {
        let fc = FlowConfig::three_markets(50, 3);
        let mut flow = Flow::new(fc);
        let mut engine = Engine::new(EngineConfig::default());
        let mut out = Vec::new();
        let mut index = 1;
        let mut ts = 1_000_000_000u64;
        let mut requests = Vec::new();
        for body in flow.setup() {
            let mut events = Vec::new();
            engine.apply(&Command::new(ts, body), &mut events);
            requests.push(CommittedRequest {
                client_id: 1,
                request_seq: requests.len() as u64 + 1,
                kind: OutcomeKind::Applied,
                applied_index: index,
                events: bourse_core::codec::encode_events(&events),
            });
        }
        out.push(CommittedEntry {
            index,
            requests: std::mem::take(&mut requests),
            market_data_flush_ns: None,
        });
        for e in 0..count {
            index += 1;
            if idle_every.is_some_and(|n| e > 0 && e % n == 0) {
                out.push(CommittedEntry {
                    index,
                    requests: Vec::new(),
                    market_data_flush_ns: Some(ts + 3_000_000),
                });
                index += 1;
                ts += 5_000_000;
            }
            for _ in 0..per_entry {
                ts += 10_000;
                let body = flow.next_command();
                let mut events = Vec::new();
                engine.apply(&Command::new(ts, body), &mut events);
                flow.observe(&events);
                requests.push(CommittedRequest {
                    client_id: 2,
                    request_seq: index * 100 + requests.len() as u64,
                    kind: OutcomeKind::Applied,
                    applied_index: index,
                    events: bourse_core::codec::encode_events(&events),
                });
            }
            if e % 5 == 0 {
                let mut dup = requests[0].clone();
                dup.kind = OutcomeKind::Duplicate;
                dup.events.clear();
                requests.push(dup);
            }
            out.push(CommittedEntry {
                index,
                requests: std::mem::take(&mut requests),
                market_data_flush_ns: None,
            });
        }
        out
    }

    #[test]
    fn replicas_number_alike_only_the_leader_sends_and_duplicates_are_not_republished() {
        let log = entries(400, 4);
        let config = PublisherConfig::default();
        let mut feeds: Vec<NodeFeed> = (0..3).map(|_| NodeFeed::new(config.clone())).collect();
        let mut sinks: Vec<VecSink> = (0..3).map(|_| VecSink::default()).collect();
        feeds[0].set_leader(true);
        for (k, entry) in log.iter().enumerate() {
            if k == 200 {
                // Failover: node 0 stops leading, node 2 takes over.
                feeds[0].set_leader(false);
                feeds[2].set_leader(true);
            }
            for (f, s) in feeds.iter_mut().zip(sinks.iter_mut()) {
                f.on_entry(entry, 5, s);
            }
        }
        assert!(sinks[1].packets.is_empty(), "a follower sends nothing");
        assert!(!sinks[0].packets.is_empty() && !sinks[2].packets.is_empty());
        let seqs: Vec<_> = feeds.iter().map(|f| f.status().next_seq).collect();
        assert!(seqs.windows(2).all(|w| w[0] == w[1]), "{seqs:?}");
        // The leader before and the leader after together sent each order-log MsgSeqNum once,
        // in order, with no gap.
        let orders: Vec<u32> = sinks[0]
            .packets
            .iter()
            .chain(sinks[2].packets.iter())
            .filter(|(c, _)| *c == Channel::Orders)
            .map(|(_, p)| u32::from_le_bytes([p[0], p[1], p[2], p[3]]))
            .collect();
        assert_eq!(
            orders,
            (1..seqs[0][Channel::Orders.index()]).collect::<Vec<_>>()
        );
        // Publishing the same log without the duplicates gives the same numbering.
        let mut plain = NodeFeed::new(config);
        let mut nowhere = VecSink::default();
        for entry in &log {
            let mut e = entry.clone();
            e.requests.retain(|r| r.kind == OutcomeKind::Applied);
            plain.on_entry(&e, 5, &mut nowhere);
        }
        assert_eq!(plain.status().next_seq, seqs[0]);
    }

    #[test]
    fn in_1ms_mode_idle_flushes_from_the_log_keep_every_replica_byte_identical_across_a_failover() {
        let log = entries_with_idle(300, 3, Some(20));
        let flushes: Vec<usize> = (0..log.len())
            .filter(|&k| log[k].market_data_flush_ns.is_some())
            .collect();
        assert!(flushes.len() >= 10);
        let config = MarketDataSection {
            modes: ["orders", "trades", "book", "statistics"]
                .iter()
                .map(|c| (c.to_string(), "1ms".to_string()))
                .collect(),
            ..MarketDataSection::default()
        }
        .publisher_config();
        assert!(!config.idle_flush_by_clock);
        // Three replicas with a failover right after an idle flush, a reference feed that
        // leads throughout, and the replicated state's numbering.
        let mut feeds: Vec<NodeFeed> = (0..4).map(|_| NodeFeed::new(config.clone())).collect();
        let mut sinks: Vec<VecSink> = (0..4).map(|_| VecSink::default()).collect();
        let mut numbering = FeedNumbering::new(&config);
        feeds[0].set_leader(true);
        feeds[3].set_leader(true);
        let failover = flushes[flushes.len() / 2] + 1;
        let mut flushed_packets = 0;
        for (k, entry) in log.iter().enumerate() {
            if k == failover {
                feeds[0].set_leader(false);
                feeds[2].set_leader(true);
            }
            let before = sinks[3].packets.len();
            for (f, s) in feeds.iter_mut().zip(sinks.iter_mut()) {
                f.on_entry(entry, 7, s);
            }
            match entry.market_data_flush_ns {
                Some(ns) => {
                    numbering.idle_flush(ns);
                    flushed_packets += sinks[3].packets.len() - before;
                }
                None => {
                    for r in entry
                        .requests
                        .iter()
                        .filter(|r| r.kind == OutcomeKind::Applied)
                    {
                        numbering
                            .push_events(&bourse_core::codec::decode_events(&r.events).unwrap());
                    }
                    numbering.end_entry(&Engine::new(EngineConfig::default()));
                }
            }
            // A duty cycle long after the interval: no replica closes packets by its clock.
            if k == 30 {
                let seqs = feeds[3].status().next_seq;
                feeds[3].tick(10_000_000_000, &mut VecSink::default());
                assert_eq!(feeds[3].status().next_seq, seqs);
            }
        }
        assert!(flushed_packets > 0, "the idle flush entries closed packets");
        assert!(sinks[1].packets.is_empty(), "a follower sends nothing");
        let seqs: Vec<_> = feeds.iter().map(|f| f.status().next_seq).collect();
        assert!(seqs.windows(2).all(|w| w[0] == w[1]), "{seqs:?}");
        for c in Channel::ALL.into_iter().filter(|c| c.is_incremental()) {
            assert_eq!(numbering.next_seq(c), seqs[0][c.index()], "{c:?}");
        }
        // The old leader's packets then the new leader's are, byte for byte, what one
        // leader sends for the whole log: MsgSeqNum and RptSeq continue with no reset.
        let mut sent = incremental(&sinks[0], 0);
        sent.extend(incremental(&sinks[2], 0));
        let reference = incremental(&sinks[3], 0);
        assert!(reference.len() > 50, "{} packets", reference.len());
        assert_eq!(sent, reference);
    }

    /// Packets of the incremental channels, as (channel, bytes).
    fn incremental(sink: &VecSink, from: usize) -> Vec<(Channel, Vec<u8>)> {
        sink.packets[from..]
            .iter()
            .filter(|(c, _)| c.is_incremental())
            .cloned()
            .collect()
    }

    #[test]
    fn a_feed_resumed_from_a_restored_state_s_numbering_sends_what_a_full_history_feed_sends() {
        use crate::batch::ClientRequest;
        use crate::state::ReplicatedState;
        let config = PublisherConfig::default();
        let mut flow = Flow::new(FlowConfig::three_markets(50, 3));
        let mut state = ReplicatedState::new(EngineConfig::default(), 64);
        state.enable_marketdata(&config);
        let mut full = NodeFeed::new(config.clone());
        full.set_leader(true);
        let mut full_sink = VecSink::default();
        let mut resumed: Option<(NodeFeed, VecSink, ReplicatedState, usize)> = None;
        let mut ts = 1_000_000_000u64;
        let mut seq = 0u64;
        let mut outcomes = Vec::new();
        let setup: Vec<ClientRequest> = flow
            .setup()
            .into_iter()
            .enumerate()
            .map(|(k, body)| ClientRequest {
                client_id: 1,
                request_seq: k as u64 + 1,
                command: Command::new(ts, body),
            })
            .collect();
        let cut = 150u64;
        for index in 1..=300u64 {
            let requests: Vec<ClientRequest> = if index == 1 {
                setup.clone()
            } else {
                (0..4)
                    .map(|_| {
                        ts += 10_000;
                        seq += 1;
                        ClientRequest {
                            client_id: 2,
                            request_seq: seq,
                            command: Command::new(ts, flow.next_command()),
                        }
                    })
                    .collect()
            };
            outcomes.clear();
            state.apply_batch(
                &crate::Batch::from_requests(&requests),
                index,
                &mut outcomes,
            );
            state.entry_applied(index);
            if let Some((_, _, restored, _)) = resumed.as_mut() {
                let mut again = Vec::new();
                restored.apply_batch(&crate::Batch::from_requests(&requests), index, &mut again);
                restored.entry_applied(index);
                assert_eq!(again, outcomes);
            }
            for o in &outcomes {
                flow.observe(&bourse_core::codec::decode_events(&o.events).unwrap());
            }
            let entry = CommittedEntry {
                index,
                requests: outcomes.clone(),
                market_data_flush_ns: None,
            };
            let added = full.on_entry(&entry, 5, &mut full_sink).to_vec();
            for id in added {
                full.define(state.engine().instrument(id).unwrap().clone());
            }
            if let Some((feed, sink, restored, _)) = resumed.as_mut() {
                let added = feed.on_entry(&entry, 5, sink).to_vec();
                for id in added {
                    feed.define(restored.engine().instrument(id).unwrap().clone());
                }
            }
            if index == cut {
                // A node restarts from a snapshot taken here: bytes, restore, resume.
                let bytes = state.snapshot();
                let restored = ReplicatedState::restore(&bytes, 64).unwrap();
                assert_eq!(restored.state_hash(), state.state_hash());
                assert_eq!(restored.snapshot(), bytes);
                let (at, checkpoint) = restored.marketdata().unwrap().checkpoint();
                assert_eq!(at, cut);
                let mut feed = NodeFeed::resume(config.clone(), at, checkpoint);
                assert_eq!(feed.next_index(), cut + 1);
                assert_eq!(feed.status().next_seq, full.status().next_seq);
                feed.set_leader(true);
                resumed = Some((feed, VecSink::default(), restored, full_sink.packets.len()));
            }
        }
        let (feed, sink, restored, from) = resumed.unwrap();
        assert_eq!(restored.state_hash(), state.state_hash());
        let expected = incremental(&full_sink, from);
        assert!(expected.len() > 100, "{} packets", expected.len());
        assert_eq!(incremental(&sink, 0), expected);
        assert_eq!(feed.status().next_seq, full.status().next_seq);
        let md = state.marketdata().unwrap();
        for c in Channel::ALL.into_iter().filter(|c| c.is_incremental()) {
            assert_eq!(md.next_seq(c), full.publisher().next_seq(c), "{c:?}");
        }
        // A damaged numbering section is refused, never a panic.
        let bytes = state.snapshot();
        for cut in [bytes.len() - 1, bytes.len() - 40] {
            assert!(ReplicatedState::restore(&bytes[..cut], 64).is_err());
        }
    }

    #[test]
    fn a_jump_in_the_stream_detaches_the_feed_for_good() {
        let log = entries(20, 2);
        let mut feed = NodeFeed::new(PublisherConfig::default());
        feed.set_leader(true);
        let mut sink = VecSink::default();
        feed.on_entry(&log[0], 1, &mut sink);
        feed.on_entry(&log[2], 1, &mut sink);
        assert!(feed
            .detached()
            .is_some_and(|w| w.contains("jumped from index 2 to 3")));
        assert!(!feed.is_active());
        let sent = sink.packets.len();
        feed.set_leader(true);
        for e in &log[3..] {
            feed.on_entry(e, 1, &mut sink);
        }
        feed.tick(10_000_000_000, &mut sink);
        assert_eq!(sink.packets.len(), sent, "a detached feed never sends");
    }

    #[test]
    fn the_section_is_checked_field_by_field() {
        let ok = MarketDataSection::default();
        ok.validate().unwrap();
        let mut bad = ok.clone();
        bad.modes.insert("snapshot".into(), "1ms".into());
        assert!(bad.validate().unwrap_err().contains("modes.snapshot"));
        let mut bad = ok.clone();
        bad.modes.insert("orders".into(), "5ms".into());
        assert!(bad.validate().unwrap_err().contains("online, 1ms or 15ms"));
        let mut bad = ok.clone();
        bad.ports.insert("orders".into(), [31402, 31403]);
        assert!(bad.validate().unwrap_err().contains("used twice"));
        let mut bad = ok.clone();
        bad.packet_bytes_max = 100;
        assert!(bad.validate().unwrap_err().contains("packet_bytes_max"));
        let text = "base_port = 32000\nmodes = { book = \"15ms\" }\n";
        let s: MarketDataSection = toml::from_str(text).unwrap();
        assert_eq!(s.feed_addrs().unwrap().replay.port(), 32020);
        assert_eq!(
            s.publisher_config().modes[Channel::Book.index()],
            PublicationMode::Every15Ms
        );
        assert!(toml::from_str::<MarketDataSection>("base_prot = 1").is_err());
    }

    #[test]
    fn feeds_to_groups_or_hosts_need_each_node_s_interfaces() {
        let text = "feed_a_host = \"239.192.10.1\"\nfeed_b_host = \"239.192.20.1\"\n\
                    multicast_ttl = 2\nmulticast_loop = false\nreplay_listen = \"0.0.0.0\"\n\
                    interfaces = { 1 = [\"10.1.0.11\", \"10.2.0.11\"], 2 = [\"10.1.0.12\", \"10.2.0.12\"] }\n";
        let s: MarketDataSection = toml::from_str(text).unwrap();
        s.validate_for(&[1, 2]).unwrap();
        let addrs = s.feed_addrs().unwrap();
        assert_eq!(addrs.channels[0].a, "239.192.10.1:31400".parse().unwrap());
        assert_eq!(addrs.channels[0].b, "239.192.20.1:31401".parse().unwrap());
        assert_eq!(addrs.replay, "0.0.0.0:31420".parse().unwrap());
        let r = s.send_routes(2).unwrap();
        assert_eq!(
            (
                r.interface_a,
                r.interface_b,
                r.multicast_ttl,
                r.multicast_loop
            ),
            (
                "10.1.0.12".parse().unwrap(),
                "10.2.0.12".parse().unwrap(),
                2,
                false
            )
        );
        let e = s.validate_for(&[1, 2, 3]).unwrap_err();
        assert!(
            e.contains("node 3 needs an entry in marketdata.interfaces"),
            "{e}"
        );
        let e = s.validate_for(&[1]).unwrap_err();
        assert!(e.contains("marketdata.interfaces.2: no node 2"), "{e}");
        let mut bad = s.clone();
        bad.interfaces
            .insert("one".into(), [Ipv4Addr::LOCALHOST; 2]);
        assert!(bad.validate().unwrap_err().contains("keys are node ids"));
        let mut bad = s.clone();
        bad.multicast_ttl = 256;
        assert!(bad.validate().unwrap_err().contains("multicast_ttl"));
        // Unicast to another host cannot leave from the loopback interface.
        let mut bad = s.clone();
        bad.feed_a_host = "10.9.0.1".parse().unwrap();
        bad.interfaces.insert("1".into(), [Ipv4Addr::LOCALHOST; 2]);
        let e = bad.send_routes(1).unwrap_err();
        assert!(e.contains("leaves the host") && e.contains("node 1"), "{e}");
        // The default stays on 127.0.0.1 for every node, without interfaces.
        let d = MarketDataSection::default();
        d.validate_for(&[1, 2, 3]).unwrap();
        let r = d.send_routes(3).unwrap();
        assert_eq!(
            (r.interface_a, r.interface_b),
            (Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST)
        );
    }
}
