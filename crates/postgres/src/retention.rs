//! Retention on Postgres: one batch of terminal instances deleted, with everything they own,
//! in one short transaction.
//!
//! The batch, in order:
//!
//! 1. `pg_try_advisory_xact_lock` on the schema's retention key: a second collector (another
//!    worker, or `keiro gc` beside one) returns at once with `locked_out` instead of queueing
//!    behind this one. The lock goes with the transaction.
//! 2. The candidates, oldest terminal first (`workflows_terminal_idx`), with the eligibility
//!    rule (keiro-journal's `retention` module) in the query, so ineligible rows never take a
//!    slot of the batch: `FOR UPDATE OF w SKIP LOCKED`, so a row some run or operator holds is
//!    left for a later batch, and Postgres re-checks the row's status on the locked version.
//!    "No child row left" is read from the statement's snapshot, which cannot miss a child: a
//!    terminal instance gains none (only a live run spawns or adopts one; a requeue or
//!    resurrect that makes it live again fails the re-check), and only retention, which holds
//!    the lock of step 1, deletes them.
//! 3. Their parents, `FOR SHARE SKIP LOCKED`, re-checked terminal: an operator's requeue or
//!    resurrect of a parent locks the parent first, so once this holds it the parent stays
//!    terminal until commit. A candidate whose parent could not be locked, or is no longer
//!    eligible, stays.
//! 4. Their wake-source rows (timers, awakeables, signal waits, remote tasks), `FOR UPDATE
//!    SKIP LOCKED`: a candidate with one held elsewhere (a late report, timer or settle, which
//!    takes its own row before the instance's) stays for a later batch, since waiting for it
//!    while holding the instance would deadlock with that holder.
//! 5. One statement deletes the instance rows and, table by table, what they own, counting
//!    each (the foreign keys' cascades and the journal's trigger then find nothing left).
//!
//! Steps 2 to 5 repeat while the batch has room and the last round deleted a child, whose
//! parent may have become eligible: a tree goes leaves first, in one batch when it fits, and
//! a batch that deleted fewer instances than it asked for found no more.

use keiro_journal::{span::traced, store_span, GcBatch, GcRequest, RetentionStore, StoreError};
use time::OffsetDateTime;

use crate::ops::span_ms;
use crate::row::{column, count};
use crate::PgStore;

type Result<T, E = StoreError> = std::result::Result<T, E>;

const GC: &str = "deleting expired instances";
const GC_ELIGIBLE: &str = "counting expired instances";

// The retention lock's key carries the schema, so installations sharing a database do not
// contend; the cutoff is computed by the database clock unless a `now` is given.
const INSTANCES_GC_LOCK: &str = "SELECT \
     pg_try_advisory_xact_lock(hashtextextended(current_schema() || '.retention', 0)) AS locked, \
     coalesce($1::timestamptz, now()) - $2::bigint * interval '1 millisecond' AS cutoff";

// `w` expired against `$1` (the cutoff), and its parent, if there is one, too. The parent
// probe is served by the primary key.
macro_rules! expired_under_expired_parent {
    () => {
        "w.status IN ('completed', 'failed', 'cancelled') AND w.completed_at < $1 \
         AND NOT EXISTS (SELECT 1 FROM workflows p \
             WHERE p.workflow_name = w.parent_name AND p.workflow_id = w.parent_id \
             AND NOT (p.status IN ('completed', 'failed', 'cancelled') \
                      AND coalesce(p.completed_at < $1, false)))"
    };
}

/// Retention's candidates query (exported for the plan test): `$1` the cutoff, `$2` the batch.
/// A candidate has no child row left (the child probe is served by workflows_list_parent_idx).
pub const INSTANCES_GC_CANDIDATES: &str = concat!(
    "SELECT w.workflow_name, w.workflow_id, w.parent_name, w.parent_id FROM workflows w WHERE ",
    expired_under_expired_parent!(),
    " AND NOT EXISTS (SELECT 1 FROM workflows c \
         WHERE c.parent_name = w.workflow_name AND c.parent_id = w.workflow_id) \
     ORDER BY w.completed_at LIMIT $2 FOR UPDATE OF w SKIP LOCKED"
);

