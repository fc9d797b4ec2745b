//! The log as the core sees it. The node implements [`LogStore`] over its journal: appends
//! go into the journal's write buffer (and its in-memory tail) at once and become durable
//! when the node syncs, which it reports with `Core::persisted`; reads serve replication and
//! apply. [`MemStore`] is the in-memory implementation the tests and the benchmark use.
//!
//! The store holds the entries `first_index()..=last_log_id().index` and remembers the id of
//! the entry just below them (`base()`): the last one compacted into a snapshot, or (0, 0).

use std::collections::VecDeque;

use crate::types::{Entry, Index, LogId, Term};

pub trait LogStore {
    /// The id of the entry just below the first one held (compacted or covered by a
    /// snapshot); `LogId::default()` for a log that was never compacted.
    fn base(&self) -> LogId;

    /// The id of the last entry, or `base()` when no entry is held.
    fn last_log_id(&self) -> LogId;

    /// The term of the entry at `index`, for `base().index..=last_log_id().index`; `None`
    /// outside that range.
    fn term(&self, index: Index) -> Option<Term>;

    /// Pushes the entries `lo..=hi` onto `out`, stopping before the running total of
    /// `Entry::size_bytes` would pass `bytes_max` (always at least one entry). The range is
    /// inside `base().index + 1..=last_log_id().index`.
    fn entries(&self, lo: Index, hi: Index, bytes_max: usize, out: &mut Vec<Entry>);

    /// Appends one entry whose index is `last_log_id().index + 1`. Not durable until the node
    /// syncs.
    fn append(&mut self, entry: Entry);

    /// Removes the entries from `index` on (a follower's conflicting, uncommitted tail).
    fn truncate_from(&mut self, index: Index);

    /// Drops the entries up to `index` inclusive (they are in a snapshot); `base()` becomes
    /// their last one's id.
    fn compact_to(&mut self, index: Index);

    /// Drops every entry and restarts the log after `base` (a snapshot was installed whose
    /// last entry this log does not hold).
    fn reset(&mut self, base: LogId);

    /// The first index held.
    fn first_index(&self) -> Index {
        self.base().index + 1
    }
}

/// The log in memory: a deque of entries after a base id.
#[derive(Clone, Debug, Default)]
pub struct MemStore {
    base: LogId,
    entries: VecDeque<Entry>,
}

impl MemStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Entries held, for the tests' checks.
    pub fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter()
    }

    pub fn get(&self, index: Index) -> Option<&Entry> {
        if index <= self.base.index {
            return None;
        }
        self.entries.get((index - self.base.index - 1) as usize)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl LogStore for MemStore {
    fn base(&self) -> LogId {
        self.base
    }

    fn last_log_id(&self) -> LogId {
        self.entries.back().map_or(self.base, |e| e.log_id)
    }

    fn term(&self, index: Index) -> Option<Term> {
        if index == self.base.index {
            return Some(self.base.term);
        }
        self.get(index).map(|e| e.log_id.term)
    }

    fn entries(&self, lo: Index, hi: Index, bytes_max: usize, out: &mut Vec<Entry>) {
        assert!(
            lo > self.base.index && lo <= hi && hi <= self.last_log_id().index,
            "entries {lo}..={hi} outside the log"
        );
        let start = (lo - self.base.index - 1) as usize;
        let end = (hi - self.base.index) as usize;
        let mut bytes = 0usize;
        for (n, entry) in self.entries.range(start..end).enumerate() {
            bytes += entry.size_bytes();
            if bytes > bytes_max && n > 0 {
                break;
            }
            out.push(entry.clone());
        }
    }

    fn append(&mut self, entry: Entry) {
        let last = self.last_log_id();
        assert_eq!(
            entry.log_id.index,
            last.index + 1,
            "append must extend the log by one"
        );
        assert!(
            entry.log_id.term >= last.term,
            "terms never fall along a log"
        );
        self.entries.push_back(entry);
    }

    fn truncate_from(&mut self, index: Index) {
        assert!(
            index > self.base.index,
            "cannot truncate into the compacted prefix"
        );
        self.entries
            .truncate((index - self.base.index - 1) as usize);
    }

    fn compact_to(&mut self, index: Index) {
        if index <= self.base.index {
            return;
        }
        let term = self.term(index).expect("compact_to an index the log holds");
        let drop = (index - self.base.index) as usize;
        self.entries.drain(..drop);
        self.base = LogId::new(term, index);
    }

    fn reset(&mut self, base: LogId) {
        self.entries.clear();
        self.base = base;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn filled(n: u64) -> MemStore {
        let mut s = MemStore::new();
        for i in 1..=n {
            s.append(Entry::normal(
                LogId::new(1 + i / 4, i),
                Bytes::from(vec![i as u8; 10]),
            ));
        }
        s
    }

    #[test]
    fn compaction_keeps_the_base_term_and_reads_after_it() {
        let mut s = filled(10);
        s.compact_to(5);
        assert_eq!(s.base(), LogId::new(2, 5));
        assert_eq!(s.term(5), Some(2));
        assert_eq!(s.term(4), None);
        assert_eq!(s.first_index(), 6);
        let mut out = Vec::new();
        s.entries(6, 10, usize::MAX, &mut out);
        assert_eq!(out.len(), 5);
        assert_eq!(out[0].log_id.index, 6);
    }

    #[test]
    fn a_byte_budget_stops_a_batch_but_never_before_one_entry() {
        let s = filled(10);
        let mut out = Vec::new();
        s.entries(1, 10, 1, &mut out);
        assert_eq!(out.len(), 1);
        out.clear();
        s.entries(
            1,
            10,
            3 * (10 + crate::types::ENTRY_OVERHEAD_BYTES),
            &mut out,
        );
        assert_eq!(out.len(), 3);
    }

    #[test]
    fn truncation_and_reset() {
        let mut s = filled(10);
        s.truncate_from(8);
        assert_eq!(s.last_log_id().index, 7);
        s.reset(LogId::new(7, 20));
        assert_eq!(s.last_log_id(), LogId::new(7, 20));
        assert!(s.is_empty());
    }
}
