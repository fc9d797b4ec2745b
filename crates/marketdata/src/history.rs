//! Recent packets of one incremental channel, kept for the TCP replay service.
//!
//! The history is a preallocated ring, so keeping a packet never allocates: packet bytes go
//! one after another into one byte ring of a fixed size (`replay_history_bytes`), and a ring
//! of `(offset, length)` records, one per packet (at most `replay_history_packets`), finds
//! them by MsgSeqNum. Both are allocated once, when the history is made; the byte ring is
//! allocated zeroed, which the operating system maps lazily, so memory is touched as packets
//! are written.

use std::collections::VecDeque;

/// Where one kept packet lies in the byte ring.
#[derive(Clone, Copy, Debug)]
struct Slot {
    offset: u32,
    len: u32,
}

/// A bounded ring of published packets by MsgSeqNum: at most `capacity_packets` packets, the
/// oldest evicted first (also when the newest one's bytes need their room).
#[derive(Debug)]
pub struct History {
    bytes: Vec<u8>,
    /// Where the next packet's bytes go.
    head: usize,
    slots: VecDeque<Slot>,
    /// MsgSeqNum of `slots.front()`.
    first_seq: u32,
    capacity_packets: usize,
    /// Bytes of the packets in `slots`.
    kept_bytes: usize,
    /// The furthest the byte ring was ever written: the part of it that is resident (the
    /// rest was never touched since its zeroed allocation).
    touched_bytes: usize,
}

/// The largest packet a history keeps (the wire format's largest packet).
const PACKET_BYTES_KEPT_MAX: usize = bourse_wire::market_data::PACKET_BYTES_MAX;

impl History {
    /// A history of up to `capacity_packets` packets with room for all of them at the wire
    /// format's largest size (for small histories; see [`History::with_bytes`]).
    pub fn new(capacity_packets: usize) -> History {
        History::with_bytes(
            capacity_packets,
            capacity_packets.saturating_mul(PACKET_BYTES_KEPT_MAX),
        )
    }

    /// A history of up to `capacity_packets` packets in a byte ring of `ring_bytes` (at least
    /// one packet of the largest size, at most 4 GiB): whichever bound is met first evicts
    /// the oldest packets.
    pub fn with_bytes(capacity_packets: usize, ring_bytes: usize) -> History {
        assert!(capacity_packets > 0);
        let ring_bytes = ring_bytes.clamp(PACKET_BYTES_KEPT_MAX, u32::MAX as usize);
        History {
            bytes: vec![0u8; ring_bytes],
            head: 0,
            slots: VecDeque::with_capacity(capacity_packets),
            first_seq: 0,
            capacity_packets,
            kept_bytes: 0,
            touched_bytes: 0,
        }
    }

    /// A history of `capacity_packets` packets of up to `packet_bytes_max` bytes each.
    #[cfg(test)]
    fn with_packet_size(capacity_packets: usize, packet_bytes_max: usize) -> History {
        let mut h = History::with_bytes(capacity_packets, 0);
        h.bytes = vec![0u8; capacity_packets * packet_bytes_max];
        h
    }

    /// Keeps a copy of `packet`. Sequence numbers must grow by one (a restart clears first).
    pub fn push(&mut self, msg_seq_num: u32, packet: &[u8]) {
        let len = packet.len();
        if len > self.bytes.len() {
            return;
        }
        if self.slots.is_empty()
            || msg_seq_num != self.first_seq.wrapping_add(self.slots.len() as u32)
        {
            self.slots.clear();
            self.kept_bytes = 0;
            self.head = 0;
            self.first_seq = msg_seq_num;
        }
        if self.head + len > self.bytes.len() {
            // The packet does not fit before the end: it goes to the start of the ring, and
            // the packets between here and the end (the oldest, left from the previous lap)
            // go, so that those kept lie in their order from the start.
            while self
                .slots
                .front()
                .is_some_and(|f| f.offset as usize >= self.head)
            {
                self.pop_oldest();
            }
            self.head = 0;
        }
        let (start, end) = (self.head, self.head + len);
        // Evict the oldest packets while there are too many or their bytes lie where this
        // one goes. Packets lie in the ring in their order, so the ones in the way are
        // always the oldest.
        while let Some(front) = self.slots.front() {
            let (f_start, f_end) = (front.offset as usize, (front.offset + front.len) as usize);
            let overlaps = f_start < end && f_end > start;
            if self.slots.len() < self.capacity_packets && !overlaps {
                break;
            }
            self.pop_oldest();
        }
        if self.slots.is_empty() {
            self.first_seq = msg_seq_num;
        }
        self.bytes[start..end].copy_from_slice(packet);
        self.slots.push_back(Slot {
            offset: start as u32,
            len: len as u32,
        });
        self.kept_bytes += len;
        self.touched_bytes = self.touched_bytes.max(end);
        self.head = end;
    }

