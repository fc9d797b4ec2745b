//! The decisions of the bed's userspace netem (`bourse-netem`, scripts/netbed.sh `impair`):
//! which packet to drop, when to release the others, which to hold back so that later ones
//! pass them, and what to do when too many are held. Pure: no clock and no I/O (the caller
//! passes the time in µs and owns the packets), so the tests below check every decision
//! exactly, and the binary only moves packets between the kernel's queue and [`Held`].

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// What one impaired link does to the packets sent on it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Impairment {
    /// Every packet released is held at least this long (one way).
    pub delay_us: u64,
    /// The delay of each packet varies uniformly by up to this much either side.
    pub jitter_us: u64,
    /// Share of packets dropped, in percent (0-100).
    pub loss_pct: f64,
    /// Share of packets held [`Impairment::reorder_extra_us`] longer than the others, so that
    /// packets sent after them arrive first (in percent, 0-100).
    pub reorder_pct: f64,
    /// How much longer a reordered packet is held.
    pub reorder_extra_us: u64,
}

/// The fate of one packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Dropped (loss).
    Drop,
    /// Released at `at_us`; `reordered` when held longer so that later packets pass it.
    Release { at_us: u64, reordered: bool },
}

/// The counters `bourse-netem` prints at exit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Packets the kernel queued to the program.
    pub queued: u64,
    /// Packets released after a delay (every released packet when the delay is not zero).
    pub delayed: u64,
    /// Packets dropped as loss.
    pub dropped: u64,
    /// Packets dropped because [`Held`] was full (not loss the link was asked for).
    pub dropped_full: u64,
    /// Packets held longer so that later ones passed them.
    pub reordered: u64,
}

/// A small seeded generator (splitmix64): the decisions of a run are replayable from its seed
/// and the order of its packets. The testkit depends on no engine crate, whose generator it
/// would otherwise use.
#[derive(Clone, Debug)]
pub struct Draws(u64);

impl Draws {
    pub fn new(seed: u64) -> Draws {
        Draws(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// True with probability `pct` percent.
    fn chance(&mut self, pct: f64) -> bool {
        // 53 bits of the draw make a uniform number in [0, 100).
        pct > 0.0 && ((self.next() >> 11) as f64 / (1u64 << 53) as f64) * 100.0 < pct
    }

    /// Uniform in [0, n].
    fn up_to(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % (n + 1)
        }
    }
}

impl Impairment {
    /// Checks the shares and the sizes; the message names the bad one.
    pub fn validate(&self) -> Result<(), String> {
        for (name, pct) in [
            ("loss-pct", self.loss_pct),
            ("reorder-pct", self.reorder_pct),
        ] {
            if !(0.0..=100.0).contains(&pct) {
                return Err(format!("--{name} must be within 0-100, got {pct}"));
            }
        }
        const DELAY_US_MAX: u64 = 60_000_000;
        for (name, us) in [
            ("delay-us", self.delay_us),
            ("jitter-us", self.jitter_us),
            ("reorder-extra-us", self.reorder_extra_us),
        ] {
            if us > DELAY_US_MAX {
                return Err(format!("--{name} must be at most {DELAY_US_MAX}, got {us}"));
            }
        }
        Ok(())
    }

    /// Whether every packet is passed on at once, untouched (nothing to hold).
    pub fn passes_through(&self) -> bool {
        self.delay_us == 0 && self.jitter_us == 0 && self.loss_pct == 0.0 && self.reorder_pct == 0.0
    }

