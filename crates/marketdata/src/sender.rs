//! The sending half of a publisher whose numbering runs elsewhere.
//!
//! A replicated core numbers its incremental packets once, inside its state machine (a
//! [`Publisher`](crate::Publisher) fed by every applied entry, so that numbering is a function
//! of the log). [`FeedSender`] is what is left for the node's market data thread: it takes
//! those packets, already closed and numbered, stamps their SendingTime, keeps the replay
//! history, and sends them while the node leads; it runs the instrument and snapshot loops and
//! the heartbeats on the wall clock, from definitions and book snapshots its caller takes from
//! the numbering publisher ([`Publisher::definitions_into`](crate::Publisher::definitions_into),
//! [`Publisher::snapshot_of`](crate::Publisher::snapshot_of)). It encodes no incremental
//! message and keeps no book.

use std::sync::{Arc, Mutex};

use bourse_core::Instrument;
use bourse_wire::market_data::PacketHeader;

use crate::book::BookOrder;
use crate::history::History;
use crate::publisher::{
    put_definitions, put_snapshot, replay_histories, ChannelCounters, ChannelOut,
};
use crate::{Channel, PacketSink, PublicationMode, PublisherConfig, SnapshotHead, CHANNEL_COUNT};

/// What the loops want from the numbering publisher at a duty cycle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoopsDue {
    /// A pass of the instrument loop is due: give the definitions to
    /// [`FeedSender::send_definitions`].
    pub definitions: bool,
    /// The snapshot of the instrument at this position is due: give it to
    /// [`FeedSender::send_snapshot`] (or skip the turn if the publisher has none to give).
    pub snapshot: Option<usize>,
}

/// Sends the packets a numbering publisher closed, and runs the loops. See the module
/// documentation.
pub struct FeedSender {
    config: PublisherConfig,
    /// Every channel's sending state: for the incremental ones only the next MsgSeqNum (from
    /// the packets sent), the last send time and the counters; the loops are built here.
    channels: Vec<ChannelOut>,
    histories: Vec<Option<Arc<Mutex<History>>>>,
    active: bool,
    loop_reset_due: bool,
    snapshot_cursor: usize,
    last_snapshot_ns: u64,
    last_instruments_ns: Option<u64>,
    /// Packets whose header did not parse (never, unless the numbering publisher is broken).
    malformed_packets: u64,
}

impl FeedSender {
    /// A standby sender whose incremental channels stand at `next_seq` (by
    /// [`Channel::index`]; the loops start at 1).
    pub fn new(config: PublisherConfig, next_seq: [u32; CHANNEL_COUNT]) -> FeedSender {
        let channels = Channel::ALL
            .iter()
            .map(|&c| {
                let mut ch = ChannelOut::new(c, PublicationMode::Online, config.packet_bytes_max);
                if c.is_incremental() {
                    ch.next_seq = next_seq[c.index()];
                }
                ch
            })
            .collect();
        let histories = replay_histories(&config);
        FeedSender {
            config,
            channels,
            histories,
            active: false,
            loop_reset_due: false,
            snapshot_cursor: 0,
            last_snapshot_ns: 0,
            last_instruments_ns: None,
            malformed_packets: 0,
        }
    }

    /// As [`crate::Publisher::set_active`]: a standby keeps its replay history and sends
    /// nothing; on activation the loops announce their numbering with SequenceReset and the
    /// instrument loop starts at once.
    pub fn set_active(&mut self, active: bool) {
        if active && !self.active {
            self.loop_reset_due = true;
            self.last_instruments_ns = None;
        }
        self.active = active;
    }

    pub fn is_active(&self) -> bool {
        self.active
    }

    /// The packets of an incremental channel kept for replay (`None` for the loops).
    pub fn history_of(&self, channel: Channel) -> Option<Arc<Mutex<History>>> {
        self.histories[channel.index()].as_ref().map(Arc::clone)
    }

    /// Every channel's history, by [`Channel::index`] (for a replay server).
    pub fn histories(&self) -> Vec<Option<Arc<Mutex<History>>>> {
        self.histories.clone()
    }

    pub fn counters(&self, channel: Channel) -> ChannelCounters {
        self.channels[channel.index()].counters
    }

    /// The MsgSeqNum the next data packet of `channel` takes.
    pub fn next_seq(&self, channel: Channel) -> u32 {
        self.channels[channel.index()].next_seq
    }

    pub fn malformed_packets(&self) -> u64 {
        self.malformed_packets
    }

    /// Packets of the incremental channels were lost before reaching this sender: continue
    /// from `next_seq`. The replay history restarts by itself at the next packet (its
    /// numbers no longer follow); subscribers recover the missing ones from the snapshot loop.
    pub fn resume_at(&mut self, next_seq: [u32; CHANNEL_COUNT]) {
        for c in Channel::ALL.into_iter().filter(|c| c.is_incremental()) {
            self.channels[c.index()].next_seq = next_seq[c.index()];
        }
    }

