//! Recovery: what `open` repairs (a torn tail) and what it refuses (everything else).

use crate::common;

use std::fs;

use bourse_journal::{verify, Journal, JournalError, RECORD_HEADER_SIZE_BYTES};
use common::*;

#[test]
fn torn_tail_is_truncated_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    drop(filled(dir.path(), 10));
    let (file, offset) = locate(dir.path(), 9);
    let len = fs::metadata(&file).unwrap().len();
    // Cut the last record in the middle of its payload, as a crash mid-write would.
    let f = fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.set_len(len - 5).unwrap();
    drop(f);

    let report = verify(dir.path()).unwrap();
    assert!(report.is_ok(), "{:?}", report.problem);
    assert_eq!(report.torn_tail.as_ref().unwrap().offset, offset);

    let (mut journal, report) = Journal::open(dir.path(), config()).unwrap();
    let torn = report.torn_tail.expect("torn tail reported");
    assert_eq!(torn.file, file);
    assert_eq!(torn.offset, offset);
    assert_eq!(torn.bytes_dropped, len - 5 - offset);
    assert_eq!(journal.last_index(), Some(8));
    assert_eq!(fs::metadata(&file).unwrap().len(), offset);
    // The log continues where the valid prefix ends.
    journal.append(&entries(9..12, 2)).unwrap();
    drop(journal);
    let (journal, report) = Journal::open(dir.path(), config()).unwrap();
    assert!(report.torn_tail.is_none());
    assert_eq!(journal.last_index(), Some(11));
    assert_eq!(all(&journal).len(), 12);
}

#[test]
fn torn_partial_header_at_tail_is_truncated() {
    let dir = tempfile::tempdir().unwrap();
    drop(filled(dir.path(), 3));
    let last = segment_files(dir.path()).pop().unwrap();
    let mut bytes = fs::read(&last).unwrap();
    let end = bytes.len() as u64;
    bytes.extend_from_slice(&[0x33; 11]);
    fs::write(&last, &bytes).unwrap();
    let (journal, report) = Journal::open(dir.path(), config()).unwrap();
    assert_eq!(report.torn_tail.unwrap().offset, end);
    assert_eq!(journal.last_index(), Some(2));
}

#[test]
fn zero_filled_tail_is_truncated() {
    // Some file systems extend the file before the data lands: a crash leaves zeros.
    let dir = tempfile::tempdir().unwrap();
    drop(filled(dir.path(), 4));
    let last = segment_files(dir.path()).pop().unwrap();
    let mut bytes = fs::read(&last).unwrap();
    bytes.extend_from_slice(&[0u8; 700]);
    fs::write(&last, &bytes).unwrap();
    let (journal, report) = Journal::open(dir.path(), config()).unwrap();
    assert_eq!(report.torn_tail.unwrap().bytes_dropped, 700);
    assert_eq!(journal.last_index(), Some(3));
}

#[test]
fn flipped_bit_in_committed_record_is_detected_with_file_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    drop(filled(dir.path(), 8));
    let (file, offset) = locate(dir.path(), 3);
    flip_bit(&file, offset + RECORD_HEADER_SIZE_BYTES + 2);
    match open_err(dir.path()) {
        JournalError::Corrupt {
            file: f,
            offset: o,
            reason,
        } => {
            assert_eq!(f, file);
            assert_eq!(o, offset);
            assert!(reason.contains("checksum"), "{reason}");
        }
        other => panic!("unexpected {other}"),
    }
    // Nothing was truncated: the file still holds every record.
    let report = verify(dir.path()).unwrap();
    let problem = report.problem.expect("verify finds it");
    assert_eq!(problem.file.as_deref(), Some(file.as_path()));
    assert_eq!(problem.offset, Some(offset));
    assert!(problem.message.contains(&file.display().to_string()));
}

