//! The cursor: a vector of per-core positions, opaque to clients.
//!
//! A client gets a cursor in every answer and hands it back to continue; it never looks
//! inside. The text form is hex of: a version byte, the deployment's *identity* (so a cursor
//! from another deployment, or from an earlier run of this one over another store, is
//! recognised as foreign: see [`fresh_identity`]), the number of parts,
//! each part `(core id u32, log index u64, ordinal u32)` meaning "everything of that core
//! before this position was delivered", and a CRC-32C of all the bytes before it (so a
//! damaged or hand-edited cursor is refused, never misread). A core missing from a cursor is
//! read from its start.
//!
//! Version 2 adds *floors*, written only while a client reads a snapshot: a snapshot starts
//! below a core's horizon (live orders older than evicted records stay in the store), so a
//! cursor cut inside it sits below the horizon too. A floor is the horizon when the snapshot
//! began: the part stays good while the core's horizon has not moved past it, since nothing
//! the snapshot promised has been evicted. Cursors without floors are written as version 1.

use crate::record::Pos;
use bourse_core::codec::{Reader, Writer};
use std::fmt;

/// The version of a cursor without floors (the only one before floors existed).
pub const CURSOR_VERSION: u8 = 1;
/// The version of a cursor with floors.
pub const CURSOR_VERSION_FLOORS: u8 = 2;
/// At most this many cores behind one cursor (and one delivery node).
pub const CORES_MAX: usize = 64;
/// The longest binary form a cursor can have.
pub const CURSOR_BYTES_MAX: usize = 1 + 8 + 1 + CORES_MAX * 16 + 1 + CORES_MAX * 16 + 4;
/// The longest text a cursor can have; anything longer is refused before it is decoded.
pub const CURSOR_TEXT_MAX: usize = 2 * CURSOR_BYTES_MAX;

/// What a client sends back: per core, the first position it has not seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cursor {
    pub deployment: u64,
    /// `(core id, position)`, in the order the deployment lists its cores.
    pub parts: Vec<(u32, Pos)>,
    /// `(core id, floor)` for parts read inside a snapshot (see the module's overview).
    pub floors: Vec<(u32, Pos)>,
}

/// Why a cursor cannot be used, with what the client should do about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CursorError {
    /// Not a cursor this service wrote (bad text, length, version or checksum).
    Malformed(String),
    /// A cursor of another delivery deployment, or naming a core this one does not serve.
    Foreign(String),
    /// The store no longer keeps everything after the cursor for that core.
    TooOld { core: u32, oldest_index: u64 },
    /// The cursor names a position of that core past what this node has applied: it was
    /// handed out by a node further along (the primary, to a client now at a lagging
    /// replica; this node before it restarted from an older state file).
    Ahead { core: u32, index: u64, applied: u64 },
}

impl fmt::Display for CursorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CursorError::Malformed(why) => write!(
                f,
                "malformed cursor ({why}): send back the cursor of the last answer unchanged, \
                 or no cursor to read a snapshot of the current state"
            ),
            CursorError::Foreign(why) => write!(
                f,
                "foreign cursor ({why}): it was issued by another delivery deployment; start \
                 again with no cursor to read a snapshot of the current state"
            ),
            CursorError::TooOld { core, oldest_index } => write!(
                f,
                "cursor too old: core {core} keeps records from log index {oldest_index} on \
                 and older changes were evicted; start again with no cursor to read a \
                 snapshot of the current state"
            ),
            CursorError::Ahead {
                core,
                index,
                applied,
            } => write!(
                f,
                "cursor ahead: it names core {core} at log index {index}, and this node has \
                 applied that core's entries before {applied} only (it was handed out by a \
                 node further along, or by this node before it restarted from an older state \
                 file); retry after a pause, poll the node that handed it out, or start again \
                 with no cursor"
            ),
        }
    }
}

impl std::error::Error for CursorError {}

/// The hash of a deployment's name: the identity of a store made without a random one
/// (tests, and every store written before identities were random), whose top 16 bits are
/// also every identity's name tag.
pub fn deployment_hash(name: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(name.as_bytes())
}