    fn pop_oldest(&mut self) {
        if let Some(f) = self.slots.pop_front() {
            self.kept_bytes -= f.len as usize;
            self.first_seq = self.first_seq.wrapping_add(1);
        }
    }

    /// Bytes of the packets kept now.
    pub fn kept_bytes(&self) -> usize {
        self.kept_bytes
    }

    /// Bytes of the ring ever written: what it holds resident, at most its size (the ring is
    /// allocated zeroed at its full size, and the rest is never touched).
    pub fn touched_bytes(&self) -> usize {
        self.touched_bytes
    }

    /// The range of sequence numbers kept, if any.
    pub fn range(&self) -> Option<(u32, u32)> {
        if self.slots.is_empty() {
            return None;
        }
        let last = self
            .first_seq
            .wrapping_add(self.slots.len() as u32)
            .wrapping_sub(1);
        Some((self.first_seq, last))
    }

    /// The packet with this sequence number, if kept.
    pub fn get(&self, msg_seq_num: u32) -> Option<&[u8]> {
        let (first, last) = self.range()?;
        if msg_seq_num < first || msg_seq_num > last {
            return None;
        }
        let slot = self.slots.get((msg_seq_num - first) as usize)?;
        let start = slot.offset as usize;
        self.bytes.get(start..start + slot.len as usize)
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(seq: u32, len: usize) -> Vec<u8> {
        (0..len).map(|k| (seq as usize * 31 + k) as u8).collect()
    }

    #[test]
    fn keeps_the_newest_packets_within_both_bounds_and_returns_them_intact() {
        // Room for 4 packets of 100 bytes: many small packets are bounded by count, a few
        // large ones by bytes.
        let mut h = History::with_packet_size(4, 100);
        let sizes = [10usize, 100, 30, 100, 100, 5, 60, 99, 1, 100, 70, 40];
        let mut pushed = Vec::new();
        for (k, &len) in sizes.iter().enumerate() {
            let seq = 7 + k as u32;
            h.push(seq, &packet(seq, len));
            pushed.push((seq, len));
            let (first, last) = h.range().unwrap();
            assert_eq!(last, seq);
            assert!(h.len() <= 4);
            assert_eq!((last - first + 1) as usize, h.len());
            // Every packet kept is the one pushed under its number, byte for byte.
            for s in first..=last {
                let len = pushed.iter().find(|(q, _)| *q == s).unwrap().1;
                assert_eq!(h.get(s).unwrap(), packet(s, len).as_slice(), "seq {s}");
            }
            // What is kept is a suffix of what was pushed, as long as the bytes allow.
            let kept_bytes: usize = (first..=last)
                .map(|s| pushed.iter().find(|(q, _)| *q == s).unwrap().1)
                .sum();
            assert!(kept_bytes <= 400);
            assert_eq!(h.kept_bytes(), kept_bytes);
            assert!(h.touched_bytes() >= kept_bytes && h.touched_bytes() <= 400);
            assert!(h.get(first.wrapping_sub(1)).is_none());
            assert!(h.get(last + 1).is_none());
        }
        // Pseudo-random sizes over many laps: what is kept is always a suffix of what was
        // pushed, intact, within both bounds.
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for (capacity, size_max) in [(4usize, 100usize), (7, 64), (50, 1400)] {
            let mut h = History::with_packet_size(capacity, size_max);
            let mut lens = Vec::new();
            for seq in 1..5_000u32 {
                rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let len = 1 + (rng >> 33) as usize % size_max;
                h.push(seq, &packet(seq, len));
                lens.push(len);
                let (first, last) = h.range().unwrap();
                assert_eq!(last, seq);
                assert!(h.len() <= capacity);
                let kept: usize = (first..=last).map(|s| lens[s as usize - 1]).sum();
                assert!(kept <= capacity * size_max);
                assert_eq!(h.kept_bytes(), kept);
                assert!(h.touched_bytes() <= capacity * size_max);
                for s in first..=last {
                    assert_eq!(
                        h.get(s).unwrap(),
                        packet(s, lens[s as usize - 1]).as_slice()
                    );
                }
                // A packet is evicted only when needed: by count, or because its bytes were
                // in the way (at most three packets' worth of the ring is ever unused).
                let pushed: usize = lens.iter().sum();
                assert!(
                    h.len() == capacity || kept + 3 * size_max >= (capacity * size_max).min(pushed),
                    "{capacity} {size_max} seq {seq}: {kept} bytes in {} packets",
                    h.len()
                );
            }
        }
        // Small packets: the count bound.
        for seq in 100..120u32 {
            h.push(seq, &packet(seq, 3));
        }
        assert_eq!(h.range(), Some((116, 119)));
        // A jump in numbering starts over.
        h.push(500, &packet(500, 8));
        assert_eq!(h.range(), Some((500, 500)));
        assert_eq!(h.get(500).unwrap(), packet(500, 8).as_slice());
        assert_eq!(h.kept_bytes(), 8);
    }
}
