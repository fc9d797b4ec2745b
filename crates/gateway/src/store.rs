//! The FIX session store the gateway uses: sequence numbers and sent messages kept in a
//! directory, like `bourse_fix::FileStore`, but cheap enough for the order path: the sequence
//! numbers are overwritten in place (one `pwrite` of a fixed-width record) instead of a
//! create-and-rename per message, which cost about a millisecond per message here.
//!
//! Files: `seqnums` (two 20-digit numbers, sender then target, fixed width so an overwrite
//! never leaves a longer stale tail) and `messages` (records `seq u64 LE, len u32 LE, bytes`,
//! appended; a torn last record is cut off at open; rewritten when it holds twice the kept
//! messages).

use bourse_fix::MessageStore;
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// A stored message may not exceed this; a record claiming more is a corrupt tail.
const STORED_MESSAGE_SIZE_MAX_BYTES: usize = 1 << 20;
const SEQNUMS_BYTES: usize = 42;

pub struct GatewayStore {
    dir: PathBuf,
    next_sender: u64,
    next_target: u64,
    seqnums: File,
    log: File,
    log_records: usize,
    messages: BTreeMap<u64, Vec<u8>>,
    stored_messages_max: usize,
    sync: bool,
}

impl GatewayStore {
    pub fn open(dir: &Path, stored_messages_max: usize, sync: bool) -> io::Result<GatewayStore> {
        assert!(stored_messages_max > 0);
        fs::create_dir_all(dir)?;
        let seq_path = dir.join("seqnums");
        let mut seqnums = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&seq_path)?;
        let mut text = String::new();
        seqnums.read_to_string(&mut text)?;
        let (next_sender, next_target) = if text.trim().is_empty() {
            (1, 1)
        } else {
            let mut parts = text.split_whitespace().map(|p| p.parse::<u64>());
            match (parts.next(), parts.next()) {
                (Some(Ok(s)), Some(Ok(t))) if s > 0 && t > 0 => (s, t),
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "corrupt seqnums file",
                    ))
                }
            }
        };
        let log_path = dir.join("messages");
        let mut messages = BTreeMap::new();
        let mut log_records = 0;
        let mut good_len = 0u64;
        if let Ok(mut f) = File::open(&log_path) {
            let mut data = Vec::new();
            f.read_to_end(&mut data)?;
            let mut pos = 0usize;
            while pos + 12 <= data.len() {
                let seq = u64::from_le_bytes(data[pos..pos + 8].try_into().unwrap_or([0; 8]));
                let len = u32::from_le_bytes(data[pos + 8..pos + 12].try_into().unwrap_or([0; 4]))
                    as usize;
                if len > STORED_MESSAGE_SIZE_MAX_BYTES || pos + 12 + len > data.len() {
                    break;
                }
                messages.insert(seq, data[pos + 12..pos + 12 + len].to_vec());
                while messages.len() > stored_messages_max {
                    messages.pop_first();
                }
                log_records += 1;
                pos += 12 + len;
                good_len = pos as u64;
            }
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        log.set_len(good_len)?;
        let mut store = GatewayStore {
            dir: dir.to_path_buf(),
            next_sender,
            next_target,
            seqnums,
            log,
            log_records,
            messages,
            stored_messages_max,
            sync,
        };
        store.write_seqnums()?;
        Ok(store)
    }

    fn write_seqnums(&mut self) -> io::Result<()> {
        let text = format!("{:020} {:020}\n", self.next_sender, self.next_target);
        debug_assert_eq!(text.len(), SEQNUMS_BYTES);
        self.seqnums.write_all_at(text.as_bytes(), 0)?;
        if self.sync {
            self.seqnums.sync_data()?;
        }
        Ok(())
    }

    fn compact_if_needed(&mut self) -> io::Result<()> {
        if self.log_records < self.stored_messages_max.saturating_mul(2).max(1024) {
            return Ok(());
        }
        let tmp = self.dir.join("messages.tmp");
        {
            let mut f = File::create(&tmp)?;
            let mut buf = Vec::new();
            for (seq, bytes) in &self.messages {
                buf.extend_from_slice(&seq.to_le_bytes());
                buf.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                buf.extend_from_slice(bytes);
            }
            f.write_all(&buf)?;
            if self.sync {
                f.sync_all()?;
            }
        }
        fs::rename(&tmp, self.dir.join("messages"))?;
        self.log = OpenOptions::new()
            .append(true)
            .open(self.dir.join("messages"))?;
        self.log_records = self.messages.len();
        Ok(())
    }
}

