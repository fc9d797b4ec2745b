//! Session stores: the next sender and target sequence numbers and the
//! outbound messages kept for resending.
//!
//! [`MemoryStore`] is for tests and for sessions that reset on every
//! connection; [`FileStore`] keeps the same state in a directory so that a
//! restarted process resumes the session where it stopped. It is the one file
//! store of bourse (the `bourse fix acceptor` and the gateway's sessions alike),
//! cheap enough for the order path: an outbound message costs one append (its
//! record also stands for the next sender number), an inbound one a fixed-width
//! overwrite of the sequence numbers, no file created or renamed.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Default bound on stored outbound messages; older ones are forgotten and
/// a resend request for them is answered with a gap fill.
pub const STORED_MESSAGES_MAX_DEFAULT: usize = 100_000;

/// One stored message may not exceed this; a record claiming more is
/// treated as a corrupt tail.
const STORED_MESSAGE_SIZE_MAX_BYTES: usize = 16 * 1024 * 1024;

pub trait MessageStore: Send {
    fn next_sender_seq_num(&self) -> u64;
    fn next_target_seq_num(&self) -> u64;
    fn set_next_sender_seq_num(&mut self, seq_num: u64) -> io::Result<()>;
    fn set_next_target_seq_num(&mut self, seq_num: u64) -> io::Result<()>;
    /// Keeps an outbound message for resending.
    fn store_message(&mut self, seq_num: u64, bytes: &[u8]) -> io::Result<()>;
    /// Appends the stored messages with `begin <= seq_num <= end`, in order.
    fn messages_in_range(
        &self,
        begin: u64,
        end: u64,
        out: &mut Vec<(u64, Vec<u8>)>,
    ) -> io::Result<()>;
    /// Forgets all messages and sets both sequence numbers back to 1.
    fn reset(&mut self) -> io::Result<()>;
    /// Bytes of the messages kept for resending (their encoded bytes, not the map's own
    /// nodes): what the bound on stored messages costs in memory.
    fn stored_bytes(&self) -> usize;
}

/// A store held in memory only.
#[derive(Debug)]
pub struct MemoryStore {
    next_sender_seq_num: u64,
    next_target_seq_num: u64,
    messages: BTreeMap<u64, Vec<u8>>,
    stored_bytes: usize,
    stored_messages_max: usize,
}

