//! Schedules in the facade: create or update one with [`Keiro::schedule`], operate them with
//! [`Keiro::schedules`], and let every [`Worker`](crate::Worker) run the elected scheduler.
//!
//! Where bad input is caught: a cron expression that does not parse, an unknown time zone, a
//! bad interval, name or catch-up bound are refused by [`ScheduleBuilder::save`] with
//! [`Error::Schedule`], before anything is written. Whether a worker registers the workflow
//! is not checked, there or by the scheduler: a tick starts its workflow by name, whichever
//! worker's scheduler leads, and the run waits for a worker that registers it, as any
//! [`Keiro::start`] does (services sharing a schema share one scheduler). A due schedule that
//! cannot start (the store refuses its runs, or a row written past these checks) gets the
//! reason in its `last_error` and is backed off (`retry_at`) without holding up the others;
//! `keiro schedule list` shows both.

use std::sync::Arc;
use std::time::Duration;

use keiro_journal::{store::encode_payload, Started, WorkflowName};
use keiro_resume::{ScheduleStore, TIME_ZONE_DEFAULT};
use serde::Serialize;
use serde_json::Value;
use time::OffsetDateTime;

use crate::{Error, Keiro};

pub use keiro_resume::{
    Cadence, CatchUp, Overlap, Schedule, ScheduleError, ScheduleSpec, SchedulerOptions,
    SchedulerSummary,
};

/// What a schedule call returns on a store without schedules.
pub(crate) fn unsupported() -> Error {
    Error::Unsupported {
        what: "schedules (the store was built with `KeiroBuilder::lease_only`)",
    }
}

impl Keiro {
    /// Creates or updates schedule `name`, which starts `workflow`; finish with
    /// [`save`](ScheduleBuilder::save).
    ///
    /// ```no_run
    /// # async fn demo(keiro: keiro::Keiro) -> Result<(), keiro::Error> {
    /// use keiro::{schedule::CatchUp, schedule::Overlap};
    /// keiro.schedule("nightly-report", "report")
    ///     .cron("30 2 * * *")
    ///     .time_zone("Europe/Berlin")
    ///     .input(&"all-regions")
    ///     .overlap(Overlap::Skip)
    ///     .catch_up(CatchUp::Last)
    ///     .save()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn schedule(&self, name: &str, workflow: &str) -> ScheduleBuilder {
        ScheduleBuilder {
            store: self.schedules.clone(),
            payload_len_max: self.payload_len_max,
            name: name.to_owned(),
            workflow: workflow.to_owned(),
            cadence: None,
            time_zone: TIME_ZONE_DEFAULT.to_owned(),
            input: Ok(Value::Null),
            overlap: Overlap::default(),
            catch_up: CatchUp::default(),
        }
    }

    /// The store's schedule half (`None` for a store built with `KeiroBuilder::lease_only`), for tests and
    /// custom schedulers.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// assert!(keiro::Keiro::temporary()?.schedule_store().is_some());
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn schedule_store(&self) -> Option<&Arc<dyn ScheduleStore>> {
        self.schedules.as_ref()
    }

    /// The schedules' operations: list, pause, resume, trigger, delete.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// assert!(keiro.schedules().list().await?.is_empty());
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn schedules(&self) -> Schedules {
        Schedules {
            store: self.schedules.clone(),
        }
    }
}

/// Builds a schedule's definition; see [`Keiro::schedule`].
#[must_use]
pub struct ScheduleBuilder {
    store: Option<Arc<dyn ScheduleStore>>,
    payload_len_max: usize,
    name: String,
    workflow: String,
    cadence: Option<Cadence>,
    time_zone: String,
    input: Result<Value, keiro_journal::WorkflowError>,
    overlap: Overlap,
    catch_up: CatchUp,
}

impl std::fmt::Debug for ScheduleBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScheduleBuilder")
            .field("name", &self.name)
            .field("workflow", &self.workflow)
            .field("cadence", &self.cadence)
            .finish_non_exhaustive()
    }
}

