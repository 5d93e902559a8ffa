//! Remote steps: a workflow hands a step to a [`RemoteWorker`], typically in another process,
//! and waits for its result.
//!
//! In a workflow body, [`Ctx::remote`](crate::Ctx::remote) with [`RemoteOptions`] dispatches
//! the step; [`RemoteStepError`] is how one ended badly. In the process that runs them,
//! [`Keiro::remote_worker`](crate::Keiro::remote_worker) builds a [`RemoteWorker`] whose
//! handlers receive a [`TaskContext`] and answer with a value or a [`TaskError`].

pub use keiro_journal::{RemoteHandlerDef, RemoteOptions, RemoteStepError};
pub use keiro_remote::{
    RemoteTask, RemoteWorker, RemoteWorkerBuilder, RemoteWorkerOptions, ReportOutcome, TaskContext,
    TaskError, TaskHandler, TaskStatus, WorkerStats,
};
