//! Who may read what: readers log on with the venue's credential store (`bourse_auth`), and
//! each credential's roles say whose records it reads ([`Reader`]).
//!
//! - Roles `viewer` and `operator` read every firm's records, as today without credentials.
//! - A role `firm:N` (as the clearing node's) reads firm N's records; several such roles read
//!   several firms. A firm's reader gets its own firms' orders and rejects, and the trades
//!   with one of its firms on a side: that side in full, the other with its account, client
//!   order id and firm withheld (`Record::seen_by`). Whatever filter it sends: a poll naming
//!   another firm is refused `not_entitled`; one naming none reads its firm (of a reader of
//!   several firms, it must name one); an account or instrument filter narrows its own
//!   firm's records further and can never widen them.
//! - A credential with neither is refused `not_entitled` at logon.
//!
//! An Argon2 check costs 20-50 ms, so it never runs on the runtime's workers, and never per
//! poll: a [`Gate`] checks each credential once on a blocking thread (at most `threads` checks
//! at once, the rest wait) and remembers the result in a [`bourse_auth::cache::VerifiedCache`]
//! for `credential_cache_seconds`, at most `credential_cache_max` credentials. HTTP sends
//! the credentials with every request (Basic), which then costs a keyed hash; the binary front
//! checks its Logon once per connection.
//!
//! [`AccessConfig`] is the node's `[access]` table: the readers' credentials, the server's
//! TLS certificate, the cache. A listener off the loopback needs both TLS and credentials,
//! as the admin API's; a node on the loopback without credentials answers everyone there.

use crate::poll::{Refusal, RefusalKind};
use bourse_auth::cache::VerifiedCache;
use bourse_auth::{CredentialEntry, CredentialStore};
use bourse_core::FirmId;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// The roles that read every firm's records.
pub const ROLE_VIEWER: &str = "viewer";
pub const ROLE_OPERATOR: &str = "operator";
/// The role prefix of a firm's reader: `firm:12` reads firm 12's records.
pub const ROLE_FIRM_PREFIX: &str = "firm:";

/// The node's `[access]` table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessConfig {
    /// The readers (`[[access.readers]]`: `name`, `password_hash` from `bourse auth
    /// hash-password`, `roles`). None: every client reads everything, which only loopback
    /// listeners allow.
    #[serde(default, skip_serializing)]
    pub readers: Vec<CredentialEntry>,
    /// The server's certificate and key (PEM): both fronts then speak TLS only. Required for
    /// a listener off the loopback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ServerTls>,
    /// How long a checked credential is remembered.
    #[serde(default = "credential_cache_seconds_default")]
    pub credential_cache_seconds: u64,
    /// The most credentials remembered at once.
    #[serde(default = "credential_cache_max_default")]
    pub credential_cache_max: usize,
}

impl Default for AccessConfig {
    fn default() -> AccessConfig {
        AccessConfig {
            readers: Vec::new(),
            tls: None,
            credential_cache_seconds: credential_cache_seconds_default(),
            credential_cache_max: credential_cache_max_default(),
        }
    }
}

fn credential_cache_seconds_default() -> u64 {
    300
}

fn credential_cache_max_default() -> usize {
    4096
}

/// A server certificate chain and its key, PEM files.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerTls {
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
}

impl AccessConfig {
    /// Checks the table, and the listeners against it: a listener off the loopback needs
    /// TLS (passwords and firms' records must not cross a network in clear) and credentials
    /// (or everyone who reaches it reads every firm's records).
    pub fn validate(&self, listeners: &[(&str, SocketAddr)]) -> Result<(), String> {
        CredentialStore::from_entries(&self.readers).map_err(|e| format!("access.readers: {e}"))?;
        for (what, addr) in listeners {
            if addr.ip().is_loopback() {
                continue;
            }
            if self.tls.is_none() {
                return Err(format!(
                    "{what} = \"{addr}\" is not a loopback address: a delivery front off the \
                     loopback speaks TLS only (readers' passwords and firms' records must not \
                     cross a network in clear): set access.tls = {{ cert_path, key_path }}, or \
                     listen on 127.0.0.1 or [::1]"
                ));
            }
            if self.readers.is_empty() {
                return Err(format!(
                    "{what} = \"{addr}\" is not a loopback address, and without \
                     [[access.readers]] the node answers everyone who reaches it with every \
                     firm's records: add readers (hashes from `bourse auth hash-password`, roles \
                     viewer, operator or firm:N), or listen on 127.0.0.1 or [::1]"
                ));
            }
        }
        if self.credential_cache_max == 0 {
            return Err("access.credential_cache_max must be positive".into());
        }
        Ok(())
    }

