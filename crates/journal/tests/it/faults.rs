//! Fail-stop: a write or fsync error poisons the journal; it never reports success after one.

use crate::common;

use std::sync::Arc;

use bourse_journal::{
    Faults, FaultyStorage, Fsync, Journal, JournalError, RealStorage, EIO, ENOSPC,
};
use common::*;

fn open_faulty(dir: &std::path::Path, fsync: Fsync) -> (Journal, Arc<Faults>) {
    let storage = FaultyStorage::new(Arc::new(RealStorage));
    let faults = storage.faults();
    let mut config = config();
    config.fsync = fsync;
    let (journal, _) = Journal::open_with_storage(Arc::new(storage), dir, config).unwrap();
    (journal, faults)
}

fn assert_io(error: &JournalError, op: &str, errno: i32) {
    match error {
        JournalError::Io { op: o, source, .. } => {
            assert_eq!(*o, op, "{error}");
            assert_eq!(source.raw_os_error(), Some(errno), "{error}");
        }
        other => panic!("expected an I/O error, got {other}"),
    }
}

fn assert_poisoned(journal: &mut Journal, cause: &str) {
    let next = journal.next_index();
    match journal.append(&entries(next..next + 1, 9)) {
        Err(JournalError::Poisoned { cause: c }) => assert!(c.contains(cause), "{c}"),
        other => panic!("expected poisoned, got {other:?}"),
    }
    assert!(matches!(
        journal.flush(),
        Err(JournalError::Poisoned { .. })
    ));
    assert!(matches!(
        journal.truncate_after(0),
        Err(JournalError::Poisoned { .. })
    ));
    assert!(journal.poisoned().is_some());
}

/// After the failure the disk holds a valid prefix; a restart recovers it.
fn assert_recovers(dir: &std::path::Path, at_least: u64) {
    let (journal, _) = Journal::open(dir, config()).unwrap();
    let last = journal.last_index().unwrap();
    assert!(last + 1 >= at_least, "recovered up to {last}");
    assert_eq!(all(&journal).len() as u64, last + 1);
}

#[test]
fn disk_full_on_write_fails_stop() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, faults) = open_faulty(dir.path(), Fsync::Always);
    journal.append(&entries(0..5, 1)).unwrap();
    // Room for a bit more than one record: the batch is partly written, then ENOSPC.
    faults.fail_writes_after(300, ENOSPC);
    let error = journal.append(&entries(5..10, 1)).unwrap_err();
    assert_io(&error, "write", ENOSPC);
    assert!(error.to_string().contains("No space left"), "{error}");
    assert_eq!(
        journal.last_index(),
        Some(4),
        "the failed batch is not visible"
    );
    // Even with space again, the journal stays stopped.
    faults.clear();
    assert_poisoned(&mut journal, "No space left");
    drop(journal);
    assert_recovers(dir.path(), 5);
}

#[test]
fn eio_on_write_fails_stop() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, faults) = open_faulty(dir.path(), Fsync::Always);
    journal.append(&entries(0..3, 1)).unwrap();
    faults.fail_writes_after(0, EIO);
    assert_io(
        &journal.append(&entries(3..4, 1)).unwrap_err(),
        "write",
        EIO,
    );
    faults.clear();
    assert_poisoned(&mut journal, "Input/output error");
    drop(journal);
    assert_recovers(dir.path(), 3);
}

#[test]
fn eio_on_fsync_fails_stop() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, faults) = open_faulty(dir.path(), Fsync::Always);
    journal.append(&entries(0..3, 1)).unwrap();
    faults.fail_syncs(EIO);
    assert_io(
        &journal.append(&entries(3..6, 1)).unwrap_err(),
        "fsync",
        EIO,
    );
    assert_eq!(journal.last_index(), Some(2));
    // A retried fsync could "succeed" after the kernel dropped the dirty pages; never trust it.
    faults.clear();
    assert_poisoned(&mut journal, "Input/output error");
    drop(journal);
    assert_recovers(dir.path(), 3);
}

#[test]
fn disk_full_on_fsync_fails_stop() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, faults) = open_faulty(dir.path(), Fsync::Always);
    journal.append(&entries(0..3, 1)).unwrap();
    faults.fail_syncs(ENOSPC);
    assert_io(
        &journal.append(&entries(3..4, 1)).unwrap_err(),
        "fsync",
        ENOSPC,
    );
    faults.clear();
    assert_poisoned(&mut journal, "No space left");
}