    /// Decides the fate of a packet queued at `now_us`.
    pub fn decide(&self, now_us: u64, draws: &mut Draws, counters: &mut Counters) -> Decision {
        counters.queued += 1;
        if draws.chance(self.loss_pct) {
            counters.dropped += 1;
            return Decision::Drop;
        }
        let jitter = draws.up_to(2 * self.jitter_us);
        let mut delay = (self.delay_us + jitter).saturating_sub(self.jitter_us);
        let reordered = draws.chance(self.reorder_pct);
        if reordered {
            delay += self.reorder_extra_us;
            counters.reordered += 1;
        }
        if delay > 0 {
            counters.delayed += 1;
        }
        Decision::Release {
            at_us: now_us + delay,
            reordered,
        }
    }
}

/// The packets held for release, earliest first (in arrival order among equal times, so a
/// constant delay keeps a link's order), at most `held_max` of them.
pub struct Held<T> {
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    slots: Vec<Option<T>>,
    free: Vec<usize>,
    seq: u64,
    held_max: usize,
}

impl<T> Held<T> {
    pub fn new(held_max: usize) -> Held<T> {
        Held {
            heap: BinaryHeap::with_capacity(held_max),
            slots: Vec::with_capacity(held_max),
            free: Vec::new(),
            seq: 0,
            held_max,
        }
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Holds `packet` until `at_us`; gives it back when `held_max` packets are held already
    /// (the caller drops it and counts it in [`Counters::dropped_full`]).
    pub fn hold(&mut self, at_us: u64, packet: T) -> Result<(), T> {
        if self.heap.len() >= self.held_max {
            return Err(packet);
        }
        let slot = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(packet);
                i
            }
            None => {
                self.slots.push(Some(packet));
                self.slots.len() - 1
            }
        };
        // The sequence number orders equal release times by arrival; the slot rides in its
        // low bits' place in a second key so the heap holds plain integers.
        self.heap
            .push(Reverse((at_us, (self.seq << 20) | slot as u64)));
        self.seq += 1;
        Ok(())
    }

