//! Credentials for everyone who logs on to the venue: trading sessions and operators.
//!
//! [`hash_password`] makes a salted Argon2id hash as a PHC string (what configs store; `bourse
//! auth hash-password` prints one); [`PasswordHashString`] is one checked for algorithm and
//! cost ([`HashCost::MAX`]); [`CredentialStore`] maps names to hashes and roles and answers one
//! [`AuthError::Denied`] for an unknown name and a wrong password, spending the same work. A
//! check costs 20-50 ms by design, so servers run it off their event loop. [`cache`] remembers
//! checked credentials, [`http_basic`] reads HTTP Basic, [`tls`] loads the venue's TLS
//! identities from PEM files.
//!
//! Invariants: ARCHITECTURE.md, `crates/auth`.

pub mod cache;
pub mod tls;

use argon2::{Algorithm, Argon2, Params, Version};
use password_hash::rand_core::{OsRng, RngCore};
use password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// Longest password accepted, in bytes (FIX 554 and the admin API; the binary Establish holds
/// at most 32).
pub const PASSWORD_BYTES_MAX: usize = 128;
/// Longest stored PHC string accepted.
pub const HASH_STRING_BYTES_MAX: usize = 256;
/// Longest credential (session or operator) name.
pub const NAME_BYTES_MAX: usize = 64;
/// Most roles one entry may hold.
pub const ROLES_PER_ENTRY_MAX: usize = 16;

/// Errors of hashing, reading hashes and checking credentials.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The name is unknown or the password does not match: deliberately one answer.
    #[error("invalid credentials")]
    Denied,
    /// The credentials are right but the entry does not hold the role asked for.
    #[error("{name} does not hold the role {role}")]
    RoleMissing { name: String, role: String },
    #[error("the password is empty")]
    EmptyPassword,
    #[error("the password has {bytes} bytes, more than {PASSWORD_BYTES_MAX}")]
    PasswordTooLong { bytes: usize },
    /// A stored hash that is not a PHC string of a supported algorithm.
    #[error("password hash is not a valid PHC string: {reason}")]
    InvalidHash { reason: String },
    #[error("password hash uses {algorithm}; only argon2id is accepted")]
    UnsupportedAlgorithm { algorithm: String },
    #[error("password hash cost m={memory_kib} KiB, t={iterations}, p={lanes} exceeds the limit m<={}, t<={}, p<={}", HashCost::MAX.memory_kib, HashCost::MAX.iterations, HashCost::MAX.lanes)]
    CostTooHigh {
        memory_kib: u32,
        iterations: u32,
        lanes: u32,
    },
    #[error("invalid hash cost: {reason}")]
    InvalidCost { reason: String },
    #[error("credential name must have 1 to {NAME_BYTES_MAX} printable ASCII bytes: {name:?}")]
    InvalidName { name: String },
    #[error("credential {name} is defined twice")]
    DuplicateName { name: String },
    #[error("credential {name}: role names must be 1 to 64 printable ASCII bytes, at most {ROLES_PER_ENTRY_MAX}")]
    InvalidRoles { name: String },
}

/// Argon2id cost parameters: memory in KiB, iterations (passes), lanes (parallelism).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashCost {
    pub memory_kib: u32,
    pub iterations: u32,
    pub lanes: u32,
}

impl HashCost {
    /// OWASP's recommended minimum for Argon2id: 19 MiB, 2 passes, 1 lane.
    pub const DEFAULT: HashCost = HashCost {
        memory_kib: 19 * 1024,
        iterations: 2,
        lanes: 1,
    };
    /// The dearest hash a stored string may ask for: 256 MiB, 16 passes, 8 lanes.
    pub const MAX: HashCost = HashCost {
        memory_kib: 256 * 1024,
        iterations: 16,
        lanes: 8,
    };
    /// The cheapest Argon2 allows (8 KiB per lane, 1 pass): for tests only, never for a venue.
    pub const TEST_ONLY: HashCost = HashCost {
        memory_kib: 8,
        iterations: 1,
        lanes: 1,
    };

