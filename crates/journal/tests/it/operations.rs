//! Log operations across reopen: rollover, truncate_after, purge_upto, reset, the vote file,
//! and the operator functions.

use crate::common;

use std::fs;

use bourse_journal::{
    chain_hash, genesis_hash, replay, verify, ChainPoint, Entry, Journal, JournalError,
    LogPosition, Meta,
};
use common::*;

/// Recomputes the chain over `entries` from `prev` and checks the journal agrees.
fn expected_hash(prev: u64, entries: &[Entry]) -> u64 {
    entries
        .iter()
        .fold(prev, |h, e| chain_hash(h, e.index, e.term, &e.payload))
}

#[test]
fn rollover_keeps_segments_within_the_size_limit() {
    let dir = tempfile::tempdir().unwrap();
    let journal = filled(dir.path(), 100);
    let files = segment_files(dir.path());
    assert!(files.len() >= 4, "{} segments", files.len());
    for file in &files {
        assert!(fs::metadata(file).unwrap().len() <= config().segment_size_bytes_max);
    }
    assert_eq!(journal.read(..).unwrap(), entries(0..100, 1));
    drop(journal);
    let (journal, report) = Journal::open(dir.path(), config()).unwrap();
    assert_eq!(report.segments, files.len());
    assert_eq!(report.records, 100);
    assert_eq!(journal.read(37..64).unwrap(), entries(37..64, 1));
    assert_eq!(
        journal.last_hash(),
        expected_hash(genesis_hash(CLUSTER), &entries(0..100, 1))
    );
}

#[test]
fn append_checks_its_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let mut journal = filled(dir.path(), 5);
    assert!(matches!(
        journal.append(&entries(6..7, 1)),
        Err(JournalError::Invalid(_))
    ));
    assert!(matches!(
        journal.append(&entries(5..6, 0)),
        Err(JournalError::Invalid(_))
    ));
    let big = Entry {
        index: 5,
        term: 1,
        payload: vec![0; 2000],
    };
    assert!(matches!(
        journal.append(&[big]),
        Err(JournalError::Invalid(_))
    ));
    assert!(journal.poisoned().is_none(), "bad arguments do not poison");
    journal.append(&entries(5..6, 1)).unwrap();
}

#[test]
fn reads_outside_the_log_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let journal = filled(dir.path(), 5);
    assert!(matches!(
        journal.read(3..9),
        Err(JournalError::OutOfRange { .. })
    ));
    assert!(journal.entry(5).is_err());
    assert!(journal.read(5..5).unwrap().is_empty());
}

#[test]
fn truncate_after_keeps_the_chain_valid_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut journal = filled(dir.path(), 100);
    let segments_before = segment_files(dir.path()).len();
    // A new leader overwrites the suffix from 41 on with entries of term 2.
    journal.truncate_after(40).unwrap();
    assert_eq!(
        journal.last_position(),
        Some(LogPosition { index: 40, term: 1 })
    );
    assert!(segment_files(dir.path()).len() < segments_before);
    journal.append(&entries(41..70, 2)).unwrap();
    let mut expected = entries(0..41, 1);
    expected.extend(entries(41..70, 2));
    drop(journal);

    let (journal, report) = Journal::open(dir.path(), config()).unwrap();
    assert!(report.torn_tail.is_none());
    assert_eq!(all(&journal), expected);
    assert_eq!(journal.last_term(), Some(2));
    assert_eq!(
        journal.last_hash(),
        expected_hash(genesis_hash(CLUSTER), &expected)
    );
    assert!(verify(dir.path()).unwrap().is_ok());
}

#[test]
fn truncate_at_a_segment_boundary_and_to_empty() {
    let dir = tempfile::tempdir().unwrap();
    let mut journal = filled(dir.path(), 60);
    let second = segment_files(dir.path())[1].clone();
    let base: u64 = second
        .file_stem()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    journal.truncate_after(base - 1).unwrap();
    assert!(
        !second.exists(),
        "a segment holding nothing kept is deleted"
    );
    assert_eq!(journal.last_index(), Some(base - 1));
    journal.truncate_after(0).unwrap();
    assert_eq!(journal.last_index(), Some(0));
    drop(journal);
    let mut journal = open(dir.path());
    assert_eq!(journal.last_index(), Some(0));
    journal.append(&entries(1..3, 4)).unwrap();
    drop(journal);
    assert_eq!(
        open(dir.path()).last_position(),
        Some(LogPosition { index: 2, term: 4 })
    );
}

