//! What a run tells the outside as it goes: the step observer (metrics) and the trace context
//! carried on remote tasks.

use std::time::Duration;

use crate::StepKind;

/// Told about every step that ran its action, for metrics. Implemented by the resume worker
/// over OpenTelemetry; keep it cheap, it runs on the hot path.
pub trait StepObserver: Send + Sync + std::fmt::Debug {
    /// A fresh step of `kind` in workflow `workflow` took `duration` from action start to the
    /// end of its append.
    fn step_finished(&self, workflow: &crate::WorkflowName, kind: StepKind, duration: Duration);

    /// A remote step's task was written for worker group `group`.
    fn remote_dispatched(&self, _group: &str) {}

    /// A remote step's task passed its redispatch deadline and was dispatched again.
    fn remote_redispatched(&self, _group: &str) {}

    /// A remote step failed with `remote_step_lost` after its last redispatch.
    fn remote_lost(&self, _group: &str) {}
}

/// Gives the W3C trace context of the current span, carried on remote tasks so a remote
/// handler's span joins the workflow's trace (`keiro-telemetry` implements it over
/// OpenTelemetry).
pub trait TraceContext: Send + Sync + std::fmt::Debug {
    /// The `traceparent` header value of the current span; `None` when no trace is exported.
    fn traceparent(&self) -> Option<String>;
}
