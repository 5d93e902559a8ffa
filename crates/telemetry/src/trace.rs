//! Tracing over OpenTelemetry: a `workflow <name>` span per drive of a run, a `remote <step>`
//! span per remote task, and the W3C trace context that joins the second to the first across
//! processes.
//!
//! The span of a drive is made current (an OpenTelemetry [`Context`]) while the body runs, so a
//! remote step dispatched from the body stamps its task with the drive's `traceparent`; the
//! remote worker parents its handler's span on it. Like [`Metrics`](crate::Metrics), the handle
//! is optional everywhere: components given `None` create no span and stamp nothing.

use std::borrow::Cow;
use std::sync::Arc;

use opentelemetry::global::{BoxedTracer, ObjectSafeTracer};
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, TraceContextExt as _, TraceFlags, TraceId, TraceState,
    Tracer as _, TracerProvider,
};
use opentelemetry::{Context, KeyValue};

use crate::names;

/// Creates keiro's spans. Cheap to clone.
#[derive(Clone)]
pub struct Tracing {
    tracer: Arc<BoxedTracer>,
}

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracing").finish_non_exhaustive()
    }
}

impl Tracing {
    /// Spans from the globally installed tracer provider (`opentelemetry::global`).
    pub fn global() -> Self {
        Self {
            tracer: Arc::new(opentelemetry::global::tracer(names::TRACER)),
        }
    }

    /// Spans from `provider`.
    pub fn from_provider<P>(provider: &P) -> Self
    where
        P: TracerProvider,
        P::Tracer: ObjectSafeTracer + Send + Sync + 'static,
    {
        Self {
            tracer: Arc::new(BoxedTracer::new(Box::new(provider.tracer(names::TRACER)))),
        }
    }

    /// Starts the span of one drive of workflow `name`/`id` and returns the context holding it:
    /// run the drive with it current (`FutureExt::with_context`), then [`end`](Self::end) it.
    pub fn workflow(&self, name: &str, id: &str) -> Context {
        let span = self
            .tracer
            .span_builder(format!("workflow {name}"))
            .with_kind(SpanKind::Internal)
            .with_attributes([
                KeyValue::new(names::WORKFLOW_NAME, name.to_owned()),
                KeyValue::new(names::WORKFLOW_ID, id.to_owned()),
            ])
            .start(self.tracer.as_ref());
        Context::current_with_span(span)
    }

    /// Starts the span of one attempt of remote step `step`, a child of the dispatching
    /// drive's span when `traceparent` carries one, and returns the context holding it.
    pub fn remote(&self, step: &str, step_id: &str, traceparent: Option<&str>) -> Context {
        let parent = traceparent
            .and_then(context_from_traceparent)
            .unwrap_or_default();
        let span = self
            .tracer
            .span_builder(Cow::Owned(format!("remote {step}")))
            .with_kind(SpanKind::Consumer)
            .with_attributes([
                KeyValue::new(names::REMOTE_STEP, step.to_owned()),
                KeyValue::new(names::REMOTE_STEP_ID, step_id.to_owned()),
            ])
            .start_with_context(self.tracer.as_ref(), &parent);
        parent.with_span(span)
    }

    /// Runs `future` with `cx` current on every poll, so spans and trace contexts taken
    /// inside it (by [`current_traceparent`]) belong to `cx`'s span.
    pub fn in_context<F: std::future::Future>(
        future: F,
        cx: Context,
    ) -> opentelemetry::context::WithContext<F> {
        opentelemetry::context::FutureExt::with_context(future, cx)
    }

    /// Ends the span a context holds.
    pub fn end(cx: &Context) {
        cx.span().end();
    }
}

/// The `traceparent` of the current OpenTelemetry context's span, if it holds a valid one.
pub fn current_traceparent() -> Option<String> {
    traceparent(&Context::current())
}

/// The W3C `traceparent` header value of the span `cx` holds, or `None` when it holds no
/// valid span (no provider installed, or tracing off).
pub fn traceparent(cx: &Context) -> Option<String> {
    let span = cx.span();
    let sc = span.span_context();
    if !sc.is_valid() {
        return None;
    }
    Some(format!(
        "00-{}-{}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8()
    ))
}

/// A context whose remote parent span is the one a W3C `traceparent` names; `None` for a value
/// that is not a version-00 traceparent of a valid span.
pub fn context_from_traceparent(header: &str) -> Option<Context> {
    let mut parts = header.trim().split('-');
    let (version, trace_id, span_id, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version != "00" || parts.next().is_some() || trace_id.len() != 32 || span_id.len() != 16 {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let sc = SpanContext::new(
        TraceId::from_hex(trace_id).ok()?,
        SpanId::from_hex(span_id).ok()?,
        TraceFlags::new(flags),
        true,
        TraceState::default(),
    );
    sc.is_valid()
        .then(|| Context::new().with_remote_span_context(sc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_round_trip() {
        let header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let cx = context_from_traceparent(header).expect("valid");
        assert_eq!(traceparent(&cx).as_deref(), Some(header));
    }

    #[test]
    fn malformed_traceparents_are_ignored() {
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-xyz-00f067aa0ba902b7-01",
        ] {
            assert!(context_from_traceparent(bad).is_none(), "{bad}");
        }
        assert_eq!(traceparent(&Context::new()), None);
    }
}