impl ScheduleBuilder {
    /// Ticks by a cron expression: five fields (minute first) or six (seconds first), with
    /// `L`, `W`, `#` and names; in [`time_zone`](Self::time_zone).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// let spec = keiro.schedule("nightly", "report").cron("30 2 * * *").spec()?;
    /// # let _ = spec;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn cron(mut self, expression: &str) -> Self {
        self.cadence = Some(Cadence::cron(expression, ""));
        self
    }

    /// Ticks every `interval` (whole seconds, at least one), at its multiples since the Unix
    /// epoch.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// let every = std::time::Duration::from_secs(15 * 60);
    /// let spec = keiro.schedule("sync", "pull").every(every).spec()?;
    /// # let _ = spec;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn every(mut self, interval: Duration) -> Self {
        self.cadence = Some(Cadence::Every(interval));
        self
    }

    /// The IANA time zone a cron expression is read in. Defaults to [`TIME_ZONE_DEFAULT`].
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// let spec = keiro.schedule("nightly", "report").cron("0 6 * * *").time_zone("Asia/Tokyo").spec()?;
    /// # let _ = spec;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn time_zone(mut self, zone: &str) -> Self {
        zone.clone_into(&mut self.time_zone);
        self
    }

    /// The input of every run. Defaults to JSON `null`.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// let spec = keiro.schedule("nightly", "report").cron("0 6 * * *").input(&"eu-west").spec()?;
    /// # let _ = spec;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn input<T: Serialize + ?Sized>(mut self, input: &T) -> Self {
        self.input = encode_payload("schedule input", input, self.payload_len_max);
        self
    }

    /// What a tick does while the previous run is live. Defaults to [`Overlap::Skip`].
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// let spec = keiro.schedule("sync", "pull")
    ///     .every(std::time::Duration::from_secs(60))
    ///     .overlap(keiro::schedule::Overlap::Skip)
    ///     .spec()?;
    /// # let _ = spec;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn overlap(mut self, overlap: Overlap) -> Self {
        self.overlap = overlap;
        self
    }

    /// What happens to missed ticks. Defaults to [`CatchUp::None`].
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// let spec = keiro.schedule("nightly", "report")
    ///     .cron("0 6 * * *")
    ///     .catch_up(keiro::schedule::CatchUp::Last)
    ///     .spec()?;
    /// # let _ = spec;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn catch_up(mut self, catch_up: CatchUp) -> Self {
        self.catch_up = catch_up;
        self
    }

    /// The checked definition, without writing it.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// assert!(keiro.schedule("nightly", "report").cron("0 6 * * *").spec().is_ok());
    /// assert!(keiro.schedule("nightly", "report").cron("not cron").spec().is_err());
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// As [`save`](Self::save), less the store's.
    pub fn spec(self) -> Result<ScheduleSpec, Error> {
        let workflow = WorkflowName::new(self.workflow)
            .map_err(keiro_resume::ScheduleError::InvalidWorkflow)?;
        let cadence = match self.cadence {
            Some(Cadence::Cron { expression, .. }) => Cadence::Cron {
                expression,
                time_zone: self.time_zone,
            },
            Some(every) => every,
            None => return Err(keiro_resume::ScheduleError::NoCadence { name: self.name }.into()),
        };
        let spec = ScheduleSpec {
            name: self.name,
            workflow,
            cadence,
            input: self.input.map_err(Error::Payload)?,
            overlap: self.overlap,
            catch_up: self.catch_up,
        };
        spec.validate()?;
        // A cron expression for a date that never comes is refused here, on this process's
        // clock; the store computes the real next tick on its own.
        spec.first_tick_after(OffsetDateTime::now_utc())?;
        Ok(spec)
    }

    /// Creates the schedule, or updates its definition (its next tick is recomputed from the
    /// store's clock; its paused flag and history are kept).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// let every = std::time::Duration::from_secs(60);
    /// let schedule = keiro.schedule("heartbeat", "ping").every(every).save().await?;
    /// println!("next tick {:?}", schedule.next_tick);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Schedule`] for a cron expression that does not parse, an unknown time zone, a
    /// bad interval, name or catch-up bound, or no cadence; [`Error::Payload`] for an input
    /// that does not encode or is too large; [`Error::Unsupported`] on a store without
    /// schedules; [`Error::Store`].
    pub async fn save(self) -> Result<Schedule, Error> {
        let store = self.store.clone().ok_or_else(unsupported)?;
        let spec = self.spec()?;
        Ok(store.schedule_upsert(&spec, None).await?)
    }
}

