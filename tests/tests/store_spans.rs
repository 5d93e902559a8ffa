//! Store spans: every store operation runs in a `keiro.store.<operation>` span (target
//! `keiro::store`, DEBUG) naming its instance, on both stores alike, and each batch a Postgres
//! lane sends has a `keiro.store.batch` span that follows from the calls it carries.
//!
//! Each test records spans with a layer of its own, installed as the thread's default
//! subscriber on a current-thread runtime: every task of the test (the Postgres lanes' tasks
//! too) runs on that thread, and tests running side by side never see each other's spans.
//!
//! A binary of its own: it installs a `tracing` subscriber, and the spans of tests running
//! beside it in one process would reach it (they did, when it was a module of `engine`).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use keiro::{store::Fence, worker::Registry, workflow::SignalSendOutcome, Ctx, Status};
use keiro_tests::{key, Backend, Harness, TestResult};
use serde_json::json;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;

#[tokio::test(flavor = "current_thread")]
async fn sqlite_store_operations_open_their_spans() -> TestResult {
    let spans = Spans::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    a_workflow_opens_a_span_per_store_operation(Harness::sqlite(), &spans).await
}

#[tokio::test(flavor = "current_thread")]
async fn postgres_store_operations_open_their_spans() -> TestResult {
    let spans = Spans::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    a_workflow_opens_a_span_per_store_operation(Harness::postgres().await, &spans).await
}

const ID: &str = "spans-1";
const TOKEN: &str = "spans-1/approval";

/// Starts, runs a step, parks on a signal, is woken by it and completes: the spans of the
/// operations on its way carry its name and id, and a failed operation records its error.
async fn a_workflow_opens_a_span_per_store_operation(h: Harness, spans: &Spans) -> TestResult {
    let mut registry = Registry::new();
    registry.register("traced", |ctx: Ctx, token: String| async move {
        let charged: u32 = ctx
            .step("charge", || async { Ok::<_, Infallible>(7) })
            .await?;
        let approved: bool = ctx.wait_signal(&token, None).await?;
        Ok((charged, approved))
    })?;
    let options = h.fast_options();

    h.keiro.start("traced", ID, &TOKEN).await?;
    keiro::worker::resume_once(&h.store, &registry, &options).await?;
    let k = key("traced", ID);
    let parked = h.store.instance_get(&k).await?.ok_or("no row")?;
    assert_eq!(parked.status, Status::Suspended, "parked on the signal");
    assert_eq!(
        h.keiro.signal(TOKEN, &true).await?,
        SignalSendOutcome::Delivered { to: k.clone() }
    );
    let done = keiro::worker::resume_once(&h.store, &registry, &options).await?;
    assert_eq!(done.completed, 1, "{done:?}");
    let row = h.store.instance_get(&k).await?.ok_or("no row")?;
    assert_eq!(row.output, Some(json!([7, true])));
    let stale = Fence {
        owner: "nobody".into(),
        epoch: 999,
    };
    let refused = h
        .store
        .instance_lease_renew(&k, &stale, std::time::Duration::from_secs(30))
        .await;
    assert!(refused.is_err(), "a stale fence renews nothing");

    let opened = spans.all();
    let store_spans: Vec<&Opened> = opened
        .iter()
        .filter(|s| s.name.starts_with("keiro.store."))
        .collect();
    for span in &store_spans {
        assert_eq!(
            (span.target.as_str(), span.level),
            ("keiro::store", Level::DEBUG),
            "{span:?}"
        );
    }
    let of_the_run = |name: &str| -> Vec<&Opened> {
        store_spans
            .iter()
            .copied()
            .filter(|s| s.name == name && s.field("keiro.workflow.id") == Some(ID))
            .filter(|s| s.field("keiro.workflow.name") == Some("traced"))
            .collect()
    };
    for name in [
        "keiro.store.instance_start",
        "keiro.store.journal_append",
        "keiro.store.signal_wait",
        "keiro.store.instance_park",
        "keiro.store.instance_get",
        "keiro.store.instance_lease_renew",
    ] {
        assert!(
            !of_the_run(name).is_empty(),
            "{:?}: no {name} span with the run's name and id among {:#?}",
            h.backend,
            names(&store_spans)
        );
    }
    let appends = of_the_run("keiro.store.journal_append");
    let charge = appends
        .iter()
        .find(|s| s.field("keiro.workflow.step") == Some("charge"))
        .ok_or("no span for the append of step charge")?;
    assert!(
        appends.len() >= 2,
        "the step and the completion: {appends:#?}"
    );
    let wait = &of_the_run("keiro.store.signal_wait")[0];
    assert_eq!(wait.field("keiro.signal.token"), Some(TOKEN));
    assert!(
        store_spans
            .iter()
            .any(|s| s.name == "keiro.store.signal_send_with"
                && s.field("keiro.signal.token") == Some(TOKEN)),
        "no span for the signal sent: {:#?}",
        names(&store_spans)
    );
    assert!(
        of_the_run("keiro.store.journal_append")
            .iter()
            .all(|s| s.field("error").is_none()),
        "the appends succeeded"
    );
    let renew = &of_the_run("keiro.store.instance_lease_renew")[0];
    assert!(
        renew.field("error").is_some_and(|e| !e.is_empty()),
        "the refused renewal records its error: {renew:?}"
    );

    let batches: Vec<&Opened> = store_spans
        .iter()
        .copied()
        .filter(|s| s.name == "keiro.store.batch")
        .collect();
    match h.backend {
        // The SQLite writer batches without lanes, so without batch spans too.
        Backend::Sqlite => assert!(batches.is_empty(), "no lanes"),
        Backend::Postgres => {
            // The append of `charge` went through the append lane: its batch's span follows
            // from the append's span, which was current while the call ran.
            let carried = batches
                .iter()
                .find(|b| b.follows.contains(&charge.at))
                .ok_or_else(|| {
                    format!("no batch follows from the append of charge: {batches:#?}")
                })?;
            assert_eq!(
                carried.field("keiro.store.operation"),
                Some("journal_append")
            );
            let len: usize = carried
                .field("keiro.store.batch_len")
                .ok_or("no batch length")?
                .parse()?;
            assert!(len >= 1, "{carried:?}");
        }
    }
    Ok(())
}