#[test]
fn flipped_bit_in_last_record_of_non_last_segment_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    drop(filled(dir.path(), 60));
    let files = segment_files(dir.path());
    assert!(files.len() >= 3);
    let first_of_second = locate(dir.path(), 0);
    assert_eq!(first_of_second.0, files[0]);
    // The last record of the first segment: the one just before the second segment's base.
    let infos: Vec<_> = bourse_journal::inspect(dir.path(), ..)
        .unwrap()
        .map(|r| r.unwrap())
        .filter(|r| r.file == files[0])
        .collect();
    let last = infos.last().unwrap();
    flip_bit(&files[0], last.offset + RECORD_HEADER_SIZE_BYTES);
    match open_err(dir.path()) {
        JournalError::Corrupt { file, offset, .. } => {
            assert_eq!(file, files[0]);
            assert_eq!(offset, last.offset);
        }
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn zeroed_sector_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    drop(filled(dir.path(), 60));
    let file = segment_files(dir.path()).remove(0);
    let len = fs::metadata(&file).unwrap().len();
    assert!(len > 2048, "segment holds data after the zeroed sector");
    let mut bytes = fs::read(&file).unwrap();
    bytes[1024..1536].fill(0);
    fs::write(&file, &bytes).unwrap();
    match open_err(dir.path()) {
        JournalError::Corrupt {
            file: f, offset, ..
        } => {
            assert_eq!(f, file);
            assert!(offset <= 1024 && offset > 128, "offset {offset}");
        }
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn zeroed_sector_in_last_segment_is_detected_not_truncated() {
    let dir = tempfile::tempdir().unwrap();
    drop(filled(dir.path(), 40));
    let file = segment_files(dir.path()).pop().unwrap();
    let len = fs::metadata(&file).unwrap().len();
    assert!(len > 1024, "last segment is big enough: {len}");
    let mut bytes = fs::read(&file).unwrap();
    bytes[512..1024].fill(0);
    fs::write(&file, &bytes).unwrap();
    assert!(matches!(open_err(dir.path()), JournalError::Corrupt { .. }));
    assert_eq!(fs::metadata(&file).unwrap().len(), len, "nothing was cut");
}

#[test]
fn truncated_middle_segment_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    drop(filled(dir.path(), 60));
    let files = segment_files(dir.path());
    assert!(files.len() >= 3);
    let len = fs::metadata(&files[1]).unwrap().len();
    let f = fs::OpenOptions::new().write(true).open(&files[1]).unwrap();
    f.set_len(len / 2).unwrap();
    drop(f);
    let error = open_err(dir.path());
    assert!(
        matches!(&error, JournalError::Corrupt { file, .. } if *file == files[1]),
        "{error}"
    );
    assert!(error.to_string().contains("not the last"), "{error}");
}

#[test]
fn middle_segment_cut_at_record_boundary_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    drop(filled(dir.path(), 60));
    let files = segment_files(dir.path());
    let infos: Vec<_> = bourse_journal::inspect(dir.path(), ..)
        .unwrap()
        .map(|r| r.unwrap())
        .filter(|r| r.file == files[1])
        .collect();
    let cut = infos[infos.len() - 2].offset;
    let f = fs::OpenOptions::new().write(true).open(&files[1]).unwrap();
    f.set_len(cut).unwrap();
    drop(f);
    match open_err(dir.path()) {
        JournalError::IndexGap { file, .. } => assert_eq!(file, files[2]),
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn missing_middle_segment_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    drop(filled(dir.path(), 60));
    let files = segment_files(dir.path());
    fs::remove_file(&files[1]).unwrap();
    match open_err(dir.path()) {
        JournalError::IndexGap { file, .. } => assert_eq!(file, files[2]),
        other => panic!("unexpected {other}"),
    }
    assert!(!verify(dir.path()).unwrap().is_ok());
}

#[test]
fn missing_first_segment_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    drop(filled(dir.path(), 60));
    let files = segment_files(dir.path());
    fs::remove_file(&files[0]).unwrap();
    match open_err(dir.path()) {
        JournalError::IndexGap {
            file, expected: 0, ..
        } => assert_eq!(file, files[1]),
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn missing_last_segment_with_committed_entries_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let mut journal = filled(dir.path(), 60);
    let mut meta = journal.meta();
    meta.committed = Some(journal.last_position().unwrap());
    journal.save_meta(meta).unwrap();
    drop(journal);
    let last = segment_files(dir.path()).pop().unwrap();
    fs::remove_file(last).unwrap();
    assert!(matches!(
        open_err(dir.path()),
        JournalError::CommittedMissing { committed: 59, .. }
    ));
}

#[test]
fn wrong_file_in_the_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(filled(dir.path(), 60));
    let files = segment_files(dir.path());
    // A file that is named like a segment but is something else.
    fs::write(
        &files[1],
        b"this is not a journal segment, it is someone's notes",
    )
    .unwrap();
    match open_err(dir.path()) {
        JournalError::NotASegment { file, reason } => {
            assert_eq!(file, files[1]);
            assert!(
                reason.contains("magic") || reason.contains("shorter"),
                "{reason}"
            );
        }
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn segment_renamed_to_wrong_index_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(filled(dir.path(), 60));
    let files = segment_files(dir.path());
    let last = files.last().unwrap();
    fs::rename(last, dir.path().join("00000000000000009999.seg")).unwrap();
    assert!(matches!(
        open_err(dir.path()),
        JournalError::NotASegment { .. }
    ));
}

#[test]
fn foreign_files_are_left_alone_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    drop(filled(dir.path(), 3));
    fs::write(dir.path().join("README.txt"), b"hello").unwrap();
    let (_, report) = Journal::open(dir.path(), config()).unwrap();
    assert_eq!(report.foreign_files, vec![dir.path().join("README.txt")]);
}