/// The operations on existing schedules; see [`Keiro::schedules`].
#[derive(Clone)]
pub struct Schedules {
    store: Option<Arc<dyn ScheduleStore>>,
}

impl std::fmt::Debug for Schedules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schedules").finish_non_exhaustive()
    }
}

impl Schedules {
    fn store(&self) -> Result<&Arc<dyn ScheduleStore>, Error> {
        self.store.as_ref().ok_or_else(unsupported)
    }

    /// Every schedule, by name.
    ///
    /// ```no_run
    /// # async fn demo(keiro: keiro::Keiro) -> Result<(), keiro::Error> {
    /// for s in keiro.schedules().list().await? {
    ///     println!("{} next {:?} error {:?}", s.spec.name, s.next_tick, s.last_error);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`], [`Error::Store`].
    pub async fn list(&self) -> Result<Vec<Schedule>, Error> {
        Ok(self.store()?.schedules_list().await?)
    }

    /// One schedule.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// let every = std::time::Duration::from_secs(60);
    /// keiro.schedule("heartbeat", "ping").every(every).save().await?;
    /// assert!(keiro.schedules().get("heartbeat").await?.is_some());
    /// assert!(keiro.schedules().get("nothing").await?.is_none());
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`], [`Error::Store`].
    pub async fn get(&self, name: &str) -> Result<Option<Schedule>, Error> {
        Ok(self.store()?.schedule_get(name).await?)
    }

    /// Pauses a schedule: no tick starts anything until it is resumed.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// let every = std::time::Duration::from_secs(60);
    /// keiro.schedule("heartbeat", "ping").every(every).save().await?;
    /// keiro.schedules().pause("heartbeat").await?;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NoSchedule`], [`Error::Unsupported`], [`Error::Store`].
    pub async fn pause(&self, name: &str) -> Result<Schedule, Error> {
        self.set_paused(name, true).await
    }

    /// Resumes a paused schedule from its next tick after now: the ticks that fell while it
    /// was paused are skipped, whatever its catch-up policy.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// let every = std::time::Duration::from_secs(60);
    /// keiro.schedule("heartbeat", "ping").every(every).save().await?;
    /// keiro.schedules().pause("heartbeat").await?;
    /// keiro.schedules().resume("heartbeat").await?;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NoSchedule`], [`Error::Unsupported`], [`Error::Store`].
    pub async fn resume(&self, name: &str) -> Result<Schedule, Error> {
        self.set_paused(name, false).await
    }

    async fn set_paused(&self, name: &str, paused: bool) -> Result<Schedule, Error> {
        self.store()?
            .schedule_set_paused(name, paused, None)
            .await?
            .ok_or_else(|| Error::NoSchedule {
                name: name.to_owned(),
            })
    }

    /// Starts one run now, outside the cadence, whatever the overlap policy and even when
    /// paused, with the id `<name>@<now, to the millisecond>`.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// let every = std::time::Duration::from_secs(3600);
    /// keiro.schedule("heartbeat", "ping").every(every).save().await?;
    /// let started = keiro.schedules().trigger("heartbeat").await?;
    /// assert!(started.created);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NoSchedule`], [`Error::Unsupported`], [`Error::Store`].
    pub async fn trigger(&self, name: &str) -> Result<Started, Error> {
        self.store()?
            .schedule_trigger(name, None)
            .await?
            .ok_or_else(|| Error::NoSchedule {
                name: name.to_owned(),
            })
    }

    /// Deletes a schedule; the runs it started stay. `false` when there was none.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// let every = std::time::Duration::from_secs(60);
    /// keiro.schedule("heartbeat", "ping").every(every).save().await?;
    /// assert!(keiro.schedules().delete("heartbeat").await?);
    /// assert!(!keiro.schedules().delete("heartbeat").await?);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`], [`Error::Store`].
    pub async fn delete(&self, name: &str) -> Result<bool, Error> {
        Ok(self.store()?.schedule_delete(name).await?)
    }
}
