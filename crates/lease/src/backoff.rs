//! Crash backoff: how long a crashed run waits before it may be claimed again, on the shared
//! ladder of [`Backoff`].

use std::time::Duration;

use keiro_journal::Backoff;

/// The default crash backoff: the seed's ladder 2, 4, 8, 16, 32, 64, 64 … seconds, without
/// jitter (as in the seed).
///
/// ```
/// use std::time::Duration;
/// use keiro_lease::{crash_delay, CRASH_BACKOFF_DEFAULT};
/// assert_eq!(crash_delay(&CRASH_BACKOFF_DEFAULT, 0), Duration::from_secs(2));
/// assert_eq!(crash_delay(&CRASH_BACKOFF_DEFAULT, 4), Duration::from_secs(32));
/// assert_eq!(crash_delay(&CRASH_BACKOFF_DEFAULT, 9), Duration::from_secs(64));
/// ```
pub const CRASH_BACKOFF_DEFAULT: Backoff =
    Backoff::exponential(Duration::from_secs(2), Duration::from_secs(64)).without_jitter();

/// The default crash ceiling: at this many attempts the run is failed.
pub const MAX_ATTEMPTS_DEFAULT: i32 = 5;

/// The wait after a crash of a run that had crashed `attempts` times before: the ladder's rung
/// `attempts + 1`, jittered when the backoff says so.
pub fn crash_delay(backoff: &Backoff, attempts: i32) -> Duration {
    let failures = u32::try_from(attempts.saturating_add(1)).unwrap_or(1);
    backoff.delay_random(failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ladder_matches_the_seed() {
        let secs: Vec<u64> = (0..8)
            .map(|a| crash_delay(&CRASH_BACKOFF_DEFAULT, a).as_secs())
            .collect();
        assert_eq!(secs, [2, 4, 8, 16, 32, 64, 64, 64]);
        assert_eq!(
            crash_delay(&CRASH_BACKOFF_DEFAULT, i32::MAX),
            Duration::from_secs(64)
        );
        assert_eq!(
            crash_delay(&CRASH_BACKOFF_DEFAULT, -5),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn jitter_only_shortens() {
        let jittered = Backoff {
            jitter: true,
            ..CRASH_BACKOFF_DEFAULT
        };
        for _ in 0..100 {
            let d = crash_delay(&jittered, 0);
            assert!(d >= Duration::from_secs(1) && d <= Duration::from_secs(2));
        }
    }
}
