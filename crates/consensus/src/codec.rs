//! The messages' binary form: little-endian fixed-width fields, a kind byte per message and
//! per entry, lengths checked against the receiver's limits before anything is allocated.
//! Entries' payloads are slices of the received buffer (`Bytes::slice`), never copies.
//!
//! ```text
//! message  := version:u8 kind:u8 from:u64 to:u64 term:u64 body
//! PreVote, Vote            := last_term:u64 hint_index:u64
//! PreVoteReply, VoteReply  := granted:u8 (0 or 1)
//! Append        := seq:u64 prev_term:u64 prev_index:u64 commit:u64 count:u32 entry*count
//! entry         := term:u64 kind:u8 len:u32 payload:len
//! AppendReply   := seq:u64 0:u8 match_index:u64 | seq:u64 1:u8 prev_index:u64 hint_index:u64
//! Heartbeat     := commit:u64
//! HeartbeatReply:= (nothing)
//! Commit        := commit:u64
//! Snapshot      := seq:u64 term:u64 index:u64 len:u32 data:len
//! ```

use bytes::{BufMut, Bytes};

use crate::message::{AppendResult, Body, Message};
use crate::types::{Entry, EntryKind, LogId, ENTRY_OVERHEAD_BYTES};

pub const CODEC_VERSION: u8 = 1;
/// Version, kind, from, to, term.
pub const HEADER_BYTES: usize = 1 + 1 + 8 + 8 + 8;

const KIND_PRE_VOTE: u8 = 1;
const KIND_PRE_VOTE_REPLY: u8 = 2;
const KIND_VOTE: u8 = 3;
const KIND_VOTE_REPLY: u8 = 4;
const KIND_APPEND: u8 = 5;
const KIND_APPEND_REPLY: u8 = 6;
const KIND_HEARTBEAT: u8 = 7;
const KIND_HEARTBEAT_REPLY: u8 = 8;
const KIND_SNAPSHOT: u8 = 9;
const KIND_COMMIT: u8 = 10;

/// What a receiver accepts; anything beyond is refused before it is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeLimits {
    pub message_bytes_max: usize,
    pub entries_max: usize,
    pub entry_bytes_max: usize,
    pub snapshot_bytes_max: usize,
}

impl DecodeLimits {
    /// Limits matching a core's configuration (what its peers send), with `snapshot_bytes_max`
    /// as the application allows.
    pub fn for_config(config: &crate::Config, snapshot_bytes_max: usize) -> Self {
        DecodeLimits {
            message_bytes_max: HEADER_BYTES + 64 + config.append_bytes_max.max(snapshot_bytes_max),
            entries_max: config.append_entries_max,
            entry_bytes_max: config.entry_bytes_max,
            snapshot_bytes_max,
        }
    }
}

/// Every way a buffer can fail to be a message, each its own reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    MessageTooLarge {
        len: usize,
        max: usize,
    },
    Truncated {
        field: &'static str,
    },
    BadVersion {
        version: u8,
    },
    UnknownKind {
        kind: u8,
    },
    BadBool {
        value: u8,
    },
    BadEntryKind {
        value: u8,
    },
    BadAppendResult {
        value: u8,
    },
    TooManyEntries {
        count: usize,
        max: usize,
    },
    EntryTooLarge {
        len: usize,
        max: usize,
    },
    SnapshotTooLarge {
        len: usize,
        max: usize,
    },
    /// Entries' terms must not fall, must not exceed the message's term, and must be at least
    /// the previous entry's term.
    EntryTermOutOfOrder,
    /// Counting entries from `prev.index` would pass `u64::MAX`.
    IndexOverflow,
    /// A blank entry with a payload.
    BlankWithPayload,
    SelfAddressed,
    TrailingBytes {
        count: usize,
    },
}

