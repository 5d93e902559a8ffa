//! The `tracing` span each store operation runs in, so a slow query shows in a trace.
//!
//! Every operation of the store traits (this crate's [`JournalStore`](crate::JournalStore),
//! [`InspectStore`](crate::InspectStore) and [`RetentionStore`](crate::RetentionStore),
//! keiro-lease's `LeaseStore`, keiro-remote's `Transport` and `RemoteAdmin`, keiro-resume's
//! `ScheduleStore`) runs in a span named `keiro.store.<operation>`, where `<operation>` is the
//! trait method's name: `keiro.store.journal_append`, `keiro.store.instance_claim`,
//! `keiro.store.timers_fire_due`. Both built-in stores open the same spans, so a trace reads the
//! same on either, and a store of your own can open them with [`store_span!`](macro@crate::store_span)
//! and [`traced`]. The spans' fields:
//!
//! - `keiro.workflow.name`, `keiro.workflow.id`: the instance, for an operation on one;
//! - `keiro.workflow.step`: the step, where the operation has one (an append, an arm, a wait);
//! - what else names the operation's object where there is no instance: `keiro.signal.token`,
//!   `keiro.awakeable.id`, `keiro.remote.step_id`, `keiro.schedule.name`;
//! - `keiro.store.len`: how many requests an operation over several carries;
//! - `error`: the failure, recorded when the operation ends with one.
//!
//! The Postgres store's group commit adds one `keiro.store.batch` span per batch a lane sends,
//! with `keiro.store.operation` (the operation it carries) and `keiro.store.batch_len`, linked
//! (`follows_from`) to the span of each call it answers.
//!
//! # Level
//!
//! Every store span is at DEBUG, target [`STORE_SPAN_TARGET`]: turn them on with
//! `RUST_LOG=keiro::store=debug` (an `EnvFilter` directive). `journal_append` and the lanes run
//! thousands of times a second on a busy worker, and a span that is off must cost next to
//! nothing there: under the usual INFO filter the macro's checks (the static maximum level, the
//! global level hint, the callsite's cached interest) turn it away before a field expression is
//! evaluated, so nothing is formatted or allocated. INFO would put a span per append into every
//! INFO-level pipeline (a registry slot and, for a `fmt` layer, a formatted field set each);
//! TRACE for the hot operations alone would hide exactly the calls one turns these spans on to
//! see, the commits.

use std::fmt;
use std::future::Future;

use tracing::{Instrument as _, Span};

/// The target of every store span, whichever store opens it: `RUST_LOG=keiro::store=debug`
/// turns them on.
///
/// ```
/// assert_eq!(keiro_journal::span::STORE_SPAN_TARGET, "keiro::store");
/// ```
pub const STORE_SPAN_TARGET: &str = "keiro::store";

/// Opens the span of one store operation: `keiro.store.<operation>` at DEBUG, target
/// [`STORE_SPAN_TARGET`], with an empty `error` field for [`traced`] to fill.
///
/// `key = <InstanceKey>` first records the instance as `keiro.workflow.name` and
/// `keiro.workflow.id`; any further fields are `tracing`'s field syntax. Field values are
/// evaluated only when the span is enabled, so they cost nothing when it is off (see the
/// module docs for the level).
///
/// ```
/// use keiro_journal::{span::traced, store_span, InstanceKey, StoreError};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), StoreError> {
/// let key = InstanceKey::parse("order", "order-42").expect("a valid key");
/// let span = store_span!("timer_arm", key = key, keiro.workflow.step = "sleep:cool-off");
/// let armed: Result<u32, StoreError> = traced(span, async { Ok(1) }).await;
/// assert_eq!(armed?, 1);
/// # Ok(()) }
/// ```
#[macro_export]
macro_rules! store_span {
    (@span $operation:literal $(, $($field:tt)+)?) => {
        $crate::span::tracing::debug_span!(
            target: $crate::span::STORE_SPAN_TARGET,
            concat!("keiro.store.", $operation),
            $($($field)+ ,)?
            error = $crate::span::tracing::field::Empty
        )
    };
    ($operation:literal, key = $key:expr $(, $($field:tt)+)?) => {
        $crate::store_span!(
            @span $operation,
            keiro.workflow.name = %$key.name,
            keiro.workflow.id = %$key.id
            $(, $($field)+)?
        )
    };
    ($operation:literal $(, $($field:tt)+)?) => {
        $crate::store_span!(@span $operation $(, $($field)+)?)
    };
}

/// Runs `operation` in `span` (entered on every poll, so whatever the operation logs or opens
/// nests in it) and records its failure in the span's `error` field as it ends.
///
/// ```
/// use keiro_journal::{store_span, span::traced, StoreError};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let missing: Result<(), StoreError> = traced(store_span!("schedules_list"), async {
///     Err(StoreError::Malformed { operation: "listing schedules", detail: "no row".into() })
/// })
/// .await;
/// assert!(missing.is_err()); // and, with store spans on, its span's `error` field says why
/// # }
/// ```
pub async fn traced<F>(span: Span, operation: F) -> F::Output
where
    F: Future,
    F::Output: SpanOutcome,
{
    let mut operation = std::pin::pin!(operation.instrument(span));
    let outcome = operation.as_mut().await;
    let span = operation.span();
    if !span.is_disabled() {
        outcome.record_in(span);
    }
    outcome
}

/// What an operation's result records in its span as it ends (see [`traced`]).
///
/// ```
/// use keiro_journal::{store_span, span::SpanOutcome, StoreError};
///
/// let failed: Result<(), StoreError> =
///     Err(StoreError::Malformed { operation: "reading", detail: "bad row".into() });
/// failed.record_in(&store_span!("instance_get")); // a no-op while the span is off
/// ```
pub trait SpanOutcome {
    /// Records this outcome in `span`: a failure as its `error` field.
    fn record_in(&self, span: &Span);
}

impl<T, E: fmt::Display> SpanOutcome for Result<T, E> {
    fn record_in(&self, span: &Span) {
        if let Err(error) = self {
            span.record("error", tracing::field::display(error));
        }
    }
}

/// An operation over several requests answers each; the span records the first failure.
impl<T, E: fmt::Display> SpanOutcome for Vec<Result<T, E>> {
    fn record_in(&self, span: &Span) {
        if let Some(Err(error)) = self.iter().find(|outcome| outcome.is_err()) {
            span.record("error", tracing::field::display(error));
        }
    }
}