    fn params(self) -> Result<Params, AuthError> {
        if self.memory_kib > Self::MAX.memory_kib
            || self.iterations > Self::MAX.iterations
            || self.lanes > Self::MAX.lanes
        {
            return Err(AuthError::CostTooHigh {
                memory_kib: self.memory_kib,
                iterations: self.iterations,
                lanes: self.lanes,
            });
        }
        Params::new(self.memory_kib, self.iterations, self.lanes, None).map_err(|e| {
            AuthError::InvalidCost {
                reason: e.to_string(),
            }
        })
    }
}

fn check_password(password: &str) -> Result<(), AuthError> {
    if password.is_empty() {
        return Err(AuthError::EmptyPassword);
    }
    if password.len() > PASSWORD_BYTES_MAX {
        return Err(AuthError::PasswordTooLong {
            bytes: password.len(),
        });
    }
    Ok(())
}

/// Hashes `password` with a fresh random salt at [`HashCost::DEFAULT`].
pub fn hash_password(password: &str) -> Result<PasswordHashString, AuthError> {
    hash_password_with(password, HashCost::DEFAULT)
}

/// Hashes `password` with a fresh random salt at the given cost.
pub fn hash_password_with(password: &str, cost: HashCost) -> Result<PasswordHashString, AuthError> {
    check_password(password)?;
    let argon = Argon2::new(Algorithm::Argon2id, Version::V0x13, cost.params()?);
    let salt = SaltString::generate(&mut OsRng);
    let hash = argon
        .hash_password(password.as_bytes(), &salt)
        .map_err(|e| AuthError::InvalidCost {
            reason: e.to_string(),
        })?;
    Ok(PasswordHashString {
        phc: hash.to_string(),
    })
}

/// A PHC string known to be Argon2id within [`HashCost::MAX`].
#[derive(Clone, PartialEq, Eq)]
pub struct PasswordHashString {
    phc: String,
}

impl std::fmt::Debug for PasswordHashString {
    /// Hashes are not secrets, but logs have no use for them either.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PasswordHashString(argon2id, ..)")
    }
}

impl std::fmt::Display for PasswordHashString {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.phc)
    }
}

impl std::str::FromStr for PasswordHashString {
    type Err = AuthError;
    fn from_str(s: &str) -> Result<Self, AuthError> {
        PasswordHashString::parse(s)
    }
}

impl<'de> Deserialize<'de> for PasswordHashString {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        PasswordHashString::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl PasswordHashString {
    /// Checks a stored PHC string: its syntax, its algorithm (argon2id) and its cost.
    pub fn parse(phc: &str) -> Result<Self, AuthError> {
        if phc.len() > HASH_STRING_BYTES_MAX {
            return Err(AuthError::InvalidHash {
                reason: format!("longer than {HASH_STRING_BYTES_MAX} bytes"),
            });
        }
        let parsed = PasswordHash::new(phc).map_err(|e| AuthError::InvalidHash {
            reason: e.to_string(),
        })?;
        if parsed.algorithm != Algorithm::Argon2id.ident() {
            return Err(AuthError::UnsupportedAlgorithm {
                algorithm: parsed.algorithm.to_string(),
            });
        }
        if parsed.hash.is_none() || parsed.salt.is_none() {
            return Err(AuthError::InvalidHash {
                reason: "salt or hash missing".into(),
            });
        }
        let params = Params::try_from(&parsed).map_err(|e| AuthError::InvalidHash {
            reason: e.to_string(),
        })?;
        HashCost {
            memory_kib: params.m_cost(),
            iterations: params.t_cost(),
            lanes: params.p_cost(),
        }
        .params()?;
        Ok(PasswordHashString {
            phc: phc.to_string(),
        })
    }

    /// Whether `password` hashes to this; the final comparison is constant-time.
    pub fn verify(&self, password: &str) -> Result<(), AuthError> {
        check_password(password).map_err(|_| AuthError::Denied)?;
        // Parsed at construction, so this cannot fail; refusing rather than panicking anyway.
        let parsed = PasswordHash::new(&self.phc).map_err(|_| AuthError::Denied)?;
        Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .map_err(|_| AuthError::Denied)
    }

    pub fn as_str(&self) -> &str {
        &self.phc
    }