impl MessageStore for GatewayStore {
    fn next_sender_seq_num(&self) -> u64 {
        self.next_sender
    }
    fn next_target_seq_num(&self) -> u64 {
        self.next_target
    }
    fn set_next_sender_seq_num(&mut self, seq_num: u64) -> io::Result<()> {
        self.next_sender = seq_num.max(1);
        self.write_seqnums()
    }
    fn set_next_target_seq_num(&mut self, seq_num: u64) -> io::Result<()> {
        self.next_target = seq_num.max(1);
        self.write_seqnums()
    }
    fn store_message(&mut self, seq_num: u64, bytes: &[u8]) -> io::Result<()> {
        if bytes.len() > STORED_MESSAGE_SIZE_MAX_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "message too large to store",
            ));
        }
        let mut rec = Vec::with_capacity(12 + bytes.len());
        rec.extend_from_slice(&seq_num.to_le_bytes());
        rec.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        rec.extend_from_slice(bytes);
        self.log.write_all(&rec)?;
        if self.sync {
            self.log.sync_data()?;
        }
        self.log_records += 1;
        self.messages.insert(seq_num, bytes.to_vec());
        while self.messages.len() > self.stored_messages_max {
            self.messages.pop_first();
        }
        self.compact_if_needed()
    }
    fn messages_in_range(
        &self,
        begin: u64,
        end: u64,
        out: &mut Vec<(u64, Vec<u8>)>,
    ) -> io::Result<()> {
        if begin <= end {
            for (seq, bytes) in self.messages.range(begin..=end) {
                out.push((*seq, bytes.clone()));
            }
        }
        Ok(())
    }
    fn reset(&mut self) -> io::Result<()> {
        self.messages.clear();
        self.log.set_len(0)?;
        self.log_records = 0;
        self.next_sender = 1;
        self.next_target = 1;
        self.write_seqnums()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_and_messages_survive_reopen_and_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut s = GatewayStore::open(dir.path(), 10, false).unwrap();
            s.set_next_sender_seq_num(3).unwrap();
            s.set_next_target_seq_num(12345).unwrap();
            s.set_next_target_seq_num(7).unwrap();
            s.store_message(1, b"one").unwrap();
            s.store_message(2, b"two").unwrap();
        }
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.path().join("messages"))
            .unwrap();
        f.write_all(&[9, 0, 0, 0, 0, 0, 0, 0, 100, 0]).unwrap();
        let s = GatewayStore::open(dir.path(), 10, false).unwrap();
        assert_eq!((s.next_sender_seq_num(), s.next_target_seq_num()), (3, 7));
        let mut out = Vec::new();
        s.messages_in_range(1, 9, &mut out).unwrap();
        assert_eq!(out, vec![(1, b"one".to_vec()), (2, b"two".to_vec())]);
    }

    #[test]
    fn only_the_newest_messages_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = GatewayStore::open(dir.path(), 3, false).unwrap();
        for seq in 1..=3000 {
            s.store_message(seq, b"x").unwrap();
        }
        let mut out = Vec::new();
        s.messages_in_range(1, 3000, &mut out).unwrap();
        assert_eq!(
            out.iter().map(|m| m.0).collect::<Vec<_>>(),
            vec![2998, 2999, 3000]
        );
        drop(s);
        let s = GatewayStore::open(dir.path(), 3, false).unwrap();
        out.clear();
        s.messages_in_range(1, 3000, &mut out).unwrap();
        assert_eq!(out.len(), 3);
    }
}
