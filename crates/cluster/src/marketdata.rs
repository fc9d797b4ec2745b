//! The market data publisher of a node: one [`bourse_marketdata::Publisher`] per node, inside
//! its replicated state, fed by the state machine as it applies each entry; the node's market
//! data thread only sends what it closed, and only while the node leads.
//!
//! # Numbering is a function of the log
//!
//! [`FeedNumbering`] is the publisher of the replicated state ([`crate::ReplicatedState`]).
//! The state machine gives it the events of every request applied in an entry (a duplicate's
//! events were published when it was first applied; stale or refused requests have none)
//! and calls [`Publisher::publish`] once per entry that applied at least one command.
//! Packets close in three ways, all decided by the log: online channels at the end of each
//! such entry; 1 ms / 15 ms channels when a batch's time (the `ts_ns` the core took from the
//! command) enters a new interval; and the idle flush, which is a log entry too. No replica
//! reads a clock to decide a packet boundary.
//!
//! The idle flush: a 1 ms / 15 ms channel whose unsent messages belong to an interval that
//! ended at least one interval ago, with no later batch to close it, must still go out. The
//! leader's market data thread sees that on its duty cycle (from the deadline the numbering
//! hands it, [`HandoffMarks::idle_flush_deadline_ns`]) and proposes a
//! [`crate::batch::LogCommand::MarketDataFlush`] entry carrying its clock reading (one at a
//! time; another only if the first was not applied within `FLUSH_REPROPOSE_NS`), as it
//! proposes hash checks. Every replica applies it at the same log index with the same time
//! ([`Publisher::idle_flush`]), so every packet boundary, MsgSeqNum and RptSeq is the same on
//! every replica in every mode, and a new leader continues the sequence exactly where the old
//! one stopped. A flush proposed by a leader that loses office before it commits is simply
//! proposed again by the next one; a flush that commits after a later batch already closed
//! the interval closes nothing. The price is that an idle interval's last packet leaves one
//! commit round trip later than a clock could send it. Packets carry the sender's clock only
//! in SendingTime, which the sender stamps and no numbering reads.
//!
//! # Numbering survives snapshots
//!
//! The numbering's state (next MsgSeqNum per channel, RptSeq, books, statistics and last
//! published top 20 per instrument) is part of the state's snapshot and hash. So a node that
//! restarted from a snapshot or installed one from the leader numbers every later packet as
//! the others do and can take over as publisher, in every mode; after a restart of every
//! node the new leader continues the same sequences. What a restarted node lacks is the
//! replay history of packets published before it started: a subscriber that needs those is
//! refused by the replay service and recovers from the snapshot loop.
//!
//! The numbering settings (`packet_bytes_max`, `modes`, `session_id`) must be the same on
//! every node and across restarts; a state restored from a snapshot taken without
//! `[marketdata]` keeps no numbering, and such a node's feed stays standby-only
//! ([`FeedStatus::detached`] says why).
//!
//! # One publisher, two halves
//!
//! Each node runs the publisher once. The state's publisher encodes every incremental
//! packet during apply; at the end of each entry it moves the packets it closed, with the
//! numbering's marks ([`HandoffMarks`]: the applied index, each channel's next MsgSeqNum,
//! the idle flush deadline, the instruments known), into a [`PacketHandoff`], one short lock
//! per entry. The market data thread ([`NodeFeed`], a [`bourse_marketdata::FeedSender`])
//! takes them in one swap, stamps SendingTime, keeps the replay history and sends them while
//! the node leads. Every replica does this, so a follower's replay history is ready when it
//! takes over. The thread encodes no incremental message and keeps no book.
//!
//! The instrument and snapshot loops and the heartbeats follow the wall clock, so they run
//! on the thread, and only while the node leads (they carry no incremental numbering; a
//! sender that becomes active announces the loops' numbering with SequenceReset, which costs
//! the subscriber nothing). They take what they need from the state under the state
//! machine's lock: the definitions only when their version changed, and one instrument's
//! orders per snapshot turn (a copy, proportional to that one book, once per
//! `snapshot_cycle_ms` / instruments). A snapshot is sent only after every packet handed off
//! before it was taken, so a subscriber never sees a snapshot ahead of the order log.
//!
//! Why this split rather than the others weighed: running the loops and heartbeats inside
//! the state machine would put wall-clock work, and its numbering of the loop channels
//! (different on every node), under the lock between applies and into a state that must be
//! equal everywhere; keeping a second full publisher on the thread (as before) doubled the
//! encoding and book work of every entry; publishing a copy of the books from every apply
//! would copy far more than the loops read (one instrument per turn). The hand-off moves
//! the bytes the publisher produced anyway.
//!
//! The hand-off is bounded ([`HANDOFF_PACKETS_MAX`] packets). Apply never waits for the
//! thread: if the queue is full, the state machine drops every further entry's packets until
//! the thread takes what waits (their numbers are still taken, so every replica's numbering
//! stays the same). The thread then sees that packets were lost and continues from the
//! numbering's marks ([`FeedStatus::resyncs`], [`FeedStatus::lost_packets`]), as it does
//! when the node installs a snapshot across entries it never applied
//! ([`carry_handoff`]): its replay history restarts at the next packet, and a subscriber
//! that missed the lost ones recovers them from the snapshot loop, as from any gap.
//!
//! Wake-ups: the leader's thread is woken at each entry's packets (it sends them at once) and
//! otherwise sleeps until its clock's next duty ([`NodeFeed::next_due_ns`]: the loops, a
//! heartbeat, an idle flush); a standby's is woken only every [`STANDBY_WAKE_MS`] or once
//! [`HANDOFF_WAKE_PACKETS`] wait, and the role is read from openraft's server metrics, which
//! change with the role, not at every pass of its core. A thread woken per entry on every
//! replica, and per millisecond on the leader, cost more than the feed's own work.
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
    BookOrder, Channel, FeedSender, LoopsDue, PacketSink, PublicationMode, Publisher,
    PublisherConfig, PublisherState, SnapshotHead, CHANNEL_COUNT, PACKET_BYTES_DEFAULT,
    REPLAY_HISTORY_PACKETS_DEFAULT,
};
use serde::{Deserialize, Serialize};

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
/// How often a standby feed wakes up: it sends nothing and closes no packet by its clock
/// (idle flushes are log entries), so it only moves the handed-off packets into its replay
/// history (sooner when [`HANDOFF_WAKE_PACKETS`] wait) and refreshes its status. The leader's
/// wakes at each entry and when its clock's next duty is due ([`NodeFeed::next_due_ns`]).
const STANDBY_WAKE_MS: u64 = 100;
/// The longest an active feed sleeps: the idle flush's re-proposal and the replay ports'
/// binding retry are checked at least this often.
const ACTIVE_WAKE_MAX_NS: u64 = 50_000_000;

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
    /// Sending (this node leads and its feed follows the replicated state's numbering).
    pub active: bool,
    /// Why this node's feed can never send (see the module documentation), if so.
    pub detached: Option<String>,
    /// The log index after the last entry whose packets the feed took.
    pub next_index: u64,
    /// Entries that applied commands and were published (sent or, as standby, kept for
    /// replay), since the feed started.
    pub entries_published: u64,
    /// The MsgSeqNum the next data packet of each channel takes, by [`Channel::index`].
    pub next_seq: [u32; CHANNEL_COUNT],
    /// Packets sent per channel by this node.
    pub packets_sent: [u64; CHANNEL_COUNT],
    /// Bytes of each channel's replay history that are resident (written at least once;
    /// `History::touched_bytes`), 0 for channels that keep none: the feed's memory.
    pub replay_history_bytes: [u64; CHANNEL_COUNT],
    /// Packets the state machine numbered that never reached this feed: the hand-off was
    /// full (the feed fell behind) or the node installed a snapshot across them.
    pub lost_packets: u64,
    /// The replay services listen (only while active).
    pub replay_listening: bool,
    /// Times the feed lost packets and continued from the replicated state's numbering.
    pub resyncs: u64,
    /// Idle flush entries applied (see the module documentation).
    pub idle_flushes: u64,
    /// Idle flush entries this node proposed while it led.
    pub idle_flushes_proposed: u64,
}

