//! Property tests: the journal against an in-memory model, and recovery against arbitrary
//! bytes.

use crate::common;

use std::fs;

use bourse_journal::{verify, Entry, Journal, LogPosition, SEGMENT_HEADER_SIZE_BYTES};
use common::*;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Append { count: u8, term_bump: u8, size: u16 },
    TruncateBack(u8),
    Purge(u8),
    Reopen,
    Flush,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u8..12, 0u8..3, 0u16..700).prop_map(|(count, term_bump, size)| Op::Append {
            count,
            term_bump,
            size
        }),
        2 => any::<u8>().prop_map(Op::TruncateBack),
        1 => any::<u8>().prop_map(Op::Purge),
        2 => Just(Op::Reopen),
        1 => Just(Op::Flush),
    ]
}

/// What the log should hold.
#[derive(Default)]
struct Model {
    entries: Vec<Entry>,
    purged: Option<LogPosition>,
}

impl Model {
    fn next_index(&self) -> u64 {
        match (self.entries.last(), self.purged) {
            (Some(e), _) => e.index + 1,
            (None, Some(p)) => p.index + 1,
            (None, None) => 0,
        }
    }

    fn last(&self) -> Option<LogPosition> {
        match self.entries.last() {
            Some(e) => Some(LogPosition {
                index: e.index,
                term: e.term,
            }),
            None => self.purged,
        }
    }
}

fn check(journal: &Journal, model: &Model) {
    assert_eq!(journal.last_position(), model.last());
    assert_eq!(journal.next_index(), model.next_index());
    assert_eq!(
        journal.first_index(),
        model.entries.first().map(|e| e.index)
    );
    assert_eq!(journal.last_purged(), model.purged);
    assert_eq!(journal.read(..).unwrap(), model.entries);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn journal_matches_model(ops in proptest::collection::vec(op(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = open(dir.path());
        let mut model = Model::default();
        for op in ops {
            match op {
                Op::Append { count, term_bump, size } => {
                    let term = model.last().map_or(1, |p| p.term) + u64::from(term_bump);
                    let start = model.next_index();
                    let batch: Vec<Entry> = (start..start + u64::from(count))
                        .map(|index| Entry {
                            index,
                            term,
                            payload: vec![(index % 251) as u8; size as usize],
                        })
                        .collect();
                    journal.append(&batch).unwrap();
                    model.entries.extend(batch);
                }
                Op::TruncateBack(back) => {
                    if model.entries.is_empty() {
                        continue;
                    }
                    // Any index from just before the first entry to the last one.
                    let back = u64::from(back) % (model.entries.len() as u64 + 1);
                    let first = model.entries[0].index;
                    let Some(index) = (model.next_index() - 1).checked_sub(back) else {
                        continue;
                    };
                    prop_assert!(index + 1 >= first);
                    journal.truncate_after(index).unwrap();
                    model.entries.retain(|e| e.index <= index);
                }
                Op::Purge(k) => {
                    if model.entries.is_empty() {
                        continue;
                    }
                    let i = usize::from(k) % model.entries.len();
                    let point = &model.entries[i];
                    model.purged = Some(LogPosition { index: point.index, term: point.term });
                    journal.purge_upto(point.index).unwrap();
                    model.entries.drain(..=i);
                }
                Op::Reopen => {
                    drop(journal);
                    let (reopened, report) = Journal::open(dir.path(), config()).unwrap();
                    prop_assert!(report.torn_tail.is_none());
                    // A segment holding only purged entries may be deleted on open; that
                    // is a cleanup, not a repair, and the model cannot tell the difference.
                    journal = reopened;
                }
                Op::Flush => journal.flush().unwrap(),
            }
            check(&journal, &model);
        }
        drop(journal);
        let report = verify(dir.path()).unwrap();
        prop_assert!(report.is_ok(), "{:?}", report.problem);
    }

    #[test]
    fn arbitrary_bytes_as_a_segment_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..3000),
        with_header in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        drop(open(dir.path()));
        let segment = segment_files(dir.path()).remove(0);
        let mut contents = Vec::new();
        if with_header {
            // A genuine header, so the record decoder itself meets the garbage.
            contents.extend_from_slice(&fs::read(&segment).unwrap()[..SEGMENT_HEADER_SIZE_BYTES as usize]);
        }
        contents.extend_from_slice(&bytes);
        fs::write(&segment, &contents).unwrap();
        let _ = verify(dir.path());
        let _ = bourse_journal::replay(dir.path(), ..).map(|r| r.count());
        if let Ok((journal, _)) = Journal::open(dir.path(), config()) {
            let _ = journal.read(..);
        }
    }

    #[test]
    fn damaged_journal_opens_to_a_prefix_or_refuses(
        damage in proptest::collection::vec((any::<u16>(), any::<u8>()), 1..4),
        cut in proptest::option::of(any::<u16>()),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let original = all(&filled(dir.path(), 40));
        let files = segment_files(dir.path());
        for (position, value) in damage {
            let file = &files[usize::from(position) % files.len()];
            let mut bytes = fs::read(file).unwrap();
            let at = usize::from(position) % bytes.len();
            bytes[at] ^= value.max(1);
            fs::write(file, bytes).unwrap();
        }
        if let Some(cut) = cut {
            let file = files.last().unwrap();
            let len = fs::metadata(file).unwrap().len();
            let f = fs::OpenOptions::new().write(true).open(file).unwrap();
            f.set_len(u64::from(cut) % (len + 1)).unwrap();
        }
        let _ = verify(dir.path());
        if let Ok((journal, _)) = Journal::open(dir.path(), config()) {
            // Whatever recovery accepted must be a prefix of what was written.
            let read = all(&journal);
            prop_assert!(read.len() <= original.len());
            prop_assert_eq!(&read[..], &original[..read.len()]);
        }
    }
}