// What a collection deletes, batch after batch: every instance whose candidates query would
// come true once its descendants are gone, i.e. expired under an expired parent with nothing
// unexpired below it. `held` walks up from each unexpired child through its ancestors (UNION:
// each once, so it ends); most instances have no parent and cost it nothing.
const INSTANCES_GC_ELIGIBLE: &str = concat!(
    "WITH RECURSIVE held (name, id) AS (\
         SELECT c.parent_name, c.parent_id FROM workflows c \
         WHERE c.parent_name IS NOT NULL \
           AND NOT (c.status IN ('completed', 'failed', 'cancelled') \
                    AND coalesce(c.completed_at < $1, false)) \
         UNION \
         SELECT a.parent_name, a.parent_id FROM held h \
         JOIN workflows a ON a.workflow_name = h.name AND a.workflow_id = h.id \
         WHERE a.parent_name IS NOT NULL) \
     SELECT count(*) AS n FROM workflows w WHERE ",
    expired_under_expired_parent!(),
    " AND NOT EXISTS (SELECT 1 FROM held h \
         WHERE h.name = w.workflow_name AND h.id = w.workflow_id)"
);

// The parents of the candidates (never candidates themselves), locked against a concurrent
// requeue or resurrect; a parent another transaction holds is skipped, and so is its child.
const INSTANCES_GC_PARENTS: &str = "SELECT p.workflow_name, p.workflow_id FROM workflows p \
     JOIN unnest($2::text[], $3::text[]) AS c(name, id) \
       ON p.workflow_name = c.name AND p.workflow_id = c.id \
     WHERE p.status IN ('completed', 'failed', 'cancelled') AND p.completed_at < $1 \
     FOR SHARE OF p SKIP LOCKED";

// The same parents, unlocked: which of them exist at all.
const INSTANCES_GC_PARENTS_EXISTING: &str = "SELECT p.workflow_name, p.workflow_id \
     FROM workflows p JOIN unnest($1::text[], $2::text[]) AS c(name, id) \
       ON p.workflow_name = c.name AND p.workflow_id = c.id";

// The cutoff alone, for a dry run.
const INSTANCES_GC_CUTOFF: &str =
    "SELECT coalesce($1::timestamptz, now()) - $2::bigint * interval '1 millisecond' AS cutoff";

// The candidates (`$1`, `$2`) some of whose wake-source rows another transaction holds: a
// late report, timer or awakeable settle, which locks its own row and then the instance's
// (the lock order), while this batch holds the instance's. Every such row of the candidates
// is locked here, `SKIP LOCKED`, and a candidate with fewer rows locked than it has goes to a
// later batch: waiting for the rest would deadlock with their holders. Locked, the rest stay
// this batch's until the delete (a terminal instance gains no new ones: their writers lock the
// instance row first).
const INSTANCES_GC_BUSY: &str = "WITH d AS (\
         SELECT * FROM unnest($1::text[], $2::text[]) AS d(name, id)), \
     t AS (SELECT x.workflow_name AS name, x.workflow_id AS id FROM timers x JOIN d \
         ON x.workflow_name = d.name AND x.workflow_id = d.id FOR UPDATE OF x SKIP LOCKED), \
     a AS (SELECT x.workflow_name AS name, x.workflow_id AS id FROM awakeables x JOIN d \
         ON x.workflow_name = d.name AND x.workflow_id = d.id FOR UPDATE OF x SKIP LOCKED), \
     s AS (SELECT x.workflow_name AS name, x.workflow_id AS id FROM signal_waiters x JOIN d \
         ON x.workflow_name = d.name AND x.workflow_id = d.id FOR UPDATE OF x SKIP LOCKED), \
     r AS (SELECT x.workflow_name AS name, x.workflow_id AS id FROM remote_tasks x JOIN d \
         ON x.workflow_name = d.name AND x.workflow_id = d.id FOR UPDATE OF x SKIP LOCKED), \
     locked AS (SELECT g.name, g.id, count(*) AS n FROM \
         (SELECT * FROM t UNION ALL SELECT * FROM a UNION ALL SELECT * FROM s \
          UNION ALL SELECT * FROM r) g GROUP BY g.name, g.id) \
     SELECT d.name AS workflow_name, d.id AS workflow_id FROM d \
     LEFT JOIN locked l ON l.name = d.name AND l.id = d.id \
     WHERE coalesce(l.n, 0) < \
         (SELECT count(*) FROM timers x \
          WHERE x.workflow_name = d.name AND x.workflow_id = d.id) \
       + (SELECT count(*) FROM awakeables x \
          WHERE x.workflow_name = d.name AND x.workflow_id = d.id) \
       + (SELECT count(*) FROM signal_waiters x \
          WHERE x.workflow_name = d.name AND x.workflow_id = d.id) \
       + (SELECT count(*) FROM remote_tasks x \
          WHERE x.workflow_name = d.name AND x.workflow_id = d.id)";

