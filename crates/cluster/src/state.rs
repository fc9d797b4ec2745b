//! The replicated state: one trading core plus the idempotency table, applied only from
//! committed log entries.
//!
//! The idempotency table (per client: the last applied `request_seq` and the encoded events it
//! produced) is part of the state, of its snapshot and of its hash, so every replica, a
//! restarted node and a node that installed a snapshot answer a retried request the same way:
//! from the table, without applying it again.
//!
//! Hash checkpoints. Every replica takes one at the same log indexes and the leader's are
//! compared with the followers' (hash entries). A checkpoint is not a hash of the whole state
//! (at a million accounts encoding the state takes seconds, and checkpoints come every
//! thousand entries): it is the *output digest*, a hash chain over every answer the state
//! machine gave (client, sequence number, outcome kind, and the core's events), folded at the
//! checkpoint with the log index, the engine's counters and the session count. It costs a
//! few nanoseconds per answer. Replicas that applied a different command, applied one twice,
//! refused one the other applied, or whose cores answered differently have different digests
//! from that entry on. The digest is part of the state (and of the snapshot), so a replica that
//! restored or installed a snapshot continues the same chain. The full state hash
//! ([`ReplicatedState::state_hash`]) remains for snapshots, status and tests.
//!
//! Snapshot bytes (the state hash is xxh3-64 of them):
//!
//! ```text
//! magic "BRSTATE2", engine_len u32, engine snapshot, session count u64,
//! sessions sorted by client id: client_id u64, last_seq u64, events_len u32, events,
//! output digest u64,
//! [only when the core publishes market data: the feed's numbering,
//!  `crate::marketdata::FeedNumbering::encode`]
//! ```
//!
//! The market data numbering is deterministic (a function of the applied entries and the
//! `[marketdata]` settings every node shares), so it is part of the hash like the rest.

use std::collections::{BTreeMap, VecDeque};

use bourse_core::codec::{DecodeError, Reader, Writer};
use bourse_core::Event;
use bourse_engine::{Engine, EngineConfig};
use serde::{Deserialize, Serialize};

use crate::batch::{encode_events, ClientRequest, EVENTS_SIZE_BYTES_MAX};

/// Clients the table remembers; requests from further new clients are refused (a fixed limit
/// keeps the refusal deterministic, unlike eviction by time).
pub const SESSIONS_MAX: usize = 100_000;
/// Hash checkpoints a replica keeps to compare with the leader's hash entries.
pub const CHECKPOINTS_KEPT_MAX: usize = 64;
/// The largest engine snapshot accepted inside a state snapshot.
pub const ENGINE_SNAPSHOT_SIZE_BYTES_MAX: usize = 1 << 31;

const MAGIC: &[u8; 8] = b"BRSTATE2";

/// How one request of a batch was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OutcomeKind {
    /// Applied now, in this entry.
    Applied,
    /// Applied earlier under the same key; `events` are the ones it produced then.
    Duplicate,
    /// Older than the client's last applied request: its answer is no longer kept. The command
    /// was applied once, earlier.
    Stale,
    /// The session table is full; the command was not applied.
    Refused,
    /// The request skips sequence numbers: its client's next request must be `expected`
    /// (pipelined requests before it were dropped on the way, by a full queue or a lost
    /// leader). The command was not applied; the client resubmits from `expected`, in order.
    Gap { expected: u64 },
}

/// The answer to one request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    pub client_id: u64,
    pub request_seq: u64,
    pub kind: OutcomeKind,
    /// The command's events in the fixed-width codec of `events.rs`. Serialized as one byte
    /// string (bincode writes the same bytes as for a `Vec<u8>`, but in one copy rather than
    /// one call per byte).
    #[serde(with = "crate::net::bytes_field")]
    pub events: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Session {
    last_seq: u64,
    events: Vec<u8>,
}

/// A hash entry disagreed with this replica's own hash at the same index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Divergence {
    pub index: u64,
    pub local_hash: u64,
    pub leader_hash: u64,
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "state hash mismatch after log index {}: this replica {:016x}, leader {:016x}",
            self.index, self.local_hash, self.leader_hash
        )
    }
}