    /// The cost this hash was made with (a new password of the same account is hashed at the
    /// cost its operator chose for the old one).
    pub fn cost(&self) -> HashCost {
        // Parsed and bounded at construction, so the parameters are there; the default only
        // guards against a change of that rule.
        PasswordHash::new(&self.phc)
            .ok()
            .and_then(|parsed| Params::try_from(&parsed).ok())
            .map_or(HashCost::DEFAULT, |p| HashCost {
                memory_kib: p.m_cost(),
                iterations: p.t_cost(),
                lanes: p.p_cost(),
            })
    }
}

/// One entry of a credential store as configs write it (`[[operators]]`, a session's fields).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialEntry {
    pub name: String,
    pub password_hash: PasswordHashString,
    /// Roles the entry holds; none: the entry authenticates but holds no role.
    #[serde(default)]
    pub roles: Vec<String>,
}

#[derive(Debug, Clone)]
struct Credential {
    hash: PasswordHashString,
    roles: Vec<String>,
}

/// Who passed [`CredentialStore::verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity<'a> {
    pub name: &'a str,
    pub roles: &'a [String],
}

impl Identity<'_> {
    pub fn has_role(&self, role: &str) -> bool {
        self.roles.iter().any(|r| r == role)
    }
}

/// Credentials by name. Lookups go through a `BTreeMap`, so nothing depends on hash order.
#[derive(Debug, Clone, Default)]
pub struct CredentialStore {
    entries: BTreeMap<String, Credential>,
}

fn valid_token(s: &str) -> bool {
    !s.is_empty() && s.len() <= NAME_BYTES_MAX && s.bytes().all(|b| (0x21..0x7f).contains(&b))
}

impl CredentialStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// A store of these entries; refuses invalid names or roles and a name given twice.
    pub fn from_entries(entries: &[CredentialEntry]) -> Result<Self, AuthError> {
        let mut store = Self::new();
        for e in entries {
            store.insert(&e.name, e.password_hash.clone(), e.roles.clone())?;
        }
        Ok(store)
    }

    pub fn insert(
        &mut self,
        name: &str,
        hash: PasswordHashString,
        roles: Vec<String>,
    ) -> Result<(), AuthError> {
        if !valid_token(name) {
            return Err(AuthError::InvalidName { name: name.into() });
        }
        if roles.len() > ROLES_PER_ENTRY_MAX || !roles.iter().all(|r| valid_token(r)) {
            return Err(AuthError::InvalidRoles { name: name.into() });
        }
        if self.entries.contains_key(name) {
            return Err(AuthError::DuplicateName { name: name.into() });
        }
        self.entries
            .insert(name.to_string(), Credential { hash, roles });
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// Checks `name`'s password. An unknown name costs one verification against a fixed hash
    /// of the default cost, so both failures take about as long and read [`AuthError::Denied`].
    pub fn verify(&self, name: &str, password: &str) -> Result<Identity<'_>, AuthError> {
        match self.entries.get_key_value(name) {
            Some((name, c)) => {
                c.hash.verify(password)?;
                Ok(Identity {
                    name,
                    roles: &c.roles,
                })
            }
            None => {
                // The result is irrelevant: the work is what keeps names from being probed.
                let _ = decoy_hash().verify(password);
                Err(AuthError::Denied)
            }
        }
    }

    /// [`CredentialStore::verify`], then the role: `RoleMissing` only after the password was right.
    pub fn verify_role(
        &self,
        name: &str,
        password: &str,
        role: &str,
    ) -> Result<Identity<'_>, AuthError> {
        let id = self.verify(name, password)?;
        if id.has_role(role) {
            Ok(id)
        } else {
            Err(AuthError::RoleMissing {
                name: name.into(),
                role: role.into(),
            })
        }
    }
}

/// Fills `out` from the operating system's random source (salts, cache keys, identities).
pub fn random_bytes(out: &mut [u8]) {
    OsRng.fill_bytes(out);
}

/// A random `u64` from the operating system's random source.
pub fn random_u64() -> u64 {
    OsRng.next_u64()
}

/// The longest `Authorization` header value [`http_basic`] reads.
pub const AUTHORIZATION_BYTES_MAX: usize = 512;

