//! [`VerifiedCache`]: the results of credential checks, remembered for a while, so that a
//! server that sees the same credentials on every request (HTTP Basic on each poll) or on
//! every reconnection spends one Argon2 check on them, not one per request.
//!
//! Entries are keyed by a keyed BLAKE2b hash of the name and the password under a key drawn
//! at random when the cache is made: the cache holds no password and no hash anyone could
//! test guesses against offline, and two different credentials never share an entry in
//! practice (256-bit keys). It holds at most `capacity` entries, each for `ttl`; when full,
//! expired entries go first, then the one closest to expiring. A denial may be remembered
//! too (the caller decides), which makes a client retrying a wrong password cheap to refuse
//! but never lets a right one in: its key differs.

use blake2::digest::{KeyInit, Mac};
use blake2::Blake2bMac512;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A cache of credential check results (see the module's overview).
pub struct VerifiedCache<T> {
    key: [u8; 64],
    capacity: usize,
    ttl: Duration,
    entries: Mutex<HashMap<[u8; 32], (T, Instant)>>,
}

impl<T: Clone> VerifiedCache<T> {
    /// A cache of at most `capacity` entries (at least 1), each kept for `ttl`.
    pub fn new(capacity: usize, ttl: Duration) -> VerifiedCache<T> {
        let mut key = [0u8; 64];
        crate::random_bytes(&mut key);
        VerifiedCache {
            key,
            capacity: capacity.max(1),
            ttl,
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn key_of(&self, name: &str, password: &str) -> [u8; 32] {
        let mut mac = <Blake2bMac512 as KeyInit>::new_from_slice(&self.key)
            .expect("a 64-byte key suits BLAKE2b");
        // Lengths first, so that ("ab", "c") and ("a", "bc") differ.
        mac.update(&(name.len() as u64).to_le_bytes());
        mac.update(name.as_bytes());
        mac.update(&(password.len() as u64).to_le_bytes());
        mac.update(password.as_bytes());
        let full = mac.finalize().into_bytes();
        let mut out = [0u8; 32];
        out.copy_from_slice(&full[..32]);
        out
    }

    /// What the check of these credentials gave, if it was remembered less than `ttl` ago.
    pub fn get(&self, name: &str, password: &str) -> Option<T> {
        self.get_at(name, password, Instant::now())
    }

    /// [`VerifiedCache::get`] at time `now`.
    pub fn get_at(&self, name: &str, password: &str, now: Instant) -> Option<T> {
        let key = self.key_of(name, password);
        let mut entries = self.entries.lock().expect("cache");
        match entries.get(&key) {
            Some((value, expires)) if *expires > now => Some(value.clone()),
            Some(_) => {
                entries.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Remembers what the check of these credentials gave, for `ttl` from now.
    pub fn insert(&self, name: &str, password: &str, value: T) {
        self.insert_at(name, password, value, Instant::now())
    }

    /// [`VerifiedCache::insert`] at time `now`.
    pub fn insert_at(&self, name: &str, password: &str, value: T, now: Instant) {
        let key = self.key_of(name, password);
        let mut entries = self.entries.lock().expect("cache");
        if entries.len() >= self.capacity && !entries.contains_key(&key) {
            entries.retain(|_, (_, expires)| *expires > now);
            if entries.len() >= self.capacity {
                let soonest = entries
                    .iter()
                    .min_by_key(|(_, (_, expires))| *expires)
                    .map(|(k, _)| *k);
                if let Some(k) = soonest {
                    entries.remove(&k);
                }
            }
        }
        entries.insert(key, (value, now + self.ttl));
    }

    /// Forgets everything (credentials changed).
    pub fn clear(&self) {
        self.entries.lock().expect("cache").clear();
    }

    pub fn len(&self) -> usize {
        self.entries.lock().expect("cache").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_is_found_under_its_credentials_only_and_until_it_expires() {
        let cache = VerifiedCache::new(8, Duration::from_secs(60));
        let t0 = Instant::now();
        cache.insert_at("alice", "pw", 7u32, t0);
        assert_eq!(cache.get_at("alice", "pw", t0), Some(7));
        assert_eq!(cache.get_at("alice", "pW", t0), None);
        assert_eq!(cache.get_at("alicep", "w", t0), None);
        assert_eq!(cache.get_at("bob", "pw", t0), None);
        assert_eq!(
            cache.get_at("alice", "pw", t0 + Duration::from_secs(59)),
            Some(7)
        );
        assert_eq!(
            cache.get_at("alice", "pw", t0 + Duration::from_secs(60)),
            None
        );
        assert!(cache.is_empty(), "an expired entry found is dropped");
    }

    #[test]
    fn a_full_cache_drops_expired_entries_then_the_oldest() {
        let cache = VerifiedCache::new(2, Duration::from_secs(10));
        let t0 = Instant::now();
        cache.insert_at("a", "1", 1u8, t0);
        cache.insert_at("b", "2", 2, t0 + Duration::from_secs(1));
        cache.insert_at("c", "3", 3, t0 + Duration::from_secs(2));
        assert_eq!(cache.len(), 2);
        let now = t0 + Duration::from_secs(2);
        assert_eq!(cache.get_at("a", "1", now), None);
        assert_eq!(cache.get_at("b", "2", now), Some(2));
        assert_eq!(cache.get_at("c", "3", now), Some(3));
        // Both expired by now: the insert clears them.
        cache.insert_at("d", "4", 4, t0 + Duration::from_secs(30));
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn two_caches_key_the_same_credentials_differently() {
        let a = VerifiedCache::<u8>::new(1, Duration::from_secs(1));
        let b = VerifiedCache::<u8>::new(1, Duration::from_secs(1));
        assert_ne!(a.key_of("n", "p"), b.key_of("n", "p"));
        assert_eq!(a.key_of("n", "p"), a.key_of("n", "p"));
    }
}