    /// The server's TLS configuration, if any.
    pub fn server_tls(&self) -> Result<Option<Arc<rustls::ServerConfig>>, String> {
        match &self.tls {
            None => Ok(None),
            Some(t) => bourse_auth::tls::server_config(&t.cert_path, &t.key_path)
                .map(Some)
                .map_err(|e| format!("access.tls: {e}")),
        }
    }
}

/// Whose records a logged-on client reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reader {
    /// Every firm's (roles `viewer`, `operator`; every client of a node without credentials).
    All,
    /// These firms' only (roles `firm:N`), in the order the roles list them.
    Firms(Vec<FirmId>),
}

impl Reader {
    /// The reader a credential's roles make; `None` when they read nothing.
    pub fn of_roles(roles: &[String]) -> Option<Reader> {
        if roles.iter().any(|r| r == ROLE_VIEWER || r == ROLE_OPERATOR) {
            return Some(Reader::All);
        }
        let mut firms: Vec<FirmId> = Vec::new();
        for f in roles
            .iter()
            .filter_map(|r| r.strip_prefix(ROLE_FIRM_PREFIX))
            .filter_map(|n| n.parse::<u32>().ok())
        {
            if !firms.contains(&FirmId(f)) {
                firms.push(FirmId(f));
            }
        }
        (!firms.is_empty()).then_some(Reader::Firms(firms))
    }

    /// The filter a poll of this reader runs with: a firm's reader never reads another
    /// firm's records, whatever it asks for.
    pub fn entitle(&self, mut filter: crate::Filter) -> Result<crate::Filter, Refusal> {
        let Reader::Firms(firms) = self else {
            return Ok(filter);
        };
        match filter.firm {
            Some(f) if firms.contains(&f) => Ok(filter),
            Some(f) => Err(not_entitled(format!(
                "these credentials read the records of firm {} only, not firm {}",
                list(firms),
                f.0
            ))),
            None if firms.len() == 1 => {
                filter.firm = Some(firms[0]);
                Ok(filter)
            }
            None => Err(not_entitled(format!(
                "these credentials read firms {}: name one of them in `firm`",
                list(firms)
            ))),
        }
    }

    /// The firms whose side of a trade this reader sees in full (`None`: every side).
    pub fn firms(&self) -> Option<&[FirmId]> {
        match self {
            Reader::All => None,
            Reader::Firms(f) => Some(f),
        }
    }
}

