//! The crash backoff policy: a pure function from the attempts already made to the delay
//! before the next one.

use std::time::Duration;

/// The default base of the exponential ladder.
pub const BACKOFF_BASE_DEFAULT: Duration = Duration::from_secs(1);
/// The default longest delay.
pub const BACKOFF_CAP_DEFAULT: Duration = Duration::from_secs(64);
/// The default jitter fraction (none, as in the seed).
pub const BACKOFF_JITTER_DEFAULT: f64 = 0.0;
/// The default crash ceiling: at this many attempts the run is failed.
pub const MAX_ATTEMPTS_DEFAULT: i32 = 5;

/// How long a crashed run waits before it may be claimed again.
///
/// The delay after a crash with `attempts` earlier crashes is
/// `min(base * 2^(attempts + 1), cap)`, spread by up to ± `jitter` of itself. With the
/// defaults that is the seed's ladder 2, 4, 8, 16, 32, 64, 64 … seconds.
///
/// ```
/// use std::time::Duration;
/// use keiro_lease::BackoffPolicy;
/// let policy = BackoffPolicy::default();
/// assert_eq!(policy.delay(0), Duration::from_secs(2));
/// assert_eq!(policy.delay(4), Duration::from_secs(32));
/// assert_eq!(policy.delay(9), Duration::from_secs(64));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackoffPolicy {
    /// The ladder's unit. Defaults to [`BACKOFF_BASE_DEFAULT`].
    pub base: Duration,
    /// The longest delay. Defaults to [`BACKOFF_CAP_DEFAULT`].
    pub cap: Duration,
    /// A fraction in `[0, 1]`: each delay is spread uniformly by up to this share of itself, so
    /// a fleet that crashed together does not retry together. Defaults to [`BACKOFF_JITTER_DEFAULT`].
    pub jitter: f64,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self {
            base: BACKOFF_BASE_DEFAULT,
            cap: BACKOFF_CAP_DEFAULT,
            jitter: BACKOFF_JITTER_DEFAULT,
        }
    }
}

/// A backoff policy field out of bounds.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("backoff policy: {field} {problem}")]
pub struct InvalidPolicy {
    /// The field.
    pub field: &'static str,
    /// The bound it breaks.
    pub problem: &'static str,
}

impl BackoffPolicy {
    /// Checks the fields' bounds.
    ///
    /// # Errors
    ///
    /// [`InvalidPolicy`] naming the field: `base` must be positive, `cap` at least `base`,
    /// `jitter` within `[0, 1]`.
    pub fn validate(&self) -> Result<(), InvalidPolicy> {
        if self.base.is_zero() {
            return Err(InvalidPolicy {
                field: "base",
                problem: "must be positive",
            });
        }
        if self.cap < self.base {
            return Err(InvalidPolicy {
                field: "cap",
                problem: "must be at least base",
            });
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(InvalidPolicy {
                field: "jitter",
                problem: "must be within [0, 1]",
            });
        }
        Ok(())
    }

    /// The delay after a crash with `attempts` earlier crashes, without jitter.
    pub fn delay(&self, attempts: i32) -> Duration {
        let exponent = u32::try_from(attempts.saturating_add(1))
            .unwrap_or(0)
            .min(32);
        self.base
            .checked_mul(1u32 << exponent.min(31))
            .unwrap_or(self.cap)
            .min(self.cap)
    }

    /// The delay with jitter applied from `sample`, a uniform draw in `[0, 1)`.
    pub fn delay_jittered(&self, attempts: i32, sample: f64) -> Duration {
        let delay = self.delay(attempts);
        if self.jitter == 0.0 {
            return delay;
        }
        let spread = (sample.clamp(0.0, 1.0) * 2.0 - 1.0) * self.jitter;
        delay.mul_f64((1.0 + spread).max(0.0))
    }

    /// The delay with jitter from a fresh random draw.
    pub fn delay_random(&self, attempts: i32) -> Duration {
        // A v4 UUID carries 122 random bits; 53 of them make a uniform f64 in [0, 1).
        let bits = uuid::Uuid::new_v4().as_u128() >> 75;
        #[allow(clippy::cast_precision_loss)] // 53 bits fit an f64 mantissa exactly
        let sample = bits as f64 / (1u64 << 53) as f64;
        self.delay_jittered(attempts, sample)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ladder_matches_the_seed() {
        let p = BackoffPolicy::default();
        let secs: Vec<u64> = (0..8).map(|a| p.delay(a).as_secs()).collect();
        assert_eq!(secs, [2, 4, 8, 16, 32, 64, 64, 64]);
        assert_eq!(p.delay(i32::MAX), Duration::from_secs(64));
        assert_eq!(p.delay(-5), Duration::from_secs(1));
    }

    #[test]
    fn jitter_stays_within_its_fraction() {
        let p = BackoffPolicy {
            jitter: 0.5,
            ..BackoffPolicy::default()
        };
        assert_eq!(p.delay_jittered(0, 0.0), Duration::from_secs(1));
        assert_eq!(p.delay_jittered(0, 1.0), Duration::from_secs(3));
        for _ in 0..100 {
            let d = p.delay_random(2);
            assert!(d >= Duration::from_secs(4) && d <= Duration::from_secs(12));
        }
    }

    #[test]
    fn validate_names_the_field() {
        let bad = BackoffPolicy {
            jitter: 2.0,
            ..BackoffPolicy::default()
        };
        assert_eq!(bad.validate().unwrap_err().field, "jitter");
        let bad = BackoffPolicy {
            cap: Duration::from_millis(1),
            ..BackoffPolicy::default()
        };
        assert_eq!(bad.validate().unwrap_err().field, "cap");
    }
}