#[test]
fn truncate_refuses_committed_entries() {
    let dir = tempfile::tempdir().unwrap();
    let mut journal = filled(dir.path(), 10);
    journal
        .save_meta(Meta {
            committed: Some(LogPosition { index: 6, term: 1 }),
            ..journal.meta()
        })
        .unwrap();
    assert!(matches!(
        journal.truncate_after(5),
        Err(JournalError::Invalid(_))
    ));
    journal.truncate_after(6).unwrap();
    assert_eq!(journal.last_index(), Some(6));
}

#[test]
fn purge_upto_keeps_the_chain_valid_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut journal = filled(dir.path(), 100);
    let files = segment_files(dir.path());
    let removed = journal.purge_upto(50).unwrap();
    assert!(removed >= 1);
    assert_eq!(segment_files(dir.path()).len(), files.len() - removed);
    assert_eq!(journal.first_index(), Some(51));
    assert_eq!(
        journal.last_purged(),
        Some(LogPosition { index: 50, term: 1 })
    );
    assert!(
        journal.entry(50).is_err(),
        "purged entries are gone logically"
    );
    journal.append(&entries(100..110, 2)).unwrap();
    drop(journal);

    let (journal, report) = Journal::open(dir.path(), config()).unwrap();
    assert!(report.removed_stale_segments.is_empty());
    assert_eq!(journal.first_index(), Some(51));
    assert_eq!(
        journal.last_purged(),
        Some(LogPosition { index: 50, term: 1 })
    );
    let mut expected = entries(51..100, 1);
    expected.extend(entries(100..110, 2));
    assert_eq!(all(&journal), expected);
    let mut whole = entries(0..100, 1);
    whole.extend(entries(100..110, 2));
    assert_eq!(
        journal.last_hash(),
        expected_hash(genesis_hash(CLUSTER), &whole)
    );
    let report = verify(dir.path()).unwrap();
    assert!(report.is_ok(), "{:?}", report.problem);
    assert_eq!(report.purged, Some(LogPosition { index: 50, term: 1 }));
}

#[test]
fn purge_of_everything_then_append() {
    let dir = tempfile::tempdir().unwrap();
    let mut journal = filled(dir.path(), 30);
    journal.purge_upto(29).unwrap();
    assert_eq!(journal.first_index(), None);
    assert_eq!(
        journal.last_position(),
        Some(LogPosition { index: 29, term: 1 })
    );
    assert_eq!(
        segment_files(dir.path()).len(),
        1,
        "only the new empty segment"
    );
    drop(journal);
    let mut journal = open(dir.path());
    assert_eq!(journal.last_index(), Some(29));
    assert_eq!(journal.next_index(), 30);
    journal.append(&entries(30..35, 1)).unwrap();
    drop(journal);
    assert_eq!(all(&open(dir.path())), entries(30..35, 1));
}

#[test]
fn interrupted_purge_is_finished_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut journal = filled(dir.path(), 100);
    let files = segment_files(dir.path());
    // Purge deletes oldest first, so a crash leaves the newest of the doomed segments behind.
    let saved: Vec<Vec<u8>> = files.iter().map(|f| fs::read(f).unwrap()).collect();
    journal.purge_upto(60).unwrap();
    drop(journal);
    let deleted: Vec<usize> = (0..files.len()).filter(|&i| !files[i].exists()).collect();
    assert!(deleted.len() >= 2);
    let last_deleted = *deleted.last().unwrap();
    fs::write(&files[last_deleted], &saved[last_deleted]).unwrap();
    let (journal, report) = Journal::open(dir.path(), config()).unwrap();
    assert_eq!(
        report.removed_stale_segments,
        vec![files[last_deleted].clone()]
    );
    assert_eq!(journal.first_index(), Some(61));
}