impl MemoryStore {
    pub fn new(stored_messages_max: usize) -> Self {
        assert!(stored_messages_max > 0);
        MemoryStore {
            next_sender_seq_num: 1,
            next_target_seq_num: 1,
            messages: BTreeMap::new(),
            stored_bytes: 0,
            stored_messages_max,
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new(STORED_MESSAGES_MAX_DEFAULT)
    }
}

/// Keeps `bytes` as message `seq_num`, forgetting the oldest past `max`; `stored_bytes`
/// follows the kept messages' bytes.
fn insert_bounded(
    messages: &mut BTreeMap<u64, Vec<u8>>,
    stored_bytes: &mut usize,
    max: usize,
    seq_num: u64,
    bytes: &[u8],
) {
    *stored_bytes += bytes.len();
    if let Some(old) = messages.insert(seq_num, bytes.to_vec()) {
        *stored_bytes -= old.len();
    }
    while messages.len() > max {
        if let Some((_, old)) = messages.pop_first() {
            *stored_bytes -= old.len();
        }
    }
}

fn collect_range(
    messages: &BTreeMap<u64, Vec<u8>>,
    begin: u64,
    end: u64,
    out: &mut Vec<(u64, Vec<u8>)>,
) {
    if begin > end {
        return;
    }
    out.extend(messages.range(begin..=end).map(|(k, v)| (*k, v.clone())));
}

impl MessageStore for MemoryStore {
    fn next_sender_seq_num(&self) -> u64 {
        self.next_sender_seq_num
    }
    fn next_target_seq_num(&self) -> u64 {
        self.next_target_seq_num
    }
    fn set_next_sender_seq_num(&mut self, seq_num: u64) -> io::Result<()> {
        assert!(seq_num >= 1);
        self.next_sender_seq_num = seq_num;
        Ok(())
    }
    fn set_next_target_seq_num(&mut self, seq_num: u64) -> io::Result<()> {
        assert!(seq_num >= 1);
        self.next_target_seq_num = seq_num;
        Ok(())
    }
    fn store_message(&mut self, seq_num: u64, bytes: &[u8]) -> io::Result<()> {
        insert_bounded(
            &mut self.messages,
            &mut self.stored_bytes,
            self.stored_messages_max,
            seq_num,
            bytes,
        );
        Ok(())
    }
    fn messages_in_range(
        &self,
        begin: u64,
        end: u64,
        out: &mut Vec<(u64, Vec<u8>)>,
    ) -> io::Result<()> {
        collect_range(&self.messages, begin, end, out);
        Ok(())
    }
    fn reset(&mut self) -> io::Result<()> {
        self.messages.clear();
        self.stored_bytes = 0;
        self.next_sender_seq_num = 1;
        self.next_target_seq_num = 1;
        Ok(())
    }
    fn stored_bytes(&self) -> usize {
        self.stored_bytes
    }
}

/// The `seqnums` file: two 20-digit numbers (sender, then target), a space
/// and a newline, so that every write has the same width.
const SEQNUMS_BYTES: usize = 42;

/// A store in a directory: `seqnums` holds the two sequence numbers as text,
/// fixed-width and overwritten in place (one positioned write; a create and a
/// rename per message cost about a millisecond each on the gateway's order
/// path), `messages` is an append-only log of records `seq_num: u64 LE,
/// len: u32 LE, bytes`. A torn last record, left by a crash in mid-append, is
/// cut off when the store is opened; the log is rewritten with the kept
/// messages once it holds twice as many records as the bound.
///
/// The sender number that follows a stored message (its number + 1, what a
/// session sets right after storing it) is not written to `seqnums`: the
/// log's last record says it, and opening takes the larger of the two. That
/// saves the session a second write per outbound message, on the path of
/// every execution report, with the same durability (the record is written,
/// and with `sync` synced, before the message is sent). A number set lower
/// than the log's last record (never done by a session without a reset,
/// which empties the log) is written to `seqnums` after an empty record with
/// number 0, which tells opening that the log no longer implies the number.
#[derive(Debug)]
pub struct FileStore {
    dir: PathBuf,
    next_sender_seq_num: u64,
    next_target_seq_num: u64,
    messages: BTreeMap<u64, Vec<u8>>,
    stored_bytes: usize,
    seqnums: File,
    log: File,
    log_records: usize,
    /// The number of the log's last record since its last empty marker (0: none), so
    /// the log implies the next sender number is at least this + 1.
    last_logged_seq: u64,
    stored_messages_max: usize,
    /// Whether to fsync after each write; off trades durability on power
    /// loss for speed, process crashes lose nothing either way.
    sync: bool,
}

impl FileStore {
    pub fn open(dir: &Path, stored_messages_max: usize, sync: bool) -> io::Result<Self> {
        assert!(stored_messages_max > 0);
        fs::create_dir_all(dir)?;
        let mut seqnums = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join("seqnums"))?;
        let mut text = String::new();
        seqnums.read_to_string(&mut text)?;
        // An empty file is a store that never wrote one (a crash before the first write).
        let (next_sender_seq_num, next_target_seq_num) = if text.trim().is_empty() {
            (1, 1)
        } else {
            parse_seqnums(&text)
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "corrupt seqnums file"))?
        };
        let log_path = dir.join("messages");
        let mut messages = BTreeMap::new();
        let mut stored_bytes = 0;
        let mut log_records = 0;
        let mut good_len: u64 = 0;
        let mut last_logged_seq = 0;
        if let Ok(mut file) = File::open(&log_path) {
            let mut data = Vec::new();
            file.read_to_end(&mut data)?;
            let mut pos = 0usize;
            while pos + 12 <= data.len() {
                let seq = u64::from_le_bytes(data[pos..pos + 8].try_into().expect("8 bytes"));
                let len = u32::from_le_bytes(data[pos + 8..pos + 12].try_into().expect("4 bytes"))
                    as usize;
                if len > STORED_MESSAGE_SIZE_MAX_BYTES || pos + 12 + len > data.len() {
                    break;
                }
                log_records += 1;
                pos += 12 + len;
                if seq == 0 {
                    // The marker of a sender number set below the log: `seqnums` has it.
                    last_logged_seq = 0;
                    continue;
                }
                last_logged_seq = seq;
                insert_bounded(
                    &mut messages,
                    &mut stored_bytes,
                    stored_messages_max,
                    seq,
                    &data[pos - len..pos],
                );
            }
            good_len = pos as u64;
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        if log.metadata()?.len() != good_len {
            log.set_len(good_len)?;
        }
        // The log's last record was stored before the number after it was set.
        let next_sender_seq_num = next_sender_seq_num.max(last_logged_seq + 1);
        let store = FileStore {
            dir: dir.to_path_buf(),
            next_sender_seq_num,
            next_target_seq_num,
            messages,
            stored_bytes,
            seqnums,
            log,
            log_records,
            last_logged_seq,
            stored_messages_max,
            sync,
        };
        // Rewritten at once in the fixed width. An older file (numbers as short as they
        // are, replaced by rename) is never longer than the fixed width, so the overwrite
        // leaves no stale tail.
        store.write_seqnums()?;
        Ok(store)
    }

    fn write_seqnums(&self) -> io::Result<()> {
        let text = format!(
            "{:020} {:020}\n",
            self.next_sender_seq_num, self.next_target_seq_num
        );
        debug_assert_eq!(text.len(), SEQNUMS_BYTES);
        self.seqnums.write_all_at(text.as_bytes(), 0)?;
        if self.sync {
            self.seqnums.sync_data()?;
        }
        Ok(())
    }

    /// Rewrites the log with only the messages still kept, once it holds
    /// twice as many records as the bound, so the file stays bounded too.
    fn compact_if_needed(&mut self) -> io::Result<()> {
        if self.log_records <= self.stored_messages_max.saturating_mul(2) {
            return Ok(());
        }
        let tmp = self.dir.join("messages.tmp");
        {
            let mut f = File::create(&tmp)?;
            for (seq, bytes) in &self.messages {
                f.write_all(&record(*seq, bytes))?;
            }
            if self.sync {
                f.sync_all()?;
            }
        }
        fs::rename(&tmp, self.dir.join("messages"))?;
        self.log = OpenOptions::new()
            .append(true)
            .open(self.dir.join("messages"))?;
        self.log_records = self.messages.len();
        // The rewritten log's last record is the highest number kept. When that is not the
        // number the log implied (a number set below the log, or none implied), the log
        // must imply nothing: a marker, and `seqnums` written with the current numbers.
        let implied = self.messages.keys().next_back().copied().unwrap_or(0);
        if implied != self.last_logged_seq {
            self.log.write_all(&record(0, &[]))?;
            if self.sync {
                self.log.sync_data()?;
            }
            self.log_records += 1;
            self.last_logged_seq = 0;
            self.write_seqnums()?;
        }
        Ok(())
    }
}

