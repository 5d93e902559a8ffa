//! The workflows table at scale: N finished instances (default 1,000,000) over 30 days and L
//! live ones (default 100,000) in the last hour, written by SQL (generate_series into the real
//! tables) so filling costs no workflow runs; then the statements an operator and a worker
//! send against it, timed: a claim, `list` with each filter, `counts`, and retention.
//!
//! The shape is production's as the plan tests model it: ten workflow names sharing the live
//! and the finished rows, mostly completed, one finished run in ten a child of an earlier one,
//! one in five on a queue. The oldest tenth of the finished runs is past the retention window
//! and has three journal rows each, so retention has work of the size a daily collection
//! would; the rest carry no journal (no measured statement reads it).

use std::time::{Duration, Instant};

use keiro::operate::{GcRequest, ListRequest};
use keiro::postgres::plans::ListStatement;
use keiro::{InstanceKey, Keiro, Status};
use serde::Serialize;
use time::OffsetDateTime;

use super::super::{Percentiles, Setup};
use crate::common::{round, Result, ResultExt};

/// The span the finished runs' completions are spread over.
const HISTORY_DAYS: i64 = 30;
/// The retention window the measured collection uses: the oldest tenth of the history.
const RETENTION_DAYS: i64 = 27;
/// Journal rows of each expired run.
const EXPIRED_JOURNAL_ROWS: i64 = 3;
/// Claims and discovery queries timed.
const CLAIM_SAMPLES: usize = 30;
/// Times each list shape and `counts` is timed (the report takes the median).
const READ_SAMPLES: usize = 7;

// The finished runs: g = 1 is the newest. A child (g % 10 = 7) has the parent g + 3, created
// and finished before it; one in five is on a queue.
const SCALE_FILL_FINISHED: &str = "INSERT INTO workflows (workflow_name, workflow_id, status, \
     input, output, last_error, created_at, updated_at, completed_at, parent_name, parent_id, \
     queue, queue_key) \
     SELECT 'scale-' || (g % 10), 'done-' || lpad(g::text, 8, '0'), \
            CASE WHEN g % 100 < 96 THEN 'completed' WHEN g % 100 < 99 THEN 'failed' \
                 ELSE 'cancelled' END, \
            '{\"n\": 1}', CASE WHEN g % 100 < 96 THEN '1'::jsonb END, \
            CASE WHEN g % 100 BETWEEN 96 AND 98 THEN 'step failed' END, \
            now() - g * $2::text::interval - interval '2 minutes', now() - g * $2::text::interval, \
            now() - g * $2::text::interval, \
            CASE WHEN g % 10 = 7 THEN 'scale-' || ((g + 3) % 10) END, \
            CASE WHEN g % 10 = 7 THEN 'done-' || lpad((g + 3)::text, 8, '0') END, \
            CASE WHEN g % 5 = 0 THEN 'q-' || (g % 3) END, \
            CASE WHEN g % 5 = 0 THEN 'k-' || (g % 400) END \
     FROM generate_series(1, $1::bigint) g";

// The expired runs' journals: the finished runs older than the retention window.
const SCALE_FILL_JOURNAL: &str = "INSERT INTO journal (workflow_name, workflow_id, generation, \
     step_name, kind, payload, recorded_at) \
     SELECT w.workflow_name, w.workflow_id, 0, 'step-' || s, 'step', to_jsonb(s), w.completed_at \
     FROM workflows w, generate_series(0, $2::bigint - 1) s \
     WHERE w.status IN ('completed', 'failed', 'cancelled') AND w.completed_at < now() - $1::text::interval";

// The live runs, created in the last hour: four in five runnable (running, no lease), one in
// five parked with a wake-up an hour away.
const SCALE_FILL_LIVE: &str = "INSERT INTO workflows (workflow_name, workflow_id, status, \
     input, created_at, updated_at, wake_after) \
     SELECT 'scale-' || (g % 10), 'live-' || lpad(g::text, 8, '0'), \
            CASE WHEN g % 5 = 0 THEN 'suspended' ELSE 'running' END, '{\"n\": 1}', \
            now() - g * $2::text::interval, now() - g * $2::text::interval, \
            CASE WHEN g % 5 = 0 THEN now() + interval '1 hour' END \
     FROM generate_series(1, $1::bigint) g";

// A worker's batch claim of 32 over the ten names, as a pass sends it; rolled back after.
const SCALE_CLAIM: &str = "SELECT count(*) FROM keiro_instances_claim_batch(\
     ARRAY['scale-0', 'scale-1', 'scale-2', 'scale-3', 'scale-4', 'scale-5', 'scale-6', \
           'scale-7', 'scale-8', 'scale-9'], 'scale-bench', 30000, 32, NULL)";

/// What filling took.
#[derive(Debug, Clone, Copy, Serialize)]
pub(super) struct Filled {
    pub(super) finished: u64,
    pub(super) live: u64,
    pub(super) expired: u64,
    pub(super) journal_rows: u64,
    pub(super) fill_s: f64,
}

