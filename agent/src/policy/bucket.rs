//! Node-wide token bucket on patches. Pure: time comes in as seconds.

/// Allows `burst` patches at once and `rate_per_s` on average.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenBucket {
    rate_per_s: f64,
    burst: f64,
    tokens: f64,
    last_s: Option<f64>,
}

impl TokenBucket {
    /// A full bucket. Non-finite or negative inputs are treated as 0
    /// (a zero-rate bucket only ever spends its initial burst).
    pub fn new(rate_per_s: f64, burst: u32) -> Self {
        let rate = if rate_per_s.is_finite() && rate_per_s > 0.0 {
            rate_per_s
        } else {
            0.0
        };
        Self {
            rate_per_s: rate,
            burst: f64::from(burst),
            tokens: f64::from(burst),
            last_s: None,
        }
    }

    /// From [`super::PolicyConfig`]'s `patch_rate_per_s` and `patch_burst`.
    pub fn from_config(cfg: &super::PolicyConfig) -> Self {
        Self::new(cfg.patch_rate_per_s, cfg.patch_burst)
    }

    fn refill(&mut self, now_s: f64) {
        if !now_s.is_finite() {
            return;
        }
        if let Some(last) = self.last_s {
            // A clock that steps back adds nothing.
            let dt = (now_s - last).max(0.0);
            self.tokens = (self.tokens + dt * self.rate_per_s).min(self.burst);
        }
        self.last_s = Some(self.last_s.map_or(now_s, |l| l.max(now_s)));
    }

    /// Takes one token if there is one.
    pub fn try_take(&mut self, now_s: f64) -> bool {
        self.refill(now_s);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Whole tokens available at `now_s` (refills, takes nothing).
    pub fn available(&mut self, now_s: f64) -> u32 {
        self.refill(now_s);
        self.tokens.floor() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_empty() {
        let mut b = TokenBucket::new(5.0, 3);
        assert!(b.try_take(0.0));
        assert!(b.try_take(0.0));
        assert!(b.try_take(0.0));
        assert!(!b.try_take(0.0));
    }

    #[test]
    fn refills_at_rate_up_to_burst() {
        let mut b = TokenBucket::new(5.0, 10);
        for _ in 0..10 {
            assert!(b.try_take(0.0));
        }
        assert!(!b.try_take(0.1));
        // 0.4 s later: 2 tokens (5/s).
        assert!(b.try_take(0.4));
        assert!(b.try_take(0.4));
        assert!(!b.try_take(0.4));
        // A long pause refills to the burst only.
        assert_eq!(b.available(1000.0), 10);
    }

    #[test]
    fn clock_stepping_back_adds_nothing() {
        let mut b = TokenBucket::new(1.0, 1);
        assert!(b.try_take(100.0));
        assert!(!b.try_take(50.0));
        assert!(!b.try_take(100.5));
        assert!(b.try_take(101.0));
    }

    #[test]
    fn zero_rate_spends_only_the_burst() {
        let mut b = TokenBucket::new(f64::NAN, 1);
        assert!(b.try_take(0.0));
        assert!(!b.try_take(1e9));
    }
}