fn record(seq_num: u64, bytes: &[u8]) -> Vec<u8> {
    let len = u32::try_from(bytes.len()).expect("stored messages are bounded far below 4 GiB");
    let mut out = Vec::with_capacity(12 + bytes.len());
    out.extend_from_slice(&seq_num.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
    out
}

fn parse_seqnums(text: &str) -> Option<(u64, u64)> {
    let mut parts = text.split_whitespace();
    let sender = parts.next()?.parse().ok()?;
    let target = parts.next()?.parse().ok()?;
    if sender == 0 || target == 0 {
        return None;
    }
    Some((sender, target))
}

impl MessageStore for FileStore {
    fn next_sender_seq_num(&self) -> u64 {
        self.next_sender_seq_num
    }
    fn next_target_seq_num(&self) -> u64 {
        self.next_target_seq_num
    }
    fn set_next_sender_seq_num(&mut self, seq_num: u64) -> io::Result<()> {
        assert!(seq_num >= 1);
        self.next_sender_seq_num = seq_num;
        if self.last_logged_seq > 0 && seq_num == self.last_logged_seq + 1 {
            // The log's last record implies it (see the type's comment).
            return Ok(());
        }
        if self.last_logged_seq > 0 && seq_num <= self.last_logged_seq {
            self.log.write_all(&record(0, &[]))?;
            if self.sync {
                self.log.sync_data()?;
            }
            self.log_records += 1;
            self.last_logged_seq = 0;
        }
        self.write_seqnums()
    }
    fn set_next_target_seq_num(&mut self, seq_num: u64) -> io::Result<()> {
        assert!(seq_num >= 1);
        self.next_target_seq_num = seq_num;
        self.write_seqnums()
    }
    fn store_message(&mut self, seq_num: u64, bytes: &[u8]) -> io::Result<()> {
        if bytes.len() > STORED_MESSAGE_SIZE_MAX_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "message too large to store",
            ));
        }
        if seq_num == 0 {
            // Number 0 is the log's marker (and no FIX message's number).
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a stored message needs a sequence number of 1 or more",
            ));
        }
        self.log.write_all(&record(seq_num, bytes))?;
        if self.sync {
            self.log.sync_data()?;
        }
        self.log_records += 1;
        self.last_logged_seq = seq_num;
        insert_bounded(
            &mut self.messages,
            &mut self.stored_bytes,
            self.stored_messages_max,
            seq_num,
            bytes,
        );
        self.compact_if_needed()
    }
    fn messages_in_range(
        &self,
        begin: u64,
        end: u64,
        out: &mut Vec<(u64, Vec<u8>)>,
    ) -> io::Result<()> {
        collect_range(&self.messages, begin, end, out);
        Ok(())
    }
    fn reset(&mut self) -> io::Result<()> {
        self.messages.clear();
        self.stored_bytes = 0;
        self.log.set_len(0)?;
        self.log_records = 0;
        self.last_logged_seq = 0;
        self.next_sender_seq_num = 1;
        self.next_target_seq_num = 1;
        self.write_seqnums()
    }
    fn stored_bytes(&self) -> usize {
        self.stored_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("bourse-fix-store-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn stored_bytes_are_the_kept_messages_bytes_in_both_stores() {
        let dir = temp_dir("bytes");
        let mut memory = MemoryStore::new(2);
        {
            let mut file = FileStore::open(&dir, 2, false).expect("open");
            for s in [&mut memory as &mut dyn MessageStore, &mut file] {
                s.store_message(1, b"one").expect("store");
                s.store_message(2, b"three").expect("store");
                assert_eq!(s.stored_bytes(), 8);
                // Past the bound the oldest is forgotten, and its bytes with it.
                s.store_message(3, b"seven..").expect("store");
                assert_eq!(s.stored_bytes(), 12);
                // A message stored again under its number replaces the old bytes.
                s.store_message(3, b"x").expect("store");
                assert_eq!(s.stored_bytes(), 6);
            }
        }
        // Reopened, the file store counts what it read back (messages 2 and 3).
        let mut file = FileStore::open(&dir, 2, false).expect("reopen");
        assert_eq!(file.stored_bytes(), 6);
        file.reset().expect("reset");
        memory.reset().expect("reset");
        assert_eq!((file.stored_bytes(), memory.stored_bytes()), (0, 0));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn file_store_survives_reopen_and_torn_tail() {
        let dir = temp_dir("reopen");
        {
            let mut s = FileStore::open(&dir, 10, false).expect("open");
            s.set_next_sender_seq_num(3).expect("set");
            s.set_next_target_seq_num(7).expect("set");
            s.store_message(1, b"one").expect("store");
            s.store_message(2, b"two").expect("store");
        }
        // Simulate a crash in mid-append.
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.join("messages"))
            .expect("open log");
        f.write_all(&[9, 0, 0]).expect("write");
        drop(f);
        let s = FileStore::open(&dir, 10, false).expect("reopen");
        assert_eq!((s.next_sender_seq_num(), s.next_target_seq_num()), (3, 7));
        let mut out = Vec::new();
        s.messages_in_range(1, 10, &mut out).expect("range");
        assert_eq!(out, vec![(1, b"one".to_vec()), (2, b"two".to_vec())]);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn sequence_numbers_are_overwritten_in_place_at_a_fixed_width() {
        let dir = temp_dir("in-place");
        fs::create_dir_all(&dir).expect("dir");
        // A store written by the earlier form of this file: short numbers, no padding.
        fs::write(dir.join("seqnums"), "12 5\n").expect("write");
        let mut s = FileStore::open(&dir, 10, false).expect("open");
        assert_eq!((s.next_sender_seq_num(), s.next_target_seq_num()), (12, 5));
        let inode = |d: &Path| {
            use std::os::unix::fs::MetadataExt;
            fs::metadata(d.join("seqnums")).expect("meta").ino()
        };
        let before = inode(&dir);
        s.set_next_sender_seq_num(123_456_789).expect("set");
        s.set_next_target_seq_num(6).expect("set");
        assert_eq!(inode(&dir), before, "the same file, not a renamed copy");
        let text = fs::read_to_string(dir.join("seqnums")).expect("read");
        assert_eq!(text.len(), SEQNUMS_BYTES);
        drop(s);
        let s = FileStore::open(&dir, 10, false).expect("reopen");
        assert_eq!(
            (s.next_sender_seq_num(), s.next_target_seq_num()),
            (123_456_789, 6)
        );
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_sender_number_after_the_last_stored_message_survives_reopen_from_the_log() {
        let dir = temp_dir("implied");
        {
            let mut s = FileStore::open(&dir, 10, false).expect("open");
            s.set_next_target_seq_num(4).expect("set");
            // As a session sends: store message n, then set the next number to n + 1.
            for seq in 1..=3 {
                s.store_message(seq, b"m").expect("store");
                s.set_next_sender_seq_num(seq + 1).expect("set");
            }
            assert_eq!(s.next_sender_seq_num(), 4);
        }
        let mut s = FileStore::open(&dir, 10, false).expect("reopen");
        assert_eq!((s.next_sender_seq_num(), s.next_target_seq_num()), (4, 4));
        // A number set beyond the log (a gap) is kept as set.
        s.set_next_sender_seq_num(9).expect("set");
        drop(s);
        let s = FileStore::open(&dir, 10, false).expect("reopen");
        assert_eq!(s.next_sender_seq_num(), 9);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_sender_number_set_below_the_log_survives_reopen_and_compaction() {
        let dir = temp_dir("lowered");
        {
            let mut s = FileStore::open(&dir, 2, false).expect("open");
            for seq in 1..=4 {
                s.store_message(seq, b"m").expect("store");
                s.set_next_sender_seq_num(seq + 1).expect("set");
            }
            s.set_next_sender_seq_num(2).expect("lower");
        }
        let mut s = FileStore::open(&dir, 2, false).expect("reopen");
        assert_eq!(s.next_sender_seq_num(), 2, "not the log's 5");
        // Storing again below the kept messages, through a compaction of the log.
        s.store_message(2, b"again").expect("store");
        s.set_next_sender_seq_num(3).expect("set");
        s.store_message(3, b"again").expect("store");
        s.set_next_sender_seq_num(4).expect("set");
        drop(s);
        let s = FileStore::open(&dir, 2, false).expect("reopen");
        assert_eq!(s.next_sender_seq_num(), 4);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_message_numbered_zero_is_refused() {
        let dir = temp_dir("zero");
        let mut s = FileStore::open(&dir, 2, false).expect("open");
        let err = s.store_message(0, b"m").expect_err("refused");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_damaged_seqnums_file_is_refused() {
        let dir = temp_dir("damaged");
        fs::create_dir_all(&dir).expect("dir");
        fs::write(dir.join("seqnums"), "x 5\n").expect("write");
        let err = FileStore::open(&dir, 10, false).expect_err("refused");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_torn_record_header_is_cut_off_and_appending_resumes_after_it() {
        let dir = temp_dir("torn-header");
        {
            let mut s = FileStore::open(&dir, 10, false).expect("open");
            s.store_message(1, b"one").expect("store");
        }
        // A record whose header claims more bytes than the file holds.
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.join("messages"))
            .expect("open log");
        f.write_all(&[2, 0, 0, 0, 0, 0, 0, 0, 100, 0, 0, 0, 1])
            .expect("write");
        drop(f);
        {
            let mut s = FileStore::open(&dir, 10, false).expect("reopen");
            s.store_message(2, b"two").expect("store");
        }
        let s = FileStore::open(&dir, 10, false).expect("reopen");
        let mut out = Vec::new();
        s.messages_in_range(1, 10, &mut out).expect("range");
        assert_eq!(out, vec![(1, b"one".to_vec()), (2, b"two".to_vec())]);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn bounded_and_compacted() {
        let dir = temp_dir("bounded");
        let mut s = FileStore::open(&dir, 2, false).expect("open");
        for seq in 1..=10 {
            s.store_message(seq, format!("m{seq}").as_bytes())
                .expect("store");
        }
        let mut out = Vec::new();
        s.messages_in_range(1, 10, &mut out).expect("range");
        assert_eq!(out.iter().map(|(k, _)| *k).collect::<Vec<_>>(), vec![9, 10]);
        drop(s);
        let s = FileStore::open(&dir, 2, false).expect("reopen");
        let mut out = Vec::new();
        s.messages_in_range(1, 10, &mut out).expect("range");
        assert_eq!(out.len(), 2);
        let _ = fs::remove_dir_all(&dir);
    }
}