    /// Sends packets of one incremental channel, in order, closed and numbered by the
    /// numbering publisher: stamps SendingTime with `now_ns`, keeps each for replay, and
    /// sends them (when active) in one hand-over to `sink`.
    pub fn send(
        &mut self,
        channel: Channel,
        packets: &mut [Vec<u8>],
        now_ns: u64,
        sink: &mut dyn PacketSink,
    ) {
        let history = self.histories[channel.index()].as_deref();
        let ch = &mut self.channels[channel.index()];
        for p in packets.iter_mut() {
            let Ok(mut header) = PacketHeader::parse(p) else {
                self.malformed_packets += 1;
                continue;
            };
            header.sending_time_ns = now_ns;
            let _ = header.write(p);
            if let Some(h) = history {
                if let Ok(mut h) = h.lock() {
                    h.push(header.msg_seq_num, p);
                }
            }
            ch.next_seq = header.msg_seq_num.wrapping_add(1).max(1);
        }
        if packets.is_empty() {
            return;
        }
        if self.active {
            sink.send_all(channel, packets);
            for p in packets.iter() {
                ch.counters.packets_sent += 1;
                ch.counters.bytes_sent += p.len() as u64;
            }
        }
        ch.last_send_ns = now_ns;
    }

    /// What the loops want at `now_ns`, the numbering publisher knowing `instruments`
    /// instruments. A standby runs no loop (its numbering of the loops is its own, and it
    /// announces it with SequenceReset when it becomes active), so it wants nothing.
    pub fn loops_due(&self, now_ns: u64, instruments: usize) -> LoopsDue {
        if !self.active {
            return LoopsDue::default();
        }
        let definitions = self
            .last_instruments_ns
            .is_none_or(|t| now_ns.saturating_sub(t) >= self.config.instruments_interval_ns);
        // One instrument per slice of the cycle, so a full pass takes the cycle whatever the
        // number of instruments.
        let spacing_ns = self.config.snapshot_cycle_ns / (instruments.max(1) as u64);
        let snapshot = (instruments > 0
            && now_ns.saturating_sub(self.last_snapshot_ns) >= spacing_ns)
            .then_some(self.snapshot_cursor % instruments.max(1));
        LoopsDue {
            definitions,
            snapshot,
        }
    }

    /// When the loops or a channel's heartbeat are next due, in the clock of
    /// [`FeedSender::loops_due`] (`None` while standby, which runs neither): the thread that
    /// drives this sender can sleep until then instead of waking on a short period.
    pub fn next_due_ns(&self, instruments: usize) -> Option<u64> {
        if !self.active {
            return None;
        }
        let definitions = self
            .last_instruments_ns
            .map_or(0, |t| t.saturating_add(self.config.instruments_interval_ns));
        let snapshot = if instruments > 0 {
            let spacing_ns = self.config.snapshot_cycle_ns / (instruments as u64);
            self.last_snapshot_ns.saturating_add(spacing_ns)
        } else {
            u64::MAX
        };
        let hb = self.config.heartbeat_interval_ns;
        let heartbeat = self
            .channels
            .iter()
            .filter(|ch| !ch.has_unsent())
            .map(|ch| ch.last_send_ns.saturating_add(hb))
            .min()
            .unwrap_or(u64::MAX);
        Some(definitions.min(snapshot).min(heartbeat))
    }

    /// One pass of the instrument loop.
    pub fn send_definitions(
        &mut self,
        defs: &[Instrument],
        now_ns: u64,
        sink: &mut dyn PacketSink,
    ) {
        self.last_instruments_ns = Some(now_ns);
        let ch = &mut self.channels[Channel::Instruments.index()];
        put_definitions(ch, defs.iter(), now_ns);
        ch.close(now_ns, None);
        ch.flush(now_ns, self.active, sink);
    }

    /// The snapshot [`LoopsDue::snapshot`] asked for, `orders` in priority order. The caller
    /// sends every incremental packet up to `head.last_msg_seq_num` first, so that a
    /// subscriber never sees a snapshot ahead of the order log.
    pub fn send_snapshot(
        &mut self,
        head: &SnapshotHead,
        orders: &[BookOrder],
        now_ns: u64,
        sink: &mut dyn PacketSink,
    ) {
        self.last_snapshot_ns = now_ns;
        self.snapshot_cursor = self.snapshot_cursor.wrapping_add(1);
        let ch = &mut self.channels[Channel::Snapshot.index()];
        put_snapshot(
            ch,
            self.config.packet_bytes_max,
            self.config.session_id,
            head,
            orders.iter(),
            orders.len(),
            now_ns,
        );
        ch.flush(now_ns, self.active, sink);
    }

