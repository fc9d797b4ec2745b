//! The audit log: one JSON line per finished request (who, when, what, outcome, and the answer
//! given), appended and flushed to the operating system before the answer goes out.
//!
//! It is also the memory of request ids across restarts: [`AuditLog::open`] reads the lines
//! already there and hands back the newest answers by request id, so a request retried after
//! the admin service restarted is answered from the log instead of applied again.

use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

/// The longest line read back from an audit log; a longer one is skipped with a warning.
pub const AUDIT_LINE_BYTES_MAX: usize = 1 << 20;

/// One audited request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditRecord {
    /// When the answer was given, Unix nanoseconds.
    pub ts_ns: u64,
    /// The operator who asked (a refused request: the name it claimed, if any).
    pub operator: String,
    pub request_id: String,
    /// The action's name (`deposit`, `kill_switch`, `add_accounts_bulk`, ...).
    pub action: String,
    /// The request itself (for a bulk addition, its line count instead of its lines).
    pub request: serde_json::Value,
    /// `applied`, `rejected`, `invalid`, `unavailable`, `refused`.
    pub outcome: String,
    /// The HTTP status answered.
    pub status: u16,
    /// The answer's body.
    pub answer: serde_json::Value,
    /// A fingerprint of the request, to tell a retry from another request reusing its id.
    #[serde(default)]
    pub fingerprint: u64,
}

/// An append-only audit log file.
pub struct AuditLog {
    path: PathBuf,
    file: File,
    pub records_written: u64,
}

impl AuditLog {
    /// Opens (creating) the log at `path` and returns the records already in it, oldest
    /// first; unreadable lines are skipped and counted in the warning printed.
    pub fn open(path: &Path) -> std::io::Result<(AuditLog, Vec<AuditRecord>)> {
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir)?;
            }
        }
        let mut records = Vec::new();
        let mut skipped = 0u64;
        if let Ok(existing) = File::open(path) {
            let mut reader = BufReader::new(existing);
            let mut line = String::new();
            loop {
                line.clear();
                if reader.read_line(&mut line)? == 0 {
                    break;
                }
                if line.len() > AUDIT_LINE_BYTES_MAX {
                    skipped += 1;
                    continue;
                }
                match serde_json::from_str::<AuditRecord>(line.trim_end()) {
                    Ok(r) => records.push(r),
                    Err(_) => skipped += 1,
                }
            }
        }
        if skipped > 0 {
            eprintln!(
                "admin: {skipped} unreadable lines in the audit log {} were skipped",
                path.display()
            );
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok((
            AuditLog {
                path: path.to_path_buf(),
                file,
                records_written: 0,
            },
            records,
        ))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one record as one line and hands it to the operating system.
    pub fn append(&mut self, record: &AuditRecord) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(record).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.file.write_all(&line)?;
        self.file.flush()?;
        self.records_written += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_written_are_read_back_on_open_and_damaged_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let record = AuditRecord {
            ts_ns: 1,
            operator: "ops".into(),
            request_id: "r1".into(),
            action: "deposit".into(),
            request: serde_json::json!({"action": "deposit"}),
            outcome: "applied".into(),
            status: 200,
            answer: serde_json::json!({"outcome": "applied"}),
            fingerprint: 7,
        };
        {
            let (mut log, old) = AuditLog::open(&path).unwrap();
            assert!(old.is_empty());
            log.append(&record).unwrap();
        }
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{not json\n")
            .unwrap();
        let (_, old) = AuditLog::open(&path).unwrap();
        assert_eq!(old, vec![record]);
    }
}
