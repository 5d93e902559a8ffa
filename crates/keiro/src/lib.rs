//! keiro: durable workflows for Rust on PostgreSQL.
//!
//! A workflow is an ordinary async function whose every step result is journaled. When a
//! process crashes, a deploy restarts it, or a run parks on a wake source, nothing is lost: a
//! worker notices the unfinished instance, leases it, and re-invokes it; journaled steps
//! return their recorded results and only the un-journaled tail runs.
//!
//! This crate is the facade: it re-exports the layers (`keiro-journal`, `keiro-lease`,
//! `keiro-resume`, `keiro-remote`, the stores) and assembles them into [`Keiro`] (start, cancel,
//! inspect, operate), [`Worker`] (the embeddable resume worker, which also runs workflows
//! directly in its caller) and [`RemoteWorker`] (runs remote steps, typically in another
//! process).
//!
//! ```no_run
//! use keiro::{Ctx, Keiro, WorkflowError};
//!
//! async fn greet(ctx: Ctx, name: String) -> Result<String, WorkflowError> {
//!     let line: String = ctx
//!         .step("compose", || async move { Ok::<_, std::io::Error>(format!("hello {name}")) })
//!         .await?;
//!     ctx.step("print", || { let line = line.clone(); async move { println!("{line}"); Ok::<_, std::io::Error>(()) } }).await?;
//!     Ok(line)
//! }
//!
//! # async fn demo() -> Result<(), keiro::Error> {
//! let keiro = Keiro::connect("postgres://postgres@127.0.0.1:5432/postgres").await?; // migrates
//! keiro.start("greet", "greet-1", &"ada").await?;                                  // idempotent by id
//! let worker = keiro.worker().register("greet", greet).build()?;
//! worker.run_until(async { let _ = tokio::signal::ctrl_c().await; }).await;
//! # Ok(()) }
//! ```
//!
//! # Direct execution
//!
//! [`Worker::run_workflow`] (typed) and [`Worker::run_named`] (by name) start an instance
//! already leased to the caller and drive it in the calling task, with no worker pass in
//! between, then return its output. What parks or crashes is left to the resume workers and
//! awaited; a caller that goes away leaves an instance they recover at lease expiry.
//!
//! ```no_run
//! # use keiro::{Ctx, Keiro, WorkflowError};
//! # async fn greet(ctx: Ctx, name: String) -> Result<String, WorkflowError> { Ok(name) }
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let keiro = Keiro::connect("postgres://postgres@127.0.0.1:5432/postgres").await?;
//! let worker = keiro.worker().register("greet", greet).build()?;
//! tokio::spawn({ let worker = worker.clone(); async move { worker.run().await } });
//! let line: String = worker.run_named("greet", "greet-2", &"ada").await?; // driven here, now
//! # let _ = line; Ok(()) }
//! ```
//!
//! # Features
//!
//! - `postgres` (default): [`Keiro::connect`] and the Postgres store.
//! - `memory`: the in-memory store, for tests and embedding.
//! - `testing`: `testing::TestEnv`, a test kit with time skipping, crash injection and
//!   replay verification (implies `memory`).
//!
//! # Guarantees
//!
//! A step whose result is journaled never runs again; one steady-state advancer per instance;
//! discovery is exact; terminal instances are never resurrected by late deliveries; history is
//! append-only. The full list, each with its test, is in the design contract.
//!
//! # Errors
//!
//! Facade operations return [`Error`]; workflow bodies see [`WorkflowError`].

mod builder;
mod direct;
mod engine;
mod error;
mod operate;
mod result;
mod schedule;
#[cfg(feature = "postgres")]
mod start_in;
#[cfg(feature = "testing")]
pub mod testing;
mod typed;
mod worker;

pub use builder::KeiroBuilder;
pub use direct::DirectError;
pub use engine::{Keiro, Store};
pub use error::Error;
pub use result::{
    ResultError, ResultOptions, RESULT_POLL_INTERVAL_DEFAULT, RESULT_POLL_INTERVAL_MIN,
};
pub use schedule::{ScheduleBuilder, Schedules};
pub use typed::{Handle, WorkflowDef};
pub use worker::{Worker, WorkerBuilder};

pub use keiro_journal::{
    error_chain, panic_message, Backoff, BoxFuture, Deliveries, DeliveryBacklog, DeliveryRefusal,
    JournalBudget, RemoteHandlerDef, RemoteOptions, RemoteStepError, StepOptions,
};
pub use keiro_journal::{
    store, workflow_fn, Append, AppendOutcome, Awakeable, AwakeableOutcome, CancelOutcome, Ctx,
    Driven, Envelope, Event, Fence, Generation, IdError, Instance, InstanceKey, IntoInstanceKey,
    JournalEntry, JournalStore, Marker, RunError, RunOptions, RunOutcome, RunStats, SignalOptions,
    SignalSendOutcome, Started, Status, StepKind, StoreError, TimerFiring, Workflow, WorkflowError,
    WorkflowId, WorkflowName, SIGNAL_TTL_DEFAULT,
};
pub use keiro_journal::{
    AwakeableInfo, AwakeableStatus, Counts, Cursor, FilterError, GcBatch, GcRequest, GroupCount,
    InspectStore, InstanceSummary, ListFilter, ListOrder, ListRequest, Page, RetentionStore,
    SignalWaitInfo, StatusCount, TimeRange, TimerInfo, TimerKind, TimerState, Waits,
    GC_BATCH_DEFAULT, GC_BATCH_MAX, LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX, WAITS_LIMIT_DEFAULT,
};
pub use keiro_lease::{
    ClaimOutcome, CrashOutcome, LeaseStore, ResurrectOutcome, StartClaim, CRASH_BACKOFF_DEFAULT,
};
pub use keiro_remote::{
    AdminError, RemoteTask, RemoteWorker, RemoteWorkerBuilder, RemoteWorkerOptions, ReportOutcome,
    RequeueOutcome, TaskContext, TaskError, TaskHandler, TaskStatus, WorkerStats,
};
pub use keiro_resume::{
    drain, resume_once, resume_once_up_to, ClosedWait, ClosedWaiters, FixedPoll, LogHook, Notifier,
    Registry, RegistryError, ResumeLogEvent, ResumeOptions, ResumeSummary, RetentionOptions,
    TimerOptions, TimerSummary, WakeFilter, WakeReason, WakeSource,
};
pub use keiro_resume::{
    Cadence, CatchUp, Overlap, Schedule, ScheduleError, ScheduleSpec, ScheduleStore,
    SchedulerOptions, SchedulerSummary,
};
pub use keiro_telemetry::{Metrics, Tracing};

/// The Postgres store.
#[cfg(feature = "postgres")]
pub use keiro_postgres as postgres;

/// The in-memory store.
#[cfg(feature = "memory")]
pub use keiro_memory as memory;
