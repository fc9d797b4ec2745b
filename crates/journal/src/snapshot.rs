//! Snapshots: a state machine's bytes plus the log position they cover, written atomically
//! (temporary file, write, fsync, rename, fsync the directory) and CRC-protected, so a crash
//! at any point leaves the previous snapshot as the latest valid one.
//!
//! ```text
//! snapshot file: 128-byte header, then the data
//!   0..8     magic "BOURSESN"
//!   8..12    format version (2)
//!   12..16   header size (128)
//!   16..32   cluster id
//!   32..40   last included index     40..48  last included term
//!   48..56   state hash              56..64  chain hash at the last included index
//!   64..72   data length in bytes    72..76  CRC32C of the data
//!   76..124  reserved, zero          124..128 CRC32C of bytes 0..124
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{JournalError, Result};
use crate::format::{read_u128, read_u32, read_u64, FORMAT_VERSION};
use crate::stats::SnapshotStats;
use crate::storage::{OpenMode, RealStorage, Storage};

const SNAPSHOT_MAGIC: [u8; 8] = *b"BOURSESN";
const SNAPSHOT_HEADER_SIZE_BYTES: usize = 128;
/// The largest snapshot the store accepts; snapshots are held in memory whole.
pub const SNAPSHOT_SIZE_BYTES_LIMIT: u64 = 4 * 1024 * 1024 * 1024;
/// The most snapshots a store may keep.
pub const SNAPSHOTS_KEPT_LIMIT: usize = 64;

/// What a snapshot covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotMeta {
    pub cluster_id: u128,
    pub last_index: u64,
    pub last_term: u64,
    /// The state machine's hash after applying `last_index`; replicas compare it.
    pub state_hash: u64,
    /// The journal's chain hash at `last_index`, so a node restored from this snapshot
    /// continues the same hash chain (see `Journal::reset`).
    pub chain_hash: u64,
}

/// A snapshot loaded from disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub meta: SnapshotMeta,
    pub data: Vec<u8>,
    pub file: PathBuf,
}

/// A snapshot file that was skipped because it is damaged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkippedSnapshot {
    pub file: PathBuf,
    pub reason: String,
}

/// The newest valid snapshot and the newer ones that had to be passed over.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LatestSnapshot {
    pub snapshot: Option<Snapshot>,
    pub skipped: Vec<SkippedSnapshot>,
}

/// A directory of snapshots; keeps the newest `keep` of them.
#[derive(Debug)]
pub struct SnapshotStore {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    cluster_id: u128,
    keep: usize,
    /// Counters for monitoring.
    stats: Arc<SnapshotStats>,
}

fn snapshot_file_name(last_index: u64, last_term: u64) -> String {
    format!("snapshot-{last_index:020}-{last_term:020}.snap")
}

fn parse_snapshot_file_name(name: &str) -> Option<(u64, u64)> {
    let rest = name.strip_prefix("snapshot-")?.strip_suffix(".snap")?;
    let (index, term) = rest.split_once('-')?;
    if index.len() != 20 || term.len() != 20 {
        return None;
    }
    if !index
        .bytes()
        .chain(term.bytes())
        .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    Some((index.parse().ok()?, term.parse().ok()?))
}

impl SnapshotStore {
    /// Opens the store on the real file system. Returns the temporary files of interrupted
    /// writes that it removed.
    pub fn open(
        dir: impl AsRef<Path>,
        cluster_id: u128,
        keep: usize,
    ) -> Result<(SnapshotStore, Vec<PathBuf>)> {
        SnapshotStore::open_with_storage(Arc::new(RealStorage), dir, cluster_id, keep)
    }

