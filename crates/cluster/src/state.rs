//! The replicated state: one trading core plus the idempotency table, applied only from
//! committed log entries.
//!
//! The idempotency table (per client: the last applied `request_seq`, the log index of the
//! entry that applied it and the xxh3-64 of its encoded events) is part of the state, of its
//! snapshot and of its hash, so every replica, a restarted node and a node that installed a
//! snapshot answer a retried request the same way: from the table, without applying it again.
//! The table keeps no events: a command's events are published once, on the committed stream
//! at the index that applied it, and a duplicate's answer names that index.
//!
//! Hash checkpoints. Every replica takes one at the same log indexes and the leader's are
//! compared with the followers' (hash entries). A checkpoint hashes the state itself, at O(1)
//! cost, from digests kept up to date as the state changes rather than by encoding it (at a
//! million accounts encoding takes over a second, and checkpoints come every thousand
//! entries): the trading core's state digest (`Engine::state_digest`, a multiset hash over
//! every resting order with its queue position, account, position and book, plus the core's
//! numbers and counters), the idempotency table's digest
//! ([`ReplicatedState::sessions_digest`]) and size, the market data numbering (its last
//! index and each channel's next MsgSeqNum) and the log index. It is seeded with the
//! *output digest*, a hash chain over every answer the state machine gave (client, sequence
//! number, outcome kind, and the core's events), which costs a few nanoseconds per answer and
//! also catches replicas whose states agree but whose answers did not. Replicas whose states
//! differ in anything, or that answered differently, have different checkpoints. The state
//! digests are recomputed on restore and the output digest is part of the snapshot, so a
//! replica that restored or installed a snapshot checkpoints exactly as the others. The full
//! state hash ([`ReplicatedState::state_hash`]) remains for snapshots, status and tests.
//!
//! Snapshot bytes (the state hash is xxh3-64 of them):
//!
//! ```text
//! magic "BRSTATE2", engine_len u32, engine snapshot, session count u64,
//! sessions sorted by client id: client_id u64, last_seq u64, applied_index u64,
//!   events_hash u64,
//! output digest u64,
//! [only when the core publishes market data: the feed's numbering,
//!  `crate::marketdata::FeedNumbering::encode`]
//! ```
//!
//! The market data numbering is deterministic (a function of the applied entries and the
//! `[marketdata]` settings every node shares), so it is part of the hash like the rest.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use bourse_core::codec::{
    decode_command, encode_events, DecodeError, Reader, Writer, EVENTS_SIZE_BYTES_MAX,
};
use bourse_core::Event;
use bourse_engine::{Engine, EngineConfig};
use serde::{Deserialize, Serialize};

use crate::batch::{AuditRef, Batch, RequestRef};
use crate::stream::CommittedRequest;

/// Clients the table remembers; requests from further new clients are refused (a fixed limit
/// keeps the refusal deterministic, unlike eviction by time).
pub const SESSIONS_MAX: usize = 100_000;
/// Hash checkpoints a replica keeps to compare with the leader's hash entries.
pub const CHECKPOINTS_KEPT_MAX: usize = 64;
/// The largest engine snapshot accepted inside a state snapshot.
pub const ENGINE_SNAPSHOT_SIZE_BYTES_MAX: usize = 1 << 31;

const MAGIC: &[u8; 8] = b"BRSTATE3";

/// How one request of a batch was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OutcomeKind {
    /// Applied now, in this entry.
    Applied,
    /// Applied earlier under the same key, at the entry the answer's `applied_index` names
    /// (its events are on the committed stream there).
    Duplicate,
    /// Older than the client's last applied request: its answer is no longer kept. The command
    /// was applied once, earlier.
    Stale,
    /// The session table is full; the command was not applied.
    Refused,
    /// The command's bytes did not decode (the leader relays them after checking only their
    /// length and form byte): not applied, and the client's session is unchanged.
    Invalid,
    /// The request skips sequence numbers: its client's next request must be `expected`
    /// (pipelined requests before it were dropped on the way, by a full queue or a lost
    /// leader). The command was not applied; the client resubmits from `expected`, in order.
    Gap { expected: u64 },
}