/// Most packets waiting in the hand-off from the state machine to the market data thread
/// (at most this many times `packet_bytes_max` bytes). When it is full the state machine
/// drops the packets of further entries until the thread takes what waits, and the thread
/// then continues from the numbering (see the module documentation): apply never waits.
pub const HANDOFF_PACKETS_MAX: usize = 16_384;
/// A standby's thread is woken once this many packets wait: a few entries' worth, so that it
/// wakes once per many entries, and a standby that becomes the leader finds at most about this
/// many packets of the previous term still to take (it sends what it takes once active, so a
/// larger backlog would go out again as duplicates, which subscribers discard but must read).
pub const HANDOFF_WAKE_PACKETS: usize = 64;

/// What the numbering stands at after the last entry handed off, taken with its packets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HandoffMarks {
    /// The last log index applied.
    pub applied_index: u64,
    /// Per channel, the MsgSeqNum of the next packet not yet handed off.
    pub next_seq: [u32; CHANNEL_COUNT],
    /// Entries whose events were published since the hand-off was attached.
    pub entries_published: u64,
    /// Idle flush entries applied since the hand-off was attached.
    pub idle_flushes: u64,
    /// When the leader should propose the next idle flush ([`Publisher::idle_flush_deadline_ns`]).
    pub idle_flush_deadline_ns: Option<u64>,
    /// Instruments the numbering knows (the snapshot loop's length).
    pub instruments: usize,
    /// [`Publisher::definitions_version`].
    pub definitions_version: u64,
}

struct HandoffQueue {
    /// Channel and entry index of each packet in `packets`.
    meta: Vec<(Channel, u64)>,
    packets: Vec<Vec<u8>>,
    /// Buffers the sender is done with, for the state machine to reuse.
    returned: Vec<Vec<u8>>,
    marks: HandoffMarks,
    /// Full: every further entry's packets are dropped until the sender takes.
    overflowed: bool,
    /// Packets were lost since the sender last took.
    lost: bool,
    lost_packets: u64,
    /// The sender is gone: hand over nothing more.
    closed: bool,
    detached: Option<String>,
}

/// The bounded hand-off of closed incremental packets from the state's publisher (under
/// apply, [`FeedNumbering`]) to the node's market data thread ([`NodeFeed`]). Both ends
/// hold a clone. One lock per entry on the apply side, one per take on the other; each
/// moves whole vectors, never waits for the other side.
#[derive(Clone)]
pub struct PacketHandoff {
    shared: Arc<HandoffShared>,
}

struct HandoffShared {
    queue: Mutex<HandoffQueue>,
    notify: tokio::sync::Notify,
    /// Whether the sender wants a wake-up at each entry's packets (an active feed sends them
    /// at once) or only when the queue fills past [`HANDOFF_WAKE_PACKETS`] (a standby keeps
    /// them for replay, and drains on its own period: waking every replica's thread at every
    /// entry cost more than the rest of its work).
    wake_each_entry: std::sync::atomic::AtomicBool,
}

/// What the sender took in one go: the packets handed off since the last take, in order,
/// and the numbering after them.
#[derive(Default)]
pub struct HandoffTake {
    pub meta: Vec<(Channel, u64)>,
    pub packets: Vec<Vec<u8>>,
    pub marks: HandoffMarks,
    pub lost: bool,
    pub lost_packets: u64,
    pub detached: Option<String>,
}

impl Default for PacketHandoff {
    fn default() -> Self {
        PacketHandoff::new()
    }
}

impl PacketHandoff {
    pub fn new() -> PacketHandoff {
        PacketHandoff {
            shared: Arc::new(HandoffShared {
                queue: Mutex::new(HandoffQueue {
                    meta: Vec::new(),
                    packets: Vec::new(),
                    returned: Vec::new(),
                    marks: HandoffMarks::default(),
                    overflowed: false,
                    lost: false,
                    lost_packets: 0,
                    closed: false,
                    detached: None,
                }),
                notify: tokio::sync::Notify::new(),
                wake_each_entry: std::sync::atomic::AtomicBool::new(true),
            }),
        }
    }

