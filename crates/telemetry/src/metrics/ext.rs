//! [`MetricsExt`]: recording through an optional [`Metrics`] handle, so a component holding
//! `Option<Metrics>` calls the recorders directly and pays one branch when metrics are off.

use std::time::Duration;

use super::{ActiveRun, Metrics};

/// Recording through an optional [`Metrics`] handle.
///
/// Components are configured with `Option<Metrics>`, and this trait lets them call the
/// recorders on the option directly: with `None` each call is one branch and returns, before any
/// attribute is built or any workflow name copied. With `Some` it forwards to the method of the
/// same name on [`Metrics`], which documents the instrument it records.
///
/// Implemented for [`Metrics`], `Option<Metrics>` (so `&Option<Metrics>`, the usual type of a
/// config field, works by auto-reference) and `Option<&Metrics>`. Implement
/// [`as_metrics`](MetricsExt::as_metrics) to record through a type of your own.
///
/// ```
/// use keiro_telemetry::{Metrics, MetricsExt as _};
///
/// struct Worker {
///     metrics: Option<Metrics>,
/// }
///
/// impl Worker {
///     fn after_pass(&self, failed: &[&str]) {
///         for workflow in failed {
///             self.metrics.failed(workflow);
///         }
///         self.metrics.as_ref().timer_backlog(0);
///     }
/// }
///
/// Worker { metrics: None }.after_pass(&["checkout"]);
/// Worker { metrics: Some(Metrics::global()) }.after_pass(&["checkout"]);
/// ```
pub trait MetricsExt {
    /// The handle to record through, or `None` to record nothing.
    ///
    /// ```
    /// use keiro_telemetry::{Metrics, MetricsExt};
    ///
    /// let metrics: Option<Metrics> = None;
    /// assert!(metrics.as_metrics().is_none());
    /// ```
    fn as_metrics(&self) -> Option<&Metrics>;

    /// [`Metrics::step_executed`] when enabled.
    ///
    /// ```
    /// # use keiro_telemetry::{Metrics, MetricsExt as _};
    /// let metrics: Option<Metrics> = None;
    /// metrics.step_executed("checkout", 1);
    /// ```
    #[inline]
    fn step_executed(&self, workflow: &str, n: u64) {
        if let Some(metrics) = self.as_metrics() {
            metrics.step_executed(workflow, n);
        }
    }

    /// [`Metrics::step_replayed`] when enabled.
    ///
    /// ```
    /// # use keiro_telemetry::{Metrics, MetricsExt as _};
    /// let metrics: Option<Metrics> = None;
    /// metrics.step_replayed("checkout", 3);
    /// ```
    #[inline]
    fn step_replayed(&self, workflow: &str, n: u64) {
        if let Some(metrics) = self.as_metrics() {
            metrics.step_replayed(workflow, n);
        }
    }

    /// [`Metrics::resumed`] when enabled.
    ///
    /// ```
    /// # use keiro_telemetry::{Metrics, MetricsExt as _};
    /// let metrics: Option<Metrics> = None;
    /// metrics.resumed("checkout");
    /// ```
    #[inline]
    fn resumed(&self, workflow: &str) {
        if let Some(metrics) = self.as_metrics() {
            metrics.resumed(workflow);
        }
    }

    /// [`Metrics::failed`] when enabled.
    ///
    /// ```
    /// # use keiro_telemetry::{Metrics, MetricsExt as _};
    /// let metrics: Option<Metrics> = None;
    /// metrics.failed("checkout");
    /// ```
    #[inline]
    fn failed(&self, workflow: &str) {
        if let Some(metrics) = self.as_metrics() {
            metrics.failed(workflow);
        }
    }

    /// [`Metrics::resume_error`] when enabled.
    ///
    /// ```
    /// # use keiro_telemetry::{Metrics, MetricsExt as _};
    /// let metrics: Option<Metrics> = None;
    /// metrics.resume_error("connection");
    /// ```
    #[inline]
    fn resume_error(&self, kind: &'static str) {
        if let Some(metrics) = self.as_metrics() {
            metrics.resume_error(kind);
        }
    }

