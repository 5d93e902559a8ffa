//! The retry policy of a step run with [`Ctx::step_with`](crate::Ctx::step_with), and how
//! its attempts are named in the journal.
//!
//! Every failed attempt is journaled under `attempt:<step>:<n>` (kind `attempt`), so a crash in
//! the middle of the retries does not reset the budget: the next drive counts the attempts
//! already made and goes on from there. When the budget is spent (or the policy refuses to
//! retry an error) the final failure is journaled under `attempt:<step>:failed`, and the body
//! gets [`WorkflowError::StepFailed`], on this drive and on every replay, without the action
//! running again. Attempt records are wake-source-like bookkeeping for divergence detection,
//! except the final failure, which the body acts on and so counts like a recorded step.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::WorkflowError;

/// The default number of attempts of a step run with [`Ctx::step_with`](crate::Ctx::step_with).
pub const STEP_ATTEMPTS_DEFAULT: u32 = 3;

/// A predicate over an action's error: `true` retries it.
type RetryIf = Arc<dyn Fn(&dyn Any) -> bool + Send + Sync>;

/// How a step's action is retried in place (see [`Ctx::step_with`](crate::Ctx::step_with)).
///
/// The wait before attempt `n + 1` is `initial_interval * backoff_factor^(n-1)`, capped at
/// `max_interval`, then scaled by a random factor in `[1 - jitter, 1]`.
///
/// ```
/// use std::time::Duration;
/// use keiro_journal::StepOptions;
/// let options = StepOptions::new(5)
///     .initial_interval(Duration::from_millis(200))
///     .backoff_factor(3.0)
///     .max_interval(Duration::from_secs(10))
///     .retry_if(|e: &std::io::Error| e.kind() != std::io::ErrorKind::PermissionDenied);
/// assert_eq!(options.max_attempts, 5);
/// ```
#[derive(Clone)]
pub struct StepOptions {
    /// Attempts in all, the first included (at least 1). Defaults to
    /// [`STEP_ATTEMPTS_DEFAULT`].
    pub max_attempts: u32,
    /// The wait after the first failure. Defaults to 1 s.
    pub initial_interval: Duration,
    /// How much each wait grows over the previous one. Defaults to 2.
    pub backoff_factor: f64,
    /// The longest wait. Defaults to 60 s.
    pub max_interval: Duration,
    /// The fraction of each wait drawn at random (0: none; 1: anywhere in `[0, wait]`), so
    /// many failing runs do not retry in lockstep. Defaults to 0.5.
    pub jitter: f64,
    retry_if: Option<RetryIf>,
}

impl std::fmt::Debug for StepOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepOptions")
            .field("max_attempts", &self.max_attempts)
            .field("initial_interval", &self.initial_interval)
            .field("backoff_factor", &self.backoff_factor)
            .field("max_interval", &self.max_interval)
            .field("jitter", &self.jitter)
            .field("retry_if", &self.retry_if.is_some())
            .finish()
    }
}

impl Default for StepOptions {
    fn default() -> Self {
        Self::new(STEP_ATTEMPTS_DEFAULT)
    }
}

impl StepOptions {
    /// `max_attempts` attempts in all, with the default waits between them.
    pub fn new(max_attempts: u32) -> Self {
        Self {
            max_attempts: max_attempts.max(1),
            initial_interval: Duration::from_secs(1),
            backoff_factor: 2.0,
            max_interval: Duration::from_secs(60),
            jitter: 0.5,
            retry_if: None,
        }
    }

    /// Sets the wait after the first failure.
    #[must_use]
    pub fn initial_interval(mut self, interval: Duration) -> Self {
        self.initial_interval = interval;
        self
    }

    /// Sets how much each wait grows over the previous one (at least 1).
    #[must_use]
    pub fn backoff_factor(mut self, factor: f64) -> Self {
        self.backoff_factor = factor;
        self
    }

    /// Sets the longest wait.
    #[must_use]
    pub fn max_interval(mut self, interval: Duration) -> Self {
        self.max_interval = interval;
        self
    }

    /// Sets the random fraction of each wait (clamped to `[0, 1]`).
    #[must_use]
    pub fn jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// Retries only the errors for which `retry` returns `true`; any other error fails the
    /// step at once. `E` is the action's error type; errors of another type are retried.
    #[must_use]
    pub fn retry_if<E: 'static>(
        mut self,
        retry: impl Fn(&E) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.retry_if = Some(Arc::new(move |error: &dyn Any| {
            error.downcast_ref::<E>().is_none_or(&retry)
        }));
        self
    }

    /// The wait after `failures` failed attempts (at least 1), before jitter.
    pub fn interval(&self, failures: u32) -> Duration {
        let exponent = i32::try_from(failures.saturating_sub(1)).unwrap_or(i32::MAX);
        let factor = self.backoff_factor.max(1.0).powi(exponent);
        let max = self.max_interval.as_secs_f64();
        Duration::from_secs_f64((self.initial_interval.as_secs_f64() * factor).min(max))
    }

    pub(crate) fn jittered_interval(&self, failures: u32) -> Duration {
        let unit = crate::unit_random();
        let jitter = self.jitter.clamp(0.0, 1.0);
        self.interval(failures).mul_f64(1.0 - jitter * unit)
    }

    pub(crate) fn retries(&self, error: &dyn Any) -> bool {
        self.retry_if.as_ref().is_none_or(|retry| retry(error))
    }
}

/// How one attempt of a step with a retry policy ended, when the run goes on.
pub(crate) enum Attempt {
    /// The result, journaled.
    Succeeded(Value),
    /// The action failed; `retry` is the policy's verdict on its error.
    Failed { message: String, retry: bool },
}

/// The body's error for a journaled final failure of `step`.
pub(crate) fn step_failed(step: &str, failure: &Value) -> WorkflowError {
    WorkflowError::StepFailed {
        step: step.to_owned(),
        attempts: failure
            .get("attempt")
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0),
        message: failure
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
    }
}