    /// When the next packet is due, if any is held.
    pub fn next_due_us(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse((at, _))| *at)
    }

    /// The next packet due at or before `now_us`.
    pub fn pop_due(&mut self, now_us: u64) -> Option<T> {
        match self.heap.peek() {
            Some(Reverse((at, _))) if *at <= now_us => self.pop(),
            _ => None,
        }
    }

    /// The next packet in release order, due or not (for releasing everything at exit).
    pub fn pop(&mut self) -> Option<T> {
        let Reverse((_, key)) = self.heap.pop()?;
        let slot = (key & ((1 << 20) - 1)) as usize;
        self.free.push(slot);
        self.slots[slot].take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(delay_us: u64, jitter_us: u64, loss_pct: f64, reorder_pct: f64) -> Impairment {
        Impairment {
            delay_us,
            jitter_us,
            loss_pct,
            reorder_pct,
            reorder_extra_us: 5_000,
        }
    }

    #[test]
    fn a_constant_delay_releases_every_packet_that_long_after_it_came_in_order() {
        let l = link(1_000, 0, 0.0, 0.0);
        let mut draws = Draws::new(1);
        let mut c = Counters::default();
        let mut held = Held::new(100);
        for i in 0..10u64 {
            let d = l.decide(i * 10, &mut draws, &mut c);
            assert_eq!(
                d,
                Decision::Release {
                    at_us: i * 10 + 1_000,
                    reordered: false
                }
            );
            held.hold(i * 10 + 1_000, i).unwrap();
        }
        assert_eq!(held.pop_due(999), None);
        let out: Vec<u64> = std::iter::from_fn(|| held.pop_due(2_000)).collect();
        assert_eq!(out, (0..10).collect::<Vec<_>>());
        assert_eq!(c.queued, 10);
        assert_eq!(c.delayed, 10);
        assert_eq!((c.dropped, c.reordered), (0, 0));
    }

    #[test]
    fn jitter_keeps_every_delay_within_the_band_either_side() {
        let l = link(1_000, 200, 0.0, 0.0);
        let mut draws = Draws::new(7);
        let mut c = Counters::default();
        let (mut lo, mut hi) = (u64::MAX, 0);
        for _ in 0..10_000 {
            let Decision::Release { at_us, .. } = l.decide(0, &mut draws, &mut c) else {
                panic!("nothing is lost without loss");
            };
            lo = lo.min(at_us);
            hi = hi.max(at_us);
        }
        assert!((800..=1_200).contains(&lo) && (800..=1_200).contains(&hi));
        // Both ends of the band are reached in 10,000 draws over 401 values.
        assert_eq!((lo, hi), (800, 1_200));
    }

    #[test]
    fn jitter_larger_than_the_delay_never_releases_before_the_packet_came() {
        let l = link(10, 100, 0.0, 0.0);
        let mut draws = Draws::new(3);
        let mut c = Counters::default();
        for _ in 0..1_000 {
            let Decision::Release { at_us, .. } = l.decide(500, &mut draws, &mut c) else {
                panic!("nothing is lost without loss");
            };
            assert!((500..=610).contains(&at_us));
        }
    }

    #[test]
    fn loss_drops_about_its_share_and_counts_every_drop() {
        let l = link(0, 0, 20.0, 0.0);
        let mut draws = Draws::new(11);
        let mut c = Counters::default();
        let drops = (0..100_000)
            .filter(|_| l.decide(0, &mut draws, &mut c) == Decision::Drop)
            .count() as u64;
        assert_eq!(c.dropped, drops);
        assert_eq!(c.queued, 100_000);
        // 20% of 100,000 draws, within ten standard deviations (σ ≈ 126).
        assert!((18_700..=21_300).contains(&drops), "{drops}");
        assert_eq!(c.delayed, 0, "no delay was asked for");
    }

    #[test]
    fn reordered_packets_are_passed_by_the_ones_sent_after_them() {
        let l = link(100, 0, 0.0, 30.0);
        let mut draws = Draws::new(5);
        let mut c = Counters::default();
        let mut held = Held::new(1_000);
        for i in 0..1_000u64 {
            match l.decide(i, &mut draws, &mut c) {
                Decision::Release { at_us, reordered } => {
                    assert_eq!(at_us, i + 100 + if reordered { 5_000 } else { 0 });
                    held.hold(at_us, i).unwrap();
                }
                Decision::Drop => panic!("nothing is lost without loss"),
            }
        }
        let out: Vec<u64> = std::iter::from_fn(|| held.pop()).collect();
        let passed = out.windows(2).filter(|w| w[0] > w[1]).count();
        assert!(passed > 0, "some packets were passed");
        assert!((200..=400).contains(&c.reordered), "{}", c.reordered);
        let mut sorted = out.clone();
        sorted.sort();
        assert_eq!(sorted, (0..1_000).collect::<Vec<_>>(), "each packet once");
    }

    #[test]
    fn held_gives_the_packet_back_beyond_its_limit_and_takes_more_once_one_left() {
        let mut held = Held::new(2);
        held.hold(10, 'a').unwrap();
        held.hold(5, 'b').unwrap();
        assert_eq!(held.hold(1, 'c'), Err('c'));
        assert_eq!(held.next_due_us(), Some(5));
        assert_eq!(held.pop_due(7), Some('b'));
        assert_eq!(held.pop_due(7), None);
        held.hold(8, 'd').unwrap();
        assert_eq!(held.len(), 2);
        assert_eq!(held.pop(), Some('d'));
        assert_eq!(held.pop(), Some('a'));
        assert!(held.is_empty());
    }

    #[test]
    fn the_same_seed_makes_the_same_decisions() {
        let l = link(100, 50, 10.0, 10.0);
        let run = |seed| {
            let mut draws = Draws::new(seed);
            let mut c = Counters::default();
            (0..1_000)
                .map(|i| l.decide(i, &mut draws, &mut c))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }

    #[test]
    fn out_of_range_shares_and_delays_are_refused_by_name() {
        let mut l = link(0, 0, 101.0, 0.0);
        assert!(l.validate().unwrap_err().contains("--loss-pct"));
        l.loss_pct = 0.0;
        l.reorder_pct = -1.0;
        assert!(l.validate().unwrap_err().contains("--reorder-pct"));
        l.reorder_pct = 0.0;
        l.delay_us = 61_000_000;
        assert!(l.validate().unwrap_err().contains("--delay-us"));
        l.delay_us = 0;
        assert!(l.validate().is_ok());
        assert!(l.passes_through());
    }
}