    /// After activation, the loops' SequenceReset (before anything else on them, so a
    /// subscriber learns their new numbering first). Call at the start of each duty cycle.
    pub fn announce_loops(&mut self, now_ns: u64, sink: &mut dyn PacketSink) {
        if self.loop_reset_due {
            self.loop_reset_due = false;
            for c in [Channel::Instruments, Channel::Snapshot] {
                self.channels[c.index()].sequence_reset(now_ns, self.active, sink);
            }
        }
    }

    /// A Heartbeat on every channel idle for the heartbeat interval (repeating its last
    /// MsgSeqNum); nothing while standby.
    pub fn heartbeats(&mut self, now_ns: u64, sink: &mut dyn PacketSink) {
        if !self.active {
            return;
        }
        let hb = self.config.heartbeat_interval_ns;
        for ch in &mut self.channels {
            if !ch.has_unsent() && now_ns.saturating_sub(ch.last_send_ns) >= hb {
                ch.heartbeat(now_ns, true, sink);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Publisher, VecSink};

    #[test]
    fn packets_are_stamped_kept_for_replay_and_sent_only_while_active() {
        // Order-log packets closed and numbered by a publisher, as the state's would be.
        let mut publisher = Publisher::new(PublisherConfig::default(), &[]);
        let mut closed = VecSink::default();
        let definition = bourse_core::Instrument {
            instrument: bourse_core::InstrumentId(7),
            symbol: "SBER".into(),
            market: bourse_core::Market::Equity,
            price_scale: 2,
            tick: bourse_core::Price(1),
            lot_size: 1,
            multiplier: 1,
            initial_margin: bourse_core::Cash(0),
            band_bps: 1_000,
            reference_price: bourse_core::Price(10_000),
            volatility: Default::default(),
        }
        .def()
        .unwrap();
        let events = vec![bourse_core::Event::InstrumentAdded {
            instrument: bourse_core::InstrumentId(7),
            definition,
            ts_ns: 1_000,
        }];
        publisher.publish(&events, 5, &mut closed);
        let mut orders: Vec<Vec<u8>> = closed
            .packets
            .iter()
            .filter(|(c, _)| *c == Channel::Orders)
            .map(|(_, p)| p.clone())
            .collect();
        assert!(!orders.is_empty());
        let mut sender = FeedSender::new(PublisherConfig::default(), [1; CHANNEL_COUNT]);
        let mut sink = VecSink::default();
        sender.send(Channel::Orders, &mut orders.clone(), 77, &mut sink);
        assert!(sink.packets.is_empty(), "a standby sends nothing");
        assert_eq!(sender.next_seq(Channel::Orders), 1 + orders.len() as u32);
        let history = sender.history_of(Channel::Orders).unwrap();
        assert_eq!(
            history.lock().unwrap().range(),
            Some((1, orders.len() as u32))
        );
        sender.set_active(true);
        sender.send(Channel::Orders, &mut orders, 99, &mut sink);
        assert_eq!(sink.packets.len(), orders.len());
        let header = PacketHeader::parse(&sink.packets[0].1).unwrap();
        assert_eq!(header.sending_time_ns, 99);
        assert_eq!(
            sender.counters(Channel::Orders).packets_sent,
            orders.len() as u64
        );
    }

    #[test]
    fn a_standby_runs_no_loop_and_an_active_sender_resets_the_loops_then_runs_them() {
        let config = PublisherConfig::default();
        let mut sender = FeedSender::new(config.clone(), [1; CHANNEL_COUNT]);
        assert_eq!(sender.loops_due(10_000_000_000, 3), LoopsDue::default());
        sender.set_active(true);
        let due = sender.loops_due(10_000_000_000, 3);
        assert!(due.definitions);
        assert_eq!(due.snapshot, Some(0));
        let mut sink = VecSink::default();
        sender.announce_loops(10_000_000_000, &mut sink);
        sender.heartbeats(10_000_000_000, &mut sink);
        let resets: Vec<Channel> = Channel::ALL
            .into_iter()
            .filter(|&c| sender.counters(c).sequence_resets == 1)
            .collect();
        assert_eq!(resets, vec![Channel::Instruments, Channel::Snapshot]);
        // Nothing was sent on the incremental channels for longer than the heartbeat
        // interval: each beats once; the loops just sent their SequenceReset.
        for c in Channel::ALL {
            let beats = u64::from(c.is_incremental());
            assert_eq!(sender.counters(c).heartbeats, beats, "{c:?}");
        }
        let head = SnapshotHead {
            security_id: 1,
            rpt_seq: 4,
            last_msg_seq_num: 9,
            instruments_total: 3,
        };
        sender.send_snapshot(&head, &[], 10_000_000_000, &mut sink);
        assert_eq!(sender.loops_due(10_000_000_001, 3).snapshot, None);
        let later = 10_000_000_000 + config.snapshot_cycle_ns;
        assert_eq!(sender.loops_due(later, 3).snapshot, Some(1));
    }
}
