//! Snapshots: atomic replacement, damage detection, retention.

use std::fs;
use std::sync::Arc;

use bourse_journal::{FaultyStorage, JournalError, RealStorage, SnapshotMeta, SnapshotStore, EIO};

const CLUSTER: u128 = 42;

fn meta(index: u64) -> SnapshotMeta {
    SnapshotMeta {
        cluster_id: CLUSTER,
        last_index: index,
        last_term: 2,
        state_hash: index * 1000 + 7,
        chain_hash: index ^ 0xabc,
    }
}

fn data(index: u64) -> Vec<u8> {
    (0..10_000u64).map(|i| (i * 7 + index) as u8).collect()
}

#[test]
fn snapshot_round_trips_and_newest_wins() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, removed) = SnapshotStore::open(dir.path(), CLUSTER, 3).unwrap();
    assert!(removed.is_empty());
    assert!(store.latest().unwrap().snapshot.is_none());
    store.write(meta(10), &data(10)).unwrap();
    store.write(meta(20), &data(20)).unwrap();
    let latest = store.latest().unwrap();
    let snapshot = latest.snapshot.unwrap();
    assert_eq!(snapshot.meta, meta(20));
    assert_eq!(snapshot.data, data(20));
    assert!(latest.skipped.is_empty());
}

#[test]
fn snapshot_crash_between_temp_write_and_rename_keeps_previous() {
    let dir = tempfile::tempdir().unwrap();
    let storage = FaultyStorage::new(Arc::new(RealStorage));
    let faults = storage.faults();
    let storage: Arc<dyn bourse_journal::Storage> = Arc::new(storage);
    let (mut store, _) =
        SnapshotStore::open_with_storage(storage.clone(), dir.path(), CLUSTER, 3).unwrap();
    store.write(meta(10), &data(10)).unwrap();
    // The "crash": the temporary file is written and synced, the rename never happens.
    faults.fail_renames(EIO);
    assert!(store.write(meta(20), &data(20)).is_err());
    faults.clear();
    let temp_count = fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".tmp")
        })
        .count();
    assert_eq!(temp_count, 1);
    drop(store);

    // Restart: the torn temporary file is cleaned up and the previous snapshot is the latest.
    let (store, removed) = SnapshotStore::open(dir.path(), CLUSTER, 3).unwrap();
    assert_eq!(removed.len(), 1);
    assert!(!removed[0].exists());
    let latest = store.latest().unwrap();
    assert_eq!(latest.snapshot.unwrap().meta, meta(10));
    assert!(latest.skipped.is_empty());
}

#[test]
fn damaged_newer_snapshot_is_skipped_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = SnapshotStore::open(dir.path(), CLUSTER, 3).unwrap();
    store.write(meta(10), &data(10)).unwrap();
    let newer = store.write(meta(20), &data(20)).unwrap();
    let mut bytes = fs::read(&newer).unwrap();
    bytes[5000] ^= 1;
    fs::write(&newer, bytes).unwrap();
    let latest = store.latest().unwrap();
    assert_eq!(latest.snapshot.unwrap().meta, meta(10));
    assert_eq!(latest.skipped.len(), 1);
    assert_eq!(latest.skipped[0].file, newer);
    assert!(latest.skipped[0].reason.contains("checksum"));
}

#[test]
fn partial_snapshot_is_skipped_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = SnapshotStore::open(dir.path(), CLUSTER, 3).unwrap();
    store.write(meta(10), &data(10)).unwrap();
    let newer = store.write(meta(20), &data(20)).unwrap();
    let f = fs::OpenOptions::new().write(true).open(&newer).unwrap();
    f.set_len(3000).unwrap();
    drop(f);
    let latest = store.latest().unwrap();
    assert_eq!(latest.snapshot.unwrap().meta, meta(10));
    assert!(latest.skipped[0].reason.contains("partial"));
}

#[test]
fn only_the_last_k_snapshots_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = SnapshotStore::open(dir.path(), CLUSTER, 2).unwrap();
    for index in [5, 10, 15, 20] {
        store.write(meta(index), &data(index)).unwrap();
    }
    let kept: Vec<u64> = store.list().unwrap().iter().map(|(i, _, _)| *i).collect();
    assert_eq!(kept, vec![15, 20]);
}

#[test]
fn another_clusters_snapshot_is_not_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = SnapshotStore::open(dir.path(), CLUSTER, 2).unwrap();
    store.write(meta(5), &data(5)).unwrap();
    let (other, _) = SnapshotStore::open(dir.path(), CLUSTER + 1, 2).unwrap();
    let latest = other.latest().unwrap();
    assert!(latest.snapshot.is_none());
    assert!(latest.skipped[0].reason.contains("cluster"));
    let mut wrong = meta(6);
    wrong.cluster_id = 7;
    assert!(matches!(
        store.write(wrong, b"x"),
        Err(JournalError::Invalid(_))
    ));
}
