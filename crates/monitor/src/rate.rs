//! The one token bucket of the project: refilled continuously at the configured rate, holding
//! at most one second's worth, so a client may burst to its rate and no further. The gateway
//! throttles each trading session with it; the delivery fronts limit each connection's polls.
//! It reads no clock: the caller passes the time.

/// Counts in thousandths of a message so that refill is exact at any rate in whole ms.
const MILLI: u64 = 1_000;

#[derive(Clone, Debug)]
pub struct TokenBucket {
    msgs_per_s: u32,
    tokens_milli: u64,
    last_ms: u64,
}

impl TokenBucket {
    pub fn new(msgs_per_s: u32) -> TokenBucket {
        assert!(msgs_per_s > 0);
        TokenBucket {
            msgs_per_s,
            tokens_milli: u64::from(msgs_per_s) * MILLI,
            last_ms: 0,
        }
    }

    pub fn msgs_per_s(&self) -> u32 {
        self.msgs_per_s
    }

    /// Takes one token at `now_ms`. Err carries the milliseconds until one is available.
    pub fn take(&mut self, now_ms: u64) -> Result<(), u32> {
        let capacity = u64::from(self.msgs_per_s) * MILLI;
        let elapsed_ms = now_ms.saturating_sub(self.last_ms);
        self.last_ms = self.last_ms.max(now_ms);
        // tokens per ms = rate / 1000, so in milli-tokens: elapsed * rate.
        let refill = elapsed_ms.saturating_mul(u64::from(self.msgs_per_s));
        self.tokens_milli = self.tokens_milli.saturating_add(refill).min(capacity);
        if self.tokens_milli >= MILLI {
            self.tokens_milli -= MILLI;
            Ok(())
        } else {
            let missing = MILLI - self.tokens_milli;
            let wait_ms = missing.div_ceil(u64::from(self.msgs_per_s)).max(1);
            Err(u32::try_from(wait_ms).unwrap_or(u32::MAX))
        }
    }
}

/// One connection's [`TokenBucket`] of requests, with the clock it reads: an HTTP server puts
/// one in each request's extensions (see `server::serve_with_slots`), so that a handler can
/// refuse a connection that asks too often without holding back any other. Cloning shares it.
#[derive(Clone, Debug)]
pub struct ConnectionRate {
    inner: std::sync::Arc<std::sync::Mutex<TokenBucket>>,
    opened: std::time::Instant,
}

impl ConnectionRate {
    pub fn new(requests_per_s: u32) -> ConnectionRate {
        ConnectionRate {
            inner: std::sync::Arc::new(std::sync::Mutex::new(TokenBucket::new(requests_per_s))),
            opened: std::time::Instant::now(),
        }
    }

    /// Takes one request's token now; Err carries the milliseconds until one is available.
    pub fn take(&self) -> Result<(), u32> {
        let now_ms = self.opened.elapsed().as_millis() as u64;
        self.inner.lock().expect("rate lock").take(now_ms)
    }

    pub fn requests_per_s(&self) -> u32 {
        self.inner.lock().expect("rate lock").msgs_per_s()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_may_burst_to_its_rate_and_then_waits_for_refill() {
        let mut t = TokenBucket::new(10);
        for _ in 0..10 {
            assert!(t.take(1_000).is_ok());
        }
        let wait = t.take(1_000).unwrap_err();
        assert_eq!(wait, 100);
        assert!(t.take(1_100).is_ok());
        assert!(t.take(1_100).is_err());
    }

    #[test]
    fn refill_never_exceeds_one_second_of_messages() {
        let mut t = TokenBucket::new(5);
        let mut ok = 0;
        for _ in 0..100 {
            if t.take(1_000_000).is_ok() {
                ok += 1;
            }
        }
        assert_eq!(ok, 5);
    }
}