// One statement, so each table's rows are counted as they go. Every owned table is named:
// journal (its trigger's cascade then finds nothing), timers, awakeables, signal waits and
// remote tasks (their foreign keys' cascades likewise). Each delete is served by the owner's
// index of its table (the journal's unique key, the timers' and signal waits' primary keys,
// awakeables_owner_idx, remote_tasks_owner_idx).
const INSTANCES_GC_DELETE: &str = "WITH d AS (\
         SELECT * FROM unnest($1::text[], $2::text[]) AS d(name, id)), \
     j AS (DELETE FROM journal x USING d \
         WHERE x.workflow_name = d.name AND x.workflow_id = d.id RETURNING 1), \
     t AS (DELETE FROM timers x USING d \
         WHERE x.workflow_name = d.name AND x.workflow_id = d.id RETURNING 1), \
     a AS (DELETE FROM awakeables x USING d \
         WHERE x.workflow_name = d.name AND x.workflow_id = d.id RETURNING 1), \
     s AS (DELETE FROM signal_waiters x USING d \
         WHERE x.workflow_name = d.name AND x.workflow_id = d.id RETURNING 1), \
     r AS (DELETE FROM remote_tasks x USING d \
         WHERE x.workflow_name = d.name AND x.workflow_id = d.id RETURNING 1), \
     w AS (DELETE FROM workflows x USING d \
         WHERE x.workflow_name = d.name AND x.workflow_id = d.id \
         AND x.status IN ('completed', 'failed', 'cancelled') RETURNING 1) \
     SELECT (SELECT count(*) FROM w) AS instances, (SELECT count(*) FROM j) AS journal, \
            (SELECT count(*) FROM t) AS timers, (SELECT count(*) FROM a) AS awakeables, \
            (SELECT count(*) FROM s) AS signal_waiters, (SELECT count(*) FROM r) AS remote_tasks";

impl PgStore {
    async fn gc_batch(&self, request: &GcRequest) -> Result<GcBatch> {
        let fail = |e: tokio_postgres::Error| self.failed(GC, e);
        let mut client = self.client(GC).await?;
        let tx = client.transaction().await.map_err(fail)?;
        let older_than = span_ms(request.older_than);
        self.count_round_trips(1);
        let head = tx
            .query_one(INSTANCES_GC_LOCK, &[&request.now, &older_than])
            .await
            .map_err(fail)?;
        if !column::<bool>(&head, "locked", GC)? {
            return Ok(GcBatch {
                locked_out: true,
                ..GcBatch::default()
            });
        }
        let cutoff: OffsetDateTime = column(&head, "cutoff", GC)?;
        let mut deleted = GcBatch::default();
        let mut room = u64::from(request.batch_bounded());
        while room > 0 {
            let round = self.gc_round(&tx, cutoff, room).await?;
            deleted += round.deleted;
            room = room.saturating_sub(round.deleted.instances);
            if !round.deleted_a_child || round.deleted.instances == 0 {
                break;
            }
        }
        self.count_round_trips(1);
        tx.commit().await.map_err(fail)?;
        Ok(deleted)
    }

