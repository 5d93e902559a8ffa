//! keiro-remote: remote steps, the part of a workflow that runs in another process.
//!
//! A body calls [`Ctx::remote`](keiro_journal::Ctx::remote): the task is written in its own
//! transaction with a stable step id and the run parks. A [`RemoteWorker`] (in any process)
//! claims tasks of the groups it serves, runs typed handlers, heartbeats long ones and reports;
//! the report journals the result and wakes the run. Failures are retried durably with
//! backoff; a lost dispatch can be re-dispatched; operators [`requeue`] failed runs and
//! [`retry_with_input`] fixes a bad input. Cancelling a run cancels its tasks: they are never
//! claimed again, a running handler learns it through [`TaskContext::cancelled`], and its
//! report is refused.
//!
//! ```no_run
//! use std::sync::Arc;
//! use keiro_remote::{RemoteWorker, TaskContext, TaskError, Transport};
//!
//! # async fn demo(transport: Arc<dyn Transport>) {
//! let worker = RemoteWorker::builder(transport)
//!     .handle("print-label", |order: String, task: TaskContext| async move {
//!         if order.is_empty() {
//!             return Err(TaskError::fatal("no order").with_code("bad_order"));
//!         }
//!         Ok(format!("label for {order} (attempt {})", task.attempt))
//!     })
//!     .build();
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! # drop(stop);
//! worker.run_until(async { let _ = stopped.await; }).await;
//! # }
//! ```

mod admin;
mod store;
mod worker;

pub use admin::{redispatch_pending, requeue, retry_key, retry_with_input, AdminError};
pub use store::{
    ClaimRequest, ClaimedTask, HeartbeatOutcome, RemoteAdmin, RemoteTask, ReportOutcome,
    RequeueOutcome, Result, RetryOutcome, TaskFailure, TaskStatus, Transport,
};
pub use worker::{
    RemoteWorker, RemoteWorkerBuilder, RemoteWorkerOptions, TaskContext, TaskError, TaskHandler,
    WorkerStats,
};