    /// [`Metrics::lease_skipped`] when enabled.
    ///
    /// ```
    /// # use keiro_telemetry::{Metrics, MetricsExt as _};
    /// let metrics: Option<Metrics> = None;
    /// metrics.lease_skipped("checkout");
    /// ```
    #[inline]
    fn lease_skipped(&self, workflow: &str) {
        if let Some(metrics) = self.as_metrics() {
            metrics.lease_skipped(workflow);
        }
    }

    /// [`Metrics::run_started`] when enabled.
    ///
    /// ```
    /// # use keiro_telemetry::{Metrics, MetricsExt as _};
    /// let metrics: Option<Metrics> = None;
    /// metrics.run_started("checkout");
    /// ```
    #[inline]
    fn run_started(&self, workflow: &str) {
        if let Some(metrics) = self.as_metrics() {
            metrics.run_started(workflow);
        }
    }

    /// [`Metrics::run_finished`] when enabled.
    ///
    /// ```
    /// # use keiro_telemetry::{Metrics, MetricsExt as _};
    /// let metrics: Option<Metrics> = None;
    /// metrics.run_finished("checkout");
    /// ```
    #[inline]
    fn run_finished(&self, workflow: &str) {
        if let Some(metrics) = self.as_metrics() {
            metrics.run_finished(workflow);
        }
    }

    /// [`Metrics::run_scope`] when enabled; `None` otherwise, which is equally fine to hold
    /// for the length of the run.
    ///
    /// ```
    /// # use keiro_telemetry::{Metrics, MetricsExt as _};
    /// let metrics: Option<Metrics> = None;
    /// let _active = metrics.run_scope("checkout");
    /// ```
    #[inline]
    fn run_scope(&self, workflow: &str) -> Option<ActiveRun> {
        self.as_metrics().map(|metrics| metrics.run_scope(workflow))
    }

    /// [`Metrics::journal_length`] when enabled.
    ///
    /// ```
    /// # use keiro_telemetry::{Metrics, MetricsExt as _};
    /// let metrics: Option<Metrics> = None;
    /// metrics.journal_length("checkout", 12);
    /// ```
    #[inline]
    fn journal_length(&self, workflow: &str, len: u64) {
        if let Some(metrics) = self.as_metrics() {
            metrics.journal_length(workflow, len);
        }
    }

    /// [`Metrics::awakeables_pending`] when enabled.
    ///
    /// ```
    /// # use keiro_telemetry::{Metrics, MetricsExt as _};
    /// let metrics: Option<Metrics> = None;
    /// metrics.awakeables_pending(4);
    /// ```
    #[inline]
    fn awakeables_pending(&self, n: u64) {
        if let Some(metrics) = self.as_metrics() {
            metrics.awakeables_pending(n);
        }
    }

    /// [`Metrics::timer_backlog`] when enabled.
    ///
    /// ```
    /// # use keiro_telemetry::{Metrics, MetricsExt as _};
    /// let metrics: Option<Metrics> = None;
    /// metrics.timer_backlog(0);
    /// ```
    #[inline]
    fn timer_backlog(&self, n: u64) {
        if let Some(metrics) = self.as_metrics() {
            metrics.timer_backlog(n);
        }
    }

    /// [`Metrics::timer_fire_lag`] when enabled.
    ///
    /// ```
    /// # use keiro_telemetry::{Metrics, MetricsExt as _};
    /// # use std::time::Duration;
    /// let metrics: Option<Metrics> = None;
    /// metrics.timer_fire_lag(Duration::from_millis(120));
    /// ```
    #[inline]
    fn timer_fire_lag(&self, lag: Duration) {
        if let Some(metrics) = self.as_metrics() {
            metrics.timer_fire_lag(lag);
        }
    }

