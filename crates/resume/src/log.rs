//! The resume worker's log hook: every notable event as a value, logged through `tracing` by
//! default and replaceable by the embedding application.

use std::sync::Arc;

use keiro_journal::InstanceKey;

use crate::ResumeSummary;

/// Something the resume worker wants to tell the operator.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ResumeLogEvent {
    /// A candidate's workflow name is not registered.
    UnknownName {
        /// The instance.
        key: InstanceKey,
    },
    /// A run crashed; the attempt was counted.
    Crashed {
        /// The instance.
        key: InstanceKey,
        /// Attempts so far.
        attempts: i32,
        /// The error.
        error: String,
    },
    /// A run reached the crash ceiling and was failed.
    FailedTerminally {
        /// The instance.
        key: InstanceKey,
        /// The error.
        error: String,
    },
    /// A crash could not be recorded because the instance went terminal meanwhile.
    CrashRecordSkipped {
        /// The instance.
        key: InstanceKey,
    },
    /// A run's code diverged from its journal; the instance is parked failed.
    Diverged {
        /// The instance.
        key: InstanceKey,
        /// The reason.
        detail: String,
    },
    /// A transient store error; no attempt was consumed.
    TransientError {
        /// The instance, when the error was about one.
        key: Option<InstanceKey>,
        /// The error chain.
        error: String,
    },
    /// A whole pass failed (discovery could not run); the loop goes on.
    PassFailed {
        /// The error chain.
        error: String,
    },
    /// A pass finished.
    PassFinished {
        /// What it did.
        summary: ResumeSummary,
    },
}

/// The log hook: called synchronously, so it should be cheap.
pub type LogHook = Arc<dyn Fn(&ResumeLogEvent) + Send + Sync>;

/// The default hook: `tracing` events at a level that fits each.
pub fn tracing_log_hook() -> LogHook {
    Arc::new(|event: &ResumeLogEvent| match event {
        ResumeLogEvent::UnknownName { key } => {
            tracing::warn!(workflow = %key, "skipping a workflow whose name is not registered");
        }
        ResumeLogEvent::Crashed {
            key,
            attempts,
            error,
        } => {
            tracing::warn!(workflow = %key, attempts, error = %error, "workflow run crashed; will retry after backoff");
        }
        ResumeLogEvent::FailedTerminally { key, error } => {
            tracing::error!(workflow = %key, error = %error, "workflow failed at the crash ceiling");
        }
        ResumeLogEvent::CrashRecordSkipped { key } => {
            tracing::info!(workflow = %key, "crash not recorded: the workflow went terminal meanwhile");
        }
        ResumeLogEvent::Diverged { key, detail } => {
            tracing::error!(workflow = %key, detail = %detail, "workflow code diverged from its journal; parked as failed");
        }
        ResumeLogEvent::TransientError { key, error } => match key {
            Some(key) => tracing::warn!(workflow = %key, error = %error, "transient store error"),
            None => tracing::warn!(error = %error, "transient store error"),
        },
        ResumeLogEvent::PassFailed { error } => {
            tracing::error!(error = %error, "resume pass failed; the loop continues");
        }
        ResumeLogEvent::PassFinished { summary } => {
            if summary.discovered > 0 {
                tracing::debug!(?summary, "resume pass finished");
            }
        }
    })
}