#[test]
fn another_clusters_journal_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(filled(dir.path(), 3));
    let mut other = config();
    other.cluster_id = CLUSTER + 1;
    let error = Journal::open(dir.path(), other).unwrap_err();
    match &error {
        JournalError::WrongCluster {
            expected, found, ..
        } => {
            assert_eq!(*expected, CLUSTER + 1);
            assert_eq!(*found, CLUSTER);
        }
        other => panic!("unexpected {other}"),
    }
    assert!(error.to_string().contains("another cluster"));
}

#[test]
fn another_nodes_journal_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(filled(dir.path(), 3));
    let mut other = config();
    other.node_id = NODE + 1;
    assert!(matches!(
        Journal::open(dir.path(), other),
        Err(JournalError::WrongNode { .. })
    ));
}

#[test]
fn segment_from_another_history_breaks_the_chain() {
    // Two journals of the same cluster and node with different contents: splice the second
    // segment of one into the other.
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    drop(filled(a.path(), 60));
    let mut journal = open(b.path());
    for start in (0..60).step_by(5) {
        journal.append(&entries(start..start + 5, 3)).unwrap();
    }
    drop(journal);
    let fa = segment_files(a.path());
    let fb = segment_files(b.path());
    assert_eq!(fa[1].file_name(), fb[1].file_name());
    fs::copy(&fb[1], &fa[1]).unwrap();
    assert!(matches!(
        open_err(a.path()),
        JournalError::ChainBroken { .. }
    ));
}

#[test]
fn missing_vote_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(filled(dir.path(), 3));
    fs::remove_file(dir.path().join(bourse_journal::META_FILE_NAME)).unwrap();
    assert!(matches!(open_err(dir.path()), JournalError::BadMeta { .. }));
}

#[test]
fn damaged_vote_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(filled(dir.path(), 3));
    flip_bit(&dir.path().join(bourse_journal::META_FILE_NAME), 41);
    assert!(matches!(open_err(dir.path()), JournalError::BadMeta { .. }));
}

#[test]
fn leftover_temporary_files_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    drop(filled(dir.path(), 3));
    let temp = dir.path().join("00000000000000000003.seg.tmp");
    fs::write(&temp, b"half a header").unwrap();
    let (_, report) = Journal::open(dir.path(), config()).unwrap();
    assert_eq!(report.removed_temp_files, vec![temp.clone()]);
    assert!(!temp.exists());
}

#[test]
fn empty_last_segment_from_interrupted_creation_is_removed() {
    // Under Fsync::Never a crash can leave a renamed segment whose header never hit the disk.
    let dir = tempfile::tempdir().unwrap();
    drop(filled(dir.path(), 60));
    let files = segment_files(dir.path());
    let next: u64 = {
        let journal = open(dir.path());
        journal.next_index()
    };
    let empty = dir.path().join(bourse_journal::segment_file_name(next));
    fs::write(&empty, [0u8; 128]).unwrap();
    assert!(verify(dir.path()).unwrap().is_ok());
    let (mut journal, report) = Journal::open(dir.path(), config()).unwrap();
    let torn = report.torn_tail.unwrap();
    assert_eq!(
        (torn.file, torn.offset, torn.bytes_dropped),
        (empty.clone(), 0, 128)
    );
    assert_eq!(segment_files(dir.path()), files);
    journal.append(&entries(next..next + 40, 1)).unwrap();
}

#[test]
fn short_foreign_file_named_as_last_segment_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(filled(dir.path(), 60));
    let next = open(dir.path()).next_index();
    let foreign = dir.path().join(bourse_journal::segment_file_name(next));
    fs::write(&foreign, b"oops").unwrap();
    match open_err(dir.path()) {
        JournalError::NotASegment { file, .. } => assert_eq!(file, foreign),
        other => panic!("unexpected {other}"),
    }
}