    pub fn open_with_storage(
        storage: Arc<dyn Storage>,
        dir: impl AsRef<Path>,
        cluster_id: u128,
        keep: usize,
    ) -> Result<(SnapshotStore, Vec<PathBuf>)> {
        if keep == 0 || keep > SNAPSHOTS_KEPT_LIMIT {
            return Err(JournalError::Config(format!(
                "snapshots kept must be in 1..={SNAPSHOTS_KEPT_LIMIT}, not {keep}"
            )));
        }
        let dir = dir.as_ref().to_path_buf();
        storage
            .create_dir_all(&dir)
            .map_err(|error| JournalError::io("create directory", &dir, error))?;
        let mut removed = Vec::new();
        for entry in storage
            .list_dir(&dir)
            .map_err(|error| JournalError::io("list directory", &dir, error))?
        {
            if !entry.is_dir && entry.name.ends_with(".snap.tmp") {
                let path = dir.join(&entry.name);
                storage
                    .remove_file(&path)
                    .map_err(|error| JournalError::io("remove", &path, error))?;
                removed.push(path);
            }
        }
        if !removed.is_empty() {
            storage
                .sync_dir(&dir)
                .map_err(|error| JournalError::io("fsync directory", &dir, error))?;
        }
        Ok((
            SnapshotStore {
                stats: SnapshotStats::new(&dir),
                storage,
                dir,
                cluster_id,
                keep,
            },
            removed,
        ))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Counters for monitoring: snapshots written, their size and write time.
    pub fn stats(&self) -> Arc<SnapshotStats> {
        self.stats.clone()
    }

    /// Snapshot files by (last index, last term), oldest first.
    pub fn list(&self) -> Result<Vec<(u64, u64, PathBuf)>> {
        let mut out = Vec::new();
        for entry in self
            .storage
            .list_dir(&self.dir)
            .map_err(|error| JournalError::io("list directory", &self.dir, error))?
        {
            if entry.is_dir {
                continue;
            }
            if let Some((index, term)) = parse_snapshot_file_name(&entry.name) {
                out.push((index, term, self.dir.join(&entry.name)));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Writes a snapshot atomically and durably, then deletes all but the newest `keep`.
    pub fn write(&mut self, meta: SnapshotMeta, data: &[u8]) -> Result<PathBuf> {
        if meta.cluster_id != self.cluster_id {
            return Err(JournalError::Invalid(format!(
                "snapshot for cluster {:032x} written to the store of cluster {:032x}",
                meta.cluster_id, self.cluster_id
            )));
        }
        if data.len() as u64 > SNAPSHOT_SIZE_BYTES_LIMIT {
            return Err(JournalError::Invalid(format!(
                "snapshot of {} bytes exceeds the limit of {SNAPSHOT_SIZE_BYTES_LIMIT}",
                data.len()
            )));
        }
        let started = std::time::Instant::now();
        let name = snapshot_file_name(meta.last_index, meta.last_term);
        let path = self.dir.join(&name);
        let temp = self.dir.join(format!("{name}.tmp"));
        match self.storage.remove_file(&temp) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(JournalError::io("remove", &temp, error)),
        }
        let mut file = self
            .storage
            .open_file(&temp, OpenMode::CreateNew)
            .map_err(|error| JournalError::io("create", &temp, error))?;
        file.write_all_at(&encode_header(&meta, data), 0)
            .map_err(|error| JournalError::io("write", &temp, error))?;
        file.write_all_at(data, SNAPSHOT_HEADER_SIZE_BYTES as u64)
            .map_err(|error| JournalError::io("write", &temp, error))?;
        file.sync_data()
            .map_err(|error| JournalError::io("fsync", &temp, error))?;
        drop(file);
        self.storage
            .rename(&temp, &path)
            .map_err(|error| JournalError::io("rename", &temp, error))?;
        self.storage
            .sync_dir(&self.dir)
            .map_err(|error| JournalError::io("fsync directory", &self.dir, error))?;
        self.stats
            .on_write(meta.last_index, data.len() as u64, started.elapsed());
        self.prune()?;
        Ok(path)
    }

    fn prune(&mut self) -> Result<()> {
        let all = self.list()?;
        if all.len() <= self.keep {
            return Ok(());
        }
        for (_, _, path) in &all[..all.len() - self.keep] {
            self.storage
                .remove_file(path)
                .map_err(|error| JournalError::io("remove", path, error))?;
        }
        self.storage
            .sync_dir(&self.dir)
            .map_err(|error| JournalError::io("fsync directory", &self.dir, error))
    }

    /// Loads the newest snapshot that checks out; damaged newer ones are reported, not used.
    pub fn latest(&self) -> Result<LatestSnapshot> {
        let mut latest = LatestSnapshot::default();
        for (_, _, path) in self.list()?.into_iter().rev() {
            match self.load(&path) {
                Ok(snapshot) => {
                    latest.snapshot = Some(snapshot);
                    break;
                }
                // The disk failing to read is not the same as a damaged file: stop.
                Err(error @ JournalError::Io { .. }) => return Err(error),
                Err(error) => latest.skipped.push(SkippedSnapshot {
                    file: path.clone(),
                    reason: error.to_string(),
                }),
            }
        }
        Ok(latest)
    }

    /// Loads and checks one snapshot file.
    pub fn load(&self, path: &Path) -> Result<Snapshot> {
        let bad = |reason: String| JournalError::BadSnapshot {
            file: path.to_path_buf(),
            reason,
        };
        let file = self
            .storage
            .open_file(path, OpenMode::Read)
            .map_err(|error| JournalError::io("open", path, error))?;
        let bytes = file
            .read_all(SNAPSHOT_SIZE_BYTES_LIMIT + SNAPSHOT_HEADER_SIZE_BYTES as u64)
            .map_err(|error| match error.kind() {
                std::io::ErrorKind::InvalidData => bad(error.to_string()),
                _ => JournalError::io("read", path, error),
            })?;
        let meta = decode_header(&bytes).map_err(bad)?;
        if meta.cluster_id != self.cluster_id {
            return Err(JournalError::WrongCluster {
                file: path.to_path_buf(),
                expected: self.cluster_id,
                found: meta.cluster_id,
            });
        }
        let data_len = read_u64(&bytes, 64);
        let available = (bytes.len() - SNAPSHOT_HEADER_SIZE_BYTES) as u64;
        if data_len != available {
            return Err(bad(format!(
                "header says {data_len} bytes of data, the file holds {available} (partial write)"
            )));
        }
        let data = &bytes[SNAPSHOT_HEADER_SIZE_BYTES..];
        let stored = read_u32(&bytes, 72);
        let computed = crc32c::crc32c(data);
        if stored != computed {
            return Err(bad(format!(
                "data checksum mismatch (stored {stored:08x}, computed {computed:08x})"
            )));
        }
        if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
            if parse_snapshot_file_name(name) != Some((meta.last_index, meta.last_term)) {
                return Err(bad(format!(
                    "file name does not match the header (index {}, term {})",
                    meta.last_index, meta.last_term
                )));
            }
        }
        Ok(Snapshot {
            meta,
            data: data.to_vec(),
            file: path.to_path_buf(),
        })
    }
}

fn encode_header(meta: &SnapshotMeta, data: &[u8]) -> [u8; SNAPSHOT_HEADER_SIZE_BYTES] {
    let mut buf = [0u8; SNAPSHOT_HEADER_SIZE_BYTES];
    buf[0..8].copy_from_slice(&SNAPSHOT_MAGIC);
    buf[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    buf[12..16].copy_from_slice(&(SNAPSHOT_HEADER_SIZE_BYTES as u32).to_le_bytes());
    buf[16..32].copy_from_slice(&meta.cluster_id.to_le_bytes());
    buf[32..40].copy_from_slice(&meta.last_index.to_le_bytes());
    buf[40..48].copy_from_slice(&meta.last_term.to_le_bytes());
    buf[48..56].copy_from_slice(&meta.state_hash.to_le_bytes());
    buf[56..64].copy_from_slice(&meta.chain_hash.to_le_bytes());
    buf[64..72].copy_from_slice(&(data.len() as u64).to_le_bytes());
    buf[72..76].copy_from_slice(&crc32c::crc32c(data).to_le_bytes());
    let crc = crc32c::crc32c(&buf[0..124]);
    buf[124..128].copy_from_slice(&crc.to_le_bytes());
    buf
}

fn decode_header(bytes: &[u8]) -> std::result::Result<SnapshotMeta, String> {
    if bytes.len() < SNAPSHOT_HEADER_SIZE_BYTES {
        return Err(format!(
            "file is {} bytes, shorter than the {SNAPSHOT_HEADER_SIZE_BYTES}-byte header",
            bytes.len()
        ));
    }
    if bytes[0..8] != SNAPSHOT_MAGIC {
        return Err("wrong magic number (expected \"BOURSESN\")".to_string());
    }
    let version = read_u32(bytes, 8);
    if version != FORMAT_VERSION {
        return Err(format!("unsupported format version {version}"));
    }
    let stored = read_u32(bytes, 124);
    let computed = crc32c::crc32c(&bytes[0..124]);
    if stored != computed {
        return Err(format!(
            "header checksum mismatch (stored {stored:08x}, computed {computed:08x})"
        ));
    }
    Ok(SnapshotMeta {
        cluster_id: read_u128(bytes, 16),
        last_index: read_u64(bytes, 32),
        last_term: read_u64(bytes, 40),
        state_hash: read_u64(bytes, 48),
        chain_hash: read_u64(bytes, 56),
    })
}