#[test]
fn fsync_error_in_batch_mode_surfaces_on_flush() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, faults) = open_faulty(
        dir.path(),
        Fsync::Batch {
            interval_ms: 10_000,
            bytes_max: 1 << 30,
        },
    );
    journal.append(&entries(0..3, 1)).unwrap();
    assert_eq!(journal.durable_next_index(), 0, "not yet synced");
    faults.fail_syncs(EIO);
    assert_io(&journal.flush().unwrap_err(), "fsync", EIO);
    faults.clear();
    assert_poisoned(&mut journal, "Input/output error");
}

#[test]
fn fsync_error_during_rollover_fails_stop() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, faults) = open_faulty(dir.path(), Fsync::Always);
    journal.append(&entries(0..10, 1)).unwrap();
    faults.fail_syncs(EIO);
    // Enough entries to need a new segment.
    let error = journal.append(&entries(10..40, 1)).unwrap_err();
    assert!(matches!(error, JournalError::Io { .. }), "{error}");
    assert_eq!(journal.last_index(), Some(9));
    faults.clear();
    assert_poisoned(&mut journal, "Input/output error");
    drop(journal);
    assert_recovers(dir.path(), 10);
}

#[test]
fn vote_write_failure_fails_stop() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, faults) = open_faulty(dir.path(), Fsync::Always);
    let mut meta = journal.meta();
    meta.term = 5;
    meta.voted_for = Some(2);
    faults.fail_syncs(EIO);
    assert!(journal.save_meta(meta).is_err());
    faults.clear();
    assert!(matches!(
        journal.save_meta(meta),
        Err(JournalError::Poisoned { .. })
    ));
}

#[test]
fn fsync_always_syncs_every_append() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, faults) = open_faulty(dir.path(), Fsync::Always);
    let before = faults.syncs();
    for i in 0..5 {
        journal.append(&entries(i..i + 1, 1)).unwrap();
        assert_eq!(journal.durable_next_index(), i + 1);
    }
    assert_eq!(faults.syncs() - before, 5);
}

#[test]
fn fsync_never_leaves_it_to_the_os_until_flush() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, faults) = open_faulty(dir.path(), Fsync::Never);
    let before = faults.syncs();
    journal.append(&entries(0..40, 1)).unwrap();
    assert_eq!(faults.syncs(), before);
    assert_eq!(journal.durable_next_index(), 0);
    journal.flush().unwrap();
    assert!(faults.syncs() > before);
    assert_eq!(journal.durable_next_index(), 40);
}

#[test]
fn fsync_batch_syncs_by_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, faults) = open_faulty(
        dir.path(),
        Fsync::Batch {
            interval_ms: 10_000,
            bytes_max: 1000,
        },
    );
    let before = faults.syncs();
    journal.append(&entries(0..1, 1)).unwrap();
    assert_eq!(faults.syncs(), before, "below the byte threshold");
    journal.append(&entries(1..12, 1)).unwrap();
    assert!(faults.syncs() > before, "byte threshold crossed");
    assert_eq!(journal.durable_next_index(), 12);
}

#[test]
fn fsync_batch_syncs_by_time() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, faults) = open_faulty(
        dir.path(),
        Fsync::Batch {
            interval_ms: 1,
            bytes_max: 1 << 30,
        },
    );
    journal.append(&entries(0..1, 1)).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    let before = faults.syncs();
    journal.append(&entries(1..2, 1)).unwrap();
    assert!(faults.syncs() > before);
    assert_eq!(journal.durable_next_index(), 2);
}