impl OutcomeKind {
    /// The kind's code in every binary form (the stream archive, the output digest), and the
    /// expected sequence number of a gap (0 for the others).
    fn code(self) -> (u8, u64) {
        match self {
            OutcomeKind::Applied => (0, 0),
            OutcomeKind::Duplicate => (1, 0),
            OutcomeKind::Stale => (2, 0),
            OutcomeKind::Refused => (3, 0),
            OutcomeKind::Gap { expected } => (4, expected),
            OutcomeKind::Invalid => (5, 0),
        }
    }

    /// Writes the code, and a gap's expected sequence number after it.
    pub fn encode(self, w: &mut Writer) {
        let (code, expected) = self.code();
        w.u8(code);
        if let OutcomeKind::Gap { .. } = self {
            w.u64(expected);
        }
    }

    /// Reads what [`OutcomeKind::encode`] wrote.
    pub fn decode(r: &mut Reader) -> Result<OutcomeKind, DecodeError> {
        Ok(match r.u8()? {
            0 => OutcomeKind::Applied,
            1 => OutcomeKind::Duplicate,
            2 => OutcomeKind::Stale,
            3 => OutcomeKind::Refused,
            4 => OutcomeKind::Gap { expected: r.u64()? },
            5 => OutcomeKind::Invalid,
            _ => return Err(r.error("unknown outcome kind")),
        })
    }
}

/// The answer to one request: how it was answered, not what it did. Its events travel once,
/// on the committed stream at `applied_index` (`crate::stream::CommittedRequest`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    pub client_id: u64,
    pub request_seq: u64,
    pub kind: OutcomeKind,
    /// The log index of the entry that applied the command: the answering entry's for
    /// `Applied`, the first application's for `Duplicate`, 0 when it was not applied.
    pub applied_index: u64,
}

