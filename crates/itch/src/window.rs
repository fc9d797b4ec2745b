//! The retransmission window: the newest messages of the session, by sequence number, bounded
//! in count and allocated once.

use crate::msg::MESSAGE_BYTES_MAX;
use std::collections::VecDeque;

/// Why a retransmission request gets no messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Refusal {
    /// The first message asked for has left the window (the oldest kept is given).
    TooOld { oldest: u64 },
    /// The first message asked for has not been sent yet.
    NotYetSent { next: u64 },
    /// A count of zero.
    Empty,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::TooOld { oldest } => {
                write!(
                    f,
                    "out of the retransmission window (oldest kept: {oldest})"
                )
            }
            Refusal::NotYetSent { next } => write!(f, "not sent yet (next: {next})"),
            Refusal::Empty => write!(f, "asks for no messages"),
        }
    }
}

/// The newest `capacity` messages, each in a fixed slot (ITCH messages are at most 44 bytes).
pub struct Window {
    capacity: usize,
    slots: VecDeque<(u8, [u8; MESSAGE_BYTES_MAX])>,
    /// Sequence number of the oldest message kept.
    first: u64,
}

impl Window {
    /// A window for `capacity` messages (at least one), starting at sequence number 1.
    pub fn new(capacity: usize) -> Window {
        let capacity = capacity.max(1);
        Window {
            capacity,
            slots: VecDeque::with_capacity(capacity),
            first: 1,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The sequence number the next message takes.
    pub fn next_sequence(&self) -> u64 {
        self.first + self.slots.len() as u64
    }

    /// The oldest sequence number still kept.
    pub fn oldest(&self) -> u64 {
        self.first
    }

    /// Keeps a message (at most 44 bytes) under the next sequence number, dropping the oldest
    /// if full; returns its sequence number.
    pub fn push(&mut self, message: &[u8]) -> u64 {
        assert!(
            message.len() <= MESSAGE_BYTES_MAX,
            "ITCH messages are at most 44 bytes"
        );
        if self.slots.len() == self.capacity {
            self.slots.pop_front();
            self.first += 1;
        }
        let mut slot = [0; MESSAGE_BYTES_MAX];
        slot[..message.len()].copy_from_slice(message);
        self.slots.push_back((message.len() as u8, slot));
        self.next_sequence() - 1
    }

    /// The messages from `sequence` on, at most `count`, handed to `take` in order until it
    /// returns false. Returns how many were handed over.
    pub fn read(
        &self,
        sequence: u64,
        count: u16,
        mut take: impl FnMut(u64, &[u8]) -> bool,
    ) -> Result<u16, Refusal> {
        if count == 0 {
            return Err(Refusal::Empty);
        }
        if sequence < self.first {
            return Err(Refusal::TooOld { oldest: self.first });
        }
        if sequence >= self.next_sequence() {
            return Err(Refusal::NotYetSent {
                next: self.next_sequence(),
            });
        }
        let start = (sequence - self.first) as usize;
        let mut given = 0u16;
        for (k, (len, bytes)) in self
            .slots
            .range(start..)
            .take(usize::from(count))
            .enumerate()
        {
            if !take(sequence + k as u64, &bytes[..usize::from(*len)]) {
                break;
            }
            given += 1;
        }
        Ok(given)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_keeps_the_newest_and_refuses_the_rest_by_name() {
        let mut w = Window::new(3);
        for k in 1..=5u8 {
            w.push(&[k; 5]);
        }
        assert_eq!(w.oldest(), 3);
        assert_eq!(w.next_sequence(), 6);
        let mut got = Vec::new();
        assert_eq!(
            w.read(4, 10, |s, m| {
                got.push((s, m[0]));
                true
            }),
            Ok(2)
        );
        assert_eq!(got, vec![(4, 4), (5, 5)]);
        assert_eq!(
            w.read(2, 1, |_, _| true),
            Err(Refusal::TooOld { oldest: 3 })
        );
        assert_eq!(
            w.read(6, 1, |_, _| true),
            Err(Refusal::NotYetSent { next: 6 })
        );
        assert_eq!(w.read(3, 0, |_, _| true), Err(Refusal::Empty));
        assert_eq!(
            w.read(3, 3, |s, _| s < 4),
            Ok(1),
            "the reader may stop early"
        );
    }
}