    /// Steps 2 to 5 of the module docs: up to `room` candidates, deleted.
    async fn gc_round(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        cutoff: OffsetDateTime,
        room: u64,
    ) -> Result<GcRound> {
        let fail = |e: tokio_postgres::Error| self.failed(GC, e);
        let limit = i64::try_from(room).unwrap_or(i64::MAX);
        self.count_round_trips(1);
        let candidates = tx
            .query(INSTANCES_GC_CANDIDATES, &[&cutoff, &limit])
            .await
            .map_err(fail)?;
        let mut names = Vec::with_capacity(candidates.len());
        let mut ids = Vec::with_capacity(candidates.len());
        let mut parents: Vec<(String, String)> = Vec::new();
        for row in &candidates {
            names.push(column::<String>(row, "workflow_name", GC)?);
            ids.push(column::<String>(row, "workflow_id", GC)?);
            let parent_name: Option<String> = column(row, "parent_name", GC)?;
            let parent_id: Option<String> = column(row, "parent_id", GC)?;
            parents.push((
                parent_name.unwrap_or_default(),
                parent_id.unwrap_or_default(),
            ));
        }
        if names.is_empty() {
            return Ok(GcRound::default());
        }
        // A candidate's parent is never a candidate of the same round: it still has a child.
        let (outside_names, outside_ids): (Vec<String>, Vec<String>) = parents
            .iter()
            .filter(|(name, _)| !name.is_empty())
            .cloned()
            .unzip();
        let mut keep = vec![true; names.len()];
        if !outside_names.is_empty() {
            self.count_round_trips(1);
            let locked = tx
                .query(
                    INSTANCES_GC_PARENTS,
                    &[&cutoff, &outside_names, &outside_ids],
                )
                .await
                .map_err(fail)?;
            let locked = locked
                .iter()
                .map(|row| {
                    Ok((
                        column::<String>(row, "workflow_name", GC)?,
                        column::<String>(row, "workflow_id", GC)?,
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
            // A parent the candidates query saw but this one did not lock (held elsewhere, or
            // no longer terminal) keeps its child for a later batch. A parent row that does
            // not exist at all passed the candidates query's probe, and cannot appear since
            // only retention deletes and we hold its lock.
            let existing = tx
                .query(
                    INSTANCES_GC_PARENTS_EXISTING,
                    &[&outside_names, &outside_ids],
                )
                .await
                .map_err(fail)?;
            self.count_round_trips(1);
            let existing = existing
                .iter()
                .map(|row| {
                    Ok((
                        column::<String>(row, "workflow_name", GC)?,
                        column::<String>(row, "workflow_id", GC)?,
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
            for (slot, parent) in keep.iter_mut().zip(&parents) {
                if !parent.0.is_empty() && existing.contains(parent) && !locked.contains(parent) {
                    *slot = false;
                }
            }
        }
        self.keep_unless_busy(tx, &names, &ids, &mut keep).await?;
        let deleted_a_child = keep
            .iter()
            .zip(&parents)
            .any(|(kept, parent)| *kept && !parent.0.is_empty());
        let (names, ids): (Vec<String>, Vec<String>) = names
            .into_iter()
            .zip(ids)
            .zip(keep)
            .filter_map(|(pair, keep)| keep.then_some(pair))
            .unzip();
        self.count_round_trips(1);
        let row = tx
            .query_one(INSTANCES_GC_DELETE, &[&names, &ids])
            .await
            .map_err(fail)?;
        let deleted = GcBatch {
            instances: count(&row, "instances", GC)?,
            journal: count(&row, "journal", GC)?,
            timers: count(&row, "timers", GC)?,
            awakeables: count(&row, "awakeables", GC)?,
            signal_waiters: count(&row, "signal_waiters", GC)?,
            remote_tasks: count(&row, "remote_tasks", GC)?,
            locked_out: false,
        };
        Ok(GcRound {
            deleted,
            deleted_a_child,
        })
    }
}

impl PgStore {
    /// Locks the wake-source rows of the candidates still kept, and lets go of those with a
    /// row held elsewhere (`INSTANCES_GC_BUSY`).
    async fn keep_unless_busy(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        names: &[String],
        ids: &[String],
        keep: &mut [bool],
    ) -> Result<()> {
        let (kept_names, kept_ids): (Vec<&String>, Vec<&String>) = names
            .iter()
            .zip(ids)
            .zip(keep.iter())
            .filter_map(|(pair, kept)| kept.then_some(pair))
            .unzip();
        if kept_names.is_empty() {
            return Ok(());
        }
        self.count_round_trips(1);
        let busy = tx
            .query(INSTANCES_GC_BUSY, &[&kept_names, &kept_ids])
            .await
            .map_err(|e| self.failed(GC, e))?;
        for row in &busy {
            let name: String = column(row, "workflow_name", GC)?;
            let id: String = column(row, "workflow_id", GC)?;
            for ((n, i), kept) in names.iter().zip(ids).zip(keep.iter_mut()) {
                if *n == name && *i == id {
                    *kept = false;
                }
            }
        }
        Ok(())
    }
}

/// What one round of a batch deleted.
#[derive(Debug, Default)]
struct GcRound {
    deleted: GcBatch,
    /// Whether an instance with a parent went: the parent may be a candidate now.
    deleted_a_child: bool,
}

#[async_trait::async_trait]
impl RetentionStore for PgStore {
    async fn instances_gc(&self, request: &GcRequest) -> Result<GcBatch> {
        traced(store_span!("instances_gc"), self.gc_batch(request)).await
    }

    async fn instances_gc_eligible(&self, request: &GcRequest) -> Result<u64> {
        traced(store_span!("instances_gc_eligible"), async {
            let head = self
                .query_one(
                    GC_ELIGIBLE,
                    INSTANCES_GC_CUTOFF,
                    &[&request.now, &span_ms(request.older_than)],
                )
                .await?;
            let cutoff: OffsetDateTime = column(&head, "cutoff", GC_ELIGIBLE)?;
            let row = self
                .query_one(GC_ELIGIBLE, INSTANCES_GC_ELIGIBLE, &[&cutoff])
                .await?;
            count(&row, "n", GC_ELIGIBLE)
        })
        .await
    }
}