fn list(firms: &[FirmId]) -> String {
    firms
        .iter()
        .map(|f| f.0.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn not_entitled(message: String) -> Refusal {
    Refusal {
        kind: RefusalKind::NotEntitled,
        message,
    }
}

/// A refusal for want of (right) credentials.
pub fn unauthenticated(message: &str) -> Refusal {
    Refusal {
        kind: RefusalKind::Unauthenticated,
        message: message.to_string(),
    }
}

/// The node's check of credentials (see the module's overview).
pub struct Gate {
    store: Arc<CredentialStore>,
    cache: VerifiedCache<Result<Reader, Refusal>>,
    checks: Semaphore,
}

impl Gate {
    /// A gate that lets everyone read everything (a node without credentials).
    pub fn open() -> Gate {
        Gate::new(CredentialStore::new(), &AccessConfig::default(), 1)
    }

    /// A gate over `store`, running at most `checks_at_once` Argon2 checks at once.
    pub fn new(store: CredentialStore, config: &AccessConfig, checks_at_once: usize) -> Gate {
        Gate {
            store: Arc::new(store),
            cache: VerifiedCache::new(
                config.credential_cache_max,
                Duration::from_secs(config.credential_cache_seconds),
            ),
            checks: Semaphore::new(checks_at_once.max(1)),
        }
    }

    /// Whether the node has no credentials (everyone reads everything).
    pub fn is_open(&self) -> bool {
        self.store.is_empty()
    }

    /// The reader these credentials make: from the cache, or checked once on a blocking
    /// thread and remembered (a wrong password too, so a client retrying it is cheap to
    /// refuse; the right one has another key).
    pub async fn check(&self, name: &str, password: &str) -> Result<Reader, Refusal> {
        if self.is_open() {
            return Ok(Reader::All);
        }
        if let Some(r) = self.cache.get(name, password) {
            return r;
        }
        let _permit = self.checks.acquire().await.expect("never closed");
        // Another request may have checked the same credentials while this one waited.
        if let Some(r) = self.cache.get(name, password) {
            return r;
        }
        let store = Arc::clone(&self.store);
        let (n, p) = (name.to_string(), password.to_string());
        let checked = tokio::task::spawn_blocking(move || match store.verify(&n, &p) {
            Ok(id) => Reader::of_roles(id.roles).ok_or_else(|| {
                not_entitled(format!(
                    "{n} holds no role that reads delivery data ({ROLE_VIEWER}, \
                     {ROLE_OPERATOR} or {ROLE_FIRM_PREFIX}N)"
                ))
            }),
            Err(_) => Err(unauthenticated("invalid credentials")),
        })
        .await
        .unwrap_or_else(|_| Err(unauthenticated("invalid credentials")));
        self.cache.insert(name, password, checked.clone());
        checked
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Filter;
    use bourse_core::AccountId;

    #[test]
    fn roles_make_readers() {
        let roles = |r: &[&str]| r.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(Reader::of_roles(&roles(&["viewer"])), Some(Reader::All));
        assert_eq!(
            Reader::of_roles(&roles(&["firm:3", "operator"])),
            Some(Reader::All)
        );
        assert_eq!(
            Reader::of_roles(&roles(&["firm:3", "firm:x", "firm:5", "firm:3"])),
            Some(Reader::Firms(vec![FirmId(3), FirmId(5)]))
        );
        assert_eq!(Reader::of_roles(&roles(&["admin", "firm:"])), None);
    }

    #[test]
    fn a_firms_reader_reads_its_own_firm_whatever_it_asks() {
        let one = Reader::Firms(vec![FirmId(2)]);
        let f = one.entitle(Filter::default()).unwrap();
        assert_eq!(f.firm, Some(FirmId(2)));
        let with_account = Filter {
            account: Some(AccountId(9)),
            ..Filter::default()
        };
        let f = one.entitle(with_account).unwrap();
        assert_eq!((f.firm, f.account), (Some(FirmId(2)), Some(AccountId(9))));
        let other = Filter {
            firm: Some(FirmId(1)),
            ..Filter::default()
        };
        assert_eq!(
            one.entitle(other).unwrap_err().kind,
            RefusalKind::NotEntitled
        );
        let two = Reader::Firms(vec![FirmId(2), FirmId(4)]);
        let e = two.entitle(Filter::default()).unwrap_err();
        assert!(e.message.contains("2, 4"), "{}", e.message);
        assert_eq!(Reader::All.entitle(other).unwrap(), other);
    }

    #[test]
    fn off_the_loopback_a_listener_needs_tls_and_readers() {
        let at = |a: &str| vec![("listen", a.parse::<SocketAddr>().unwrap())];
        let mut c = AccessConfig::default();
        assert!(c.validate(&at("127.0.0.1:1")).is_ok());
        assert!(c.validate(&at("[::1]:1")).is_ok());
        let e = c.validate(&at("10.0.0.1:1")).unwrap_err();
        assert!(e.contains("TLS only"), "{e}");
        c.tls = Some(ServerTls {
            cert_path: "c.pem".into(),
            key_path: "k.pem".into(),
        });
        let e = c.validate(&at("0.0.0.0:1")).unwrap_err();
        assert!(e.contains("[[access.readers]]"), "{e}");
        c.readers.push(CredentialEntry {
            name: "r".into(),
            password_hash: bourse_auth::hash_password_with("pw", bourse_auth::HashCost::TEST_ONLY)
                .unwrap(),
            roles: vec!["viewer".into()],
        });
        assert!(c.validate(&at("0.0.0.0:1")).is_ok());
    }
}