fn position(index: u64) -> bourse_journal::LogPosition {
    bourse_journal::LogPosition { index, term: 1 }
}

#[test]
fn the_commit_point_survives_reopen_and_never_goes_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut journal = filled(dir.path(), 30);
    assert_eq!(journal.committed(), None);
    journal.save_committed(position(12)).unwrap();
    journal.save_committed(position(20)).unwrap();
    journal.save_committed(position(15)).unwrap();
    assert_eq!(journal.committed(), Some(position(20)));
    drop(journal);
    assert!(dir.path().join(bourse_journal::COMMIT_FILE_NAME).exists());
    let report = verify(dir.path()).unwrap();
    assert!(report.is_ok(), "{:?}", report.problem);
    assert!(
        report.foreign_files.is_empty(),
        "{:?}",
        report.foreign_files
    );
    let (journal, report) = Journal::open(dir.path(), config()).unwrap();
    assert!(report.committed_lost.is_none());
    assert_eq!(journal.committed(), Some(position(20)));
}

#[test]
fn under_batch_the_commit_point_waits_for_the_fsync_that_makes_it_durable() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config();
    config.fsync = bourse_journal::Fsync::Batch {
        interval_ms: 10_000,
        bytes_max: 1 << 30,
    };
    let (mut journal, _) = Journal::open(dir.path(), config).unwrap();
    journal.append(&entries(0..10, 1)).unwrap();
    assert_eq!(journal.durable_next_index(), 0);
    // Committed by a quorum of peers, but not yet durable here: recording it now would make
    // a crash before the fsync look like lost committed records.
    journal.save_committed(position(8)).unwrap();
    assert_eq!(journal.committed(), None);
    journal.flush().unwrap();
    assert_eq!(journal.committed(), Some(position(8)));
}

#[test]
fn a_log_cut_at_a_record_boundary_inside_the_commit_point_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut journal = filled(dir.path(), 60);
    journal.save_committed(position(59)).unwrap();
    drop(journal);
    // Cut the last segment exactly before the record of index 55: every record left is
    // whole, so without the commit point this would look like a clean end.
    let (file, offset) = locate(dir.path(), 55);
    let f = fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.set_len(offset).unwrap();
    drop(f);
    let error = open_err(dir.path());
    match &error {
        JournalError::CommittedMissing {
            committed: 59,
            end: Some((end_file, end_offset)),
            ..
        } => {
            assert_eq!(end_file, &file);
            assert_eq!(*end_offset, offset);
        }
        other => panic!("unexpected {other}"),
    }
    let text = error.to_string();
    let name = file.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        text.contains(&name) && text.contains(&offset.to_string()) && text.contains("commit"),
        "{text}"
    );
    assert_eq!(error.file(), Some(file.as_path()));
    assert_eq!(error.offset(), Some(offset));
    assert!(!verify(dir.path()).unwrap().is_ok());

    // Under fsync Never the same loss is what the operator accepted: the journal opens,
    // says what it lost, and no longer vouches for the missing entries.
    let mut never = config();
    never.fsync = bourse_journal::Fsync::Never;
    let (journal, report) = Journal::open(dir.path(), never).unwrap();
    assert!(report.committed_lost.unwrap().contains("index 59"));
    assert_eq!(journal.committed(), Some(position(54)));
}

#[test]
fn a_missing_last_segment_under_the_commit_point_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut journal = filled(dir.path(), 60);
    journal.save_committed(position(59)).unwrap();
    drop(journal);
    let mut files = segment_files(dir.path());
    let last = files.pop().unwrap();
    fs::remove_file(&last).unwrap();
    let error = open_err(dir.path());
    assert!(
        matches!(error, JournalError::CommittedMissing { committed: 59, .. }),
        "{error}"
    );
    let text = error.to_string();
    let now_last = files
        .last()
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();
    assert!(text.contains(&now_last), "{text}");
}

#[test]
fn a_damaged_commit_point_file_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut journal = filled(dir.path(), 10);
    journal.save_committed(position(5)).unwrap();
    drop(journal);
    let path = dir.path().join(bourse_journal::COMMIT_FILE_NAME);
    flip_bit(&path, 41);
    let error = open_err(dir.path());
    assert!(
        matches!(&error, JournalError::BadMeta { file, .. } if file == &path),
        "{error}"
    );
}
