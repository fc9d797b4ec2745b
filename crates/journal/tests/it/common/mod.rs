//! Helpers shared by the journal's integration tests.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};

use bourse_journal::{Config, Entry, Fsync, Journal, JournalError};

pub const CLUSTER: u128 = 0x0123_4567_89ab_cdef_0011_2233_4455_6677;
pub const NODE: u64 = 1;

/// Small segments so a few dozen entries span several files.
pub fn config() -> Config {
    let mut config = Config::new(CLUSTER, NODE);
    config.segment_size_bytes_max = 4096;
    config.payload_size_bytes_max = 1024;
    config.fsync = Fsync::Always;
    config
}

pub fn payload(index: u64, term: u64) -> Vec<u8> {
    let len = 20 + (index % 7) as usize * 30;
    (0..len)
        .map(|i| (index as usize * 31 + term as usize * 7 + i) as u8)
        .collect()
}

pub fn entries(indexes: std::ops::Range<u64>, term: u64) -> Vec<Entry> {
    indexes
        .map(|index| Entry {
            index,
            term,
            payload: payload(index, term),
        })
        .collect()
}

pub fn open(dir: &Path) -> Journal {
    Journal::open(dir, config()).expect("open").0
}

/// A journal with entries 0..count, term 1, appended in batches of 5.
pub fn filled(dir: &Path, count: u64) -> Journal {
    let mut journal = open(dir);
    let mut index = 0;
    while index < count {
        let end = (index + 5).min(count);
        journal.append(&entries(index..end, 1)).expect("append");
        index = end;
    }
    journal
}

pub fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    files.sort();
    files
}

/// The byte offset and file of record `index`, found with the operator's inspect.
pub fn locate(dir: &Path, index: u64) -> (PathBuf, u64) {
    let info = bourse_journal::inspect(dir, index..=index)
        .expect("inspect")
        .next()
        .expect("record present")
        .expect("record valid");
    (info.file, info.offset)
}

pub fn flip_bit(path: &Path, offset: u64) {
    let mut bytes = fs::read(path).expect("read");
    bytes[offset as usize] ^= 0x04;
    fs::write(path, bytes).expect("write");
}

pub fn open_err(dir: &Path) -> JournalError {
    match Journal::open(dir, config()) {
        Ok(_) => panic!("open should have failed"),
        Err(error) => error,
    }
}

pub fn all(journal: &Journal) -> Vec<Entry> {
    journal.read(..).expect("read all")
}