/// The bits of an identity that come from the deployment's name.
pub const NAME_TAG_MASK: u64 = 0xffff << 48;

/// A new identity for a fresh, empty store of the deployment `name`: the top 16 bits of the
/// name's hash (so a read replica can tell that its primary serves the deployment it was
/// configured for) and 48 bits of `random`, so that two runs over two stores never issue each
/// other's cursors (two fresh starts of one name share an identity with probability 2^-48).
pub fn fresh_identity(name: &str, random: u64) -> u64 {
    (deployment_hash(name) & NAME_TAG_MASK) | (random & !NAME_TAG_MASK)
}

/// Whether `identity` is one of the deployment `name`'s (its name tag matches).
pub fn identity_names(identity: u64, name: &str) -> bool {
    identity & NAME_TAG_MASK == deployment_hash(name) & NAME_TAG_MASK
}

impl Cursor {
    /// The binary form (what the SBE protocol carries): version, deployment, parts, CRC.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(15 + 16 * (self.parts.len() + self.floors.len()));
        let floors = !self.floors.is_empty();
        w.u8(if floors {
            CURSOR_VERSION_FLOORS
        } else {
            CURSOR_VERSION
        });
        w.u64(self.deployment);
        let write = |w: &mut Writer, list: &[(u32, Pos)]| {
            w.u8(list.len() as u8);
            for (core, pos) in list {
                w.u32(*core);
                w.u64(pos.index);
                w.u32(pos.ord);
            }
        };
        write(&mut w, &self.parts);
        if floors {
            write(&mut w, &self.floors);
        }
        let crc = crc32c::crc32c(&w.buf);
        w.u32(crc);
        w.buf
    }

    /// The text form (what the HTTP API carries): the binary form in lowercase hex.
    pub fn encode(&self) -> String {
        hex_text(&self.to_bytes())
    }

    pub fn decode(text: &str) -> Result<Cursor, CursorError> {
        let bad = |why: &str| CursorError::Malformed(why.to_string());
        if text.len() > CURSOR_TEXT_MAX {
            return Err(bad("longer than any cursor"));
        }
        if !text.len().is_multiple_of(2) {
            return Err(bad("odd number of hex digits"));
        }
        let bytes = hex_bytes(text).ok_or_else(|| bad("not lowercase hex"))?;
        Cursor::from_bytes(&bytes)
    }

    /// Reads the binary form; refuses anything damaged, truncated or of another version.
    pub fn from_bytes(bytes: &[u8]) -> Result<Cursor, CursorError> {
        let bad = |why: &str| CursorError::Malformed(why.to_string());
        if bytes.len() > CURSOR_BYTES_MAX {
            return Err(bad("longer than any cursor"));
        }
        if bytes.len() < 14 {
            return Err(bad("too short"));
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        let crc = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
        if crc32c::crc32c(body) != crc {
            return Err(bad("checksum does not match"));
        }
        let mut r = Reader::new(body);
        let version = r.u8().map_err(|e| bad(e.what))?;
        if version != CURSOR_VERSION && version != CURSOR_VERSION_FLOORS {
            return Err(CursorError::Malformed(format!(
                "version {version}, this service reads versions {CURSOR_VERSION} and \
                 {CURSOR_VERSION_FLOORS}"
            )));
        }
        let deployment = r.u64().map_err(|e| bad(e.what))?;
        let parts = read_parts(&mut r)?;
        let floors = if version == CURSOR_VERSION_FLOORS {
            let floors = read_parts(&mut r)?;
            if floors.is_empty() || floors.iter().any(|(c, _)| !parts.iter().any(|p| p.0 == *c)) {
                return Err(bad("a floor of a core without a part"));
            }
            floors
        } else {
            Vec::new()
        };
        r.expect_end().map_err(|e| bad(e.what))?;
        Ok(Cursor {
            deployment,
            parts,
            floors,
        })
    }
}