/// The engine and the idempotency table.
pub struct ReplicatedState {
    engine: Engine,
    sessions: BTreeMap<u64, Session>,
    /// (log index, state hash) taken every `checkpoint_every_entries`; not part of the state.
    checkpoints: VecDeque<(u64, u64)>,
    checkpoint_every_entries: u64,
    events: Vec<Event>,
    commands_applied: u64,
    /// Hash entries this process compared with its own checkpoint (and found equal).
    hash_checks_passed: u64,
    /// The output digest (see the module documentation): part of the state.
    digest: u64,
    /// The market data feed's numbering, when the core publishes market data.
    marketdata: Option<crate::marketdata::FeedNumbering>,
}

impl ReplicatedState {
    pub fn new(config: EngineConfig, checkpoint_every_entries: u64) -> ReplicatedState {
        assert!(checkpoint_every_entries > 0);
        ReplicatedState {
            engine: Engine::new(config),
            sessions: BTreeMap::new(),
            checkpoints: VecDeque::new(),
            checkpoint_every_entries,
            events: Vec::with_capacity(256),
            commands_applied: 0,
            hash_checks_passed: 0,
            digest: 0,
            marketdata: None,
        }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Commands this process applied to the engine (not counting duplicates).
    pub fn commands_applied(&self) -> u64 {
        self.commands_applied
    }

    /// Hash entries compared with this replica's own checkpoint and found equal.
    pub fn hash_checks_passed(&self) -> u64 {
        self.hash_checks_passed
    }

    /// The last request applied for `client_id`, if any.
    pub fn last_seq(&self, client_id: u64) -> Option<u64> {
        self.sessions.get(&client_id).map(|s| s.last_seq)
    }

    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// Applies the requests of one committed batch, each at most once per idempotency key.
    pub fn apply_batch(&mut self, requests: &[ClientRequest], out: &mut Vec<Outcome>) {
        for request in requests {
            let outcome = self.apply_request(request);
            self.fold(&outcome);
            out.push(outcome);
        }
        if let Some(md) = &mut self.marketdata {
            md.end_entry(&self.engine);
        }
    }

    /// Keeps the market data feed's numbering in the state from now on (see
    /// `crate::marketdata::FeedNumbering`). Only a fresh state takes it, before its first
    /// entry; a restored state brings its own (or none, if it was taken without market data).
    pub fn enable_marketdata(&mut self, config: &bourse_marketdata::PublisherConfig) {
        if self.marketdata.is_none() && self.engine.counters().commands == 0 {
            self.marketdata = Some(crate::marketdata::FeedNumbering::new(config));
        }
    }

    /// The market data feed's numbering, if the state keeps it.
    pub fn marketdata(&self) -> Option<&crate::marketdata::FeedNumbering> {
        self.marketdata.as_ref()
    }

    /// Chains one answer into the output digest (no allocation: a fixed header, then the
    /// events' bytes, each hashed with the running digest as the seed).
    fn fold(&mut self, outcome: &Outcome) {
        let (kind, expected) = match outcome.kind {
            OutcomeKind::Applied => (1u64, 0u64),
            OutcomeKind::Duplicate => (2, 0),
            OutcomeKind::Stale => (3, 0),
            OutcomeKind::Refused => (4, 0),
            OutcomeKind::Gap { expected } => (5, expected),
        };
        let mut header = [0u8; 32];
        header[0..8].copy_from_slice(&outcome.client_id.to_le_bytes());
        header[8..16].copy_from_slice(&outcome.request_seq.to_le_bytes());
        header[16..24].copy_from_slice(&kind.to_le_bytes());
        header[24..32].copy_from_slice(&expected.to_le_bytes());
        let seed = xxhash_rust::xxh3::xxh3_64_with_seed(&header, self.digest);
        self.digest = xxhash_rust::xxh3::xxh3_64_with_seed(&outcome.events, seed);
    }

    /// The checkpoint value at log `index`: the output digest folded with the index, the
    /// engine's counters and the session count (each O(1) to read).
    pub fn checkpoint_hash(&self, index: u64) -> u64 {
        let c = self.engine.counters();
        let words = [
            index,
            c.commands,
            c.orders_accepted,
            c.orders_rejected,
            c.trades,
            c.cancels,
            c.replaces,
            c.expiries,
            c.volume_lots as u64,
            (c.volume_lots >> 64) as u64,
            self.sessions.len() as u64,
        ];
        let mut buf = [0u8; 8 * 11];
        for (i, w) in words.iter().enumerate() {
            buf[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        xxhash_rust::xxh3::xxh3_64_with_seed(&buf, self.digest)
    }

    fn apply_request(&mut self, request: &ClientRequest) -> Outcome {
        let outcome = |kind, events| Outcome {
            client_id: request.client_id,
            request_seq: request.request_seq,
            kind,
            events,
        };
        match self.sessions.get(&request.client_id) {
            Some(s) if request.request_seq == s.last_seq => {
                return outcome(OutcomeKind::Duplicate, s.events.clone())
            }
            Some(s) if request.request_seq < s.last_seq => {
                return outcome(OutcomeKind::Stale, Vec::new())
            }
            // Applying N+1 while N is missing would reorder one client's commands; refusing
            // it keeps each client's commands gapless and in its own order.
            Some(s) if request.request_seq > s.last_seq + 1 => {
                return outcome(
                    OutcomeKind::Gap {
                        expected: s.last_seq + 1,
                    },
                    Vec::new(),
                )
            }
            None if self.sessions.len() >= SESSIONS_MAX => {
                return outcome(OutcomeKind::Refused, Vec::new())
            }
            None if request.request_seq != 1 => {
                return outcome(OutcomeKind::Gap { expected: 1 }, Vec::new())
            }
            _ => {}
        }
        self.events.clear();
        self.engine.apply(&request.command, &mut self.events);
        if let Some(md) = &mut self.marketdata {
            md.push_events(&self.events);
        }
        self.commands_applied += 1;
        let events = encode_events(&self.events);
        assert!(events.len() <= EVENTS_SIZE_BYTES_MAX);
        self.sessions.insert(
            request.client_id,
            Session {
                last_seq: request.request_seq,
                events: events.clone(),
            },
        );
        outcome(OutcomeKind::Applied, events)
    }

    /// Called after every applied log entry (of any kind): takes a hash checkpoint at every
    /// multiple of `checkpoint_every_entries`, the same indexes on every replica.
    pub fn entry_applied(&mut self, index: u64) {
        if let Some(md) = &mut self.marketdata {
            md.entry_applied(index);
        }
        if index.is_multiple_of(self.checkpoint_every_entries) {
            let hash = self.checkpoint_hash(index);
            if self.checkpoints.len() == CHECKPOINTS_KEPT_MAX {
                self.checkpoints.pop_front();
            }
            self.checkpoints.push_back((index, hash));
        }
    }

    /// The newest checkpoint, which a leader puts in a hash entry.
    pub fn last_checkpoint(&self) -> Option<(u64, u64)> {
        self.checkpoints.back().copied()
    }

    /// Compares a leader's hash with this replica's hash at the same index, if it has one.
    pub fn check_hash(&mut self, index: u64, leader_hash: u64) -> Result<bool, Divergence> {
        match self.checkpoints.iter().find(|(i, _)| *i == index) {
            Some(&(_, local_hash)) if local_hash != leader_hash => Err(Divergence {
                index,
                local_hash,
                leader_hash,
            }),
            Some(_) => {
                self.hash_checks_passed += 1;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The state's canonical bytes.
    pub fn snapshot(&self) -> Vec<u8> {
        let engine = self.engine.snapshot();
        let mut w = Writer::with_capacity(engine.len() + 64 + self.sessions.len() * 64);
        w.buf.extend_from_slice(MAGIC);
        w.bytes(&engine);
        w.u64(self.sessions.len() as u64);
        for (client_id, s) in &self.sessions {
            w.u64(*client_id);
            w.u64(s.last_seq);
            w.bytes(&s.events);
        }
        w.u64(self.digest);
        if let Some(md) = &self.marketdata {
            md.encode(&mut w);
        }
        w.finish()
    }

    /// xxh3-64 of the snapshot bytes: equal on every replica after the same log prefix.
    pub fn state_hash(&self) -> u64 {
        xxhash_rust::xxh3::xxh3_64(&self.snapshot())
    }

    /// Rebuilds the state from [`ReplicatedState::snapshot`] bytes.
    pub fn restore(
        bytes: &[u8],
        checkpoint_every_entries: u64,
    ) -> Result<ReplicatedState, DecodeError> {
        assert!(checkpoint_every_entries > 0);
        let r = Reader::new(bytes);
        if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
            return Err(r.error("not a replicated state snapshot"));
        }
        let mut r = Reader::new(&bytes[MAGIC.len()..]);
        let engine_bytes = r.bytes(ENGINE_SNAPSHOT_SIZE_BYTES_MAX)?;
        let engine = Engine::restore(engine_bytes).map_err(|_| DecodeError {
            offset: MAGIC.len(),
            what: "engine snapshot does not restore",
        })?;
        let count = r.count(20)?;
        if count > SESSIONS_MAX {
            return Err(r.error("more sessions than allowed"));
        }
        let mut sessions = BTreeMap::new();
        let mut previous: Option<u64> = None;
        for _ in 0..count {
            let client_id = r.u64()?;
            if previous.is_some_and(|p| p >= client_id) {
                return Err(r.error("sessions out of order"));
            }
            previous = Some(client_id);
            let last_seq = r.u64()?;
            let events = r.bytes(EVENTS_SIZE_BYTES_MAX)?.to_vec();
            sessions.insert(client_id, Session { last_seq, events });
        }
        let digest = r.u64()?;
        // Anything after the digest is the market data numbering.
        let marketdata = if r.remaining() > 0 {
            Some(crate::marketdata::FeedNumbering::decode(&mut r)?)
        } else {
            None
        };
        r.expect_end()?;
        Ok(ReplicatedState {
            engine,
            sessions,
            checkpoints: VecDeque::new(),
            checkpoint_every_entries,
            events: Vec::with_capacity(256),
            commands_applied: 0,
            hash_checks_passed: 0,
            digest,
            marketdata,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bourse_core::{AccountId, AccountSpec, Cash, Command, CommandBody, FirmId};
    use bourse_core::{StpMode, StpScope};

    fn config() -> EngineConfig {
        EngineConfig {
            orders_max: 1024,
            instruments_max: 16,
            accounts_max: 1024,
            levels_per_side_hint: 8,
            first_order_id: 1,
        }
    }

    fn add_account(client_id: u64, request_seq: u64, account: u32) -> ClientRequest {
        ClientRequest {
            client_id,
            request_seq,
            command: Command::new(
                request_seq,
                CommandBody::AddAccount(AccountSpec {
                    account: AccountId(account),
                    firm: FirmId(1),
                    may_short: false,
                    stp: StpMode::None,
                    stp_scope: StpScope::Account,
                }),
            ),
        }
    }

    #[test]
    fn a_retried_request_is_answered_from_the_table_not_applied_twice() {
        let mut s = ReplicatedState::new(config(), 10);
        let mut out = Vec::new();
        s.apply_batch(&[add_account(7, 1, 100)], &mut out);
        let deposit = ClientRequest {
            client_id: 7,
            request_seq: 2,
            command: Command::new(
                2,
                CommandBody::Deposit {
                    account: AccountId(100),
                    amount: Cash(50),
                },
            ),
        };
        s.apply_batch(&[deposit.clone(), deposit.clone()], &mut out);
        assert_eq!(out[1].kind, OutcomeKind::Applied);
        assert_eq!(out[2].kind, OutcomeKind::Duplicate);
        assert_eq!(out[1].events, out[2].events);
        assert_eq!(s.engine().account(AccountId(100)).unwrap().cash, Cash(50));
        assert_eq!(s.commands_applied(), 2);
        s.apply_batch(&[add_account(7, 1, 101)], &mut out);
        assert_eq!(out[3].kind, OutcomeKind::Stale);
        assert!(s.engine().account(AccountId(101)).is_none());
    }

    #[test]
    fn snapshot_restore_keeps_the_table_and_the_hash() {
        let mut s = ReplicatedState::new(config(), 10);
        let mut out = Vec::new();
        for c in 1..5u64 {
            s.apply_batch(&[add_account(c, 1, c as u32)], &mut out);
        }
        let bytes = s.snapshot();
        let restored = ReplicatedState::restore(&bytes, 10).unwrap();
        assert_eq!(restored.state_hash(), s.state_hash());
        assert_eq!(restored.last_seq(3), Some(1));
        for cut in [0, 5, bytes.len() / 2, bytes.len() - 1] {
            assert!(ReplicatedState::restore(&bytes[..cut], 10).is_err());
        }
    }

    #[test]
    fn a_request_that_skips_a_seq_is_refused_until_the_missing_one_comes() {
        let mut s = ReplicatedState::new(config(), 10);
        let mut out = Vec::new();
        // A new client must start at 1.
        s.apply_batch(&[add_account(4, 2, 10)], &mut out);
        assert_eq!(out[0].kind, OutcomeKind::Gap { expected: 1 });
        assert!(out[0].events.is_empty());
        s.apply_batch(
            &[
                add_account(4, 1, 11),
                add_account(4, 3, 13),
                add_account(4, 2, 12),
            ],
            &mut out,
        );
        assert_eq!(out[1].kind, OutcomeKind::Applied);
        assert_eq!(out[2].kind, OutcomeKind::Gap { expected: 2 });
        assert_eq!(out[3].kind, OutcomeKind::Applied);
        assert!(s.engine().account(AccountId(13)).is_none());
        assert!(s.engine().account(AccountId(10)).is_none());
        assert_eq!(s.last_seq(4), Some(2));
        // The resubmitted 3 now applies.
        s.apply_batch(&[add_account(4, 3, 13)], &mut out);
        assert_eq!(out[4].kind, OutcomeKind::Applied);
        assert!(s.engine().account(AccountId(13)).is_some());
        assert_eq!(s.commands_applied(), 3);
    }

    #[test]
    fn the_table_is_part_of_the_hash() {
        let mut a = ReplicatedState::new(config(), 10);
        let mut b = ReplicatedState::new(config(), 10);
        let mut out = Vec::new();
        a.apply_batch(&[add_account(1, 1, 5)], &mut out);
        b.apply_batch(&[add_account(2, 1, 5)], &mut out);
        assert_eq!(a.engine().state_hash(), b.engine().state_hash());
        assert_ne!(a.state_hash(), b.state_hash());
    }

    #[test]
    fn the_checkpoint_follows_every_answer_and_a_restored_state_continues_it() {
        let mut a = ReplicatedState::new(config(), 2);
        let mut b = ReplicatedState::new(config(), 2);
        let mut out = Vec::new();
        a.apply_batch(&[add_account(1, 1, 5)], &mut out);
        b.apply_batch(&[add_account(1, 1, 5)], &mut out);
        assert_eq!(a.checkpoint_hash(2), b.checkpoint_hash(2));
        assert_ne!(
            a.checkpoint_hash(2),
            a.checkpoint_hash(4),
            "the index is folded in"
        );
        // The same request again on one replica only: the engines and tables still agree,
        // but that replica answered one more time, and the checkpoint shows it.
        a.apply_batch(&[add_account(1, 1, 5)], &mut out);
        assert_eq!(a.state_hash(), {
            let mut c = ReplicatedState::restore(&b.snapshot(), 2).unwrap();
            c.digest = a.digest;
            c.state_hash()
        });
        assert_ne!(a.checkpoint_hash(2), b.checkpoint_hash(2));
        // A state restored from a snapshot continues the chain where it was.
        let mut restored = ReplicatedState::restore(&a.snapshot(), 2).unwrap();
        a.apply_batch(&[add_account(1, 2, 6)], &mut out);
        restored.apply_batch(&[add_account(1, 2, 6)], &mut out);
        assert_eq!(a.checkpoint_hash(6), restored.checkpoint_hash(6));
        assert_eq!(a.state_hash(), restored.state_hash());
    }

    #[test]
    fn a_different_hash_at_a_checkpoint_is_a_divergence() {
        let mut s = ReplicatedState::new(config(), 2);
        s.entry_applied(1);
        s.entry_applied(2);
        let (index, hash) = s.last_checkpoint().unwrap();
        assert_eq!(index, 2);
        assert_eq!(s.check_hash(2, hash), Ok(true));
        assert_eq!(s.check_hash(4, hash), Ok(false));
        assert!(s.check_hash(2, hash ^ 1).is_err());
    }
}