/// One list shape's timing.
#[derive(Debug, Clone, Serialize)]
pub(super) struct ListTiming {
    pub(super) filter: &'static str,
    pub(super) p50_ms: f64,
    pub(super) max_ms: f64,
    pub(super) rows: usize,
    /// Whether the plan the server chose for it reads a table sequentially.
    pub(super) seq_scan: bool,
}

/// The table part's figures.
#[derive(Debug, Clone, Serialize)]
pub(super) struct TableFigures {
    pub(super) filled: Filled,
    pub(super) claim: Percentiles,
    pub(super) discovery: Percentiles,
    pub(super) list: Vec<ListTiming>,
    pub(super) counts_p50_ms: f64,
    pub(super) counts_max_ms: f64,
    pub(super) gc_instances: u64,
    pub(super) gc_rows: u64,
    pub(super) gc_s: f64,
    pub(super) gc_rows_per_s: f64,
    pub(super) gc_instances_per_s: f64,
}

/// An interval of `span / n`, as PostgreSQL reads it.
fn spacing(span: Duration, n: u64) -> String {
    #[allow(clippy::cast_precision_loss)] // sizes far below 2^52
    let micros = span.as_secs_f64() * 1e6 / n.max(1) as f64;
    format!("{micros:.0} microseconds")
}

/// Fills the fresh schema of `setup`.
async fn fill(setup: &Setup, finished: u64, live: u64) -> Result<Filled> {
    let started = Instant::now();
    let history = Duration::from_secs(u64::try_from(HISTORY_DAYS).unwrap_or(30) * 86_400);
    let (finished_i, live_i) = (
        i64::try_from(finished).context("-n")?,
        i64::try_from(live).context("--live")?,
    );
    let db = &setup.db;
    db.execute(
        SCALE_FILL_FINISHED,
        &[&finished_i, &spacing(history, finished)],
    )
    .await
    .context("filling the finished runs")?;
    let journal_rows = db
        .execute(
            SCALE_FILL_JOURNAL,
            &[&format!("{RETENTION_DAYS} days"), &EXPIRED_JOURNAL_ROWS],
        )
        .await
        .context("filling the expired runs' journals")?;
    db.execute(
        SCALE_FILL_LIVE,
        &[&live_i, &spacing(Duration::from_secs(3600), live)],
    )
    .await
    .context("filling the live runs")?;
    // A table in its steady state: statistics, and a visibility map as autovacuum keeps it.
    // One statement each: several in one string run as one transaction, where VACUUM may not.
    for table in ["workflows", "journal"] {
        db.batch_execute(&format!("VACUUM ANALYZE {table}"))
            .await
            .context(format!("vacuuming {table}"))?;
    }
    Ok(Filled {
        finished,
        live,
        expired: journal_rows / u64::try_from(EXPIRED_JOURNAL_ROWS).unwrap_or(1),
        journal_rows,
        fill_s: round(started.elapsed().as_secs_f64(), 1),
    })
}

/// Times `samples` runs of `statement` (its row count ignored), each in a transaction rolled
/// back, so a claim leaves the backlog as it found it.
async fn timed_rolled_back(
    db: &mut tokio_postgres::Client,
    statement: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    samples: usize,
) -> Result<Percentiles> {
    let mut spans = Vec::with_capacity(samples);
    for _ in 0..samples {
        let tx = db.transaction().await.context("opening a transaction")?;
        let started = Instant::now();
        tx.query(statement, params)
            .await
            .context(format!("running {statement}"))?;
        spans.push(started.elapsed());
        tx.rollback().await.context("rolling back")?;
    }
    Ok(Percentiles::of(&spans))
}

/// The list shapes measured: each filter alone, as an operator's first page asks for it.
fn list_shapes(now: OffsetDateTime) -> Result<Vec<(&'static str, ListRequest)>> {
    let day = time::Duration::days(1);
    let mut shapes = Vec::new();
    let mut add = |label: &'static str, edit: &dyn Fn(&mut ListRequest)| {
        let mut request = ListRequest::default();
        edit(&mut request);
        shapes.push((label, request));
    };
    let name: keiro::workflow::WorkflowName = "scale-3".parse().context("a workflow name")?;
    let parent = InstanceKey::parse("scale-0", "done-00012340").context("an instance key")?;
    add("none", &|_| {});
    add("name", &|r| r.filter.name = Some(name.clone()));
    add("status failed", &|r| r.filter.status = Some(Status::Failed));
    add("status running", &|r| {
        r.filter.status = Some(Status::Running)
    });
    add("created since a day", &|r| {
        r.filter.created.since = Some(now - day);
    });
    add("finished in a day, 10 days ago", &|r| {
        r.filter.finished.since = Some(now - day * 11);
        r.filter.finished.until = Some(now - day * 10);
    });
    add("updated since a day (unindexed by design)", &|r| {
        r.filter.updated.since = Some(now - day);
    });
    add("parent", &|r| r.filter.parent = Some(parent.clone()));
    add("id prefix", &|r| {
        r.filter.id_prefix = Some("done-0012".to_owned())
    });
    add("failed remote", &|r| r.filter.failed_remote = true);
    add("queue", &|r| r.filter.queue = Some("q-1".to_owned()));
    add("queue and key", &|r| {
        r.filter.queue = Some("q-1".to_owned());
        r.filter.queue_key = Some("k-10".to_owned());
    });
    Ok(shapes)
}