/// A count, then that many `(core u32, index u64, ordinal u32)`, no core twice.
fn read_parts(r: &mut Reader<'_>) -> Result<Vec<(u32, Pos)>, CursorError> {
    let bad = |why: &str| CursorError::Malformed(why.to_string());
    let n = usize::from(r.u8().map_err(|e| bad(e.what))?);
    if n > CORES_MAX {
        return Err(bad("more cores than a deployment has"));
    }
    let mut parts = Vec::with_capacity(n);
    for _ in 0..n {
        let core = r.u32().map_err(|e| bad(e.what))?;
        let index = r.u64().map_err(|e| bad(e.what))?;
        let ord = r.u32().map_err(|e| bad(e.what))?;
        if parts.iter().any(|(c, _)| *c == core) {
            return Err(bad("a core named twice"));
        }
        parts.push((core, Pos { index, ord }));
    }
    Ok(parts)
}

pub(crate) use bourse_client::delivery::api::{hex_bytes, hex_text};

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cursor(parts: Vec<(u32, u64, u32)>) -> Cursor {
        Cursor {
            deployment: deployment_hash("test"),
            parts: parts
                .into_iter()
                .map(|(c, index, ord)| (c, Pos { index, ord }))
                .collect(),
            floors: Vec::new(),
        }
    }

    /// The same cursor with a floor for every other part.
    fn with_floors(mut c: Cursor) -> Cursor {
        c.floors = c
            .parts
            .iter()
            .step_by(2)
            .map(|&(core, p)| (core, p.next()))
            .collect();
        c
    }

    proptest! {
        #[test]
        fn every_cursor_reads_back_as_written(
            parts in proptest::collection::btree_map(any::<u32>(), (any::<u64>(), any::<u32>()), 0..CORES_MAX)
        ) {
            let c = cursor(parts.into_iter().map(|(c, (i, o))| (c, i, o)).collect());
            let text = c.encode();
            prop_assert!(text.len() <= CURSOR_TEXT_MAX);
            prop_assert_eq!(Cursor::decode(&text).unwrap(), c.clone());
            let c = with_floors(c);
            let text = c.encode();
            prop_assert!(text.len() <= CURSOR_TEXT_MAX);
            prop_assert_eq!(Cursor::decode(&text).unwrap(), c);
        }

        #[test]
        fn arbitrary_text_is_refused_or_read_but_never_panics(text in ".{0,200}") {
            let _ = Cursor::decode(&text);
        }

        #[test]
        fn any_changed_digit_is_refused(
            parts in proptest::collection::vec((any::<u32>(), any::<u64>(), any::<u32>()), 1..4),
            at in any::<prop::sample::Index>(),
            to in 0u8..16,
        ) {
            let mut seen = std::collections::BTreeSet::new();
            let parts: Vec<_> = parts.into_iter().filter(|p| seen.insert(p.0)).collect();
            let text = with_floors(cursor(parts)).encode();
            let i = at.index(text.len());
            let mut bytes = text.clone().into_bytes();
            bytes[i] = b"0123456789abcdef"[usize::from(to)];
            prop_assume!(bytes[i] != text.as_bytes()[i]);
            let changed = String::from_utf8(bytes).unwrap();
            prop_assert!(matches!(Cursor::decode(&changed), Err(CursorError::Malformed(_))));
        }
    }

    #[test]
    fn a_fresh_identity_keeps_the_names_tag_and_differs_by_its_random_bits() {
        let a = fresh_identity("venue", 1);
        let b = fresh_identity("venue", 2);
        assert_ne!(a, b);
        assert!(identity_names(a, "venue") && identity_names(b, "venue"));
        assert!(!identity_names(a, "other-venue"));
        assert!(identity_names(deployment_hash("venue"), "venue"));
    }

    #[test]
    fn bad_text_is_refused_naming_what_is_wrong() {
        let text = cursor(vec![(0, 9, 1)]).encode();
        let why = |t: &str| Cursor::decode(t).unwrap_err().to_string();
        assert!(why("xyz").contains("odd number"));
        assert!(why("zz").contains("not lowercase hex"));
        assert!(why(&text.to_uppercase()).contains("not lowercase hex"));
        assert!(why(&text[..text.len() - 2]).contains("checksum"));
        assert!(why("00").contains("too short"));
        assert!(why(&"0".repeat(CURSOR_TEXT_MAX + 2)).contains("longer"));
        assert!(why("zz").contains("no cursor to read a snapshot"));
    }
}
