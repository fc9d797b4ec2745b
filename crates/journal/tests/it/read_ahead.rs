//! Reading ranges with read-ahead: the same entries as one read per record, far fewer read
//! calls on a long range, no more bytes than asked for on a short one, and a read error past
//! a record never fails that record.

use crate::common;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bourse_journal::{
    DirEntry, Entry, Journal, JournalError, OpenMode, RealStorage, SegmentFile, Storage,
    READ_AHEAD_BYTES,
};
use common::*;

/// Counts read calls and bytes, and fails any read that covers byte `fail` of a file (when set;
/// only segments are read while a range is read, and the test that sets it has one segment).
#[derive(Debug, Default)]
struct Reads {
    calls: AtomicU64,
    bytes: AtomicU64,
    fail: Mutex<Option<u64>>,
}

#[derive(Debug)]
struct CountingStorage(Arc<Reads>);

#[derive(Debug)]
struct CountingFile {
    inner: Box<dyn SegmentFile>,
    reads: Arc<Reads>,
}

impl Storage for CountingStorage {
    fn create_dir_all(&self, path: &Path) -> std::io::Result<()> {
        RealStorage.create_dir_all(path)
    }
    fn list_dir(&self, path: &Path) -> std::io::Result<Vec<DirEntry>> {
        RealStorage.list_dir(path)
    }
    fn open_file(&self, path: &Path, mode: OpenMode) -> std::io::Result<Box<dyn SegmentFile>> {
        Ok(Box::new(CountingFile {
            inner: RealStorage.open_file(path, mode)?,
            reads: self.0.clone(),
        }))
    }
    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        RealStorage.remove_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        RealStorage.rename(from, to)
    }
    fn sync_dir(&self, path: &Path) -> std::io::Result<()> {
        RealStorage.sync_dir(path)
    }
}

impl SegmentFile for CountingFile {
    fn size_bytes(&self) -> std::io::Result<u64> {
        self.inner.size_bytes()
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        if let Some(at) = *self.reads.fail.lock().unwrap() {
            if (offset..offset + buf.len() as u64).contains(&at) {
                return Err(std::io::Error::from_raw_os_error(bourse_journal::EIO));
            }
        }
        self.reads.calls.fetch_add(1, Ordering::Relaxed);
        self.reads
            .bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.inner.read_exact_at(buf, offset)
    }
    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_all_at(buf, offset)
    }
    fn sync_data(&mut self) -> std::io::Result<()> {
        self.inner.sync_data()
    }
    fn set_len(&mut self, len_bytes: u64) -> std::io::Result<()> {
        self.inner.set_len(len_bytes)
    }
}

/// Entries of varied sizes, some larger than the read-ahead, over several segments.
fn big_entries(count: u64) -> Vec<Entry> {
    (0..count)
        .map(|index| {
            let len = match index % 5 {
                0 => READ_AHEAD_BYTES as usize + 1000,
                1 => 3,
                _ => 20_000 + (index as usize * 7919) % 90_000,
            };
            Entry {
                index,
                term: 1,
                payload: (0..len).map(|i| (i as u64 * 31 + index) as u8).collect(),
            }
        })
        .collect()
}

fn open_counting(dir: &Path) -> (Journal, Arc<Reads>) {
    let reads = Arc::new(Reads::default());
    let mut config = bourse_journal::Config::new(CLUSTER, NODE);
    config.segment_size_bytes_max = 4 << 20;
    config.payload_size_bytes_max = 2 << 20;
    config.fsync = bourse_journal::Fsync::Never;
    let storage = Arc::new(CountingStorage(reads.clone()));
    let (journal, _) = Journal::open_with_storage(storage, dir, config).unwrap();
    (journal, reads)
}

#[test]
fn ranges_read_with_read_ahead_return_exactly_the_entries_written() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, reads) = open_counting(dir.path());
    let written = big_entries(60);
    for chunk in written.chunks(7) {
        journal.append(chunk).unwrap();
    }
    journal.flush().unwrap();
    assert!(
        segment_files(dir.path()).len() >= 3,
        "spans several segments"
    );
    let ranges = [
        (0, 60),
        (0, 1),
        (59, 60),
        (4, 5),
        (3, 41),
        (17, 18),
        (10, 59),
    ];
    for (start, end) in ranges {
        reads.calls.store(0, Ordering::Relaxed);
        reads.bytes.store(0, Ordering::Relaxed);
        let got = journal.read(start..end).unwrap();
        let same = got == written[start as usize..end as usize];
        assert!(same, "{start}..{end}: other entries than written");
        // Never more bytes than the records asked for (the frames add a small header each).
        let payload_bytes: u64 = got.iter().map(|e| e.payload.len() as u64).sum();
        let read_bytes = reads.bytes.load(Ordering::Relaxed);
        assert!(read_bytes >= payload_bytes);
        assert!(
            read_bytes <= payload_bytes + 64 * (end - start),
            "{start}..{end}"
        );
    }
    // A long range of small records takes far fewer read calls than records.
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, reads) = open_counting(dir.path());
    journal.append(&entries(0..5_000, 1)).unwrap();
    reads.calls.store(0, Ordering::Relaxed);
    let got = journal.read(..).unwrap();
    assert!(got == entries(0..5_000, 1), "other entries than written");
    assert!(
        reads.calls.load(Ordering::Relaxed) <= 5,
        "one call per chunk"
    );
}

#[test]
fn a_read_error_past_a_record_does_not_fail_that_record() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, reads) = open_counting(dir.path());
    let written = entries(0..200, 1);
    journal.append(&written).unwrap();
    journal.flush().unwrap();
    let (path, before) = locate(dir.path(), 150);
    assert_eq!(segment_files(dir.path()), vec![path]);
    *reads.fail.lock().unwrap() = Some(before + 1);
    let mut got = Vec::new();
    let mut error = None;
    for e in journal.entries(..).unwrap() {
        match e {
            Ok(e) => got.push(e),
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    let indexes: Vec<u64> = got.iter().map(|e| e.index).collect();
    assert_eq!(
        (got.len(), error.is_some()),
        (150, true),
        "read until the bad record: {error:?}"
    );
    assert_eq!(
        indexes,
        (0..150).collect::<Vec<u64>>(),
        "the records before the bad one"
    );
    assert!(got == written[..150], "other entries than written");
    match error {
        Some(JournalError::Io { op, .. }) => assert_eq!(op, "read"),
        other => panic!("expected a read error, got {other:?}"),
    }
}
