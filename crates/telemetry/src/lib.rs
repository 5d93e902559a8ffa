//! keiro's metrics and spans: the OpenTelemetry instruments the engine records, behind a
//! handle that costs nothing when metrics are switched off, and [`Tracing`], the optional
//! `workflow <name>` and `remote <step>` spans joined across processes by W3C trace context.
//!
//! This crate depends on the `opentelemetry` API only. The application picks the SDK and the
//! exporter, builds one [`Metrics`] from a meter, and passes `Some(metrics)` to the keiro
//! components it configures; components that get `None` record nothing. Every instrument name,
//! unit, description and attribute key is a constant in [`names`].
//!
//! ```
//! use std::time::Duration;
//!
//! use keiro_telemetry::{names, Metrics, MetricsExt as _};
//!
//! // Once at startup, after the application installed its meter provider.
//! let meter = opentelemetry::global::meter(names::METER);
//! let metrics: Option<Metrics> = Some(Metrics::new(&meter));
//!
//! // A component handed the handle records through it...
//! let _active = metrics.run_scope("checkout");
//! metrics.step_executed("checkout", 1);
//! metrics.step_duration("checkout", "local", Duration::from_millis(42));
//!
//! // ...and one configured without it records nothing.
//! let disabled: Option<Metrics> = None;
//! disabled.step_executed("checkout", 1);
//! ```
//!
//! # Instruments
//!
//! | Name | Kind | Unit | Attributes | Recorded by |
//! |---|---|---|---|---|
//! | `keiro.workflow.steps.executed` | counter | `{step}` | workflow | [`Metrics::step_executed`] |
//! | `keiro.workflow.steps.replayed` | counter | `{step}` | workflow | [`Metrics::step_replayed`] |
//! | `keiro.workflow.resumed` | counter | `{workflow}` | workflow | [`Metrics::resumed`] |
//! | `keiro.workflow.failed` | counter | `{workflow}` | workflow | [`Metrics::failed`] |
//! | `keiro.workflow.resume.errors` | counter | `{error}` | error kind | [`Metrics::resume_error`] |
//! | `keiro.workflow.lease.skipped` | counter | `{workflow}` | workflow | [`Metrics::lease_skipped`] |
//! | `keiro.workflow.active` | up-down counter | `{workflow}` | workflow | [`Metrics::run_scope`], [`Metrics::run_started`], [`Metrics::run_finished`] |
//! | `keiro.workflow.journal.length` | histogram | `{event}` | workflow | [`Metrics::journal_length`] |
//! | `keiro.workflow.awakeables.pending` | gauge | `{awakeable}` | — | [`Metrics::awakeables_pending`] |
//! | `keiro.timer.backlog` | gauge | `{timer}` | — | [`Metrics::timer_backlog`] |
//! | `keiro.timer.fire.lag` | histogram | `ms` | — | [`Metrics::timer_fire_lag`] |
//! | `keiro.remote.dispatched` | counter | `{task}` | group | [`Metrics::remote_dispatched`] |
//! | `keiro.remote.redispatched` | counter | `{task}` | group | [`Metrics::remote_redispatched`] |
//! | `keiro.remote.lost` | counter | `{task}` | group | [`Metrics::remote_lost`] |
//! | `keiro.step.duration` | histogram | `s` | workflow, step kind | [`Metrics::step_duration`] |
//!
//! The two gauges are counts the database computes; [`Metrics::sample_due`] paces them (at
//! most once per [`GAUGE_INTERVAL_DEFAULT`] per handle, [`Metrics::gauge_interval`] to change
//! it), so observing a large backlog does not add to the load it causes.
//!
//! `keiro.workflow.active` is an up-down counter, not a gauge, because runs start and finish
//! in separate tasks that can each report a ±1 without sharing state; see
//! [`Metrics::run_started`].
//!
//! # Cardinality
//!
//! Each distinct attribute combination is a time series the SDK keeps in memory and the
//! backend stores, so attributes carry only values from small, fixed sets: the workflow's
//! registered *name*, a remote worker group (without its `@partition`, which the application
//! chooses), and `&'static str` kinds. Instance ids, step
//! names (which can embed ids), error messages and payloads never become attributes; they
//! belong on spans and in logs. Taking kinds as `&'static str` makes passing formatted text a
//! compile error rather than a slow leak.
//!
//! # No-op behaviour
//!
//! Components hold an `Option<Metrics>` and record through [`MetricsExt`]. Under `None` every
//! recorder is a single branch: no attribute is built, no workflow name is copied, nothing is
//! allocated and nothing can panic. Under `Some`, a recording builds its attributes on the
//! stack, and copying a borrowed workflow name or group into its attribute is the only
//! allocation this crate makes. A [`Metrics`] built on a no-op meter (no provider installed)
//! is also safe to use; it just pays for that copy.
//!
//! # Errors
//!
//! Recording never fails. An instrument the SDK rejects is replaced by a no-op one and the
//! SDK reports it through its own internal logging.

mod metrics;
pub mod names;
#[cfg(feature = "testing")]
pub mod testing;
mod trace;

pub use metrics::{ActiveRun, Metrics, MetricsExt, SampledGauge, GAUGE_INTERVAL_DEFAULT};
pub use opentelemetry::Context;
pub use trace::{context_from_traceparent, current_traceparent, traceparent, Tracing};
