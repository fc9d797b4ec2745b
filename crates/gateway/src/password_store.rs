//! Passwords the clients changed themselves (FIX NewPassword, 925), kept in a file of their own.
//!
//! The gateway's configuration is the operator's, and the gateway never writes it. A gateway
//! with `password_store_path` keeps there the hashes of passwords its FIX clients changed on
//! Logon; at start the file's entries replace the configured `password_hash` of their
//! sessions, so a change survives restarts. A missing file means no change yet. Without
//! `password_store_path` the passwords are read-only: a Logon that asks for a change is
//! refused, after its old password was checked, saying so.
//!
//! An entry may only replace a password the configuration already asks for: the store cannot
//! give a password to a session the operator left without one, nor name a session the
//! configuration does not have (both refused at start, naming the entry). The file is
//! replaced whole on each change (written beside it, synced, renamed), so a crash leaves the
//! old file or the new one, never half of either.

use crate::config::GatewayConfig;
use bourse_auth::PasswordHashString;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The file as TOML: `[[fix_sessions]]` entries.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct StoreFile {
    #[serde(default)]
    fix_sessions: Vec<StoredPassword>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct StoredPassword {
    client_comp_id: String,
    gateway_comp_id: String,
    password_hash: String,
}

/// A FIX session's CompIDs: (client, gateway).
pub type SessionNames = (String, String);

/// The changed passwords, as on disk.
#[derive(Debug)]
pub struct PasswordStore {
    path: PathBuf,
    entries: BTreeMap<SessionNames, PasswordHashString>,
}

impl PasswordStore {
    /// Reads the store at `path`; a missing file is an empty store.
    pub fn open(path: &Path) -> Result<PasswordStore, String> {
        let what = |e: String| format!("password_store_path {}: {e}", path.display());
        let file: StoreFile = match std::fs::read_to_string(path) {
            Ok(text) => toml::from_str(&text).map_err(|e| what(e.to_string()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => StoreFile::default(),
            Err(e) => return Err(what(e.to_string())),
        };
        let mut entries = BTreeMap::new();
        for e in file.fix_sessions {
            let hash = PasswordHashString::parse(&e.password_hash)
                .map_err(|err| what(format!("session {}: {err}", e.client_comp_id)))?;
            let names = (e.client_comp_id, e.gateway_comp_id);
            if entries.insert(names.clone(), hash).is_some() {
                return Err(what(format!("session {} listed twice", names.0)));
            }
        }
        Ok(PasswordStore {
            path: path.to_path_buf(),
            entries,
        })
    }

    /// Replaces the configured hash of every session the store names.
    pub fn apply(&self, config: &mut GatewayConfig) -> Result<(), String> {
        for ((client, gateway), hash) in &self.entries {
            let session = config
                .fix_sessions
                .iter_mut()
                .find(|s| &s.client_comp_id == client && &s.gateway_comp_id == gateway)
                .ok_or_else(|| {
                    format!(
                        "password_store_path {}: session {client}/{gateway} is not configured",
                        self.path.display()
                    )
                })?;
            if session.password_hash.is_none() {
                return Err(format!(
                    "password_store_path {}: session {client} has no password_hash in the configuration, so none can be changed",
                    self.path.display()
                ));
            }
            session.password_hash = Some(hash.clone());
        }
        Ok(())
    }

    /// Records `hash` as the session's password and writes the file before returning: the
    /// change holds only once this returns Ok.
    pub fn set(&mut self, names: &SessionNames, hash: PasswordHashString) -> Result<(), String> {
        let before = self.entries.insert(names.clone(), hash);
        let written = self.write();
        if written.is_err() {
            // The file still holds the old password; so must memory.
            match before {
                Some(old) => self.entries.insert(names.clone(), old),
                None => self.entries.remove(names),
            };
        }
        written
    }

    fn write(&self) -> Result<(), String> {
        let file = StoreFile {
            fix_sessions: self
                .entries
                .iter()
                .map(|((client, gateway), hash)| StoredPassword {
                    client_comp_id: client.clone(),
                    gateway_comp_id: gateway.clone(),
                    password_hash: hash.as_str().to_string(),
                })
                .collect(),
        };
        let text = toml::to_string(&file).map_err(|e| e.to_string())?;
        let text = format!(
            "# Passwords changed by FIX clients (NewPassword, 925); written by the gateway.\n{text}"
        );
        let tmp = self.path.with_extension("tmp");
        let fail = |e: std::io::Error| format!("cannot write {}: {e}", self.path.display());
        let mut f = std::fs::File::create(&tmp).map_err(fail)?;
        f.write_all(text.as_bytes()).map_err(fail)?;
        f.sync_all().map_err(fail)?;
        std::fs::rename(&tmp, &self.path).map_err(fail)?;
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if let Ok(d) = std::fs::File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    }

    /// The hash the store holds for a session, if it holds one.
    pub fn get(&self, names: &SessionNames) -> Option<&PasswordHashString> {
        self.entries.get(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bourse_auth::HashCost;

    fn names() -> SessionNames {
        ("ALPHA".into(), "BOURSE".into())
    }

    #[test]
    fn a_change_is_on_disk_when_set_returns_and_read_back_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("passwords.toml");
        let mut store = PasswordStore::open(&path).unwrap();
        assert!(store.get(&names()).is_none());
        let hash = bourse_auth::hash_password_with("new one", HashCost::TEST_ONLY).unwrap();
        store.set(&names(), hash).unwrap();
        let again = PasswordStore::open(&path).unwrap();
        assert!(again.get(&names()).unwrap().verify("new one").is_ok());
    }

    #[test]
    fn a_store_that_cannot_be_written_keeps_the_old_password() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("passwords.toml");
        let mut store = PasswordStore::open(&path).unwrap();
        let hash = bourse_auth::hash_password_with("new one", HashCost::TEST_ONLY).unwrap();
        let err = store.set(&names(), hash).unwrap_err();
        assert!(err.contains("cannot write"), "{err}");
        assert!(store.get(&names()).is_none());
    }

    #[test]
    fn a_store_entry_for_an_unknown_field_or_bad_hash_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("passwords.toml");
        std::fs::write(&path, "[[fix_sessions]]\nclient_comp_id = \"A\"\ngateway_comp_id = \"B\"\npassword_hash = \"x\"\n").unwrap();
        let err = PasswordStore::open(&path).unwrap_err();
        assert!(err.contains("session A"), "{err}");
        std::fs::write(&path, "[[fix_sessions]]\nclient = \"A\"\n").unwrap();
        let err = PasswordStore::open(&path).unwrap_err();
        assert!(err.contains("unknown field"), "{err}");
    }
}
