//! A node's configuration: its group's fixed voters, its timers in ticks and its limits.

use crate::types::NodeId;

/// The largest group the core accepts. Vote tallies are bit sets over voter positions, and a
/// venue's replica group has three or five members.
pub const VOTERS_MAX: usize = 9;

/// Everything the core is told; nothing here changes while it runs (no membership change:
/// the venue only ever initialises its groups' members).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// This node.
    pub id: NodeId,
    /// Every voter of the group, this node included, in ascending order without repeats.
    pub voters: Vec<NodeId>,
    /// A leader sends a heartbeat after this many ticks without one.
    pub heartbeat_ticks: u64,
    /// This node's election slot: a follower that hears no leader for a timeout drawn from
    /// `election_ticks_min..election_ticks_max` starts a pre-vote. Give each node its own
    /// slot with [`election_window_ticks`], so that the first to time out rarely ties.
    pub election_ticks_min: u64,
    pub election_ticks_max: u64,
    /// A leader that has not heard from a quorum for this many ticks steps down (check
    /// quorum). The venue uses the top of the node's slot (`election_ticks_max`).
    pub lease_ticks: u64,
    /// AppendEntries a leader keeps unanswered per follower in the replicate state.
    pub append_in_flight_max: usize,
    /// Entries in one AppendEntries.
    pub append_entries_max: usize,
    /// Bytes of entries (payload plus `ENTRY_OVERHEAD_BYTES` each) in one AppendEntries; one
    /// entry is always sent even if larger, so `entry_bytes_max` must fit.
    pub append_bytes_max: usize,
    /// The largest payload `propose` takes.
    pub entry_bytes_max: usize,
    /// Entries the leader holds appended but not committed; `propose` refuses beyond it.
    pub uncommitted_entries_max: u64,
    /// Committed entries handed to the application in one `Ready`.
    pub apply_entries_max: usize,
    /// Entries kept below a snapshot's index when the log is compacted, so that a follower
    /// lagging by fewer catches up from the log rather than by snapshot.
    pub log_kept_below_snapshot_entries: u64,
    /// A follower that was sent a snapshot and has not answered is offered it again after
    /// this many ticks (the message may have been lost).
    pub snapshot_retry_ticks: u64,
}

/// Why a configuration was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    VotersEmpty,
    VotersTooMany { count: usize },
    VotersUnsorted,
    SelfNotVoter,
    HeartbeatNotBelowElection,
    ElectionWindowEmpty,
    LeaseZero,
    LimitZero { name: &'static str },
    EntryLargerThanAppend,
}

impl Config {
    /// A configuration with the venue's shape: with one tick a millisecond these are its
    /// defaults (heartbeat 50 ms, elections 150-300 ms split into slots, 4 appends in flight).
    pub fn with_defaults(id: NodeId, voters: Vec<NodeId>) -> Self {
        let (election_ticks_min, election_ticks_max) = election_window_ticks(&voters, id, 150, 300);
        Config {
            id,
            voters,
            heartbeat_ticks: 50,
            election_ticks_min,
            election_ticks_max,
            lease_ticks: election_ticks_max,
            append_in_flight_max: 4,
            append_entries_max: 256,
            append_bytes_max: 1 << 20,
            entry_bytes_max: (1 << 20) - crate::types::ENTRY_OVERHEAD_BYTES,
            uncommitted_entries_max: 4096,
            apply_entries_max: 1024,
            log_kept_below_snapshot_entries: 1000,
            snapshot_retry_ticks: 1000,
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.voters.is_empty() {
            return Err(ConfigError::VotersEmpty);
        }
        if self.voters.len() > VOTERS_MAX {
            return Err(ConfigError::VotersTooMany {
                count: self.voters.len(),
            });
        }
        if self.voters.windows(2).any(|w| w[0] >= w[1]) {
            return Err(ConfigError::VotersUnsorted);
        }
        if !self.voters.contains(&self.id) {
            return Err(ConfigError::SelfNotVoter);
        }
        if self.election_ticks_min >= self.election_ticks_max {
            return Err(ConfigError::ElectionWindowEmpty);
        }
        if self.heartbeat_ticks == 0 || self.heartbeat_ticks >= self.election_ticks_min {
            return Err(ConfigError::HeartbeatNotBelowElection);
        }
        if self.lease_ticks == 0 {
            return Err(ConfigError::LeaseZero);
        }
        for (name, value) in [
            ("append_in_flight_max", self.append_in_flight_max),
            ("append_entries_max", self.append_entries_max),
            ("append_bytes_max", self.append_bytes_max),
            ("entry_bytes_max", self.entry_bytes_max),
            ("apply_entries_max", self.apply_entries_max),
            (
                "uncommitted_entries_max",
                self.uncommitted_entries_max as usize,
            ),
            ("snapshot_retry_ticks", self.snapshot_retry_ticks as usize),
        ] {
            if value == 0 {
                return Err(ConfigError::LimitZero { name });
            }
        }
        if self.entry_bytes_max + crate::types::ENTRY_OVERHEAD_BYTES > self.append_bytes_max {
            return Err(ConfigError::EntryLargerThanAppend);
        }
        Ok(())
    }

    /// Votes that make a decision: a majority of the voters.
    pub fn quorum(&self) -> usize {
        self.voters.len() / 2 + 1
    }

    /// This node's position among the voters (the bit it has in a tally).
    pub fn position(&self, id: NodeId) -> Option<usize> {
        self.voters.binary_search(&id).ok()
    }
}

/// Node `id`'s slot of the range `range_min..range_max` (ticks), in the order of ids, as
/// `ClusterConfig::election_window_ms` computes it today: the range is split into one slot
/// per voter and each node draws from the first three fifths of its own, so that the lowest
/// live id times out first and the others are still waiting when its vote requests arrive.
pub fn election_window_ticks(
    voters: &[NodeId],
    id: NodeId,
    range_min: u64,
    range_max: u64,
) -> (u64, u64) {
    assert!(range_min < range_max, "an election range needs room");
    let rank = voters.iter().filter(|&&n| n < id).count() as u64;
    let slots = (voters.len() as u64).max(1);
    let slot_ticks = (range_max - range_min) / slots;
    let width_ticks = (slot_ticks * 3 / 5).max(1);
    let min_ticks = range_min + rank * slot_ticks;
    (min_ticks, min_ticks + width_ticks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_order_of_ids_and_do_not_overlap() {
        let voters = [1, 2, 3];
        assert_eq!(election_window_ticks(&voters, 1, 150, 300), (150, 180));
        assert_eq!(election_window_ticks(&voters, 2, 150, 300), (200, 230));
        assert_eq!(election_window_ticks(&voters, 3, 150, 300), (250, 280));
    }

    #[test]
    fn defaults_validate_and_bad_configs_are_named() {
        let config = Config::with_defaults(2, vec![1, 2, 3]);
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.quorum(), 2);
        let mut bad = config.clone();
        bad.voters = vec![3, 1, 2];
        assert_eq!(bad.validate(), Err(ConfigError::VotersUnsorted));
        let mut bad = config.clone();
        bad.id = 9;
        assert_eq!(bad.validate(), Err(ConfigError::SelfNotVoter));
        let mut bad = config.clone();
        bad.append_in_flight_max = 0;
        assert_eq!(
            bad.validate(),
            Err(ConfigError::LimitZero {
                name: "append_in_flight_max"
            })
        );
        let mut bad = config;
        bad.heartbeat_ticks = bad.election_ticks_min;
        assert_eq!(bad.validate(), Err(ConfigError::HeartbeatNotBelowElection));
    }
}
