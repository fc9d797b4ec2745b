//! The commit point file: the highest log position this node knows to be committed *and*
//! durable in its own segments (raft's optionally persisted `committed`).
//!
//! Recovery compares it with the end of the log: a log that ends before it lost records that
//! were committed, which a torn write cannot explain (a torn write only hits a record that was
//! never durable). That turns a segment cut at a record boundary, or a missing last segment,
//! from "looks like a clean end" into a refusal naming the files.
//!
//! The file is written in place (one 64-byte positional write, inside one sector) on every
//! advance, because it advances with every committed batch and the vote file's atomic
//! replacement (two fsyncs and a rename) would cost more than the batch itself. That is safe
//! because the point is a lower bound: [`crate::Journal`] only ever writes a position whose
//! records were already durable (under `Fsync::Batch` it holds a newer one back until the
//! fsync covers it), so whatever version of the file survives a crash is true; a lost write
//! only makes the check weaker. A torn write, which would need a sector to be half written,
//! fails the CRC and is reported like any other damage.
//!
//! ```text
//!   0..8    magic "BOURSEJC"      8..12  format version (2)     12..16 reserved, zero
//!   16..32  cluster id            32..40 node id
//!   40..48  committed index       48..56 committed term
//!   56..60  reserved, zero        60..64 CRC32C of bytes 0..60
//! ```

use std::path::Path;

use crate::error::{JournalError, Result};
use crate::format::{read_u64, Identity, FORMAT_VERSION};
use crate::meta::LogPosition;
use crate::storage::{OpenMode, SegmentFile, Storage};

pub const COMMIT_FILE_NAME: &str = "commit";
const COMMIT_MAGIC: [u8; 8] = *b"BOURSEJC";
pub(crate) const COMMIT_SIZE_BYTES: usize = 64;

pub(crate) fn encode(identity: Identity, committed: LogPosition) -> [u8; COMMIT_SIZE_BYTES] {
    let mut buf = [0u8; COMMIT_SIZE_BYTES];
    buf[0..8].copy_from_slice(&COMMIT_MAGIC);
    buf[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    buf[16..32].copy_from_slice(&identity.cluster_id.to_le_bytes());
    buf[32..40].copy_from_slice(&identity.node_id.to_le_bytes());
    buf[40..48].copy_from_slice(&committed.index.to_le_bytes());
    buf[48..56].copy_from_slice(&committed.term.to_le_bytes());
    let crc = crc32c::crc32c(&buf[0..60]);
    buf[60..64].copy_from_slice(&crc.to_le_bytes());
    buf
}

fn decode(bytes: &[u8], identity: Identity, file: &Path) -> Result<LogPosition> {
    crate::meta::check_header(bytes, &COMMIT_MAGIC, COMMIT_SIZE_BYTES, identity, file)?;
    Ok(LogPosition {
        index: read_u64(bytes, 40),
        term: read_u64(bytes, 48),
    })
}

/// Reads the commit point file, or returns None if there is none.
pub(crate) fn read_commit(
    storage: &dyn Storage,
    dir: &Path,
    identity: Identity,
) -> Result<Option<LogPosition>> {
    let path = dir.join(COMMIT_FILE_NAME);
    let file = match storage.open_file(&path, OpenMode::Read) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(JournalError::io("open", &path, error)),
    };
    let bytes = file
        .read_all(COMMIT_SIZE_BYTES as u64 * 2)
        .map_err(|error| JournalError::io("read", &path, error))?;
    decode(&bytes, identity, &path).map(Some)
}

/// Creates the commit point file atomically (temporary file, rename), so that it never exists
/// without a valid first record; later writes go in place through the returned handle.
pub(crate) fn create_commit(
    storage: &dyn Storage,
    dir: &Path,
    identity: Identity,
    committed: LogPosition,
    durable: bool,
) -> Result<Box<dyn SegmentFile>> {
    let temp = dir.join(format!("{COMMIT_FILE_NAME}.tmp"));
    let path = dir.join(COMMIT_FILE_NAME);
    match storage.remove_file(&temp) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(JournalError::io("remove", &temp, error)),
    }
    let mut file = storage
        .open_file(&temp, OpenMode::CreateNew)
        .map_err(|error| JournalError::io("create", &temp, error))?;
    file.write_all_at(&encode(identity, committed), 0)
        .map_err(|error| JournalError::io("write", &temp, error))?;
    if durable {
        file.sync_data()
            .map_err(|error| JournalError::io("fsync", &temp, error))?;
    }
    storage
        .rename(&temp, &path)
        .map_err(|error| JournalError::io("rename", &temp, error))?;
    if durable {
        storage
            .sync_dir(dir)
            .map_err(|error| JournalError::io("fsync directory", dir, error))?;
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: Identity = Identity {
        cluster_id: 7,
        node_id: 2,
    };

    #[test]
    fn a_commit_point_round_trips_and_any_flipped_bit_is_refused() {
        let position = LogPosition {
            index: 1234,
            term: 5,
        };
        let bytes = encode(ID, position);
        let file = Path::new("commit");
        assert_eq!(decode(&bytes, ID, file).unwrap(), position);
        for bit in 0..COMMIT_SIZE_BYTES * 8 {
            let mut damaged = bytes;
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(decode(&damaged, ID, file).is_err(), "bit {bit}");
        }
        assert!(decode(&bytes[..63], ID, file).is_err());
        let other = Identity {
            cluster_id: 7,
            node_id: 3,
        };
        assert!(matches!(
            decode(&bytes, other, file),
            Err(JournalError::WrongNode { .. })
        ));
    }
}
