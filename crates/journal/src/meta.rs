//! The vote file: raft's hard state (term, vote, committed index) and the journal's purge point,
//! in one 128-byte CRC-protected record that is replaced atomically (write a temporary file,
//! fsync it, rename it over the old one, fsync the directory).
//!
//! ```text
//!   0..8     magic "BOURSEJM"
//!   8..12    format version (2)
//!   12..16   flags: 1 voted_for, 2 vote committed, 4 committed, 8 purged
//!   16..32   cluster id          32..40  node id
//!   40..48   term                48..56  voted_for
//!   56..64   committed index     64..72  committed term
//!   72..80   purged index        80..88  purged term       88..96  purged chain hash
//!   96..124  reserved, zero      124..128 CRC32C of bytes 0..124
//! ```

use std::path::Path;

use crate::error::{JournalError, Result};
use crate::format::{read_u128, read_u32, read_u64, Identity, FORMAT_VERSION};
use crate::storage::{OpenMode, Storage};

pub const META_FILE_NAME: &str = "vote";
pub const META_TEMP_FILE_NAME: &str = "vote.tmp";
const META_MAGIC: [u8; 8] = *b"BOURSEJM";
const META_SIZE_BYTES: usize = 128;

const FLAG_VOTED_FOR: u32 = 1;
const FLAG_VOTE_COMMITTED: u32 = 2;
const FLAG_COMMITTED: u32 = 4;
const FLAG_PURGED: u32 = 8;

/// A raft log id: an entry's index and the term it was created in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogPosition {
    pub term: u64,
    pub index: u64,
}

/// A point of the hash chain: a log position and the chain hash of the entry there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainPoint {
    pub index: u64,
    pub term: u64,
    pub hash: u64,
}

impl ChainPoint {
    pub fn position(&self) -> LogPosition {
        LogPosition {
            index: self.index,
            term: self.term,
        }
    }
}

/// Raft's hard state as the journal stores it (openraft's `Vote` plus the committed log id).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    pub term: u64,
    pub voted_for: Option<u64>,
    /// openraft's `Vote::committed`: the vote was granted by a quorum.
    pub vote_committed: bool,
    pub committed: Option<LogPosition>,
}

/// Everything in the vote file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct MetaRecord {
    pub meta: Meta,
    /// The last entry removed by a purge or a reset; the log logically starts after it.
    pub purged: Option<ChainPoint>,
}

