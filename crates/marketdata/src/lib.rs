//! # bourse-marketdata: the market data feeds of one trading core
//!
//! Committed event batches go out as SIMBA-like SBE packets over UDP, feeds A and B, on six
//! [`Channel`]s (the wire format is `bourse-wire`'s, `docs/protocol-market-data.md`). Start at
//! [`Publisher`] (sans-I/O: its own books, packets in reused buffers handed to a
//! [`PacketSink`]; a standby numbers exactly as the leader) and [`FeedSender`] (the sending
//! half on a node's market data thread). [`History`] and [`replay::ReplayServer`] serve
//! retransmission over TCP; [`udp::UdpSink`] sends; [`Subscriber`] (sans-I/O) arbitrates A and
//! B, recovers and builds books; [`pcap`] and [`describe`] serve recordings.
//!
//! Nothing here panics on input from the network. Design: ARCHITECTURE.md, `crates/marketdata`.

#![forbid(unsafe_code)]

pub mod book;
pub mod describe;
mod history;
pub mod pcap;
mod publisher;
pub mod replay;
mod sender;
mod subscriber;
pub mod udp;

/// The wire codecs this crate speaks, re-exported so tools need no second dependency.
pub use bourse_wire as wire;

pub use book::{BookOrder, LevelView, OrderBook};
pub use history::History;
pub use publisher::{
    PacketSink, Publisher, PublisherState, SnapshotHead, VecSink, PACKET_BYTES_MIN,
};
pub use sender::{FeedSender, LoopsDue};
pub use subscriber::{
    InstrumentView, RecoveryRequest, Subscriber, SubscriberConfig, SubscriberStats,
};

/// Default largest packet the publisher builds (the seeds' MTU-safe figure).
pub const PACKET_BYTES_DEFAULT: usize = 1_400;
/// Levels per side in the aggregated book.
pub const TOP_LEVELS: usize = 20;

/// The channels of one core. Each has its own MsgSeqNum sequence and its own pair of UDP
/// destinations (feed A and feed B).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Channel {
    /// Order log: OrderUpdate, OrderExecution, EmptyBook, SecurityStatus,
    /// TradingSessionStatus. Incremental (every incremental channel has a replay service).
    Orders = 0,
    /// Trade messages. Incremental.
    Trades = 1,
    /// AggregatedBook (top 20 levels per side), for instruments whose top 20 changed.
    Book = 2,
    /// Statistics: last, volume, turnover, open/high/low, VWAP, best bid/ask, trade count.
    Statistics = 3,
    /// SecurityDefinition loop (and nothing else).
    Instruments = 4,
    /// OrderBookSnapshot loop.
    Snapshot = 5,
}

/// Number of channels.
pub const CHANNEL_COUNT: usize = 6;

impl Channel {
    pub const ALL: [Channel; CHANNEL_COUNT] = [
        Channel::Orders,
        Channel::Trades,
        Channel::Book,
        Channel::Statistics,
        Channel::Instruments,
        Channel::Snapshot,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    /// Whether packets carry an IncrementalPacketHeader (and a subscriber must see every one).
    pub fn is_incremental(self) -> bool {
        !matches!(self, Channel::Instruments | Channel::Snapshot)
    }

    pub fn name(self) -> &'static str {
        match self {
            Channel::Orders => "orders",
            Channel::Trades => "trades",
            Channel::Book => "book",
            Channel::Statistics => "statistics",
            Channel::Instruments => "instruments",
            Channel::Snapshot => "snapshot",
        }
    }

    pub fn from_name(name: &str) -> Option<Channel> {
        Channel::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// When a channel's packets leave: after every committed batch, or once per interval of the
/// commands' own time (the seeds' three modes). Coalesced channels (book, statistics) publish
/// only the latest state of each instrument per interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PublicationMode {
    Online,
    Every1Ms,
    Every15Ms,
}

impl PublicationMode {
    pub fn interval_ns(self) -> u64 {
        match self {
            PublicationMode::Online => 0,
            PublicationMode::Every1Ms => 1_000_000,
            PublicationMode::Every15Ms => 15_000_000,
        }
    }

