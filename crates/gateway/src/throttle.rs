//! Per-session throttle: a token bucket refilled continuously at the configured rate, holding
//! at most one second's worth, so a session may burst to its rate and no further.

/// Counts in thousandths of a message so that refill is exact at any rate in whole ms.
const MILLI: u64 = 1_000;

#[derive(Clone, Debug)]
pub struct Throttle {
    msgs_per_s: u32,
    tokens_milli: u64,
    last_ms: u64,
}

impl Throttle {
    pub fn new(msgs_per_s: u32) -> Throttle {
        assert!(msgs_per_s > 0);
        Throttle {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_may_burst_to_its_rate_and_then_waits_for_refill() {
        let mut t = Throttle::new(10);
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
        let mut t = Throttle::new(5);
        let mut ok = 0;
        for _ in 0..100 {
            if t.take(1_000_000).is_ok() {
                ok += 1;
            }
        }
        assert_eq!(ok, 5);
    }
}