/// Batch mode driven by a flusher (group commit): nothing fsyncs on a timer; a prepared sync
/// runs outside the journal's `&mut` access, appends go on meanwhile, and it makes durable
/// exactly what was written when it was prepared. Counts fsyncs through the faulty storage's
/// counter, so the test does not depend on timing.
#[test]
fn batch_group_commit_syncs_at_once_and_covers_only_what_it_captured() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, faults) = open_faulty(
        dir.path(),
        Fsync::Batch {
            interval_ms: 1,
            bytes_max: 1 << 30,
        },
    );
    journal.set_batch_flusher(true);
    journal.append(&entries(0..3, 1)).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    let before = faults.syncs();
    // The interval passed, but with a flusher an append never fsyncs on the timer.
    journal.append(&entries(3..4, 1)).unwrap();
    assert_eq!(faults.syncs(), before, "append fsynced on the interval");
    assert_eq!(journal.durable_next_index(), 0);

    // A waiting caller: the sync starts at once, whatever the interval.
    let prepared = journal
        .prepare_sync()
        .unwrap()
        .expect("unsynced data waits");
    assert_eq!(prepared.target_next_index(), 4);
    // Appends during the fsync are not covered by it.
    journal.append(&entries(4..6, 1)).unwrap();
    journal
        .save_committed(bourse_journal::LogPosition { index: 3, term: 1 })
        .unwrap();
    assert_eq!(journal.committed(), None, "commit point ahead of durable");
    let outcome = prepared.run();
    assert_eq!(faults.syncs(), before + 1, "one fsync for the group");
    journal.finish_sync(outcome).unwrap();
    assert_eq!(journal.durable_next_index(), 4);
    assert_eq!(journal.committed().map(|c| c.index), Some(3));

    // The next sync covers the appends that arrived during the first.
    let prepared = journal.prepare_sync().unwrap().expect("entries 4..6 wait");
    assert_eq!(prepared.target_next_index(), 6);
    // (The first sync's commit point created the commit file, with fsyncs of its own.)
    let before = faults.syncs();
    journal.finish_sync(prepared.run()).unwrap();
    assert_eq!(journal.durable_next_index(), 6);
    assert_eq!(faults.syncs(), before + 1);
    assert!(journal.prepare_sync().unwrap().is_none(), "nothing left");
}

/// Every group commit of a segment fsyncs through the one handle taken at its first: a
/// descriptor dup'ed and closed per fsync cost two system calls per consensus round.
#[test]
fn batch_group_commits_of_a_segment_share_one_fsync_handle() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, faults) = open_faulty(
        dir.path(),
        Fsync::Batch {
            interval_ms: 10_000,
            bytes_max: 1 << 30,
        },
    );
    journal.set_batch_flusher(true);
    for round in 0..10u64 {
        journal.append(&entries(round..round + 1, 1)).unwrap();
        let outcome = journal_prepare(&mut journal);
        journal.finish_sync(outcome).unwrap();
        assert_eq!(journal.durable_next_index(), round + 1);
    }
    assert_eq!(faults.sync_handles(), 1, "a handle per group commit");
}

/// A sync prepared before a truncation must not vouch for entries written after it under the
/// same indexes.
#[test]
fn batch_group_commit_ignores_a_sync_prepared_before_a_truncation() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, _faults) = open_faulty(
        dir.path(),
        Fsync::Batch {
            interval_ms: 10_000,
            bytes_max: 1 << 30,
        },
    );
    journal.set_batch_flusher(true);
    journal.append(&entries(0..6, 1)).unwrap();
    let prepared = journal.prepare_sync().unwrap().expect("data waits");
    journal.truncate_after(2).unwrap();
    journal.append(&entries(3..6, 2)).unwrap();
    journal.finish_sync(prepared.run()).unwrap();
    assert!(
        journal.durable_next_index() <= 3,
        "claimed rewritten entries"
    );
    let outcome = journal_prepare(&mut journal);
    journal.finish_sync(outcome).unwrap();
    assert_eq!(journal.durable_next_index(), 6);
}

fn journal_prepare(journal: &mut Journal) -> bourse_journal::SyncOutcome {
    journal.prepare_sync().unwrap().expect("data waits").run()
}

/// An fsync error on the flusher's path fails stop like any other.
#[test]
fn batch_group_commit_fsync_error_fails_stop() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, faults) = open_faulty(
        dir.path(),
        Fsync::Batch {
            interval_ms: 10_000,
            bytes_max: 1 << 30,
        },
    );
    journal.set_batch_flusher(true);
    journal.append(&entries(0..3, 1)).unwrap();
    let prepared = journal.prepare_sync().unwrap().expect("data waits");
    faults.fail_syncs(EIO);
    let outcome = prepared.run();
    assert_io(&journal.finish_sync(outcome).unwrap_err(), "fsync", EIO);
    assert_eq!(journal.durable_next_index(), 0);
    faults.clear();
    assert_poisoned(&mut journal, "Input/output error");
}