fn names<'a>(spans: &[&'a Opened]) -> Vec<&'a str> {
    spans.iter().map(|s| s.name).collect()
}

/// One span as it was opened, with the fields recorded on it since.
#[derive(Debug, Clone)]
struct Opened {
    /// Its position in the record: what `follows` refers to.
    at: usize,
    name: &'static str,
    target: String,
    level: Level,
    fields: BTreeMap<String, String>,
    /// The positions of the spans it follows from.
    follows: Vec<usize>,
}

impl Opened {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

/// A layer that records every span opened, in order.
#[derive(Debug, Clone, Default)]
struct Spans(Arc<Mutex<Vec<Opened>>>);

/// The position of a live span in the record, kept in its extensions: span ids are reused
/// once a span closes, positions are not.
struct At(usize);

impl Spans {
    fn lock(&self) -> MutexGuard<'_, Vec<Opened>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn all(&self) -> Vec<Opened> {
        self.lock().clone()
    }
}

fn at<S: Subscriber + for<'a> LookupSpan<'a>>(ctx: &Context<'_, S>, id: &Id) -> Option<usize> {
    ctx.span(id)
        .and_then(|span| span.extensions().get::<At>().map(|at| at.0))
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let meta = attrs.metadata();
        let mut spans = self.lock();
        let at = spans.len();
        spans.push(Opened {
            at,
            name: meta.name(),
            target: meta.target().to_owned(),
            level: *meta.level(),
            fields: fields.0,
            follows: Vec::new(),
        });
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(At(at));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(at) = at(&ctx, id) {
            let mut fields = Fields::default();
            values.record(&mut fields);
            self.lock()[at].fields.extend(fields.0);
        }
    }

    fn on_follows_from(&self, id: &Id, follows: &Id, ctx: Context<'_, S>) {
        if let (Some(at), Some(follows)) = (at(&ctx, id), at(&ctx, follows)) {
            self.lock()[at].follows.push(follows);
        }
    }
}

/// Field values as text: a `%` value as it displays, a string as itself.
#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}
