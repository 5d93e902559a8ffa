//! [`VersionStore`] for [`SqliteStore`]: heartbeats and moves through the writer, counts and
//! lists through a reader.

use std::time::Duration;

use keiro_journal::store::Result;
use keiro_journal::{span::traced, store_span, InstanceKey};
use keiro_lease::versions::{VersionCount, VersionStore, WorkerBeat, WorkerRow};

use super::SqliteStore;
use crate::row::micros;
use crate::versions;

#[async_trait::async_trait]
impl VersionStore for SqliteStore {
    fn app_version(&self) -> &str {
        &self.inner.config.app_version
    }

    async fn worker_beat(&self, beat: &WorkerBeat) -> Result<()> {
        let beat = beat.clone();
        traced(
            store_span!("worker_beat"),
            self.inner.writer.write(versions::BEAT, move |conn, clock| {
                versions::worker_beat(conn, micros(clock), &beat)
            }),
        )
        .await
    }

    async fn worker_leave(&self, worker_id: &str) -> Result<bool> {
        let worker_id = worker_id.to_owned();
        traced(
            store_span!("worker_leave"),
            self.inner.writer.write(versions::LEAVE, move |conn, _| {
                versions::worker_leave(conn, &worker_id)
            }),
        )
        .await
    }

    async fn workers_forget(&self, not_seen_for: Duration) -> Result<u64> {
        traced(
            store_span!("workers_forget"),
            self.inner
                .writer
                .write(versions::FORGET, move |conn, clock| {
                    let before = micros(clock).saturating_sub(
                        i64::try_from(not_seen_for.as_micros()).unwrap_or(i64::MAX),
                    );
                    versions::workers_forget(conn, before)
                }),
        )
        .await
    }

    async fn workers_list(&self) -> Result<Vec<WorkerRow>> {
        self.read(versions::WORKERS, |conn, _| versions::workers_list(conn))
            .await
    }

    async fn versions_count(&self) -> Result<Vec<VersionCount>> {
        self.read(versions::COUNT, |conn, _| versions::versions_count(conn))
            .await
    }

    async fn versions_move(&self, from: &str, to: &str) -> Result<u64> {
        let (from, to) = (from.to_owned(), to.to_owned());
        traced(
            store_span!("versions_move"),
            self.inner.writer.write(versions::MOVE, move |conn, clock| {
                versions::versions_move(conn, micros(clock), &from, &to)
            }),
        )
        .await
    }

    async fn version_live_runs(&self, version: &str, limit: i64) -> Result<Vec<InstanceKey>> {
        let version = version.to_owned();
        self.read(versions::LIVE_RUNS, move |conn, _| {
            versions::version_live_runs(conn, &version, limit)
        })
        .await
    }
}