/// Whether the server's plan for `request` reads a table sequentially.
async fn seq_scan(db: &tokio_postgres::Client, request: &ListRequest) -> Result<bool> {
    let statement = ListStatement::new(request);
    let rows = db
        .query(
            &format!("EXPLAIN (FORMAT JSON) {}", statement.sql),
            &statement.params(),
        )
        .await
        .context("explaining a list statement")?;
    let plan: serde_json::Value = rows[0].get(0);
    Ok(plan.to_string().contains("Seq Scan"))
}

/// Fills, then measures.
pub(super) async fn run(setup: &mut Setup, finished: u64, live: u64) -> Result<TableFigures> {
    println!("scale: filling {finished} finished and {live} live instances");
    let filled = fill(setup, finished, live).await?;
    println!(
        "scale: filled in {:.1} s: {} expired runs with {} journal rows",
        filled.fill_s, filled.expired, filled.journal_rows
    );
    let claim = timed_rolled_back(&mut setup.db, SCALE_CLAIM, &[], CLAIM_SAMPLES).await?;
    let discovery = timed_rolled_back(
        &mut setup.db,
        keiro::postgres::plans::INSTANCES_RUNNABLE,
        &[&None::<OffsetDateTime>, &Some(32_i64)],
        CLAIM_SAMPLES,
    )
    .await?;
    println!(
        "scale: claim of 32 over {live} live: p50 {:.2} ms, p99 {:.2} ms; discovery of 32: p50 \
         {:.2} ms, p99 {:.2} ms",
        claim.p50_ms, claim.p99_ms, discovery.p50_ms, discovery.p99_ms
    );

    let keiro = Keiro::builder(setup.store.clone()).without_push().build();
    let now = OffsetDateTime::now_utc();
    let mut list = Vec::new();
    for (filter, request) in list_shapes(now)? {
        let mut spans = Vec::new();
        let mut rows = 0;
        for _ in 0..READ_SAMPLES {
            let started = Instant::now();
            let page = keiro
                .list(&request)
                .await
                .context(format!("listing by {filter}"))?;
            spans.push(started.elapsed());
            rows = page.instances.len();
        }
        let p = Percentiles::of(&spans);
        let seq_scan = seq_scan(&setup.db, &request).await?;
        println!(
            "scale: list by {filter}: p50 {:.2} ms, max {:.2} ms, {rows} rows{}",
            p.p50_ms,
            p.max_ms,
            if seq_scan { ", SEQUENTIAL SCAN" } else { "" }
        );
        list.push(ListTiming {
            filter,
            p50_ms: p.p50_ms,
            max_ms: p.max_ms,
            rows,
            seq_scan,
        });
    }

    let mut spans = Vec::new();
    for _ in 0..READ_SAMPLES {
        let started = Instant::now();
        keiro.counts().await.context("counting")?;
        spans.push(started.elapsed());
    }
    let counts = Percentiles::of(&spans);
    println!(
        "scale: counts: p50 {:.2} ms, max {:.2} ms",
        counts.p50_ms, counts.max_ms
    );

    let request = GcRequest::new(Duration::from_secs(
        u64::try_from(RETENTION_DAYS).unwrap_or(27) * 86_400,
    ));
    let started = Instant::now();
    let deleted = keiro
        .gc(&request, Duration::ZERO)
        .await
        .context("collecting")?;
    let gc_s = started.elapsed().as_secs_f64();
    let gc_rows = deleted.instances + deleted.journal;
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52
    let (rows_per_s, instances_per_s) = (
        gc_rows as f64 / gc_s.max(1e-9),
        deleted.instances as f64 / gc_s.max(1e-9),
    );
    println!(
        "scale: retention deleted {} instances and {} journal rows in {:.2} s: {rows_per_s:.0} \
         rows/s ({instances_per_s:.0} instances/s)",
        deleted.instances, deleted.journal, gc_s
    );
    Ok(TableFigures {
        filled,
        claim,
        discovery,
        list,
        counts_p50_ms: counts.p50_ms,
        counts_max_ms: counts.max_ms,
        gc_instances: deleted.instances,
        gc_rows,
        gc_s: round(gc_s, 2),
        gc_rows_per_s: round(rows_per_s, 0),
        gc_instances_per_s: round(instances_per_s, 0),
    })
}
