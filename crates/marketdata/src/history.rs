//! Recent order-log packets, kept for the TCP replay service.

use std::collections::VecDeque;

/// A bounded ring of published packets by MsgSeqNum. Buffers of evicted packets are reused, so
/// once the ring is full, keeping a packet allocates nothing.
#[derive(Debug)]
pub struct History {
    packets: VecDeque<(u32, Vec<u8>)>,
    capacity_packets: usize,
}

impl History {
    pub fn new(capacity_packets: usize) -> History {
        assert!(capacity_packets > 0);
        History {
            packets: VecDeque::with_capacity(capacity_packets.min(1 << 16)),
            capacity_packets,
        }
    }

    /// Keeps a copy of `packet`. Sequence numbers must grow by one (a restart clears first).
    pub fn push(&mut self, msg_seq_num: u32, packet: &[u8]) {
        if let Some(&(last, _)) = self.packets.back() {
            if msg_seq_num != last.wrapping_add(1) {
                self.packets.clear();
            }
        }
        let mut buf = if self.packets.len() >= self.capacity_packets {
            self.packets.pop_front().map(|(_, b)| b).unwrap_or_default()
        } else {
            Vec::with_capacity(packet.len())
        };
        buf.clear();
        buf.extend_from_slice(packet);
        self.packets.push_back((msg_seq_num, buf));
    }

    /// The range of sequence numbers kept, if any.
    pub fn range(&self) -> Option<(u32, u32)> {
        Some((self.packets.front()?.0, self.packets.back()?.0))
    }

    /// The packet with this sequence number, if kept.
    pub fn get(&self, msg_seq_num: u32) -> Option<&[u8]> {
        let (first, last) = self.range()?;
        if msg_seq_num < first || msg_seq_num > last {
            return None;
        }
        self.packets
            .get((msg_seq_num - first) as usize)
            .map(|(_, b)| b.as_slice())
    }

    pub fn len(&self) -> usize {
        self.packets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.packets.is_empty()
    }
}