/// Appends `message`'s binary form to `out` (which the caller reuses).
pub fn encode(message: &Message, out: &mut Vec<u8>) {
    out.reserve(HEADER_BYTES + 40 + message.entries_bytes());
    out.put_u8(CODEC_VERSION);
    let kind = match &message.body {
        Body::PreVote { .. } => KIND_PRE_VOTE,
        Body::PreVoteReply { .. } => KIND_PRE_VOTE_REPLY,
        Body::Vote { .. } => KIND_VOTE,
        Body::VoteReply { .. } => KIND_VOTE_REPLY,
        Body::Append { .. } => KIND_APPEND,
        Body::AppendReply { .. } => KIND_APPEND_REPLY,
        Body::Heartbeat { .. } => KIND_HEARTBEAT,
        Body::HeartbeatReply => KIND_HEARTBEAT_REPLY,
        Body::Commit { .. } => KIND_COMMIT,
        Body::Snapshot { .. } => KIND_SNAPSHOT,
    };
    out.put_u8(kind);
    out.put_u64_le(message.from);
    out.put_u64_le(message.to);
    out.put_u64_le(message.term);
    match &message.body {
        Body::PreVote { last_log_id } | Body::Vote { last_log_id } => put_log_id(out, *last_log_id),
        Body::PreVoteReply { granted } | Body::VoteReply { granted } => {
            out.put_u8(u8::from(*granted))
        }
        Body::Append {
            seq,
            prev,
            commit,
            entries,
        } => {
            out.put_u64_le(*seq);
            put_log_id(out, *prev);
            out.put_u64_le(*commit);
            out.put_u32_le(u32::try_from(entries.len()).expect("entries per message fit u32"));
            for entry in entries {
                out.put_u64_le(entry.log_id.term);
                out.put_u8(match entry.kind {
                    EntryKind::Blank => 0,
                    EntryKind::Normal => 1,
                });
                out.put_u32_le(u32::try_from(entry.payload.len()).expect("an entry fits u32"));
                out.put_slice(&entry.payload);
            }
        }
        Body::AppendReply { seq, result } => {
            out.put_u64_le(*seq);
            match result {
                AppendResult::Accepted { match_index } => {
                    out.put_u8(0);
                    out.put_u64_le(*match_index);
                }
                AppendResult::Rejected {
                    prev_index,
                    hint_index,
                } => {
                    out.put_u8(1);
                    out.put_u64_le(*prev_index);
                    out.put_u64_le(*hint_index);
                }
            }
        }
        Body::Heartbeat { commit } | Body::Commit { commit } => out.put_u64_le(*commit),
        Body::HeartbeatReply => {}
        Body::Snapshot {
            seq,
            snapshot,
            data,
        } => {
            out.put_u64_le(*seq);
            put_log_id(out, *snapshot);
            out.put_u32_le(u32::try_from(data.len()).expect("a snapshot message fits u32"));
            out.put_slice(data);
        }
    }
}

fn put_log_id(out: &mut Vec<u8>, id: LogId) {
    out.put_u64_le(id.term);
    out.put_u64_le(id.index);
}

/// A cursor over the received buffer that names the field it failed on.
struct Reader<'a> {
    buf: &'a Bytes,
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&[u8], DecodeError> {
        if self.buf.len() - self.at < n {
            return Err(DecodeError::Truncated { field });
        }
        let s = &self.buf[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, field)?[0])
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        let s = self.take(4, field)?;
        Ok(u32::from_le_bytes(s.try_into().expect("four bytes")))
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        let s = self.take(8, field)?;
        Ok(u64::from_le_bytes(s.try_into().expect("eight bytes")))
    }

    fn log_id(&mut self, field: &'static str) -> Result<LogId, DecodeError> {
        Ok(LogId::new(self.u64(field)?, self.u64(field)?))
    }

    fn bool(&mut self, field: &'static str) -> Result<bool, DecodeError> {
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(DecodeError::BadBool { value }),
        }
    }

    fn bytes(&mut self, n: usize, field: &'static str) -> Result<Bytes, DecodeError> {
        if self.buf.len() - self.at < n {
            return Err(DecodeError::Truncated { field });
        }
        let b = self.buf.slice(self.at..self.at + n);
        self.at += n;
        Ok(b)
    }
}