    /// [`Metrics::remote_dispatched`] when enabled.
    ///
    /// ```
    /// # use keiro_telemetry::{Metrics, MetricsExt as _};
    /// let metrics: Option<Metrics> = None;
    /// metrics.remote_dispatched("print-label");
    /// ```
    #[inline]
    fn remote_dispatched(&self, group: &str) {
        if let Some(metrics) = self.as_metrics() {
            metrics.remote_dispatched(group);
        }
    }

    /// [`Metrics::remote_redispatched`] when enabled.
    ///
    /// ```
    /// # use keiro_telemetry::{Metrics, MetricsExt as _};
    /// let metrics: Option<Metrics> = None;
    /// metrics.remote_redispatched("print-label");
    /// ```
    #[inline]
    fn remote_redispatched(&self, group: &str) {
        if let Some(metrics) = self.as_metrics() {
            metrics.remote_redispatched(group);
        }
    }

    /// [`Metrics::remote_lost`] when enabled.
    ///
    /// ```
    /// # use keiro_telemetry::{Metrics, MetricsExt as _};
    /// let metrics: Option<Metrics> = None;
    /// metrics.remote_lost("print-label");
    /// ```
    #[inline]
    fn remote_lost(&self, group: &str) {
        if let Some(metrics) = self.as_metrics() {
            metrics.remote_lost(group);
        }
    }

    /// [`Metrics::queue_depth`] when enabled.
    ///
    /// ```
    /// # use keiro_telemetry::{Metrics, MetricsExt as _};
    /// let metrics: Option<Metrics> = None;
    /// metrics.queue_depth("llm", 12, 4);
    /// ```
    #[inline]
    fn queue_depth(&self, queue: &str, waiting: u64, running: u64) {
        if let Some(metrics) = self.as_metrics() {
            metrics.queue_depth(queue, waiting, running);
        }
    }

    /// [`Metrics::queue_admitted`] when enabled.
    ///
    /// ```
    /// # use keiro_telemetry::{Metrics, MetricsExt as _};
    /// let metrics: Option<Metrics> = None;
    /// metrics.queue_admitted("llm", None);
    /// ```
    #[inline]
    fn queue_admitted(&self, queue: &str, waited: Option<Duration>) {
        if let Some(metrics) = self.as_metrics() {
            metrics.queue_admitted(queue, waited);
        }
    }

    /// [`Metrics::queue_throttled`] when enabled.
    ///
    /// ```
    /// # use keiro_telemetry::{Metrics, MetricsExt as _};
    /// let metrics: Option<Metrics> = None;
    /// metrics.queue_throttled("llm");
    /// ```
    #[inline]
    fn queue_throttled(&self, queue: &str) {
        if let Some(metrics) = self.as_metrics() {
            metrics.queue_throttled(queue);
        }
    }

    /// [`Metrics::step_duration`] when enabled.
    ///
    /// ```
    /// # use keiro_telemetry::{Metrics, MetricsExt as _};
    /// # use std::time::Duration;
    /// let metrics: Option<Metrics> = None;
    /// metrics.step_duration("checkout", "local", Duration::from_millis(35));
    /// ```
    #[inline]
    fn step_duration(&self, workflow: &str, step_kind: &'static str, duration: Duration) {
        if let Some(metrics) = self.as_metrics() {
            metrics.step_duration(workflow, step_kind, duration);
        }
    }
}

impl MetricsExt for Metrics {
    #[inline]
    fn as_metrics(&self) -> Option<&Metrics> {
        Some(self)
    }
}

impl MetricsExt for Option<Metrics> {
    #[inline]
    fn as_metrics(&self) -> Option<&Metrics> {
        self.as_ref()
    }
}

impl MetricsExt for Option<&Metrics> {
    #[inline]
    fn as_metrics(&self) -> Option<&Metrics> {
        *self
    }
}