impl From<&CommittedRequest> for Outcome {
    fn from(r: &CommittedRequest) -> Outcome {
        Outcome {
            client_id: r.client_id,
            request_seq: r.request_seq,
            kind: r.kind,
            applied_index: r.applied_index,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Session {
    last_seq: u64,
    /// The log index of the entry that applied request `last_seq` (a duplicate's answer).
    applied_index: u64,
    /// xxh3-64 of the encoded events of request `last_seq`, computed once when it applied:
    /// the output digest and the session table's digest both use it, and a duplicate's answer
    /// is folded with it, as the first answer was.
    events_hash: u64,
}

/// Hashes a client id for the session table: the splitmix64 finaliser, a bijection of `u64`,
/// so distinct ids never share a hash. The table serves lookups only; nothing ever iterates it
/// in its own order into an output (the snapshot sorts by client id), so the hash function has
/// no effect on what the state says, only on how fast it finds a session.
#[derive(Default)]
struct ClientIdHasher(u64);

impl Hasher for ClientIdHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed; this keeps the hasher correct for any other input.
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        let mut z = v.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        self.0 = z ^ (z >> 31);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type SessionTable = HashMap<u64, Session, BuildHasherDefault<ClientIdHasher>>;

/// One session's term in [`ReplicatedState::sessions_digest`].
fn session_term(client_id: u64, s: &Session) -> u64 {
    let mut words = [0u8; 32];
    words[0..8].copy_from_slice(&client_id.to_le_bytes());
    words[8..16].copy_from_slice(&s.last_seq.to_le_bytes());
    words[16..24].copy_from_slice(&s.applied_index.to_le_bytes());
    words[24..32].copy_from_slice(&s.events_hash.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&words)
}

/// xxh3-64 of an empty event list (the events of answers that carry none).
fn empty_events_hash() -> u64 {
    xxhash_rust::xxh3::xxh3_64(&[])
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
    /// The idempotency table. A hash map for O(1) lookups on the apply path; it is sorted by
    /// client id only where order matters (the snapshot).
    sessions: SessionTable,
    /// Wrapping sum of [`session_term`] over the table, kept up to date on every change.
    sessions_digest: u64,
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
            sessions: SessionTable::default(),
            sessions_digest: 0,
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

    /// How many requests the engine applied under each client id since the state began, as
    /// `(client id, count)` in no particular order. A client's requests apply gapless from
    /// seq 1 (a gap, a stale or an undecodable request applies nothing and leaves its session
    /// as it was) and a session is never dropped, so its last applied seq is exactly that
    /// count; the counts sum to the engine's `commands` counter. What a deployment reads to
    /// tell who sent the commands its cores applied.
    pub fn applied_by_client(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.sessions.iter().map(|(id, s)| (*id, s.last_seq))
    }

    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// A digest of the idempotency table: the wrapping sum over its sessions of a hash of
    /// (client id, last applied `request_seq`, the index that applied it, xxh3-64 of its
    /// events). It is updated on
    /// every change of the table (O(1) per request) and recomputed from the table on restore,
    /// so two replicas with equal tables have equal digests whatever order they filled them in.
    pub fn sessions_digest(&self) -> u64 {
        self.sessions_digest
    }

    /// The digest recomputed from the whole table (what [`ReplicatedState::sessions_digest`]
    /// must always equal).
    fn recompute_sessions_digest(sessions: &SessionTable) -> u64 {
        sessions.iter().fold(0u64, |sum, (client_id, s)| {
            sum.wrapping_add(session_term(*client_id, s))
        })
    }

    /// Applies the requests of one committed batch, the log entry at `index`, each at most
    /// once per idempotency key, decoding each command (once) only when it is to be applied.
    /// Each request's answer, with the events of an applied one, goes to `out`.
    pub fn apply_batch(&mut self, batch: &Batch, index: u64, out: &mut Vec<CommittedRequest>) {
        assert!(index > 0, "log indexes start at 1");
        out.reserve(batch.len());
        for request in batch.requests() {
            let (answer, events_hash) = self.apply_request(request, index);
            self.fold(&answer, events_hash);
            out.push(answer);
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

    /// The numbering, to attach the market data thread's hand-off to it.
    pub fn marketdata_mut(&mut self) -> Option<&mut crate::marketdata::FeedNumbering> {
        self.marketdata.as_mut()
    }

    /// Chains one answer into the output digest: one hash, with the running digest as the
    /// seed, of a fixed record (client, sequence number, outcome kind, the expected sequence
    /// number of a gap, the index that applied it, and `events_hash`, the xxh3-64 of the
    /// events it applied with). The events are
    /// hashed once per answer, by the caller, which also keeps that hash in the session, so
    /// neither the table's digest nor a duplicate's answer hashes them again.
    fn fold(&mut self, outcome: &CommittedRequest, events_hash: u64) {
        debug_assert!(
            outcome.kind == OutcomeKind::Duplicate
                || events_hash == xxhash_rust::xxh3::xxh3_64(&outcome.events)
        );
        let (kind, expected) = outcome.kind.code();
        let mut record = [0u8; 48];
        record[0..8].copy_from_slice(&outcome.client_id.to_le_bytes());
        record[8..16].copy_from_slice(&outcome.request_seq.to_le_bytes());
        record[16..24].copy_from_slice(&u64::from(kind).to_le_bytes());
        record[24..32].copy_from_slice(&expected.to_le_bytes());
        record[32..40].copy_from_slice(&outcome.applied_index.to_le_bytes());
        record[40..48].copy_from_slice(&events_hash.to_le_bytes());
        self.digest = xxhash_rust::xxh3::xxh3_64_with_seed(&record, self.digest);
    }

    /// The checkpoint value at log `index`: the log index, the trading core's state digest
    /// (`Engine::state_digest`: every order, account, position, book and counter), the
    /// idempotency table's digest ([`ReplicatedState::sessions_digest`]) and size, and the
    /// market data numbering (its last applied index and each channel's next MsgSeqNum),
    /// hashed with the output digest as the seed. Each part is O(1) to read.
    pub fn checkpoint_hash(&self, index: u64) -> u64 {
        use bourse_marketdata::{Channel, CHANNEL_COUNT};
        let mut words = [0u64; 5 + CHANNEL_COUNT];
        words[0] = index;
        words[1] = self.engine.state_digest();
        words[2] = self.sessions_digest;
        words[3] = self.sessions.len() as u64;
        if let Some(md) = &self.marketdata {
            // 1 + index, so that "numbering at index 0" differs from "no numbering".
            words[4] = 1 + md.index();
            for (i, channel) in Channel::ALL.iter().enumerate() {
                words[5 + i] = md.next_seq(*channel) as u64;
            }
        }
        let mut buf = [0u8; 8 * (5 + CHANNEL_COUNT)];
        for (i, w) in words.iter().enumerate() {
            buf[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        xxhash_rust::xxh3::xxh3_64_with_seed(&buf, self.digest)
    }

    /// Answers one request of the entry at `index`: applies it (a new key) or answers from the
    /// table. Returns the answer and the xxh3-64 of the events it folds into the output digest.
    fn apply_request(&mut self, request: RequestRef, index: u64) -> (CommittedRequest, u64) {
        let answer = |kind, applied_index, events| CommittedRequest {
            client_id: request.client_id,
            request_seq: request.request_seq,
            kind,
            applied_index,
            events,
            // Who asked goes with every answer of the request, a retry's too: the stream
            // shows each log entry's requests as they were written.
            audit: request.audit.map(AuditRef::to_audit),
        };
        let refused = |kind| (answer(kind, 0, Vec::new()), empty_events_hash());
        let sessions_count = self.sessions.len();
        // One lookup: the session is updated in place when the request applies.
        let session = self.sessions.get_mut(&request.client_id);
        match &session {
            Some(s) if request.request_seq == s.last_seq => {
                let duplicate = answer(OutcomeKind::Duplicate, s.applied_index, Vec::new());
                return (duplicate, s.events_hash);
            }
            Some(s) if request.request_seq < s.last_seq => return refused(OutcomeKind::Stale),
            // Applying N+1 while N is missing would reorder one client's commands; refusing
            // it keeps each client's commands gapless and in its own order.
            Some(s) if request.request_seq > s.last_seq + 1 => {
                return refused(OutcomeKind::Gap {
                    expected: s.last_seq + 1,
                })
            }
            None if sessions_count >= SESSIONS_MAX => return refused(OutcomeKind::Refused),
            None if request.request_seq != 1 => return refused(OutcomeKind::Gap { expected: 1 }),
            _ => {}
        }
        let Ok(command) = decode_command(request.command) else {
            return refused(OutcomeKind::Invalid);
        };
        self.events.clear();
        self.engine.apply(&command, &mut self.events);
        if let Some(md) = &mut self.marketdata {
            md.push_events(&self.events);
        }
        self.commands_applied += 1;
        let events = encode_events(&self.events);
        assert!(events.len() <= EVENTS_SIZE_BYTES_MAX);
        let events_hash = xxhash_rust::xxh3::xxh3_64(&events);
        let new = Session {
            last_seq: request.request_seq,
            applied_index: index,
            events_hash,
        };
        let term = session_term(request.client_id, &new);
        match session {
            Some(s) => {
                let old = session_term(request.client_id, s);
                self.sessions_digest = self.sessions_digest.wrapping_sub(old).wrapping_add(term);
                *s = new;
            }
            None => {
                self.sessions_digest = self.sessions_digest.wrapping_add(term);
                self.sessions.insert(request.client_id, new);
            }
        }
        (answer(OutcomeKind::Applied, index, events), events_hash)
    }

    /// A market data idle flush entry (`LogCommand::MarketDataFlush`): the numbering closes
    /// the packets every replica's publisher closes.
    pub fn marketdata_flush(&mut self, now_ns: u64) {
        if let Some(md) = &mut self.marketdata {
            md.idle_flush(now_ns);
        }
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
        let mut w = Writer::with_capacity(engine.len() + 64 + self.sessions.len() * 32);
        w.buf.extend_from_slice(MAGIC);
        w.bytes(&engine);
        w.u64(self.sessions.len() as u64);
        // The table is a hash map: its own order must never reach the bytes.
        let mut sorted: Vec<(&u64, &Session)> = self.sessions.iter().collect();
        sorted.sort_unstable_by_key(|(client_id, _)| **client_id);
        for (client_id, s) in sorted {
            w.u64(*client_id);
            w.u64(s.last_seq);
            w.u64(s.applied_index);
            w.u64(s.events_hash);
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
        let count = r.count(32)?;
        if count > SESSIONS_MAX {
            return Err(r.error("more sessions than allowed"));
        }
        let mut sessions = SessionTable::default();
        sessions.reserve(count);
        let mut previous: Option<u64> = None;
        for _ in 0..count {
            let client_id = r.u64()?;
            if previous.is_some_and(|p| p >= client_id) {
                return Err(r.error("sessions out of order"));
            }
            previous = Some(client_id);
            let session = Session {
                last_seq: r.u64()?,
                applied_index: r.u64()?,
                events_hash: r.u64()?,
            };
            sessions.insert(client_id, session);
        }
        let sessions_digest = ReplicatedState::recompute_sessions_digest(&sessions);
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
            sessions_digest,
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
    use crate::batch::{BatchBuilder, ClientRequest};

    fn batch(requests: &[ClientRequest]) -> Batch {
        Batch::from_requests(requests)
    }
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
        s.apply_batch(&batch(&[add_account(7, 1, 100)]), 1, &mut out);
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
        s.apply_batch(&batch(&[deposit.clone(), deposit.clone()]), 2, &mut out);
        assert_eq!(out[1].kind, OutcomeKind::Applied);
        assert_eq!(out[2].kind, OutcomeKind::Duplicate);
        // The duplicate names the entry that applied it and carries no events again.
        assert_eq!(out[2].applied_index, out[1].applied_index);
        assert!(!out[1].events.is_empty());
        assert!(out[2].events.is_empty());
        assert_eq!(s.engine().account(AccountId(100)).unwrap().cash, Cash(50));
        assert_eq!(s.commands_applied(), 2);
        s.apply_batch(&batch(&[add_account(7, 1, 101)]), 3, &mut out);
        assert_eq!(out[3].kind, OutcomeKind::Stale);
        assert!(s.engine().account(AccountId(101)).is_none());
    }

    #[test]
    fn a_command_that_does_not_decode_is_answered_invalid_on_every_replica_and_applies_nothing() {
        let mut damaged = BatchBuilder::with_capacity(2);
        // A known form (new order) with a cut body: it passes the leader's form check.
        damaged.push_encoded(9, 1, &[1, 2, 3]).unwrap();
        damaged.push(&add_account(9, 1, 100));
        let damaged = damaged.finish();
        let mut a = ReplicatedState::new(config(), 10);
        let mut b = ReplicatedState::new(config(), 10);
        let (mut out_a, mut out_b) = (Vec::new(), Vec::new());
        a.apply_batch(&damaged, 4, &mut out_a);
        b.apply_batch(&damaged, 4, &mut out_b);
        assert_eq!(out_a, out_b);
        assert_eq!(out_a[0].kind, OutcomeKind::Invalid);
        assert!(out_a[0].events.is_empty());
        // The session did not move: the same key applies the next, sound command.
        assert_eq!(out_a[1].kind, OutcomeKind::Applied);
        assert!(a.engine().account(AccountId(100)).is_some());
        assert_eq!(a.commands_applied(), 1);
        assert_eq!(a.checkpoint_hash(10), b.checkpoint_hash(10));
    }

    #[test]
    fn snapshot_restore_keeps_the_table_and_the_hash() {
        let mut s = ReplicatedState::new(config(), 10);
        let mut out = Vec::new();
        for c in 1..5u64 {
            s.apply_batch(&batch(&[add_account(c, 1, c as u32)]), 6, &mut out);
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
        s.apply_batch(&batch(&[add_account(4, 2, 10)]), 7, &mut out);
        assert_eq!(out[0].kind, OutcomeKind::Gap { expected: 1 });
        assert!(out[0].events.is_empty());
        s.apply_batch(
            &batch(&[
                add_account(4, 1, 11),
                add_account(4, 3, 13),
                add_account(4, 2, 12),
            ]),
            8,
            &mut out,
        );
        assert_eq!(out[1].kind, OutcomeKind::Applied);
        assert_eq!(out[2].kind, OutcomeKind::Gap { expected: 2 });
        assert_eq!(out[3].kind, OutcomeKind::Applied);
        assert!(s.engine().account(AccountId(13)).is_none());
        assert!(s.engine().account(AccountId(10)).is_none());
        assert_eq!(s.last_seq(4), Some(2));
        // The resubmitted 3 now applies.
        s.apply_batch(&batch(&[add_account(4, 3, 13)]), 9, &mut out);
        assert_eq!(out[4].kind, OutcomeKind::Applied);
        assert!(s.engine().account(AccountId(13)).is_some());
        assert_eq!(s.commands_applied(), 3);
    }

    #[test]
    fn the_applied_counts_by_client_sum_to_the_engine_s_commands_whatever_was_refused() {
        let mut s = ReplicatedState::new(config(), 10);
        let mut out = Vec::new();
        s.apply_batch(
            &batch(&[
                add_account(1, 1, 1),
                add_account(1, 1, 1), // a duplicate: answered from the table
                add_account(1, 3, 3), // a gap: refused
                add_account(2, 1, 2),
                add_account(2, 2, 4),
                add_account(5, 2, 5), // a new client not starting at 1: refused
            ]),
            1,
            &mut out,
        );
        s.apply_batch(
            &batch(&[add_account(1, 2, 6), add_account(2, 1, 2)]),
            2,
            &mut out,
        );
        let mut by_client: Vec<(u64, u64)> = s.applied_by_client().collect();
        by_client.sort_unstable();
        assert_eq!(by_client, [(1, 2), (2, 2)]);
        let restored = ReplicatedState::restore(&s.snapshot(), 10).unwrap();
        let mut again: Vec<(u64, u64)> = restored.applied_by_client().collect();
        again.sort_unstable();
        assert_eq!(again, by_client, "a restored state keeps the counts");
        let sum: u64 = by_client.iter().map(|(_, n)| n).sum();
        assert_eq!(sum, s.engine().counters().commands);
    }

    #[test]
    fn the_table_is_part_of_the_hash() {
        let mut a = ReplicatedState::new(config(), 10);
        let mut b = ReplicatedState::new(config(), 10);
        let mut out = Vec::new();
        a.apply_batch(&batch(&[add_account(1, 1, 5)]), 10, &mut out);
        b.apply_batch(&batch(&[add_account(2, 1, 5)]), 10, &mut out);
        assert_eq!(a.engine().state_hash(), b.engine().state_hash());
        assert_ne!(a.state_hash(), b.state_hash());
    }

    #[test]
    fn the_checkpoint_follows_every_answer_and_a_restored_state_continues_it() {
        let mut a = ReplicatedState::new(config(), 2);
        let mut b = ReplicatedState::new(config(), 2);
        let mut out = Vec::new();
        a.apply_batch(&batch(&[add_account(1, 1, 5)]), 12, &mut out);
        b.apply_batch(&batch(&[add_account(1, 1, 5)]), 12, &mut out);
        assert_eq!(a.checkpoint_hash(2), b.checkpoint_hash(2));
        assert_ne!(
            a.checkpoint_hash(2),
            a.checkpoint_hash(4),
            "the index is folded in"
        );
        // The same request again on one replica only: the engines and tables still agree,
        // but that replica answered one more time, and the checkpoint shows it.
        a.apply_batch(&batch(&[add_account(1, 1, 5)]), 14, &mut out);
        assert_eq!(a.state_hash(), {
            let mut c = ReplicatedState::restore(&b.snapshot(), 2).unwrap();
            c.digest = a.digest;
            c.state_hash()
        });
        assert_ne!(a.checkpoint_hash(2), b.checkpoint_hash(2));
        // A state restored from a snapshot continues the chain where it was.
        let mut restored = ReplicatedState::restore(&a.snapshot(), 2).unwrap();
        a.apply_batch(&batch(&[add_account(1, 2, 6)]), 15, &mut out);
        restored.apply_batch(&batch(&[add_account(1, 2, 6)]), 15, &mut out);
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

    fn deposit(client_id: u64, request_seq: u64, account: u32, amount: i128) -> ClientRequest {
        ClientRequest {
            client_id,
            request_seq,
            command: Command::new(
                request_seq,
                CommandBody::Deposit {
                    account: AccountId(account),
                    amount: Cash(amount),
                },
            ),
        }
    }

    /// A small deterministic generator (xorshift64*), so a failure replays from its seed.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    #[test]
    fn the_sessions_digest_kept_on_the_way_equals_the_one_recomputed() {
        for seed in 1..=20u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let mut s = ReplicatedState::new(config(), 7);
            let mut out = Vec::new();
            // The sequence number each client would send next if it behaved.
            let mut next = [1u64; 6];
            let mut kinds = std::collections::HashSet::new();
            for _ in 0..60 {
                let mut batch = Vec::new();
                for _ in 0..1 + rng.below(8) {
                    let c = rng.below(next.len() as u64) as usize;
                    let client_id = c as u64 * 1_000_003 + 11;
                    // Mostly the next request; sometimes a retry, an old one, or a gap.
                    let request_seq = match rng.below(10) {
                        0 => next[c].saturating_sub(1).max(1),
                        1 => next[c].saturating_sub(3).max(1),
                        2 => next[c] + 1 + rng.below(3),
                        _ => next[c],
                    };
                    let account = 1 + rng.below(20) as u32;
                    batch.push(if rng.below(3) == 0 {
                        add_account(client_id, request_seq, account)
                    } else {
                        deposit(client_id, request_seq, account, 1 + rng.below(100) as i128)
                    });
                    if request_seq == next[c] {
                        next[c] += 1;
                    }
                }
                out.clear();
                s.apply_batch(&Batch::from_requests(&batch), 17, &mut out);
                for o in &out {
                    kinds.insert(std::mem::discriminant(&o.kind));
                    if o.kind != OutcomeKind::Applied {
                        // A gap refused the request: the client resends from the expected one.
                        if let OutcomeKind::Gap { expected } = o.kind {
                            let c = ((o.client_id - 11) / 1_000_003) as usize;
                            next[c] = expected;
                        }
                    }
                }
                assert_eq!(
                    s.sessions_digest(),
                    ReplicatedState::recompute_sessions_digest(&s.sessions),
                    "seed {seed}"
                );
            }
            assert!(kinds.len() >= 3, "seed {seed}: too few kinds of answers");
            assert_eq!(s.session_count(), next.len(), "seed {seed}");
            let restored = ReplicatedState::restore(&s.snapshot(), 7).unwrap();
            assert_eq!(restored.sessions_digest(), s.sessions_digest());
            assert_eq!(restored.snapshot(), s.snapshot());
        }
    }

    #[test]
    fn the_table_snapshots_in_client_order_whatever_order_it_was_filled_in() {
        // Deposits to an account that does not exist are rejected and change nothing in the
        // engine, so the two states differ only in the order their sessions were created.
        let ids: Vec<u64> = (0..300u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 8)
            .collect();
        let mut a = ReplicatedState::new(config(), 10);
        let mut b = ReplicatedState::new(config(), 10);
        let mut out = Vec::new();
        for &id in &ids {
            a.apply_batch(&batch(&[deposit(id, 1, 999, 5)]), 18, &mut out);
        }
        for &id in ids.iter().rev() {
            b.apply_batch(&batch(&[deposit(id, 1, 999, 5)]), 18, &mut out);
        }
        assert_eq!(a.sessions_digest(), b.sessions_digest());
        assert_ne!(a.sessions_digest(), 0);
        // Everything but the output digest (the last 8 bytes: no market data here) is equal;
        // the output digests differ because the answers came in another order.
        let (sa, sb) = (a.snapshot(), b.snapshot());
        assert_eq!(sa[..sa.len() - 8], sb[..sb.len() - 8]);
        assert_ne!(sa[sa.len() - 8..], sb[sb.len() - 8..]);
        // restore refuses a table out of order, so restoring proves the order.
        let restored = ReplicatedState::restore(&sa, 10).unwrap();
        assert_eq!(restored.sessions_digest(), a.sessions_digest());
        // A session's next request changes the digest.
        let before = a.sessions_digest();
        a.apply_batch(&batch(&[deposit(ids[0], 2, 999, 5)]), 20, &mut out);
        assert_ne!(a.sessions_digest(), before);
    }
}