/// Reads an HTTP `Authorization: Basic ...` header value: (name, password); `None` for any
/// other scheme, bad base64, text that is not UTF-8 or has no `:`, or a value longer than
/// [`AUTHORIZATION_BYTES_MAX`]. The one reader for every HTTP API of the venue.
pub fn http_basic(value: &str) -> Option<(String, String)> {
    use base64ct::{Base64, Encoding};
    if value.len() > AUTHORIZATION_BYTES_MAX {
        return None;
    }
    let encoded = value.strip_prefix("Basic ")?.trim();
    let mut buf = [0u8; AUTHORIZATION_BYTES_MAX];
    let decoded = Base64::decode(encoded, &mut buf).ok()?;
    let text = std::str::from_utf8(decoded).ok()?;
    let (name, password) = text.split_once(':')?;
    Some((name.to_string(), password.to_string()))
}

/// The `Authorization` header value that carries these credentials as HTTP Basic.
pub fn http_basic_value(name: &str, password: &str) -> String {
    use base64ct::{Base64, Encoding};
    format!(
        "Basic {}",
        Base64::encode_string(format!("{name}:{password}").as_bytes())
    )
}

/// A hash of a random password at the default cost, made once per process on first use.
fn decoy_hash() -> &'static PasswordHashString {
    static DECOY: OnceLock<PasswordHashString> = OnceLock::new();
    DECOY.get_or_init(|| {
        let salt = SaltString::generate(&mut OsRng);
        hash_password(salt.as_str()).expect("the default cost is valid")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cheap(password: &str) -> PasswordHashString {
        hash_password_with(password, HashCost::TEST_ONLY).unwrap()
    }

    #[test]
    fn a_hash_verifies_its_password_and_nothing_else() {
        let h = cheap("s3cret");
        assert!(h.as_str().starts_with("$argon2id$v=19$m=8,t=1,p=1$"));
        assert_eq!(h.verify("s3cret"), Ok(()));
        assert_eq!(h.verify("s3creT"), Err(AuthError::Denied));
        assert_eq!(h.verify(""), Err(AuthError::Denied));
    }

    #[test]
    fn a_hash_tells_the_cost_it_was_made_with() {
        assert_eq!(cheap("pw").cost(), HashCost::TEST_ONLY);
        let other = HashCost {
            memory_kib: 16,
            iterations: 2,
            lanes: 1,
        };
        assert_eq!(hash_password_with("pw", other).unwrap().cost(), other);
    }

    #[test]
    fn two_hashes_of_one_password_differ_by_their_salt() {
        assert_ne!(cheap("pw").as_str(), cheap("pw").as_str());
    }

    #[test]
    fn the_default_cost_round_trips_through_its_phc_string() {
        let h = hash_password("operator pass").unwrap();
        assert!(h.as_str().contains("m=19456,t=2,p=1"), "{h}");
        let again: PasswordHashString = h.as_str().parse().unwrap();
        assert_eq!(again.verify("operator pass"), Ok(()));
    }

    #[test]
    fn bad_stored_hashes_are_refused_naming_why() {
        let e = PasswordHashString::parse("plaintext").unwrap_err();
        assert!(matches!(e, AuthError::InvalidHash { .. }), "{e}");
        let pbkdf = "$pbkdf2-sha256$i=1000$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA";
        let e = PasswordHashString::parse(pbkdf).unwrap_err();
        assert!(matches!(e, AuthError::UnsupportedAlgorithm { .. }), "{e}");
        let h = cheap("x").as_str().replace("m=8,t=1", "m=4194304,t=1");
        let e = PasswordHashString::parse(&h).unwrap_err();
        assert!(matches!(e, AuthError::CostTooHigh { .. }), "{e}");
        assert!(e.to_string().contains("m=4194304"), "{e}");
    }

    #[test]
    fn passwords_are_bounded() {
        assert_eq!(
            hash_password_with("", HashCost::TEST_ONLY),
            Err(AuthError::EmptyPassword)
        );
        let long = "a".repeat(PASSWORD_BYTES_MAX + 1);
        assert_eq!(
            hash_password_with(&long, HashCost::TEST_ONLY),
            Err(AuthError::PasswordTooLong {
                bytes: PASSWORD_BYTES_MAX + 1
            })
        );
    }

    #[test]
    fn the_store_answers_one_error_for_unknown_names_and_wrong_passwords() {
        let mut store = CredentialStore::new();
        store
            .insert("alice", cheap("pa"), vec!["admin".into()])
            .unwrap();
        store.insert("bob", cheap("pb"), vec![]).unwrap();
        let id = store.verify("alice", "pa").unwrap();
        assert_eq!(id.name, "alice");
        assert!(id.has_role("admin"));
        assert_eq!(store.verify("alice", "pb"), Err(AuthError::Denied));
        assert_eq!(store.verify("carol", "pa"), Err(AuthError::Denied));
        assert!(store.verify_role("alice", "pa", "admin").is_ok());
        assert_eq!(
            store.verify_role("bob", "pb", "admin"),
            Err(AuthError::RoleMissing {
                name: "bob".into(),
                role: "admin".into()
            })
        );
        assert_eq!(
            store.verify_role("bob", "wrong", "admin"),
            Err(AuthError::Denied)
        );
    }

    #[test]
    fn the_store_refuses_bad_names_and_duplicates() {
        let mut store = CredentialStore::new();
        store.insert("a", cheap("p"), vec![]).unwrap();
        assert!(matches!(
            store.insert("a", cheap("p"), vec![]),
            Err(AuthError::DuplicateName { .. })
        ));
        assert!(matches!(
            store.insert("has space", cheap("p"), vec![]),
            Err(AuthError::InvalidName { .. })
        ));
        assert!(matches!(
            store.insert("b", cheap("p"), vec![String::new()]),
            Err(AuthError::InvalidRoles { .. })
        ));
    }

    #[test]
    fn entries_read_from_toml_refuse_unknown_fields_and_bad_hashes() {
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct File {
            operators: Vec<CredentialEntry>,
        }
        let h = cheap("pw");
        let text = format!(
            "[[operators]]\nname = \"ops\"\npassword_hash = \"{h}\"\nroles = [\"admin\"]\n"
        );
        let f: File = toml::from_str(&text).unwrap();
        let store = CredentialStore::from_entries(&f.operators).unwrap();
        assert!(store.verify_role("ops", "pw", "admin").is_ok());
        let typo = text.replace("roles", "role");
        assert!(toml::from_str::<File>(&typo)
            .unwrap_err()
            .to_string()
            .contains("unknown field `role`"));
        let bad = text.replace("$argon2id$", "$argon2i$");
        let e = toml::from_str::<File>(&bad).unwrap_err().to_string();
        assert!(e.contains("only argon2id"), "{e}");
    }

    #[test]
    fn http_basic_reads_back_what_it_writes_and_nothing_else() {
        let v = http_basic_value("firm-2", "a:b c");
        assert_eq!(http_basic(&v), Some(("firm-2".into(), "a:b c".into())));
        assert_eq!(http_basic("Bearer abc"), None);
        assert_eq!(http_basic("Basic !!!"), None);
        assert_eq!(
            http_basic(&http_basic_value("", "")),
            Some((String::new(), String::new()))
        );
        assert_eq!(http_basic(&format!("Basic {}", "A".repeat(600))), None);
    }

    #[test]
    fn random_values_differ() {
        assert_ne!(random_u64(), random_u64());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        /// Reading a stored hash never panics, whatever the config holds.
        #[test]
        fn parsing_arbitrary_text_never_panics(s in ".{0,300}") {
            let _ = PasswordHashString::parse(&s);
        }

        #[test]
        fn parsing_mangled_hashes_never_panics(cut in 0usize..80, junk in "[a-zA-Z0-9$=,+/]{0,40}") {
            let h = "$argon2id$v=19$m=8,t=1,p=1$c2FsdHNhbHRzYWx0$3Ykf0b5mzd6jP7zW4y5hQ4wXLv2mQ1d7c8Qz1H4kQ8Y";
            let s = format!("{}{}", &h[..cut.min(h.len())], junk);
            let _ = PasswordHashString::parse(&s);
        }
    }
}
