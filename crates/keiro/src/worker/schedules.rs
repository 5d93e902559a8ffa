//! A worker's schedules: where they live, how its scheduler runs, and the scheduler pass a
//! test or a custom loop runs by hand. The schedules themselves are made and operated through
//! [`Keiro::schedule`](crate::Keiro::schedule) and [`Keiro::schedules`](crate::Keiro::schedules).

use std::sync::Arc;

use keiro_resume::{ScheduleStore, SchedulerOptions, SchedulerSummary};
use time::OffsetDateTime;

use super::Worker;
use crate::schedule::unsupported;
use crate::Error;

/// A worker's schedule store and scheduler options.
#[derive(Clone)]
pub(super) struct WorkerSchedules {
    pub(super) store: Option<Arc<dyn ScheduleStore>>,
    pub(super) options: Option<SchedulerOptions>,
}

impl Default for WorkerSchedules {
    fn default() -> Self {
        Self {
            store: None,
            options: Some(SchedulerOptions::default()),
        }
    }
}

impl WorkerSchedules {
    /// Checks the scheduler's options, when it runs.
    pub(super) fn validate(&self) -> Result<(), keiro_resume::InvalidOptions> {
        self.options
            .as_ref()
            .map_or(Ok(()), SchedulerOptions::validate)
    }
}

impl Worker {
    /// One scheduler pass at `now` (`None`: the store's clock), for tests and custom loops:
    /// take or renew the leadership, then start the due runs of every schedule.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// let worker = keiro.worker().build()?;
    /// let summary = worker.schedule_once(None).await?;
    /// assert_eq!(summary.started, 0);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] without a schedule store or with the scheduler turned off,
    /// [`Error::Store`].
    pub async fn schedule_once(
        &self,
        now: Option<OffsetDateTime>,
    ) -> Result<SchedulerSummary, Error> {
        let (Some(store), Some(options)) = (&self.schedules.store, &self.schedules.options) else {
            return Err(unsupported());
        };
        Ok(keiro_resume::schedule_once(store.as_ref(), options, now).await?)
    }

    /// Starts the scheduler loop, when this worker has a schedule store and its scheduler is on.
    pub(super) fn spawn_scheduler(
        &self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Option<tokio::task::JoinHandle<SchedulerSummary>> {
        let store = self.schedules.store.clone()?;
        let options = self.schedules.options.clone()?;
        Some(tokio::spawn(keiro_resume::run_scheduler_loop(
            store, options, shutdown,
        )))
    }
}
