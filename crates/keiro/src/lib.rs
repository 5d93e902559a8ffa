//! keiro: durable workflows for Rust on PostgreSQL.
//!
//! A workflow is an ordinary async function whose every step result is journaled. When a
//! process crashes, a deploy restarts it, or a run parks on a wake source, nothing is lost: a
//! worker notices the unfinished instance, leases it, and re-invokes it; journaled steps
//! return their recorded results and only the un-journaled tail runs.
//!
//! This crate is the facade: it re-exports the layers (`keiro-journal`, `keiro-lease`,
//! `keiro-resume`, `keiro-remote`, the stores) and assembles them into [`Keiro`] (start, cancel,
//! signal, inspect, operate) and [`Worker`] (the embeddable resume worker, which also runs
//! workflows directly in its caller).
//!
//! # Where to start
//!
//! Read [`Ctx`] first: a workflow is an `async fn(Ctx, Input) -> Result<Output, WorkflowError>`,
//! and `Ctx`'s methods are its steps, sleeps, signals, awakeables, children, events and
//! streams. Then
//! [`Keiro`], the handle you start and operate instances with, and [`WorkerBuilder`], where
//! you register workflows and build the [`Worker`] that runs them. [`WorkflowDef`] and
//! [`Handle`] give a workflow a typed input and output; [`StepOptions`] retries a step;
//! [`WorkflowError`] is what a body returns (its control-flow variants are re-raised, see
//! [`WorkflowError::is_control_flow`]), [`Error`] what the facade's calls return.
//!
//! The crate root holds only what a workflow's author writes every day. Everything else is in
//! a module named for who it is for:
//!
//! - [`workflow`]: for workflow authors, beyond the root: the `Workflow` trait, run options and
//!   outcomes, the journal budget, deliveries, awakeables, identities.
//! - [`worker`]: for tuning and driving workers: `Tuning` (the options the builder sets as a
//!   whole), `ResumeOptions`, wake sources, the log hook, `resume_once` and `drain`.
//! - [`remote`]: remote steps and the [`RemoteWorker`](remote::RemoteWorker) that runs them,
//!   typically in another process.
//! - [`schedule`]: cron and interval schedules that start workflows.
//! - [`operate`]: for operators: list, count, what an instance waits on, retention, and the
//!   tools that repair a run (requeue, resurrect, retry with a new input).
//! - [`store`]: for people writing a store, or reading its records: the traits, the records
//!   (instances, journal entries, events) and the requests and outcomes of its operations.
//! - `postgres` and `store::sqlite`: the stores; `testing`: a test kit (see Features).
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
//! - `postgres` (default): the Postgres store, and `postgres://` URLs in [`Keiro::connect`].
//! - `sqlite`: the SQLite store (one file, no server) at `keiro::store::sqlite`, and
//!   `sqlite:PATH` URLs in [`Keiro::connect`].
//!   [`Keiro::temporary`] opens one in a temporary directory, for tests and scratch runs.
//! - `testing`: `testing::TestEnv`, a test kit with time skipping, crash injection and
//!   replay verification, on a temporary SQLite file or a throwaway Postgres schema (implies
//!   `sqlite`).
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
pub mod codec;
mod connect;
mod direct;
mod engine;
mod error;
mod hand_off;
mod handle;
mod messages;
pub mod operate;
pub mod queue;
mod reencrypt;
pub mod remote;
mod result;
pub mod schedule;
#[cfg(feature = "postgres")]
mod start_in;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;
mod typed;
mod updates;
pub mod versions;
pub mod worker;
pub mod workflow;

pub use builder::KeiroBuilder;
pub use direct::DirectError;
pub use error::Error;
pub use handle::Keiro;
pub use keiro_journal::{
    Backoff, Ctx, InstanceKey, SignalOptions, Status, StepOptions, WorkflowError,
};
pub use keiro_telemetry::{Metrics, Tracing};
pub use result::{ResultError, ResultOptions};
pub use typed::{Handle, WorkflowDef};
pub use worker::{Worker, WorkerBuilder};

/// The Postgres store.
#[cfg(feature = "postgres")]
pub use keiro_postgres as postgres;