#[test]
fn reset_to_a_snapshot_beyond_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut journal = filled(dir.path(), 20);
    let point = ChainPoint {
        index: 500,
        term: 7,
        hash: 0xfeed,
    };
    journal.reset(point).unwrap();
    assert_eq!(
        journal.last_position(),
        Some(LogPosition {
            index: 500,
            term: 7
        })
    );
    assert_eq!(
        journal.last_purged(),
        Some(LogPosition {
            index: 500,
            term: 7
        })
    );
    journal.append(&entries(501..505, 7)).unwrap();
    drop(journal);
    let journal = open(dir.path());
    assert_eq!(all(&journal), entries(501..505, 7));
    assert_eq!(
        journal.last_hash(),
        expected_hash(0xfeed, &entries(501..505, 7))
    );
    assert_eq!(segment_files(dir.path()).len(), 1);
}

#[test]
fn hash_and_term_at_serve_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let journal = filled(dir.path(), 30);
    let h = expected_hash(genesis_hash(CLUSTER), &entries(0..18, 1));
    assert_eq!(journal.hash_at(17).unwrap(), h);
    assert_eq!(journal.term_at(17).unwrap(), 1);
}

#[test]
fn vote_file_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let mut journal = open(dir.path());
    assert_eq!(journal.meta(), Meta::default());
    let meta = Meta {
        term: 3,
        voted_for: Some(2),
        vote_committed: true,
        committed: None,
    };
    journal.save_meta(meta).unwrap();
    drop(journal);
    let journal = open(dir.path());
    assert_eq!(journal.meta(), meta);
    assert!(!dir.path().join("vote.tmp").exists());
}

#[test]
fn new_journal_is_reported_as_created() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, report) = Journal::open(dir.path(), config()).unwrap();
    assert!(report.created);
    assert_eq!(journal.last_position(), None);
    assert_eq!(journal.first_index(), None);
    drop(journal);
    let (_, report) = Journal::open(dir.path(), config()).unwrap();
    assert!(!report.created);
}

#[test]
fn verify_inspect_and_replay_report_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let journal = filled(dir.path(), 50);
    let last_hash = journal.last_hash();
    drop(journal);
    let report = verify(dir.path()).unwrap();
    assert!(report.is_ok());
    assert_eq!(report.cluster_id, Some(CLUSTER));
    assert_eq!(report.node_id, Some(NODE));
    assert_eq!(report.records, 50);
    assert_eq!(report.first_index, Some(0));
    assert_eq!(report.last, Some(LogPosition { index: 49, term: 1 }));
    assert_eq!(report.last_hash, Some(last_hash));
    assert_eq!(report.segments.iter().map(|s| s.records).sum::<u64>(), 50);

    let infos: Vec<_> = bourse_journal::inspect(dir.path(), 10..20)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(infos.len(), 10);
    assert_eq!(infos[0].index, 10);
    assert_eq!(infos[0].payload_len as usize, payload(10, 1).len());
    let replayed: Vec<_> = replay(dir.path(), ..)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(replayed, entries(0..50, 1));
}

#[test]
fn replay_stops_with_an_error_at_damage() {
    let dir = tempfile::tempdir().unwrap();
    drop(filled(dir.path(), 50));
    let (file, offset) = locate(dir.path(), 30);
    flip_bit(&file, offset + 40);
    let results: Vec<_> = replay(dir.path(), ..).unwrap().collect();
    let errors = results.iter().filter(|r| r.is_err()).count();
    assert_eq!(errors, 1);
    assert!(results.last().unwrap().is_err());
}

#[test]
fn read_detects_bit_rot_after_open() {
    let dir = tempfile::tempdir().unwrap();
    let journal = filled(dir.path(), 10);
    let (file, offset) = locate(dir.path(), 4);
    flip_bit(&file, offset + 36);
    match journal.entry(4) {
        Err(JournalError::Corrupt {
            file: f, offset: o, ..
        }) => {
            assert_eq!((f, o), (file, offset));
        }
        other => panic!("unexpected {other:?}"),
    }
}

