//! [`NodeHooks`]: the few observation points inside a node that its monitor cannot get from
//! outside (openraft's metrics, the journal's counters, the committed stream).
//!
//! - t2, a request handed to the batcher: one request in `sample_every` (per thread, a plain
//!   countdown; nothing at all while no monitor turned sampling on) carries the moment it was
//!   queued. When the batch holding it is answered, the batch's log index and that moment are
//!   kept in a small bounded ring ([`Handoff`]); the monitor matches the index with the
//!   journal's append time (t3) to get the t2→t3 leg (queue wait, proposal, append).
//! - The commit index on a follower: openraft does not report it, so the node keeps the
//!   highest `leader_commit` it received in an AppendEntries request (one atomic maximum).
//!
//! The batcher queue depth and the snapshot build time are read elsewhere
//! ([`crate::Node::batcher_queue_depth`], [`crate::StateMachineStore::snapshot_build_times`]).

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Handoffs kept for the monitor at most; older ones are dropped when it does not drain.
pub const HANDOFFS_KEPT_MAX: usize = 1_024;

/// A sampled request's batch: its log index, when the request was handed to the batcher
/// (t2), and when the batch's answer came back from openraft (committed and applied).
#[derive(Clone, Copy, Debug)]
pub struct Handoff {
    pub index: u64,
    pub queued_at: Instant,
    pub answered_at: Instant,
}

thread_local! {
    /// Requests left before the next sampled one, per thread (no shared write per request).
    static COUNTDOWN: Cell<u32> = const { Cell::new(1) };
}

/// The node's hooks, shared by its tasks. All methods are cheap and never block for long.
#[derive(Debug, Default)]
pub struct NodeHooks {
    /// 0: sampling off (the default until a monitor asks for it).
    sample_every: AtomicU32,
    /// The highest `leader_commit` received, plus one (0: none yet).
    leader_commit_plus_one: AtomicU64,
    handoffs: Mutex<VecDeque<Handoff>>,
}

impl NodeHooks {
    /// Samples one request in `every` for t2 (0 turns sampling off).
    pub fn set_sample_every(&self, every: u32) {
        self.sample_every.store(every, Ordering::Relaxed);
    }

    /// Whether to stamp this request's t2: the moment, for one request in `sample_every`.
    #[inline]
    pub fn sample_t2(&self) -> Option<Instant> {
        let every = self.sample_every.load(Ordering::Relaxed);
        if every == 0 {
            return None;
        }
        COUNTDOWN.with(|c| {
            let left = c.get();
            if left <= 1 {
                c.set(every);
                Some(Instant::now())
            } else {
                c.set(left - 1);
                None
            }
        })
    }

    /// Keeps a sampled request's batch index and t2 for the monitor.
    pub fn on_answered(&self, index: u64, queued_at: Instant) {
        let answered_at = Instant::now();
        if let Ok(mut h) = self.handoffs.lock() {
            if h.len() >= HANDOFFS_KEPT_MAX {
                h.pop_front();
            }
            h.push_back(Handoff {
                index,
                queued_at,
                answered_at,
            });
        }
    }

    /// The handoffs kept since the last call, oldest first.
    pub fn take_handoffs(&self) -> Vec<Handoff> {
        self.handoffs
            .lock()
            .map(|mut h| h.drain(..).collect())
            .unwrap_or_default()
    }

    /// Notes the leader's commit index carried by an AppendEntries request.
    #[inline]
    pub fn on_leader_commit(&self, index: Option<u64>) {
        if let Some(i) = index {
            self.leader_commit_plus_one
                .fetch_max(i.saturating_add(1), Ordering::Relaxed);
        }
    }

    /// The highest commit index a leader told this node (`None`: never told).
    pub fn leader_commit(&self) -> Option<u64> {
        self.leader_commit_plus_one
            .load(Ordering::Relaxed)
            .checked_sub(1)
    }
}

/// The highest log index a majority of `members` matched (`None`: no majority matched any).
pub fn quorum_index(members: usize, matched: &[(u64, Option<u64>)]) -> Option<u64> {
    if members == 0 {
        return None;
    }
    let mut m: Vec<u64> = matched.iter().filter_map(|(_, i)| *i).collect();
    m.sort_unstable_by(|a, b| b.cmp(a));
    m.get(members / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_is_off_until_asked_then_one_in_n() {
        let h = NodeHooks::default();
        assert!((0..100).all(|_| h.sample_t2().is_none()));
        h.set_sample_every(4);
        let n = (0..100).filter(|_| h.sample_t2().is_some()).count();
        assert_eq!(n, 25);
    }

    #[test]
    fn leader_commit_only_rises_and_handoffs_are_bounded() {
        let h = NodeHooks::default();
        assert_eq!(h.leader_commit(), None);
        h.on_leader_commit(Some(0));
        assert_eq!(h.leader_commit(), Some(0));
        h.on_leader_commit(Some(9));
        h.on_leader_commit(Some(4));
        h.on_leader_commit(None);
        assert_eq!(h.leader_commit(), Some(9));
        let t = Instant::now();
        for i in 0..(HANDOFFS_KEPT_MAX as u64 + 10) {
            h.on_answered(i, t);
        }
        let taken = h.take_handoffs();
        assert_eq!(taken.len(), HANDOFFS_KEPT_MAX);
        assert_eq!(taken[0].index, 10, "the oldest are dropped");
        assert!(h.take_handoffs().is_empty());
    }

    #[test]
    fn quorum_index_is_the_majority_th_highest_match() {
        let m = [(1, Some(10)), (2, Some(7)), (3, None)];
        assert_eq!(quorum_index(3, &m), Some(7));
        assert_eq!(quorum_index(3, &[(1, Some(10))]), None);
        assert_eq!(quorum_index(1, &[(1, Some(4))]), Some(4));
    }
}
