//! Application versions on Postgres (migration 0025): workers' heartbeat rows in
//! `keiro_workers`, the runs per version, and the move of one version's live runs to another.
//!
//! Plain parameterized statements, each its own transaction. The empty version is stored as
//! NULL (unversioned), which is what the `app_version` column's default gives a connection
//! with no `keiro.app_version` setting.

use keiro_journal::store::Result;
use keiro_journal::{span::traced, store_span, InstanceKey};
use keiro_lease::versions::{VersionCount, VersionStore, Versions, WorkerBeat, WorkerRow};

use std::time::Duration;

use crate::ops::span_ms;
use crate::row::{self, column};
use crate::PgStore;

const BEAT: &str = "writing a worker's heartbeat";
const LEAVE: &str = "deleting a worker's heartbeat";
const FORGET: &str = "deleting the heartbeats of workers not seen";
const WORKERS: &str = "listing workers";
const COUNT: &str = "counting runs per version";
const MOVE: &str = "moving the runs of a version";
const LIVE_RUNS: &str = "listing the live runs of a version";

const WORKER_BEAT: &str = "INSERT INTO keiro_workers AS k \
         (worker_id, app_version, serves, queues, started_at, last_seen) \
     VALUES ($1, nullif($2, ''), $3, $4, now(), now()) \
     ON CONFLICT (worker_id) DO UPDATE SET app_version = excluded.app_version, \
         serves = excluded.serves, queues = excluded.queues, last_seen = now()";

const WORKER_LEAVE: &str = "DELETE FROM keiro_workers WHERE worker_id = $1";

const WORKERS_FORGET: &str =
    "DELETE FROM keiro_workers WHERE last_seen < now() - $1::bigint * interval '1 millisecond'";

const WORKERS_LIST: &str = "SELECT worker_id, coalesce(app_version, '') AS app_version, serves, \
         queues, started_at, last_seen \
     FROM keiro_workers ORDER BY worker_id";

const VERSIONS_COUNT: &str = "SELECT coalesce(app_version, '') AS app_version, status, \
         count(*) AS runs \
     FROM workflows GROUP BY 1, 2 ORDER BY 1, 2";

// Live runs only: a terminal run's version is its history. workflows_active_idx finds them.
const VERSIONS_MOVE: &str =
    "UPDATE workflows SET app_version = nullif($2, ''), updated_at = now() \
     WHERE status IN ('running', 'suspended') AND app_version IS NOT DISTINCT FROM nullif($1, '')";

const VERSION_LIVE_RUNS: &str = "SELECT workflow_name, workflow_id FROM workflows \
     WHERE status IN ('running', 'suspended') AND app_version IS NOT DISTINCT FROM nullif($1, '') \
     ORDER BY workflow_name, workflow_id LIMIT $2";

#[async_trait::async_trait]
impl VersionStore for PgStore {
    fn app_version(&self) -> &str {
        PgStore::app_version(self)
    }

    async fn worker_beat(&self, beat: &WorkerBeat) -> Result<()> {
        let span = store_span!("worker_beat");
        let serves = beat.serves.as_filter();
        traced(span, async {
            self.db()
                .execute(
                    BEAT,
                    WORKER_BEAT,
                    &[&beat.worker_id, &beat.app_version, &serves, &beat.queues],
                )
                .await
                .map(drop)
        })
        .await
    }

    async fn worker_leave(&self, worker_id: &str) -> Result<bool> {
        let span = store_span!("worker_leave");
        traced(span, async {
            Ok(self
                .db()
                .execute(LEAVE, WORKER_LEAVE, &[&worker_id])
                .await?
                > 0)
        })
        .await
    }

    async fn workers_forget(&self, not_seen_for: Duration) -> Result<u64> {
        let span = store_span!("workers_forget");
        let window = span_ms(not_seen_for);
        traced(span, self.db().execute(FORGET, WORKERS_FORGET, &[&window])).await
    }

    async fn workers_list(&self) -> Result<Vec<WorkerRow>> {
        let rows = self.db().query(WORKERS, WORKERS_LIST, &[]).await?;
        rows.iter()
            .map(|r| {
                let serves: Option<Vec<String>> = column(r, "serves", WORKERS)?;
                Ok(WorkerRow {
                    worker_id: column(r, "worker_id", WORKERS)?,
                    app_version: column(r, "app_version", WORKERS)?,
                    serves: serves.map_or(Versions::Any, Versions::only),
                    queues: column(r, "queues", WORKERS)?,
                    started_at: column(r, "started_at", WORKERS)?,
                    last_seen: column(r, "last_seen", WORKERS)?,
                })
            })
            .collect()
    }

    async fn versions_count(&self) -> Result<Vec<VersionCount>> {
        let rows = self.db().query(COUNT, VERSIONS_COUNT, &[]).await?;
        rows.iter()
            .map(|r| {
                let status: String = column(r, "status", COUNT)?;
                Ok(VersionCount {
                    app_version: column(r, "app_version", COUNT)?,
                    status: row::status(&status, COUNT)?,
                    runs: row::count(r, "runs", COUNT)?,
                })
            })
            .collect()
    }

    async fn versions_move(&self, from: &str, to: &str) -> Result<u64> {
        let span = store_span!("versions_move");
        traced(span, self.db().execute(MOVE, VERSIONS_MOVE, &[&from, &to])).await
    }

    async fn version_live_runs(&self, version: &str, limit: i64) -> Result<Vec<InstanceKey>> {
        let rows = self
            .db()
            .query(LIVE_RUNS, VERSION_LIVE_RUNS, &[&version, &limit])
            .await?;
        rows.iter()
            .map(|r| {
                let name: String = column(r, "workflow_name", LIVE_RUNS)?;
                let id: String = column(r, "workflow_id", LIVE_RUNS)?;
                row::key(&name, &id, LIVE_RUNS)
            })
            .collect()
    }
}