/// Puts back the oldest `count` segments of `files` (as a reset interrupted while deleting
/// newest first would leave them) and removes the segment the reset created.
fn simulate_interrupted_reset(
    dir: &std::path::Path,
    files: &[std::path::PathBuf],
    saved: &[Vec<u8>],
    count: usize,
) {
    for file in segment_files(dir) {
        fs::remove_file(file).unwrap();
    }
    for i in 0..count {
        fs::write(&files[i], &saved[i]).unwrap();
    }
}

#[test]
fn interrupted_reset_beyond_the_log_is_finished_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut journal = filled(dir.path(), 60);
    let files = segment_files(dir.path());
    let saved: Vec<Vec<u8>> = files.iter().map(|f| fs::read(f).unwrap()).collect();
    let point = ChainPoint {
        index: 500,
        term: 7,
        hash: 0xfeed,
    };
    journal.reset(point).unwrap();
    drop(journal);
    simulate_interrupted_reset(dir.path(), &files, &saved, 2);
    let (journal, report) = Journal::open(dir.path(), config()).unwrap();
    assert_eq!(report.removed_stale_segments.len(), 2);
    assert_eq!(
        journal.last_position(),
        Some(LogPosition {
            index: 500,
            term: 7
        })
    );
    assert_eq!(journal.last_hash(), 0xfeed);
}

#[test]
fn interrupted_reset_inside_the_log_is_finished_on_open() {
    // A snapshot from another history at index 10: the old segments do not pass through it.
    let dir = tempfile::tempdir().unwrap();
    let mut journal = filled(dir.path(), 60);
    let files = segment_files(dir.path());
    let saved: Vec<Vec<u8>> = files.iter().map(|f| fs::read(f).unwrap()).collect();
    let point = ChainPoint {
        index: 10,
        term: 9,
        hash: 0xbeef,
    };
    journal.reset(point).unwrap();
    drop(journal);
    simulate_interrupted_reset(dir.path(), &files, &saved, 2);
    let (mut journal, report) = Journal::open(dir.path(), config()).unwrap();
    assert_eq!(report.removed_stale_segments.len(), 2);
    assert_eq!(journal.next_index(), 11);
    journal.append(&entries(11..13, 9)).unwrap();
    assert_eq!(
        journal.last_hash(),
        expected_hash(0xbeef, &entries(11..13, 9))
    );
}

#[test]
fn record_offsets_follow_the_kept_segments_not_the_appended_records() {
    let dir = tempfile::tempdir().unwrap();
    // Durability is not what is checked here: no fsync keeps the 3,000 appends quick.
    let mut quick = config();
    quick.fsync = bourse_journal::Fsync::Never;
    let (mut journal, _) = Journal::open(dir.path(), quick).unwrap();
    let kept = 100u64;
    let mut held_max = 0u64;
    for index in 0..3_000u64 {
        journal.append(&entries(index..index + 1, 1)).unwrap();
        if index >= kept && index % 50 == 0 {
            journal.purge_upto(index - kept).unwrap();
        }
        // Whole segments are deleted, so the records still on disk are the kept ones plus
        // those of the oldest segment below the purge point.
        let first = journal.first_index().unwrap_or(0);
        let on_disk = segment_files(dir.path()).len() as u64;
        let held = journal.next_index() - first;
        held_max = held_max.max(held);
        let offsets = journal.record_offsets_bytes() as u64;
        assert!(offsets >= 4 * held, "{offsets} bytes for {held} records");
        // Each table at most doubles past its records (and holds at least 4 slots).
        assert!(
            offsets <= 8 * (held + 4 * on_disk),
            "{offsets} bytes of offsets for {held} records in {on_disk} segments"
        );
    }
    // 3,000 records appended; the tables hold only what the few kept segments hold.
    assert!(held_max < 1_000, "{held_max} records held at most");
    assert!(journal.record_offsets_bytes() < 4 * 3_000 / 2);
}