    /// See `HandoffShared::wake_each_entry`; on by default.
    pub fn set_wake_each_entry(&self, on: bool) {
        self.shared
            .wake_each_entry
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, HandoffQueue> {
        // A panic while holding this lock leaves plain vectors behind: still usable.
        self.shared
            .queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The state machine's side, at the end of an entry: moves the staged packets in (or
    /// drops them if the queue is full) and publishes the numbering's marks. Returns false
    /// once the sender is gone.
    fn hand_over(
        &self,
        staged: &mut Staged,
        marks: HandoffMarks,
        published: bool,
        flushed: bool,
    ) -> bool {
        let mut q = self.queue();
        if q.closed {
            return false;
        }
        if staged.spare.len() < HANDOFF_PACKETS_MAX {
            staged.spare.append(&mut q.returned);
        } else {
            q.returned.clear();
        }
        let n = staged.packets.len();
        let pushed = n > 0 && !q.overflowed && q.packets.len() + n <= HANDOFF_PACKETS_MAX;
        if pushed {
            let index = marks.applied_index;
            q.meta.extend(staged.channels.drain(..).map(|c| (c, index)));
            q.packets.append(&mut staged.packets);
        } else if n > 0 {
            q.overflowed = true;
            q.lost = true;
            q.lost_packets += n as u64;
            staged.channels.clear();
            staged.spare.append(&mut staged.packets);
        }
        let (entries, flushes) = (q.marks.entries_published, q.marks.idle_flushes);
        q.marks = HandoffMarks {
            entries_published: entries + u64::from(published),
            idle_flushes: flushes + u64::from(flushed),
            ..marks
        };
        let queued = q.packets.len();
        drop(q);
        let wake_each = self
            .shared
            .wake_each_entry
            .load(std::sync::atomic::Ordering::Relaxed);
        if flushed || (pushed && (wake_each || queued >= HANDOFF_WAKE_PACKETS)) {
            self.shared.notify.notify_one();
        }
        true
    }

    /// Packets of entries this node never applied one by one (it installed a snapshot across
    /// them): the sender continues from the new numbering.
    fn mark_lost(&self) {
        self.queue().lost = true;
        self.shared.notify.notify_one();
    }

    /// The state no longer keeps a numbering to follow.
    fn detach(&self, why: String) {
        self.queue().detached.get_or_insert(why);
        self.shared.notify.notify_one();
    }

    /// The sender's side: takes everything handed off since the last take into `into`,
    /// giving back the buffers of the previous take.
    pub fn take(&self, into: &mut HandoffTake) {
        let mut q = self.queue();
        if q.returned.len() < HANDOFF_PACKETS_MAX {
            q.returned.append(&mut into.packets);
        }
        into.packets.clear();
        into.meta.clear();
        std::mem::swap(&mut q.meta, &mut into.meta);
        std::mem::swap(&mut q.packets, &mut into.packets);
        into.marks = q.marks;
        into.lost = std::mem::take(&mut q.lost);
        into.lost_packets = q.lost_packets;
        into.detached.clone_from(&q.detached);
        q.overflowed = false;
    }

    /// Resolves when packets were handed off (or something else happened) since the last
    /// call; a notification that came while nobody waited is kept for the next.
    pub async fn notified(&self) {
        self.shared.notify.notified().await;
    }

    /// The sender is gone: the state machine hands over nothing more.
    pub fn close(&self) {
        let mut q = self.queue();
        q.closed = true;
        q.meta.clear();
        q.packets.clear();
        q.returned.clear();
    }
}

/// The packets the state's publisher closed during the current entry, waiting for its end
/// (none kept while no hand-off is attached: the numbering alone matters then).
#[derive(Default)]
struct Staged {
    enabled: bool,
    channels: Vec<Channel>,
    packets: Vec<Vec<u8>>,
    spare: Vec<Vec<u8>>,
}

impl PacketSink for Staged {
    fn send(&mut self, channel: Channel, packet: &[u8]) {
        if !self.enabled {
            return;
        }
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(packet);
        self.channels.push(channel);
        self.packets.push(buf);
    }
}

/// Version byte of [`FeedNumbering`]'s encoding inside the replicated state's snapshot.
const NUMBERING_VERSION: u8 = 1;

/// The node's one market data publisher, inside the replicated state: the state machine
/// feeds it with the events of every applied request, entry by entry, and every idle flush
/// entry. Its state (next MsgSeqNum per channel, per instrument RptSeq, books, statistics,
/// last published top 20) is therefore the same on every replica after the same log index;
/// it travels in the state's snapshot, so a node restored from a snapshot at index N (or that
/// installed one) numbers every later packet like the others.
///
/// The packets it closes go, at the end of each entry, into the [`PacketHandoff`] the
/// node's market data thread attached ([`FeedNumbering::attach`]); with none attached it
/// numbers and drops them.
///
/// Only the settings that decide numbering (packet size, publication modes, session id) are
/// kept with it; they come from `[marketdata]`, which must be the same on every node.
pub struct FeedNumbering {
    publisher: Publisher,
    /// The last log index applied (0 before the first).
    index: u64,
    events: Vec<Event>,
    added: Vec<InstrumentId>,
    handoff: Option<PacketHandoff>,
    staged: Staged,
    /// The current entry published events / was an idle flush (for the hand-off's counters).
    published: bool,
    flushed: bool,
}

impl FeedNumbering {
    /// Numbering from log index 1 with these settings.
    pub fn new(config: &PublisherConfig) -> FeedNumbering {
        FeedNumbering::with_publisher(Publisher::new(numbering_config(config), &[]), 0)
    }

    fn with_publisher(publisher: Publisher, index: u64) -> FeedNumbering {
        // Active, so that the packets it closes reach its sink (the hand-off); it keeps no
        // replay history and never ticks, so activity changes nothing else.
        FeedNumbering {
            publisher,
            index,
            events: Vec::with_capacity(1024),
            added: Vec::new(),
            handoff: None,
            staged: Staged::default(),
            published: false,
            flushed: false,
        }
    }

    /// Hands every packet closed from now on to `handoff`, and publishes the current marks
    /// there at once (the sender starts from them).
    pub fn attach(&mut self, handoff: PacketHandoff) {
        self.staged.channels.clear();
        self.staged.packets.clear();
        let marks = self.marks();
        handoff.hand_over(&mut self.staged, marks, false, false);
        self.staged.enabled = true;
        self.handoff = Some(handoff);
    }

    /// The hand-off, leaving none (to carry it to a state installed from a snapshot).
    pub fn take_handoff(&mut self) -> Option<PacketHandoff> {
        self.staged.enabled = false;
        self.handoff.take()
    }

    fn marks(&self) -> HandoffMarks {
        let mut next_seq = [1u32; CHANNEL_COUNT];
        for c in Channel::ALL {
            next_seq[c.index()] = self.publisher.next_unsent_seq(c);
        }
        HandoffMarks {
            applied_index: self.index,
            next_seq,
            idle_flush_deadline_ns: self.publisher.idle_flush_deadline_ns(),
            instruments: self.publisher.instrument_count(),
            definitions_version: self.publisher.definitions_version(),
            ..HandoffMarks::default()
        }
    }

    /// The events of one request applied in the current entry.
    pub fn push_events(&mut self, events: &[Event]) {
        self.events.extend_from_slice(events);
    }

    /// The current entry's requests are all applied: publish their events (if any) as one
    /// batch, then give the definitions of the instruments it added from `engine`.
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
        let events = std::mem::take(&mut self.events);
        // The time only stamps SendingTime, which the sender sets when it sends.
        self.publisher.publish(&events, 0, &mut self.staged);
        self.events = events;
        self.events.clear();
        self.published = true;
        for id in &self.added {
            if let Some(def) = engine.instrument(*id) {
                self.publisher.add_instrument(def.clone());
            }
        }
    }

    /// A market data idle flush entry: closes what every replica's publisher closes.
    pub fn idle_flush(&mut self, now_ns: u64) {
        self.publisher.idle_flush(now_ns, &mut self.staged);
        self.flushed = true;
    }

    /// Every entry, of any kind, once applied: the entry's packets and the marks go to the
    /// hand-off.
    pub fn entry_applied(&mut self, index: u64) {
        self.index = index;
        let (published, flushed) = (self.published, self.flushed);
        self.published = false;
        self.flushed = false;
        if let Some(h) = &self.handoff {
            let marks = self.marks();
            if !h.hand_over(&mut self.staged, marks, published, flushed) {
                self.take_handoff();
            }
        }
    }

    /// The last log index applied.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The publisher (for the loops: definitions and book snapshots).
    pub fn publisher(&self) -> &Publisher {
        &self.publisher
    }

    /// The publisher state after [`FeedNumbering::index`].
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

/// Moves the market data hand-off from a state to the one that replaces it (a snapshot
/// installed from the leader). The entries in between were never applied here one by one, so
/// their packets never existed on this node: the sender is told it lost some. A new state
/// without a numbering detaches the feed.
pub(crate) fn carry_handoff(old: &mut crate::ReplicatedState, new: &mut crate::ReplicatedState) {
    let Some(handoff) = old.marketdata_mut().and_then(FeedNumbering::take_handoff) else {
        return;
    };
    match new.marketdata_mut() {
        Some(md) => {
            handoff.mark_lost();
            md.attach(handoff);
        }
        None => handoff.detach(
            "the snapshot installed from the leader keeps no market data numbering (it \
             predates [marketdata]): this node's feed stays standby-only"
                .to_string(),
        ),
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

/// The market data thread's side of a node's feed (sans-I/O): takes the packets the state's
/// publisher handed off and sends them through a [`FeedSender`] while the node leads; runs
/// the loops from what the caller takes from the state ([`NodeFeed::loops_due`]).
pub struct NodeFeed {
    sender: FeedSender,
    handoff: PacketHandoff,
    take: HandoffTake,
    leader: bool,
    detached: Option<String>,
    /// Entry indexes whose order-log packets the last drain sent.
    published: Vec<u64>,
    status: FeedStatus,
}

impl NodeFeed {
    /// A standby feed taking from `handoff`, which a [`FeedNumbering`] was just attached to
    /// (or `detached`, with the reason, if the state keeps no numbering).
    pub fn new(
        config: PublisherConfig,
        handoff: PacketHandoff,
        detached: Option<String>,
    ) -> NodeFeed {
        let mut take = HandoffTake::default();
        handoff.take(&mut take);
        let sender = FeedSender::new(config, take.marks.next_seq);
        let mut feed = NodeFeed {
            sender,
            handoff,
            take,
            leader: false,
            detached,
            published: Vec::new(),
            status: FeedStatus::default(),
        };
        feed.status.next_index = feed.take.marks.applied_index + 1;
        feed
    }

    /// The feed can never send again (see the module documentation).
    pub fn detach(&mut self, why: String) {
        self.detached.get_or_insert(why);
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
        // Set before the caller's next drain, so that no entry handed off after it waits
        // for the standby period.
        self.handoff.set_wake_each_entry(active);
        if active != self.sender.is_active() {
            self.sender.set_active(active);
        }
    }

    pub fn is_active(&self) -> bool {
        self.sender.is_active()
    }

    pub fn sender(&self) -> &FeedSender {
        &self.sender
    }

    /// The numbering's marks as of the last drain.
    pub fn marks(&self) -> &HandoffMarks {
        &self.take.marks
    }

    /// Takes everything handed off and sends it (while active), in order, each channel's run
    /// of packets in one hand-over to `sink`. Returns the entry indexes whose order-log
    /// packets were sent.
    pub fn drain(&mut self, now_ns: u64, sink: &mut dyn PacketSink) -> &[u64] {
        self.published.clear();
        self.handoff.take(&mut self.take);
        if let Some(why) = self.take.detached.clone() {
            self.detach(why);
        }
        let take = &mut self.take;
        let mut start = 0;
        while start < take.packets.len() {
            let channel = take.meta[start].0;
            let end = start
                + take.meta[start..]
                    .iter()
                    .take_while(|(c, _)| *c == channel)
                    .count();
            if self.detached.is_none() {
                self.sender
                    .send(channel, &mut take.packets[start..end], now_ns, sink);
                if channel == Channel::Orders && self.sender.is_active() {
                    for &(_, index) in &take.meta[start..end] {
                        if self.published.last() != Some(&index) {
                            self.published.push(index);
                        }
                    }
                }
            }
            start = end;
        }
        if take.lost {
            // Packets numbered by the state never reached this feed: it continues from the
            // numbering; the replay history restarts at the next packet, and subscribers
            // recover the missing ones from the snapshot loop.
            self.status.resyncs += 1;
        }
        self.sender.resume_at(take.marks.next_seq);
        self.status.next_index = take.marks.applied_index + 1;
        self.status.lost_packets = take.lost_packets;
        &self.published
    }

    /// Whether the leader should propose an idle flush entry now.
    pub fn idle_flush_due(&self, now_ns: u64) -> bool {
        self.take
            .marks
            .idle_flush_deadline_ns
            .is_some_and(|d| now_ns >= d)
    }

    /// When this feed's thread must next wake by the clock (the loops, a heartbeat, an idle
    /// flush), `None` while standby or detached.
    pub fn next_due_ns(&self) -> Option<u64> {
        if self.detached.is_some() {
            return None;
        }
        let loops = self.sender.next_due_ns(self.take.marks.instruments)?;
        Some(
            self.take
                .marks
                .idle_flush_deadline_ns
                .map_or(loops, |d| d.min(loops)),
        )
    }

    /// What the loops want now (nothing while standby or detached).
    pub fn loops_due(&self, now_ns: u64) -> LoopsDue {
        if self.detached.is_some() {
            return LoopsDue::default();
        }
        self.sender.loops_due(now_ns, self.take.marks.instruments)
    }

    pub fn send_definitions(
        &mut self,
        defs: &[Instrument],
        now_ns: u64,
        sink: &mut dyn PacketSink,
    ) {
        self.sender.send_definitions(defs, now_ns, sink);
    }

    /// Sends a snapshot taken from the state: first every packet handed off until now (the
    /// snapshot reflects them), then the snapshot.
    pub fn send_snapshot(
        &mut self,
        head: &SnapshotHead,
        orders: &[BookOrder],
        now_ns: u64,
        sink: &mut dyn PacketSink,
    ) -> &[u64] {
        self.drain(now_ns, sink);
        self.sender.send_snapshot(head, orders, now_ns, sink);
        &self.published
    }

    /// The loops' SequenceReset after activation (first, at the start of a duty cycle).
    pub fn announce_loops(&mut self, now_ns: u64, sink: &mut dyn PacketSink) {
        if self.detached.is_none() {
            self.sender.announce_loops(now_ns, sink);
        }
    }

    pub fn heartbeats(&mut self, now_ns: u64, sink: &mut dyn PacketSink) {
        if self.detached.is_none() {
            self.sender.heartbeats(now_ns, sink);
        }
    }

    pub fn status(&self) -> FeedStatus {
        let mut s = self.status.clone();
        s.active = self.sender.is_active();
        s.detached = self.detached.clone();
        s.entries_published = self.take.marks.entries_published;
        s.idle_flushes = self.take.marks.idle_flushes;
        for c in Channel::ALL {
            s.next_seq[c.index()] = self.sender.next_seq(c);
            s.packets_sent[c.index()] = self.sender.counters(c).packets_sent;
            s.replay_history_bytes[c.index()] = self
                .sender
                .history_of(c)
                .and_then(|h| h.lock().ok().map(|h| h.touched_bytes() as u64))
                .unwrap_or(0);
        }
        s
    }
}

/// A node's market data service: a thread that takes the packets the node's replicated
/// state numbered (a [`PacketHandoff`]), follows its leadership and drives a [`NodeFeed`]
/// into UDP feeds A and B. Stop it with [`MarketDataService::stop`] (dropping it stops it
/// too).
pub struct MarketDataService {
    stop: tokio::sync::watch::Sender<bool>,
    status: Arc<Mutex<FeedStatus>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MarketDataService {
    /// Starts publishing for `node` as `section` says, from where the replicated state's
    /// numbering stands (see the module documentation); `section` must be the one the node
    /// was started with.
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
        let id = node.id();
        let metrics = node.raft().server_metrics();
        let raft = node.raft().clone();
        let sm = node.state_machine().clone();
        // The publication delay (`md_published`) goes into the node's stage histograms.
        let stages = node.stages().clone();
        let status = Arc::new(Mutex::new(FeedStatus::default()));
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
                rt.block_on(run(Thread {
                    id,
                    config,
                    raft,
                    metrics,
                    sm,
                    sink,
                    replay_addr,
                    status: status2,
                    stop: stop_rx,
                    stages,
                }));
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

    /// A reader of this service's status that outlives borrows of it (a sampler thread's).
    pub fn status_reader(&self) -> FeedStatusReader {
        FeedStatusReader(Arc::clone(&self.status))
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

/// Reads a [`MarketDataService`]'s latest status from any thread (see
/// [`MarketDataService::status_reader`]); after the service stops, its last status.
#[derive(Clone)]
pub struct FeedStatusReader(Arc<Mutex<FeedStatus>>);

impl FeedStatusReader {
    pub fn read(&self) -> FeedStatus {
        self.0.lock().map(|s| s.clone()).unwrap_or_default()
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

/// A node's role as openraft reports it, changed only when the role, leader, vote or
/// membership changes (the full `RaftMetrics` watch changes at every pass of openraft's core,
/// several times per entry, and woke this thread as often).
type ServerMetricsWatch = openraft::alias::WatchReceiverOf<
    crate::TypeConfig,
    openraft::metrics::RaftServerMetrics<crate::TypeConfig>,
>;

fn is_leader(
    m: &openraft::metrics::RaftServerMetrics<crate::TypeConfig>,
    id: crate::NodeId,
) -> bool {
    m.state == openraft::ServerState::Leader && m.current_leader == Some(id)
}

/// What the market data thread runs with.
struct Thread {
    id: crate::NodeId,
    config: PublisherConfig,
    raft: crate::Raft,
    metrics: ServerMetricsWatch,
    sm: crate::StateMachineStore,
    sink: UdpSink,
    replay_addr: SocketAddr,
    status: Arc<Mutex<FeedStatus>>,
    stop: tokio::sync::watch::Receiver<bool>,
    stages: crate::stages::Stages,
}

/// Attaches a hand-off to the replicated state's numbering (under the state machine's lock,
/// so the feed starts exactly where the numbering stands) and makes the feed that takes from
/// it; detached if the state keeps no numbering.
async fn attach(sm: &crate::StateMachineStore, config: &PublisherConfig) -> NodeFeed {
    let handoff = PacketHandoff::new();
    let attached = sm.attach_marketdata(handoff.clone()).await;
    let detached = (!attached).then(|| {
        "the replicated state keeps no market data numbering (its snapshot predates \
         [marketdata]): this node's feed stays standby-only"
            .to_string()
    });
    NodeFeed::new(config.clone(), handoff, detached)
}

/// The loops' turn: their SequenceReset after activation, the instrument loop's definitions
/// (taken from the state only when they changed) and one instrument's snapshot (its orders copied under the state machine's lock,
/// one instrument at a time), then the heartbeats.
async fn run_loops(
    feed: &mut NodeFeed,
    t: &mut Thread,
    defs: &mut (Option<u64>, Vec<Instrument>),
    orders: &mut Vec<BookOrder>,
    now: u64,
) {
    feed.announce_loops(now, &mut t.sink);
    let due = feed.loops_due(now);
    if due.definitions {
        let version = feed.marks().definitions_version;
        if defs.0 != Some(version) {
            let list = &mut defs.1;
            t.sm.with_state(|s| {
                if let Some(md) = s.marketdata() {
                    md.publisher().definitions_into(list);
                }
            })
            .await;
            defs.0 = Some(version);
        }
        feed.send_definitions(&defs.1, now, &mut t.sink);
    }
    if let Some(position) = due.snapshot {
        let head =
            t.sm.with_state(|s| {
                s.marketdata()
                    .and_then(|md| md.publisher().snapshot_of(position, orders))
            })
            .await;
        if let Some(head) = head {
            let published = feed.send_snapshot(&head, orders, now, &mut t.sink).to_vec();
            record_published(t, &published);
        }
    }
    feed.heartbeats(now, &mut t.sink);
}

/// The publication delay of the entries whose order-log packets just went out (online mode).
fn record_published(t: &Thread, indexes: &[u64]) {
    if t.config.modes[Channel::Orders.index()] == PublicationMode::Online {
        for &index in indexes {
            t.stages.on_md_published(index);
        }
    }
}

async fn run(mut t: Thread) {
    let id = t.id;
    let mut feed = attach(&t.sm, &t.config).await;
    let mut replay: Option<ReplayServer> = None;
    let mut replay_bind_failures: u64 = 0;
    let mut replay_tried: Option<Instant> = None;
    let mut last_tick_ns = 0u64;
    let mut metrics_open = true;
    let mut flush_proposed_ns: Option<u64> = None;
    let mut idle_flushes_seen = 0u64;
    let mut idle_flushes_proposed = 0u64;
    let mut resyncs_seen = 0u64;
    let mut defs = (None, Vec::new());
    let mut orders = Vec::new();
    feed.set_leader(is_leader(&t.metrics.borrow(), id));
    loop {
        if *t.stop.borrow() {
            break;
        }
        // Wait for handed-off packets, a change of leadership, the stop signal, or the next
        // duty the clock brings (the loops and heartbeats run even when nothing commits).
        let wake_ns = if feed.is_active() {
            let now = now_ns();
            feed.next_due_ns()
                .map_or(ACTIVE_WAKE_MAX_NS, |due| due.saturating_sub(now))
                .clamp(TICK_INTERVAL_NS, ACTIVE_WAKE_MAX_NS)
        } else {
            STANDBY_WAKE_MS * 1_000_000
        };
        tokio::select! {
            _ = feed.handoff.notified() => {}
            changed = t.metrics.changed(), if metrics_open => {
                if changed.is_err() {
                    // openraft stopped: this node leads nothing any more.
                    metrics_open = false;
                    feed.set_leader(false);
                } else {
                    feed.set_leader(is_leader(&t.metrics.borrow(), id));
                }
            }
            _ = t.stop.changed() => {}
            _ = tokio::time::sleep(Duration::from_nanos(wake_ns)) => {}
        }
        let published = feed.drain(now_ns(), &mut t.sink).to_vec();
        record_published(&t, &published);
        let status = feed.status();
        if status.resyncs != resyncs_seen {
            resyncs_seen = status.resyncs;
            eprintln!(
                "bourse node {id}: market data: {} packets never reached this node's feed \
                 (it fell behind, or the node installed a snapshot); continuing from the \
                 replicated state's numbering",
                status.lost_packets
            );
        }
        if status.idle_flushes != idle_flushes_seen {
            idle_flushes_seen = status.idle_flushes;
            flush_proposed_ns = None;
        }
        let now = now_ns();
        if now.saturating_sub(last_tick_ns) >= TICK_INTERVAL_NS {
            last_tick_ns = now;
            run_loops(&mut feed, &mut t, &mut defs, &mut orders, now).await;
            // The leader proposes the idle flush as a log entry, so that every replica closes
            // the same packets at the same point of the log; one at a time.
            if feed.is_active()
                && feed.idle_flush_due(now)
                && flush_proposed_ns.is_none_or(|p| now.saturating_sub(p) >= FLUSH_REPROPOSE_NS)
            {
                flush_proposed_ns = Some(now);
                idle_flushes_proposed += 1;
                // Fire and forget: if leadership is lost, the next leader proposes its own.
                let _ = t
                    .raft
                    .client_write_ff(
                        crate::batch::LogCommand::MarketDataFlush { now_ns: now },
                        None,
                    )
                    .await;
            }
            // The replay services listen only while this node's feed sends.
            if feed.is_active() {
                let due = replay_tried
                    .is_none_or(|p| p.elapsed() >= Duration::from_millis(REPLAY_BIND_RETRY_MS));
                if replay.is_none() && due {
                    replay_tried = Some(Instant::now());
                    let sender = feed.sender();
                    match ReplayServer::spawn_histories(t.replay_addr, |c| sender.history_of(c)) {
                        Ok(s) => {
                            if replay_bind_failures > 0 {
                                eprintln!(
                                    "bourse node {id}: market data replay listening on {} \
                                     after {replay_bind_failures} failed attempts",
                                    t.replay_addr
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
                                    "bourse node {id}: market data replay on {}: {e} \
                                     (retrying every {REPLAY_BIND_RETRY_MS} ms)",
                                    t.replay_addr
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
        }
        let mut s = feed.status();
        s.replay_listening = replay.is_some();
        s.idle_flushes_proposed = idle_flushes_proposed;
        if let Ok(mut shared) = t.status.lock() {
            *shared = s;
        }
    }
    feed.handoff.close();
    feed.set_leader(false);
    drop(replay);
    let mut s = feed.status();
    s.idle_flushes_proposed = idle_flushes_proposed;
    if let Ok(mut shared) = t.status.lock() {
        *shared = s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::ClientRequest;
    use crate::state::ReplicatedState;
    use crate::Batch;
    use bourse_core::Command;
    use bourse_engine::workload::{Flow, FlowConfig};
    use bourse_engine::EngineConfig;
    use bourse_marketdata::VecSink;

    /// One log entry of the tests: a batch of client requests, or an idle flush.
    #[derive(Clone)]
    enum Step {
        Batch(Vec<ClientRequest>),
        Flush(u64),
    }

    /// The log of a seeded flow: the setup, then `per_entry` commands per entry (each its own
    /// request); every fifth entry also repeats its first request (a duplicate, which the
    /// state answers from its table). With `idle_every: Some(n)`, every n entries the flow
    /// pauses for 5 ms and the log holds the idle flush entry a leader proposes 3 ms into
    /// the pause.
    fn steps(count: usize, per_entry: usize, idle_every: Option<usize>) -> Vec<Step> {
        let mut flow = Flow::new(FlowConfig::three_markets(50, 3));
        // The flow draws its next orders from what the core answered: a reference state.
        let mut reference = ReplicatedState::new(EngineConfig::default(), 64);
        let mut ts = 1_000_000_000u64;
        let mut seq = 0u64;
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
        let mut out = vec![Step::Batch(setup)];
        let mut answers = Vec::new();
        reference.apply_batch(&batch_of(&out[0]), 1, &mut answers);
        for e in 0..count {
            if idle_every.is_some_and(|n| e > 0 && e % n == 0) {
                out.push(Step::Flush(ts + 3_000_000));
                ts += 5_000_000;
            }
            let mut requests: Vec<ClientRequest> = (0..per_entry)
                .map(|_| {
                    ts += 10_000;
                    seq += 1;
                    ClientRequest {
                        client_id: 2,
                        request_seq: seq,
                        command: Command::new(ts, flow.next_command()),
                    }
                })
                .collect();
            if e % 5 == 0 {
                requests.push(requests[0].clone());
            }
            answers.clear();
            reference.apply_batch(
                &Batch::from_requests(&requests),
                out.len() as u64 + 1,
                &mut answers,
            );
            for a in answers
                .iter()
                .filter(|a| a.kind == crate::OutcomeKind::Applied)
            {
                flow.observe(&bourse_core::codec::decode_events(&a.events).unwrap());
            }
            out.push(Step::Batch(requests));
        }
        out
    }

    fn batch_of(step: &Step) -> Batch {
        match step {
            Step::Batch(requests) => Batch::from_requests(requests),
            Step::Flush(_) => unreachable!("a flush entry is no batch"),
        }
    }

    /// A replica: its replicated state (the one publisher) and its market data thread's feed.
    struct Replica {
        state: ReplicatedState,
        feed: NodeFeed,
        sink: VecSink,
    }

    impl Replica {
        fn new(config: &PublisherConfig) -> Replica {
            let mut state = ReplicatedState::new(EngineConfig::default(), 64);
            state.enable_marketdata(config);
            Replica::from_state(state, config)
        }

        fn from_state(mut state: ReplicatedState, config: &PublisherConfig) -> Replica {
            let handoff = PacketHandoff::new();
            state.marketdata_mut().unwrap().attach(handoff.clone());
            Replica {
                state,
                feed: NodeFeed::new(config.clone(), handoff, None),
                sink: VecSink::default(),
            }
        }

        /// Applies the entry at `index` (as the state machine does); the feed does not take it.
        fn apply_only(&mut self, index: u64, step: &Step) {
            match step {
                Step::Batch(_) => {
                    let mut answers = Vec::new();
                    self.state.apply_batch(&batch_of(step), index, &mut answers);
                }
                Step::Flush(ns) => self.state.marketdata_flush(*ns),
            }
            self.state.entry_applied(index);
        }

        /// Applies the entry at `index`, then the feed takes and sends what it handed off.
        fn apply(&mut self, index: u64, step: &Step) {
            self.apply_only(index, step);
            self.feed.drain(7, &mut self.sink);
        }

        fn incremental_seqs(&self) -> Vec<u32> {
            Channel::ALL
                .into_iter()
                .filter(|c| c.is_incremental())
                .map(|c| self.feed.status().next_seq[c.index()])
                .collect()
        }
    }

    /// Packets of the incremental channels, as (channel, bytes).
    fn incremental(sink: &VecSink, from: usize) -> Vec<(Channel, Vec<u8>)> {
        sink.packets[from..]
            .iter()
            .filter(|(c, _)| c.is_incremental())
            .cloned()
            .collect()
    }

    fn msg_seq_num(packet: &[u8]) -> u32 {
        u32::from_le_bytes([packet[0], packet[1], packet[2], packet[3]])
    }

    #[test]
    fn replicas_number_alike_only_the_leader_sends_and_duplicates_are_not_republished() {
        let log = steps(400, 4, None);
        let config = PublisherConfig::default();
        let mut replicas: Vec<Replica> = (0..3).map(|_| Replica::new(&config)).collect();
        replicas[0].feed.set_leader(true);
        for (k, step) in log.iter().enumerate() {
            if k == 200 {
                // Failover: node 0 stops leading, node 2 takes over.
                replicas[0].feed.set_leader(false);
                replicas[2].feed.set_leader(true);
            }
            for r in &mut replicas {
                r.apply(k as u64 + 1, step);
            }
        }
        assert!(
            replicas[1].sink.packets.is_empty(),
            "a follower sends nothing"
        );
        assert!(!replicas[0].sink.packets.is_empty() && !replicas[2].sink.packets.is_empty());
        let seqs: Vec<_> = replicas.iter().map(|r| r.feed.status().next_seq).collect();
        assert!(seqs.windows(2).all(|w| w[0] == w[1]), "{seqs:?}");
        // The leader before and the leader after together sent each order-log MsgSeqNum once,
        // in order, with no gap.
        let orders: Vec<u32> = replicas[0]
            .sink
            .packets
            .iter()
            .chain(replicas[2].sink.packets.iter())
            .filter(|(c, _)| *c == Channel::Orders)
            .map(|(_, p)| msg_seq_num(p))
            .collect();
        assert_eq!(
            orders,
            (1..seqs[0][Channel::Orders.index()]).collect::<Vec<_>>()
        );
        // Publishing the same log without the duplicates gives the same numbering.
        let mut plain = Replica::new(&config);
        for (k, step) in log.iter().enumerate() {
            let mut step = step.clone();
            if let Step::Batch(requests) = &mut step {
                let mut seen = std::collections::BTreeSet::new();
                requests.retain(|r| seen.insert((r.client_id, r.request_seq)));
            }
            plain.apply(k as u64 + 1, &step);
        }
        assert_eq!(plain.feed.status().next_seq, seqs[0]);
    }

    #[test]
    fn in_1ms_mode_idle_flushes_from_the_log_keep_every_replica_byte_identical_across_a_failover() {
        let log = steps(300, 3, Some(20));
        let flushes: Vec<usize> = (0..log.len())
            .filter(|&k| matches!(log[k], Step::Flush(_)))
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
        // Three replicas with a failover right after an idle flush, and a reference that
        // leads throughout.
        let mut replicas: Vec<Replica> = (0..4).map(|_| Replica::new(&config)).collect();
        replicas[0].feed.set_leader(true);
        replicas[3].feed.set_leader(true);
        let failover = flushes[flushes.len() / 2] + 1;
        let mut flushed_packets = 0;
        for (k, step) in log.iter().enumerate() {
            if k == failover {
                replicas[0].feed.set_leader(false);
                replicas[2].feed.set_leader(true);
            }
            let before = replicas[3].sink.packets.len();
            for r in &mut replicas {
                r.apply(k as u64 + 1, step);
            }
            if matches!(step, Step::Flush(_)) {
                flushed_packets += replicas[3].sink.packets.len() - before;
            }
            // A duty cycle long after the interval: no feed closes packets by its clock.
            if k == 30 {
                let seqs = replicas[3].feed.status().next_seq;
                replicas[3]
                    .feed
                    .heartbeats(10_000_000_000, &mut VecSink::default());
                assert_eq!(replicas[3].feed.status().next_seq, seqs);
            }
        }
        assert!(flushed_packets > 0, "the idle flush entries closed packets");
        assert!(
            replicas[1].sink.packets.is_empty(),
            "a follower sends nothing"
        );
        let seqs: Vec<_> = replicas.iter().map(Replica::incremental_seqs).collect();
        assert!(seqs.windows(2).all(|w| w[0] == w[1]), "{seqs:?}");
        // The old leader's packets then the new leader's are, byte for byte, what one
        // leader sends for the whole log: MsgSeqNum and RptSeq continue with no reset.
        let mut sent = incremental(&replicas[0].sink, 0);
        sent.extend(incremental(&replicas[2].sink, 0));
        let reference = incremental(&replicas[3].sink, 0);
        assert!(reference.len() > 50, "{} packets", reference.len());
        assert_eq!(sent, reference);
    }

    #[test]
    fn a_feed_resumed_from_a_restored_state_s_numbering_sends_what_a_full_history_feed_sends() {
        let config = PublisherConfig::default();
        let log = steps(300, 4, None);
        let mut full = Replica::new(&config);
        full.feed.set_leader(true);
        let cut = 150usize;
        let mut resumed: Option<(Replica, usize)> = None;
        for (k, step) in log.iter().enumerate() {
            let index = k as u64 + 1;
            full.apply(index, step);
            if let Some((r, _)) = resumed.as_mut() {
                r.apply(index, step);
            }
            if k + 1 == cut {
                // A node restarts from a snapshot taken here: bytes, restore, resume.
                let bytes = full.state.snapshot();
                let restored = ReplicatedState::restore(&bytes, 64).unwrap();
                assert_eq!(restored.state_hash(), full.state.state_hash());
                assert_eq!(restored.snapshot(), bytes);
                assert_eq!(restored.marketdata().unwrap().index(), index);
                let mut r = Replica::from_state(restored, &config);
                assert_eq!(r.feed.status().next_index, index + 1);
                assert_eq!(r.feed.status().next_seq, full.feed.status().next_seq);
                r.feed.set_leader(true);
                resumed = Some((r, full.sink.packets.len()));
            }
        }
        let (r, from) = resumed.unwrap();
        assert_eq!(r.state.state_hash(), full.state.state_hash());
        let expected = incremental(&full.sink, from);
        assert!(expected.len() > 100, "{} packets", expected.len());
        assert_eq!(incremental(&r.sink, 0), expected);
        assert_eq!(r.feed.status().next_seq, full.feed.status().next_seq);
        let md = full.state.marketdata().unwrap();
        for c in Channel::ALL.into_iter().filter(|c| c.is_incremental()) {
            assert_eq!(md.next_seq(c), full.feed.sender().next_seq(c), "{c:?}");
        }
        // A damaged numbering section is refused, never a panic.
        let bytes = full.state.snapshot();
        for cut in [bytes.len() - 1, bytes.len() - 40] {
            assert!(ReplicatedState::restore(&bytes[..cut], 64).is_err());
        }
    }

    #[test]
    fn a_snapshot_installed_across_entries_keeps_the_feed_which_continues_the_numbering() {
        let config = PublisherConfig::default();
        let log = steps(200, 4, None);
        let mut leader = Replica::new(&config);
        let mut behind = Replica::new(&config);
        leader.feed.set_leader(true);
        behind.feed.set_leader(true);
        let (stop, install) = (60usize, 120usize);
        let mut from = 0;
        for (k, step) in log.iter().enumerate() {
            let index = k as u64 + 1;
            leader.apply(index, step);
            if k < stop {
                behind.apply(index, step);
            } else if k + 1 == install {
                // The lagging node installs the leader's snapshot, as openraft does.
                let bytes = leader.state.snapshot();
                let mut state = ReplicatedState::restore(&bytes, 64).unwrap();
                carry_handoff(&mut behind.state, &mut state);
                behind.state = state;
                behind.feed.drain(7, &mut behind.sink);
                from = leader.sink.packets.len();
                behind.sink.packets.clear();
            } else if k + 1 > install {
                behind.apply(index, step);
            }
        }
        let status = behind.feed.status();
        assert_eq!(status.resyncs, 1, "{status:?}");
        assert_eq!(status.detached, None);
        assert_eq!(status.next_seq, leader.feed.status().next_seq);
        let expected = incremental(&leader.sink, from);
        assert!(expected.len() > 100, "{} packets", expected.len());
        assert_eq!(incremental(&behind.sink, 0), expected);
        // Its replay history restarted at the first packet after the install.
        let history = behind.feed.sender().history_of(Channel::Orders).unwrap();
        let first = msg_seq_num(
            &expected
                .iter()
                .find(|(c, _)| *c == Channel::Orders)
                .unwrap()
                .1,
        );
        assert_eq!(history.lock().unwrap().range().unwrap().0, first);
    }

    #[test]
    fn a_feed_that_falls_behind_the_bounded_hand_off_loses_packets_and_continues_from_the_numbering(
    ) {
        let config = PublisherConfig::default();
        let log = steps(8_000, 4, None);
        let mut r = Replica::new(&config);
        r.feed.set_leader(true);
        // The feed takes nothing while the state applies every entry: the hand-off fills up,
        // apply goes on, the packets beyond the bound are dropped.
        let stalled = 7_000;
        for (k, step) in log.iter().take(stalled).enumerate() {
            r.apply_only(k as u64 + 1, step);
        }
        let numbered = r.state.marketdata().unwrap().next_seq(Channel::Orders);
        r.feed.drain(7, &mut r.sink);
        let status = r.feed.status();
        assert!(status.lost_packets > 0, "{status:?}");
        assert_eq!(status.resyncs, 1);
        assert_eq!(status.next_index, stalled as u64 + 1);
        assert!(r.sink.packets.len() <= HANDOFF_PACKETS_MAX);
        assert!((r.sink.packets.len() as u64) + status.lost_packets > HANDOFF_PACKETS_MAX as u64);
        assert_eq!(status.next_seq[Channel::Orders.index()], numbered);
        // From there it sends every packet again, numbered on from the state's numbering.
        let sent = r.sink.packets.len();
        for (k, step) in log.iter().enumerate().skip(stalled) {
            r.apply(k as u64 + 1, step);
        }
        let orders: Vec<u32> = r.sink.packets[sent..]
            .iter()
            .filter(|(c, _)| *c == Channel::Orders)
            .map(|(_, p)| msg_seq_num(p))
            .collect();
        let next = r.state.marketdata().unwrap().next_seq(Channel::Orders);
        assert_eq!(orders, (numbered..next).collect::<Vec<_>>());
        assert_eq!(r.feed.status().resyncs, 1);
    }

    /// Whether the hand-off's notification is pending (taking it if so).
    fn woken(handoff: &PacketHandoff) -> bool {
        use futures_util::FutureExt;
        handoff.notified().now_or_never().is_some()
    }

    #[test]
    fn a_leader_s_feed_is_woken_at_each_entry_a_standby_s_only_when_its_hand_off_fills() {
        let config = PublisherConfig::default();
        let log = steps(6_000, 4, None);
        let mut r = Replica::new(&config);
        r.feed.set_leader(true);
        let handoff = r.feed.handoff.clone();
        let _ = woken(&handoff);
        let mut index = 0;
        let mut next = |r: &mut Replica| {
            // An entry that numbers at least one packet (some are rejects that publish none).
            loop {
                let before = r.state.marketdata().unwrap().next_seq(Channel::Orders);
                r.apply_only(index + 1, &log[index as usize]);
                index += 1;
                if r.state.marketdata().unwrap().next_seq(Channel::Orders) != before {
                    return;
                }
            }
        };
        next(&mut r);
        assert!(woken(&handoff), "the leader sends each entry at once");
        r.feed.drain(7, &mut r.sink);
        r.feed.set_leader(false);
        let mut entries = 0;
        // An entry hands off a few packets at most: stop short of the threshold by a margin.
        while handoff.queue().packets.len() + 16 < HANDOFF_WAKE_PACKETS {
            next(&mut r);
            entries += 1;
            assert!(
                !woken(&handoff),
                "a standby is not woken at entry {entries}"
            );
        }
        while handoff.queue().packets.len() < HANDOFF_WAKE_PACKETS {
            next(&mut r);
        }
        assert!(
            woken(&handoff),
            "a standby is woken once a few entries' packets wait"
        );
        r.feed.drain(7, &mut r.sink);
        assert_eq!(r.feed.status().lost_packets, 0);
        // Leading again, it is woken at the next entry.
        r.feed.set_leader(true);
        next(&mut r);
        assert!(woken(&handoff));
    }

    #[test]
    fn an_active_feed_sleeps_until_its_loops_or_heartbeats_are_due_a_standby_has_no_due_time() {
        // A long snapshot cycle, so that the instrument loop is what falls due first.
        let config = PublisherConfig {
            snapshot_cycle_ns: 600_000_000_000,
            ..PublisherConfig::default()
        };
        let mut r = Replica::new(&config);
        r.apply(1, &steps(1, 1, None)[0]);
        assert_eq!(r.feed.next_due_ns(), None, "a standby runs no loop");
        r.feed.set_leader(true);
        // Nothing was sent yet: the definitions are due at once.
        assert_eq!(r.feed.next_due_ns(), Some(0));
        let now = 1_000_000_000;
        assert!(r.feed.loops_due(now).definitions);
        r.feed.send_definitions(&[], now, &mut r.sink);
        r.feed.heartbeats(now, &mut r.sink);
        // The order-log channel last sent at 7 (`Replica::apply`'s clock) owes a heartbeat a
        // heartbeat interval later; the instrument loop is due an interval after `now`.
        let next = r.feed.next_due_ns().unwrap();
        let heartbeat_due = 7 + config.heartbeat_interval_ns;
        let definitions_due = now + config.instruments_interval_ns;
        assert_eq!(next, heartbeat_due.min(definitions_due));
        assert_eq!(r.feed.loops_due(definitions_due - 1), LoopsDue::default());
        assert!(r.feed.loops_due(definitions_due).definitions);
    }

    #[test]
    fn a_feed_whose_state_keeps_no_numbering_is_detached_and_never_sends() {
        let handoff = PacketHandoff::new();
        let mut feed = NodeFeed::new(
            PublisherConfig::default(),
            handoff,
            Some("no numbering".to_string()),
        );
        feed.set_leader(true);
        assert!(!feed.is_active());
        let mut sink = VecSink::default();
        feed.drain(1, &mut sink);
        assert_eq!(feed.loops_due(10_000_000_000), LoopsDue::default());
        feed.heartbeats(10_000_000_000, &mut sink);
        assert!(sink.packets.is_empty(), "a detached feed never sends");
        assert_eq!(feed.status().detached.as_deref(), Some("no numbering"));
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
