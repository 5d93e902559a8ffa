//! Events and streams: what a run publishes to its callers while it runs
//! ([`Ctx::set_event`], [`Ctx::write_stream`], [`Ctx::close_stream`]).
//!
//! Each write is a journal step of its own (the `n`-th write of a key in the generation is
//! `event:<key>#<n>` or `stream:<key>#<n>`; a close is `stream:<key>#end`), appended fenced in
//! the same transaction as the row a reader reads (`model::message`). So a replayed write
//! finds its step and writes nothing, and a write the run went past is in the store. The
//! bodies are deterministic, so the `n`-th write of a key is the same write on every drive.

use std::time::Instant;

use serde::Serialize;

use crate::ctx::RecordVia;
use crate::model::message::{
    message_step, stream_close_step, validate_message_key, EVENT_STEP_PREFIX, STREAM_STEP_PREFIX,
};
use crate::store::contract::StreamWrite;
use crate::{Ctx, StepKind, WorkflowError};

impl Ctx {
    /// Sets event `key` to `value`: readers ([`Keiro::get_event`] in the facade) see it as
    /// soon as it is journaled, and those waiting for it are woken. Setting it again replaces
    /// the value (readers get the latest). On replay it returns at once, writing nothing.
    ///
    /// [`Keiro::get_event`]: https://docs.rs/keiro/latest/keiro/struct.Keiro.html#method.get_event
    ///
    /// ```no_run
    /// # async fn body(ctx: keiro_journal::Ctx) -> Result<(), keiro_journal::WorkflowError> {
    /// ctx.set_event("payment", &"confirmed").await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`WorkflowError::InvalidStep`] for a key
    /// [`validate_message_key`](crate::store::validate_message_key) refuses; the errors of an
    /// unstorable value ([`WorkflowError::Encode`], [`WorkflowError::PayloadTooLarge`]);
    /// [`WorkflowError::Halted`] when the run must stop (its lease was lost, it was
    /// cancelled).
    pub async fn set_event<T: Serialize + ?Sized>(
        &self,
        key: &str,
        value: &T,
    ) -> Result<(), WorkflowError> {
        validate_message_key(key)?;
        let step = self.next_message_step(EVENT_STEP_PREFIX, key);
        if self.replayed(&step, StepKind::Event)?.is_some() {
            return Ok(());
        }
        self.before_fresh_work(&step).await?;
        let json = self.inner.encode(&step, value)?;
        let started = Instant::now();
        self.record_via(
            &step,
            StepKind::Event,
            json,
            RecordVia::Event(key.to_owned()),
        )
        .await?;
        self.observe(StepKind::Event, started);
        Ok(())
    }

    /// Appends `value` to stream `key` at its next offset (0 for the first item): readers
    /// following the stream ([`Keiro::read_stream`] in the facade) get it as soon as it is
    /// journaled. On replay it returns at once, writing nothing.
    ///
    /// [`Keiro::read_stream`]: https://docs.rs/keiro/latest/keiro/struct.Keiro.html#method.read_stream
    ///
    /// ```no_run
    /// # async fn body(ctx: keiro_journal::Ctx) -> Result<(), keiro_journal::WorkflowError> {
    /// for token in ["hello", "world"] {
    ///     ctx.write_stream("tokens", &token).await?;
    /// }
    /// ctx.close_stream("tokens").await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`set_event`](Self::set_event), and [`WorkflowError::StreamFull`] past the run's
    /// [`StreamBudget`](crate::message::StreamBudget), [`WorkflowError::StreamClosed`] after
    /// [`close_stream`](Self::close_stream): nothing is written then, and the body may go on.
    pub async fn write_stream<T: Serialize + ?Sized>(
        &self,
        key: &str,
        value: &T,
    ) -> Result<(), WorkflowError> {
        validate_message_key(key)?;
        let step = self.next_message_step(STREAM_STEP_PREFIX, key);
        if let Some(recorded) = self.replayed(&step, StepKind::Stream)? {
            self.count_stream_item(crate::encoded_len(&recorded));
            return Ok(());
        }
        self.before_fresh_work(&step).await?;
        let json = self.inner.encode(&step, value)?;
        let len = crate::encoded_len(&json);
        let budget = self.options().stream_budget;
        let (items, bytes) = self.state().stream_written;
        let grown = (items + 1, bytes + u64::try_from(len).unwrap_or(u64::MAX));
        if grown.0 > budget.generation_items || grown.1 > budget.generation_bytes {
            return Err(WorkflowError::StreamFull {
                key: key.to_owned(),
                scope: "generation",
                items: grown.0,
                bytes: grown.1,
                budget_items: budget.generation_items,
                budget_bytes: budget.generation_bytes,
            });
        }
        let write = StreamWrite {
            key: key.to_owned(),
            items_max: budget.items,
            bytes_max: budget.bytes,
        };
        let started = Instant::now();
        self.record_via(&step, StepKind::Stream, json, RecordVia::Stream(write))
            .await?;
        self.count_stream_item(len);
        self.observe(StepKind::Stream, started);
        Ok(())
    }

    /// Closes stream `key`: its readers end once they have read every item. Closing a closed
    /// stream, or one never written, is fine (a never-written stream is closed empty). A run
    /// that ends (completed, failed, cancelled) ends its streams without closing them.
    ///
    /// ```no_run
    /// # async fn body(ctx: keiro_journal::Ctx) -> Result<(), keiro_journal::WorkflowError> {
    /// ctx.close_stream("tokens").await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`set_event`](Self::set_event).
    pub async fn close_stream(&self, key: &str) -> Result<(), WorkflowError> {
        validate_message_key(key)?;
        let step = stream_close_step(key);
        if self.replayed(&step, StepKind::Stream)?.is_some() {
            return Ok(());
        }
        self.before_fresh_work(&step).await?;
        let started = Instant::now();
        self.record_via(
            &step,
            StepKind::Stream,
            serde_json::Value::Null,
            RecordVia::StreamClose(key.to_owned()),
        )
        .await?;
        self.observe(StepKind::Stream, started);
        Ok(())
    }

    /// The step of this body's next write of `key` under `prefix`: the `n`-th write of a key
    /// is the `n`-th step for it, on every drive.
    fn next_message_step(&self, prefix: &str, key: &str) -> String {
        let mut state = self.state();
        let next = state
            .message_ordinals
            .entry(format!("{prefix}{key}"))
            .or_insert(0);
        *next += 1;
        message_step(prefix, key, *next)
    }

    /// Counts a stream item of `len` encoded bytes this generation wrote.
    fn count_stream_item(&self, len: usize) {
        let mut state = self.state();
        state.stream_written.0 += 1;
        state.stream_written.1 += u64::try_from(len).unwrap_or(u64::MAX);
    }

    fn observe(&self, kind: StepKind, started: Instant) {
        if let Some(observer) = &self.inner.options.observer {
            observer.step_finished(&self.inner.key.name, kind, started.elapsed());
        }
    }
}
