//! Application versions on one SQLite file (migration 0007; PostgreSQL's are plain statements
//! in crates/postgres/src/versions.rs): workers' heartbeat rows in `keiro_workers`, the runs per
//! version, and the move of one version's live runs to another. The empty version is stored as
//! NULL (unversioned), as `keiro_app_version()` answers for a store with no version.

use crate::cached::Cached;
use keiro_journal::store::Result;
use keiro_journal::InstanceKey;
use keiro_lease::versions::{VersionCount, Versions, WorkerBeat, WorkerRow};
use rusqlite::{params, Connection};
use serde_json::Value;

use crate::error::{malformed, store};
use crate::row;

pub(crate) const BEAT: &str = "writing a worker's heartbeat";
pub(crate) const LEAVE: &str = "deleting a worker's heartbeat";
pub(crate) const FORGET: &str = "deleting the heartbeats of workers not seen";
pub(crate) const WORKERS: &str = "listing workers";
pub(crate) const COUNT: &str = "counting runs per version";
pub(crate) const MOVE: &str = "moving the runs of a version";
pub(crate) const LIVE_RUNS: &str = "listing the live runs of a version";

const WORKER_BEAT: &str = "INSERT INTO keiro_workers \
         (worker_id, app_version, serves, queues, started_at, last_seen) \
     VALUES (?1, nullif(?2, ''), ?3, ?4, ?5, ?5) \
     ON CONFLICT (worker_id) DO UPDATE SET app_version = excluded.app_version, \
         serves = excluded.serves, queues = excluded.queues, last_seen = excluded.last_seen";

/// Writes (or refreshes) a worker's heartbeat row, `last_seen` at `now`.
pub(crate) fn worker_beat(conn: &Connection, now: i64, beat: &WorkerBeat) -> Result<()> {
    let serves = beat
        .serves
        .as_filter()
        .map(|list| Value::from(list.to_vec()).to_string());
    let queues = Value::from(beat.queues.clone()).to_string();
    conn.execute_cached(
        WORKER_BEAT,
        params![beat.worker_id, beat.app_version, serves, queues, now],
    )
    .map_err(|e| store(BEAT, e))?;
    Ok(())
}

const WORKER_LEAVE: &str = "DELETE FROM keiro_workers WHERE worker_id = ?1";

/// Deletes a worker's row; whether it was there.
pub(crate) fn worker_leave(conn: &Connection, worker_id: &str) -> Result<bool> {
    Ok(conn
        .execute_cached(WORKER_LEAVE, [worker_id])
        .map_err(|e| store(LEAVE, e))?
        > 0)
}

const WORKERS_FORGET: &str = "DELETE FROM keiro_workers WHERE last_seen < ?1";

/// Deletes the rows of workers last seen before `before` (micros); how many.
pub(crate) fn workers_forget(conn: &Connection, before: i64) -> Result<u64> {
    let gone = conn
        .execute_cached(WORKERS_FORGET, [before])
        .map_err(|e| store(FORGET, e))?;
    Ok(u64::try_from(gone).unwrap_or(u64::MAX))
}

const WORKERS_LIST: &str = "SELECT worker_id, coalesce(app_version, ''), serves, queues, \
         started_at, last_seen \
     FROM keiro_workers ORDER BY worker_id";

type StoredWorker = (String, String, Option<String>, String, i64, i64);

/// Every heartbeat row, by worker id.
pub(crate) fn workers_list(conn: &Connection) -> Result<Vec<WorkerRow>> {
    let rows: Vec<StoredWorker> = conn
        .prepare_cached(WORKERS_LIST)
        .and_then(|mut s| {
            s.query_map([], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            })?
            .collect()
        })
        .map_err(|e| store(WORKERS, e))?;
    let list = |text: &str| -> Result<Vec<String>> {
        serde_json::from_str(text).map_err(|e| malformed(WORKERS, format_args!("a list: {e}")))
    };
    rows.into_iter()
        .map(
            |(worker_id, app_version, serves, queues, started_at, last_seen)| {
                Ok(WorkerRow {
                    worker_id,
                    app_version,
                    serves: match serves {
                        None => Versions::Any,
                        Some(text) => Versions::only(list(&text)?),
                    },
                    queues: list(&queues)?,
                    started_at: row::instant(started_at, WORKERS)?,
                    last_seen: row::instant(last_seen, WORKERS)?,
                })
            },
        )
        .collect()
}

const VERSIONS_COUNT: &str = "SELECT coalesce(app_version, ''), status, count(*) \
     FROM workflows GROUP BY 1, 2 ORDER BY 1, 2";

/// How many runs of each version are in each status.
pub(crate) fn versions_count(conn: &Connection) -> Result<Vec<VersionCount>> {
    let rows: Vec<(String, String, i64)> = conn
        .prepare_cached(VERSIONS_COUNT)
        .and_then(|mut s| {
            s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect()
        })
        .map_err(|e| store(COUNT, e))?;
    rows.into_iter()
        .map(|(app_version, status, runs)| {
            Ok(VersionCount {
                app_version,
                status: row::status(&status, COUNT)?,
                runs: u64::try_from(runs)
                    .map_err(|_| malformed(COUNT, format_args!("negative count {runs}")))?,
            })
        })
        .collect()
}

// Live runs only: a terminal run's version is its history.
const VERSIONS_MOVE: &str = "UPDATE workflows SET app_version = nullif(?2, ''), updated_at = ?3 \
     WHERE status IN ('running', 'suspended') AND app_version IS nullif(?1, '')";

/// Hands the live runs of version `from` to `to`; how many moved.
pub(crate) fn versions_move(conn: &Connection, now: i64, from: &str, to: &str) -> Result<u64> {
    let moved = conn
        .execute_cached(VERSIONS_MOVE, params![from, to, now])
        .map_err(|e| store(MOVE, e))?;
    Ok(u64::try_from(moved).unwrap_or(u64::MAX))
}

const VERSION_LIVE_RUNS: &str = "SELECT workflow_name, workflow_id FROM workflows \
     WHERE status IN ('running', 'suspended') AND app_version IS nullif(?1, '') \
     ORDER BY workflow_name, workflow_id LIMIT ?2";

/// Up to `limit` live runs of `version`, by key.
pub(crate) fn version_live_runs(
    conn: &Connection,
    version: &str,
    limit: i64,
) -> Result<Vec<InstanceKey>> {
    let rows: Vec<(String, String)> = conn
        .prepare_cached(VERSION_LIVE_RUNS)
        .and_then(|mut s| {
            s.query_map(params![version, limit], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect()
        })
        .map_err(|e| store(LIVE_RUNS, e))?;
    rows.iter()
        .map(|(name, id)| row::key(name, id, LIVE_RUNS))
        .collect()
}