impl MetaRecord {
    fn encode(&self, identity: Identity) -> [u8; META_SIZE_BYTES] {
        let mut buf = [0u8; META_SIZE_BYTES];
        let mut flags = 0u32;
        buf[0..8].copy_from_slice(&META_MAGIC);
        buf[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        buf[16..32].copy_from_slice(&identity.cluster_id.to_le_bytes());
        buf[32..40].copy_from_slice(&identity.node_id.to_le_bytes());
        buf[40..48].copy_from_slice(&self.meta.term.to_le_bytes());
        if let Some(voted_for) = self.meta.voted_for {
            flags |= FLAG_VOTED_FOR;
            buf[48..56].copy_from_slice(&voted_for.to_le_bytes());
        }
        if self.meta.vote_committed {
            flags |= FLAG_VOTE_COMMITTED;
        }
        if let Some(committed) = self.meta.committed {
            flags |= FLAG_COMMITTED;
            buf[56..64].copy_from_slice(&committed.index.to_le_bytes());
            buf[64..72].copy_from_slice(&committed.term.to_le_bytes());
        }
        if let Some(purged) = self.purged {
            flags |= FLAG_PURGED;
            buf[72..80].copy_from_slice(&purged.index.to_le_bytes());
            buf[80..88].copy_from_slice(&purged.term.to_le_bytes());
            buf[88..96].copy_from_slice(&purged.hash.to_le_bytes());
        }
        buf[12..16].copy_from_slice(&flags.to_le_bytes());
        let crc = crc32c::crc32c(&buf[0..124]);
        buf[124..128].copy_from_slice(&crc.to_le_bytes());
        buf
    }

    fn decode(bytes: &[u8], identity: Identity, file: &Path) -> Result<MetaRecord> {
        check_header(bytes, &META_MAGIC, META_SIZE_BYTES, identity, file)?;
        let flags = read_u32(bytes, 12);
        Ok(MetaRecord {
            meta: Meta {
                term: read_u64(bytes, 40),
                voted_for: (flags & FLAG_VOTED_FOR != 0).then(|| read_u64(bytes, 48)),
                vote_committed: flags & FLAG_VOTE_COMMITTED != 0,
                committed: (flags & FLAG_COMMITTED != 0).then(|| LogPosition {
                    index: read_u64(bytes, 56),
                    term: read_u64(bytes, 64),
                }),
            },
            purged: (flags & FLAG_PURGED != 0).then(|| ChainPoint {
                index: read_u64(bytes, 72),
                term: read_u64(bytes, 80),
                hash: read_u64(bytes, 88),
            }),
        })
    }
}

/// Checks what the meta file and the commit file share: size, magic number, format version,
/// the CRC32C in the last four bytes over everything before it, and the identity at bytes
/// 16..40 (cluster id, node id). Every refusal names the file and the reason.
pub(crate) fn check_header(
    bytes: &[u8],
    magic: &[u8; 8],
    size_bytes: usize,
    identity: Identity,
    file: &Path,
) -> Result<()> {
    let bad = |reason: String| JournalError::BadMeta {
        file: file.to_path_buf(),
        reason,
    };
    if bytes.len() != size_bytes {
        return Err(bad(format!(
            "file is {} bytes, expected {size_bytes}",
            bytes.len()
        )));
    }
    if bytes[0..8] != *magic {
        return Err(bad(format!(
            "wrong magic number (expected \"{}\")",
            String::from_utf8_lossy(magic)
        )));
    }
    let version = read_u32(bytes, 8);
    if version != FORMAT_VERSION {
        return Err(bad(format!("unsupported format version {version}")));
    }
    let stored = read_u32(bytes, size_bytes - 4);
    let computed = crc32c::crc32c(&bytes[0..size_bytes - 4]);
    if stored != computed {
        return Err(bad(format!(
            "checksum mismatch (stored {stored:08x}, computed {computed:08x})"
        )));
    }
    let cluster_id = read_u128(bytes, 16);
    if cluster_id != identity.cluster_id {
        return Err(JournalError::WrongCluster {
            file: file.to_path_buf(),
            expected: identity.cluster_id,
            found: cluster_id,
        });
    }
    let node_id = read_u64(bytes, 32);
    if node_id != identity.node_id {
        return Err(JournalError::WrongNode {
            file: file.to_path_buf(),
            expected: identity.node_id,
            found: node_id,
        });
    }
    Ok(())
}

/// Reads the vote file, or returns None if there is none.
pub(crate) fn read_meta(
    storage: &dyn Storage,
    dir: &Path,
    identity: Identity,
) -> Result<Option<MetaRecord>> {
    let path = dir.join(META_FILE_NAME);
    let file = match storage.open_file(&path, OpenMode::Read) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(JournalError::io("open", &path, error)),
    };
    let bytes = file
        .read_all(META_SIZE_BYTES as u64 * 2)
        .map_err(|error| JournalError::io("read", &path, error))?;
    MetaRecord::decode(&bytes, identity, &path).map(Some)
}

/// Replaces the vote file atomically and durably.
pub(crate) fn write_meta(
    storage: &dyn Storage,
    dir: &Path,
    identity: Identity,
    record: &MetaRecord,
) -> Result<()> {
    let temp = dir.join(META_TEMP_FILE_NAME);
    let path = dir.join(META_FILE_NAME);
    match storage.remove_file(&temp) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(JournalError::io("remove", &temp, error)),
    }
    let mut file = storage
        .open_file(&temp, OpenMode::CreateNew)
        .map_err(|error| JournalError::io("create", &temp, error))?;
    file.write_all_at(&record.encode(identity), 0)
        .map_err(|error| JournalError::io("write", &temp, error))?;
    file.sync_data()
        .map_err(|error| JournalError::io("fsync", &temp, error))?;
    drop(file);
    storage
        .rename(&temp, &path)
        .map_err(|error| JournalError::io("rename", &temp, error))?;
    storage
        .sync_dir(dir)
        .map_err(|error| JournalError::io("fsync directory", dir, error))
}
