//! The one backoff ladder every retry in keiro climbs, and the one random source its jitter
//! draws from.
//!
//! Crash backoff (keiro-lease), a remote step's retries (the task table), the remote worker's
//! claim and report retries, and the LISTEN connection's reconnects all wait
//! `initial * 2^(failures - 1)`, capped, optionally jittered: one type keeps their arithmetic
//! and their bounds in one place. Step retry policies ([`StepOptions`](crate::StepOptions))
//! add attempts, a growth factor and a predicate on top, and draw from the same source.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Exponential backoff: the delay after `n` failures is `initial * 2^(n-1)`, capped at `max`;
/// with `jitter` it is scaled by a random factor in `[0.5, 1.0]`, so a fleet that failed
/// together does not retry in lockstep, and a jittered delay is never longer than the plain one.
///
/// ```
/// use std::time::Duration;
/// use keiro_journal::Backoff;
///
/// let ladder = Backoff::exponential(Duration::from_secs(2), Duration::from_secs(64)).without_jitter();
/// let secs: Vec<u64> = (1..=7).map(|n| ladder.delay(n).as_secs()).collect();
/// assert_eq!(secs, [2, 4, 8, 16, 32, 64, 64]);
/// assert!(Backoff::default().delay_random(3) <= Backoff::default().delay(3));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backoff {
    /// The delay after the first failure. Defaults to 1 s.
    pub initial: Duration,
    /// The largest delay. Defaults to 5 min.
    pub max: Duration,
    /// Whether delays are jittered. Defaults to `true`.
    pub jitter: bool,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::exponential(Duration::from_secs(1), Duration::from_secs(300))
    }
}

/// A backoff field out of bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("backoff: {field} {problem}")]
pub struct InvalidBackoff {
    /// The field.
    pub field: &'static str,
    /// The bound it breaks.
    pub problem: &'static str,
}

impl Backoff {
    /// Exponential backoff from `initial`, capped at `max`, jittered.
    pub const fn exponential(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            jitter: true,
        }
    }

    /// The same delays without jitter.
    #[must_use]
    pub const fn without_jitter(self) -> Self {
        Self {
            jitter: false,
            ..self
        }
    }

    /// Checks the bounds: `initial` must be positive and `max` at least `initial`.
    ///
    /// # Errors
    ///
    /// [`InvalidBackoff`] naming the field.
    pub fn validate(&self) -> Result<(), InvalidBackoff> {
        if self.initial.is_zero() {
            return Err(InvalidBackoff {
                field: "initial",
                problem: "must be positive",
            });
        }
        if self.max < self.initial {
            return Err(InvalidBackoff {
                field: "max",
                problem: "must be at least initial",
            });
        }
        Ok(())
    }

    /// The delay after `failures` failed attempts (at least 1), before jitter.
    pub fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.initial
            .checked_mul(1u32 << doublings)
            .map_or(self.max, |d| d.min(self.max))
    }

    /// The delay after `failures` failed attempts with jitter applied, drawing the random
    /// factor from `unit` (a number in `[0, 1]`).
    pub fn jittered_delay(&self, failures: u32, unit: f64) -> Duration {
        let delay = self.delay(failures);
        if self.jitter {
            delay.mul_f64(0.5 + unit.clamp(0.0, 1.0) * 0.5)
        } else {
            delay
        }
    }

    /// The delay after `failures` failed attempts, jittered from a fresh random draw.
    pub fn delay_random(&self, failures: u32) -> Duration {
        self.jittered_delay(failures, unit_random())
    }
}

/// A uniform draw in `[0, 1)`: the one random source of keiro's jitter. Not for secrets
/// (tokens use UUIDs from the operating system's generator).
pub fn unit_random() -> f64 {
    fastrand::f64()
}

/// `interval` stretched by a random 0–20%. One-sided, so a loop sleeping this between polls
/// never polls more often than once per `interval`, while a fleet started together spreads out.
pub fn stretched(interval: Duration) -> Duration {
    interval.mul_f64(1.0 + 0.2 * unit_random())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_its_cap() {
        let b = Backoff::exponential(Duration::from_millis(100), Duration::from_millis(500))
            .without_jitter();
        let delays: Vec<_> = (1..=5).map(|n| b.delay(n).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 500, 500]);
        assert_eq!(b.delay(200), Duration::from_millis(500));
        assert_eq!(b.delay(0), Duration::from_millis(100));
    }

    #[test]
    fn jitter_stays_within_half_and_full_delay() {
        let b = Backoff::exponential(Duration::from_millis(100), Duration::from_secs(1));
        assert_eq!(b.jittered_delay(1, 0.0), Duration::from_millis(50));
        assert_eq!(b.jittered_delay(1, 1.0), Duration::from_millis(100));
        for _ in 0..1000 {
            let d = b.delay_random(2);
            assert!(d >= Duration::from_millis(100) && d <= Duration::from_millis(200));
        }
    }

    #[test]
    fn validate_names_the_field() {
        let zero = Backoff::exponential(Duration::ZERO, Duration::from_secs(1));
        assert_eq!(zero.validate().unwrap_err().field, "initial");
        let inverted = Backoff::exponential(Duration::from_secs(2), Duration::from_secs(1));
        assert_eq!(inverted.validate().unwrap_err().field, "max");
        assert!(Backoff::default().validate().is_ok());
    }

    #[test]
    fn stretch_is_one_sided_and_bounded() {
        let base = Duration::from_millis(1000);
        for _ in 0..1000 {
            let d = stretched(base);
            assert!(d >= base && d <= Duration::from_millis(1200));
        }
    }
}