    pub fn parse(text: &str) -> Option<PublicationMode> {
        match text {
            "online" => Some(PublicationMode::Online),
            "1ms" => Some(PublicationMode::Every1Ms),
            "15ms" => Some(PublicationMode::Every15Ms),
            _ => None,
        }
    }
}

/// Which feed a packet came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Feed {
    A,
    B,
    /// Resent by the TCP replay service.
    Replay,
}

/// The publisher's settings.
#[derive(Clone, Debug)]
pub struct PublisherConfig {
    /// Largest packet, in bytes (at most `bourse_wire::market_data::PACKET_BYTES_MAX`).
    pub packet_bytes_max: usize,
    /// Publication mode per channel, indexed by [`Channel::index`]. The instrument and
    /// snapshot loops ignore it (they run on their own intervals below).
    pub modes: [PublicationMode; CHANNEL_COUNT],
    /// ExchangeTradingSessionId stamped on incremental packets and snapshots.
    pub session_id: u32,
    /// Packets kept for the replay service, per incremental channel; 0 keeps none (a
    /// publisher run only for its numbering).
    pub replay_history_packets: usize,
    /// Bytes of packets kept for replay, per incremental channel (allocated up front; the
    /// oldest packets go when either bound is met).
    pub replay_history_bytes: usize,
    /// A channel with nothing sent for this long sends a Heartbeat.
    pub heartbeat_interval_ns: u64,
    /// The snapshot loop sends one full cycle (every instrument's snapshot once) every this
    /// many ns, its instruments spread evenly over the cycle, as real feeds bound their
    /// snapshot channels: the loop's rate no longer grows with the number of instruments.
    pub snapshot_cycle_ns: u64,
    /// The instrument loop sends a full pass of definitions every this many ns.
    pub instruments_interval_ns: u64,
    /// Whether [`Publisher::tick`] closes the packets of an idle 1 ms / 15 ms channel by the
    /// wall clock (a publisher on its own). A replicated core's publisher sets it false: its
    /// idle flushes are log entries, so that every replica closes the same packets
    /// ([`Publisher::idle_flush_due`], [`Publisher::idle_flush`]).
    pub idle_flush_by_clock: bool,
}

/// One pass of the snapshot loop over every instrument by default: a second. (It was one
/// instrument per millisecond: 1,000 snapshots a second whatever the number of instruments,
/// about 19,000 packets a second on feeds A and B with three small markets.)
pub const SNAPSHOT_CYCLE_NS_DEFAULT: u64 = 1_000_000_000;

/// Packets kept for replay by default. The protocol document names 1,000,000
/// (`REPLAY_HISTORY_PACKETS`); at up to 1,400 bytes each that is 1.4 GB, so the default here is
/// smaller and the figure is a setting.
pub const REPLAY_HISTORY_PACKETS_DEFAULT: usize = 100_000;

/// Bytes kept for replay per incremental channel by default: 100,000 packets of the order
/// log's typical 100-200 bytes.
pub const REPLAY_HISTORY_BYTES_DEFAULT: usize = 16 << 20;

impl Default for PublisherConfig {
    fn default() -> Self {
        PublisherConfig {
            packet_bytes_max: PACKET_BYTES_DEFAULT,
            modes: [PublicationMode::Online; CHANNEL_COUNT],
            session_id: 1,
            replay_history_packets: REPLAY_HISTORY_PACKETS_DEFAULT,
            replay_history_bytes: REPLAY_HISTORY_BYTES_DEFAULT,
            heartbeat_interval_ns: u64::from(bourse_wire::market_data::HEARTBEAT_INTERVAL_MS)
                * 1_000_000,
            snapshot_cycle_ns: SNAPSHOT_CYCLE_NS_DEFAULT,
            instruments_interval_ns: 100_000_000,
            idle_flush_by_clock: true,
        }
    }
}

/// Wall clock in ns since the epoch, for packet SendingTime and tools. The publisher itself
/// takes `now` from its caller (read once per duty cycle).
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