/// Reads one message that fills `buf` exactly.
pub fn decode(buf: &Bytes, limits: &DecodeLimits) -> Result<Message, DecodeError> {
    if buf.len() > limits.message_bytes_max {
        return Err(DecodeError::MessageTooLarge {
            len: buf.len(),
            max: limits.message_bytes_max,
        });
    }
    let mut r = Reader { buf, at: 0 };
    let version = r.u8("version")?;
    if version != CODEC_VERSION {
        return Err(DecodeError::BadVersion { version });
    }
    let kind = r.u8("kind")?;
    let from = r.u64("from")?;
    let to = r.u64("to")?;
    let term = r.u64("term")?;
    if from == to {
        return Err(DecodeError::SelfAddressed);
    }
    let body = match kind {
        KIND_PRE_VOTE => Body::PreVote {
            last_log_id: r.log_id("last_log_id")?,
        },
        KIND_VOTE => Body::Vote {
            last_log_id: r.log_id("last_log_id")?,
        },
        KIND_PRE_VOTE_REPLY => Body::PreVoteReply {
            granted: r.bool("granted")?,
        },
        KIND_VOTE_REPLY => Body::VoteReply {
            granted: r.bool("granted")?,
        },
        KIND_APPEND => {
            let seq = r.u64("seq")?;
            let prev = r.log_id("prev")?;
            let commit = r.u64("commit")?;
            let count = r.u32("count")? as usize;
            if count > limits.entries_max {
                return Err(DecodeError::TooManyEntries {
                    count,
                    max: limits.entries_max,
                });
            }
            // Each entry takes at least its overhead, so a count the buffer cannot hold is
            // refused before the vector is sized by it.
            if count * ENTRY_OVERHEAD_BYTES > buf.len() - r.at {
                return Err(DecodeError::Truncated { field: "entries" });
            }
            prev.index
                .checked_add(count as u64)
                .ok_or(DecodeError::IndexOverflow)?;
            let mut entries = Vec::with_capacity(count);
            let mut term_before = prev.term;
            for i in 0..count {
                let entry_term = r.u64("entry term")?;
                if entry_term < term_before || entry_term > term {
                    return Err(DecodeError::EntryTermOutOfOrder);
                }
                term_before = entry_term;
                let kind = match r.u8("entry kind")? {
                    0 => EntryKind::Blank,
                    1 => EntryKind::Normal,
                    value => return Err(DecodeError::BadEntryKind { value }),
                };
                let len = r.u32("entry length")? as usize;
                if len > limits.entry_bytes_max {
                    return Err(DecodeError::EntryTooLarge {
                        len,
                        max: limits.entry_bytes_max,
                    });
                }
                if kind == EntryKind::Blank && len != 0 {
                    return Err(DecodeError::BlankWithPayload);
                }
                let payload = r.bytes(len, "entry payload")?;
                let log_id = LogId::new(entry_term, prev.index + 1 + i as u64);
                entries.push(Entry {
                    log_id,
                    kind,
                    payload,
                });
            }
            Body::Append {
                seq,
                prev,
                commit,
                entries,
            }
        }
        KIND_APPEND_REPLY => {
            let seq = r.u64("seq")?;
            let result = match r.u8("append result")? {
                0 => AppendResult::Accepted {
                    match_index: r.u64("match_index")?,
                },
                1 => AppendResult::Rejected {
                    prev_index: r.u64("prev_index")?,
                    hint_index: r.u64("hint_index")?,
                },
                value => return Err(DecodeError::BadAppendResult { value }),
            };
            Body::AppendReply { seq, result }
        }
        KIND_HEARTBEAT => Body::Heartbeat {
            commit: r.u64("commit")?,
        },
        KIND_HEARTBEAT_REPLY => Body::HeartbeatReply,
        KIND_COMMIT => Body::Commit {
            commit: r.u64("commit")?,
        },
        KIND_SNAPSHOT => {
            let seq = r.u64("seq")?;
            let snapshot = r.log_id("snapshot")?;
            let len = r.u32("snapshot length")? as usize;
            if len > limits.snapshot_bytes_max {
                return Err(DecodeError::SnapshotTooLarge {
                    len,
                    max: limits.snapshot_bytes_max,
                });
            }
            let data = r.bytes(len, "snapshot data")?;
            Body::Snapshot {
                seq,
                snapshot,
                data,
            }
        }
        kind => return Err(DecodeError::UnknownKind { kind }),
    };
    if r.at != buf.len() {
        return Err(DecodeError::TrailingBytes {
            count: buf.len() - r.at,
        });
    }
    Ok(Message {
        from,
        to,
        term,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LIMITS: DecodeLimits = DecodeLimits {
        message_bytes_max: 1 << 16,
        entries_max: 16,
        entry_bytes_max: 512,
        snapshot_bytes_max: 4096,
    };

    fn log_id() -> impl Strategy<Value = LogId> {
        (0u64..1000, 0u64..1_000_000).prop_map(|(t, i)| LogId::new(t, i))
    }

    fn body(term: u64) -> impl Strategy<Value = Body> {
        let append = (
            any::<u64>(),
            log_id(),
            any::<u64>(),
            prop::collection::vec(
                (any::<bool>(), prop::collection::vec(any::<u8>(), 0..64)),
                0..16,
            ),
        )
            .prop_map(move |(seq, prev, commit, raw)| {
                let prev = LogId::new(prev.term.min(term), prev.index);
                let entries = raw
                    .into_iter()
                    .enumerate()
                    .map(|(i, (blank, payload))| {
                        let id = LogId::new(term.max(prev.term), prev.index + 1 + i as u64);
                        if blank {
                            Entry::blank(id)
                        } else {
                            Entry::normal(id, Bytes::from(payload))
                        }
                    })
                    .collect();
                Body::Append {
                    seq,
                    prev,
                    commit,
                    entries,
                }
            });
        prop_oneof![
            log_id().prop_map(|last_log_id| Body::PreVote { last_log_id }),
            log_id().prop_map(|last_log_id| Body::Vote { last_log_id }),
            any::<bool>().prop_map(|granted| Body::PreVoteReply { granted }),
            any::<bool>().prop_map(|granted| Body::VoteReply { granted }),
            append,
            (any::<u64>(), any::<u64>()).prop_map(|(seq, match_index)| Body::AppendReply {
                seq,
                result: AppendResult::Accepted { match_index }
            }),
            (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(seq, prev_index, hint_index)| {
                Body::AppendReply {
                    seq,
                    result: AppendResult::Rejected {
                        prev_index,
                        hint_index,
                    },
                }
            }),
            any::<u64>().prop_map(|commit| Body::Heartbeat { commit }),
            Just(Body::HeartbeatReply),
            any::<u64>().prop_map(|commit| Body::Commit { commit }),
            (
                any::<u64>(),
                log_id(),
                prop::collection::vec(any::<u8>(), 0..256)
            )
                .prop_map(|(seq, snapshot, data)| Body::Snapshot {
                    seq,
                    snapshot,
                    data: Bytes::from(data)
                }),
        ]
    }

    fn message() -> impl Strategy<Value = Message> {
        (1u64..10, 1u64..10, 0u64..2000)
            .prop_filter("not self-addressed", |(f, t, _)| f != t)
            .prop_flat_map(|(from, to, term)| {
                body(term).prop_map(move |body| Message {
                    from,
                    to,
                    term,
                    body,
                })
            })
    }

    proptest! {
        #[test]
        fn every_message_round_trips(m in message()) {
            let mut out = Vec::new();
            encode(&m, &mut out);
            let back = decode(&Bytes::from(out), &LIMITS).expect("a message the encoder wrote decodes");
            prop_assert_eq!(back, m);
        }

        #[test]
        fn every_cut_of_a_message_is_refused(m in message(), cut in any::<prop::sample::Index>()) {
            let mut out = Vec::new();
            encode(&m, &mut out);
            let cut = cut.index(out.len());
            prop_assert!(decode(&Bytes::copy_from_slice(&out[..cut]), &LIMITS).is_err());
            let mut longer = out.clone();
            longer.push(0);
            prop_assert_eq!(decode(&Bytes::from(longer), &LIMITS), Err(DecodeError::TrailingBytes { count: 1 }));
        }

        #[test]
        fn garbage_never_panics(raw in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&Bytes::from(raw), &LIMITS);
        }

        #[test]
        fn garbage_after_a_valid_header_never_panics(kind in 0u8..12, raw in prop::collection::vec(any::<u8>(), 0..512)) {
            let mut out = vec![CODEC_VERSION, kind];
            out.extend_from_slice(&1u64.to_le_bytes());
            out.extend_from_slice(&2u64.to_le_bytes());
            out.extend_from_slice(&7u64.to_le_bytes());
            out.extend_from_slice(&raw);
            let _ = decode(&Bytes::from(out), &LIMITS);
        }
    }

    #[test]
    fn limits_are_enforced_before_reading() {
        let entries = (1..=17).map(|i| Entry::blank(LogId::new(1, i))).collect();
        let m = Message {
            from: 1,
            to: 2,
            term: 1,
            body: Body::Append {
                seq: 0,
                prev: LogId::default(),
                commit: 0,
                entries,
            },
        };
        let mut out = Vec::new();
        encode(&m, &mut out);
        assert_eq!(
            decode(&Bytes::from(out), &LIMITS),
            Err(DecodeError::TooManyEntries { count: 17, max: 16 })
        );

        let big = Entry::normal(LogId::new(1, 1), Bytes::from(vec![0u8; 513]));
        let m = Message {
            from: 1,
            to: 2,
            term: 1,
            body: Body::Append {
                seq: 0,
                prev: LogId::default(),
                commit: 0,
                entries: vec![big],
            },
        };
        let mut out = Vec::new();
        encode(&m, &mut out);
        assert_eq!(
            decode(&Bytes::from(out), &LIMITS),
            Err(DecodeError::EntryTooLarge { len: 513, max: 512 })
        );

        let m = Message {
            from: 1,
            to: 2,
            term: 1,
            body: Body::Snapshot {
                seq: 0,
                snapshot: LogId::default(),
                data: Bytes::from(vec![0u8; 4097]),
            },
        };
        let mut out = Vec::new();
        encode(&m, &mut out);
        assert_eq!(
            decode(&Bytes::from(out), &LIMITS),
            Err(DecodeError::SnapshotTooLarge {
                len: 4097,
                max: 4096
            })
        );
    }

    #[test]
    fn specific_reasons_for_bad_fields() {
        let m = Message {
            from: 1,
            to: 2,
            term: 3,
            body: Body::VoteReply { granted: true },
        };
        let mut out = Vec::new();
        encode(&m, &mut out);
        let mut bad = out.clone();
        bad[0] = 9;
        assert_eq!(
            decode(&Bytes::from(bad), &LIMITS),
            Err(DecodeError::BadVersion { version: 9 })
        );
        let mut bad = out.clone();
        bad[1] = 200;
        assert_eq!(
            decode(&Bytes::from(bad), &LIMITS),
            Err(DecodeError::UnknownKind { kind: 200 })
        );
        let mut bad = out.clone();
        *bad.last_mut().unwrap() = 2;
        assert_eq!(
            decode(&Bytes::from(bad), &LIMITS),
            Err(DecodeError::BadBool { value: 2 })
        );
        let mut bad = out;
        bad[10..18].copy_from_slice(&1u64.to_le_bytes());
        assert_eq!(
            decode(&Bytes::from(bad), &LIMITS),
            Err(DecodeError::SelfAddressed)
        );

        // An entry whose term is above the message's.
        let e = Entry::normal(LogId::new(5, 1), Bytes::from_static(b"x"));
        let m = Message {
            from: 1,
            to: 2,
            term: 4,
            body: Body::Append {
                seq: 0,
                prev: LogId::default(),
                commit: 0,
                entries: vec![e],
            },
        };
        let mut out = Vec::new();
        encode(&m, &mut out);
        assert_eq!(
            decode(&Bytes::from(out), &LIMITS),
            Err(DecodeError::EntryTermOutOfOrder)
        );
    }
}
