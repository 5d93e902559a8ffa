//! [`SqliteStore`]'s queue operations (`QueueStore`'s methods, `LeaseStore::queue_admit`, and
//! the start on a queue that `instance_start` routes to), each turning a rule's outcome of the
//! `queue` module into the traits' answer as crates/postgres/src/ops/queue.rs does.

use std::time::Duration;

use keiro_journal::queue::{DebounceRequest, QueueInfo, QueueRefusal, QueueSpec, QueueStart};
use keiro_journal::store::{Error as StoreError, Result, StartRequest};
use keiro_journal::{span::traced, store_span, Started, WorkflowName};
use keiro_lease::{Claim, ClaimBatch, QueueStore, Versions};
use time::OffsetDateTime;

use crate::queue::{self, QueueStartCode};
use crate::storable;

use super::lease::claim;
use super::{span_ms, SqliteStore};

const DECLARE: &str = "declaring a queue";
const PAUSE: &str = "pausing or resuming a queue";
const WEIGHT: &str = "weighting a queue key";
const START: &str = "starting an instance on a queue";
const ADMIT: &str = "admitting runs of a queue";
const DEBOUNCE: &str = "debouncing a start";

impl SqliteStore {
    /// Records `spec`, or replaces the limits of the queue of that name; pause state, key
    /// weights and fairness progress stay (`QueueStore::queue_declare`).
    ///
    /// # Errors
    ///
    /// `ValueRefused` for a name holding a NUL; a non-retryable `Database` error for a value
    /// the table's checks refuse (a limit below 1).
    pub async fn queue_declare(&self, spec: &QueueSpec) -> Result<()> {
        storable::text(DECLARE, "queue name", &spec.name)?;
        let spec = spec.clone();
        self.inner
            .writer
            .write(DECLARE, move |conn, now| {
                queue::queue_declare(conn, now, &spec)
            })
            .await
    }

    /// Pauses (`true`) or resumes admission to `queue`; whether it exists
    /// (`QueueStore::queue_set_paused`). A resumed queue wakes the workers serving it.
    ///
    /// # Errors
    ///
    /// `ValueRefused` for a name holding a NUL; `Unavailable` when the file stayed locked or
    /// the commit failed.
    pub async fn queue_set_paused(&self, queue: &str, paused: bool) -> Result<bool> {
        storable::text(PAUSE, "queue name", queue)?;
        let queue = queue.to_owned();
        self.inner
            .writer
            .write(PAUSE, move |conn, now| {
                queue::queue_set_paused(conn, now, &queue, paused)
            })
            .await
    }

    /// Sets `key`'s weight under weighted fairness; whether the queue exists
    /// (`QueueStore::queue_key_weight`).
    ///
    /// # Errors
    ///
    /// `ValueRefused` for a name or key holding a NUL; a non-retryable `Database` error for a
    /// weight below 1.
    pub async fn queue_key_weight(&self, queue: &str, key: &str, weight: i32) -> Result<bool> {
        storable::text(WEIGHT, "queue name", queue)?;
        storable::text(WEIGHT, "queue key", key)?;
        let (queue, key) = (queue.to_owned(), key.to_owned());
        self.inner
            .writer
            .write(WEIGHT, move |conn, _| {
                queue::queue_key_weight(conn, &queue, &key, weight)
            })
            .await
    }

    /// Starts `request` on its queue (`queue` is `request.queue`): what
    /// `JournalStore::instance_start` does for a request with a queue.
    ///
    /// # Errors
    ///
    /// `QueueRefused` for an unknown queue, a dedup id or priority the queue does not take, or
    /// a dedup id a live run holds on a queue that refuses duplicates; `ValueRefused` for an
    /// input, queue name, key or dedup id PostgreSQL would refuse.
    pub(crate) async fn queue_start(
        &self,
        request: &StartRequest,
        queue: &QueueStart,
    ) -> Result<Started> {
        storable::value(START, &request.input)?;
        storable::text(START, "queue name", &queue.queue)?;
        for (what, text) in [("queue key", &queue.key), ("dedup id", &queue.dedup_id)] {
            if let Some(text) = text {
                storable::text(START, what, text)?;
            }
        }
        let (request, queue) = (request.clone(), queue.clone());
        self.inner
            .writer
            .write(START, move |conn, now| {
                let parent = request
                    .parent
                    .as_ref()
                    .map(|p| (p.name.as_str(), p.id.as_str()));
                let code = queue::queue_start(
                    conn,
                    now,
                    request.key.name.as_str(),
                    request.key.id.as_str(),
                    &request.input,
                    parent,
                    request.priority,
                    &queue.queue,
                    queue.key.as_deref(),
                    queue.dedup_id.as_deref(),
                    queue.not_before,
                )?;
                let refused = |refusal| StoreError::QueueRefused {
                    queue: queue.queue.clone(),
                    refusal,
                };
                match code {
                    QueueStartCode::Started(created, row) => {
                        if created {
                            crate::attribute::attributes_put(
                                conn,
                                now,
                                request.key.name.as_str(),
                                request.key.id.as_str(),
                                &request.attributes,
                            )?;
                        }
                        Ok(Started {
                            created,
                            instance: row.instance(START)?,
                        })
                    }
                    QueueStartCode::Existing(row) => Ok(Started {
                        created: false,
                        instance: row.instance(START)?,
                    }),
                    QueueStartCode::Duplicate(row) => Err(refused(QueueRefusal::Duplicate {
                        holder: row.instance(START)?.key,
                    })),
                    QueueStartCode::Unknown => Err(refused(QueueRefusal::Unknown)),
                    QueueStartCode::DedupNotEnabled => Err(refused(QueueRefusal::DedupNotEnabled)),
                    QueueStartCode::PriorityNotEnabled => {
                        Err(refused(QueueRefusal::PriorityNotEnabled))
                    }
                }
            })
            .await
    }

    /// Admits and claims up to `limit` waiting runs of `queues` whose workflow name is in
    /// `names`, for `owner` until `now + ttl`, under each queue's limits
    /// (`LeaseStore::queue_admit`).
    ///
    /// # Errors
    ///
    /// `ValueRefused` for a queue name holding a NUL; `Malformed` for a row keiro cannot read.
    pub async fn queue_admit(
        &self,
        queues: &[String],
        names: &[WorkflowName],
        owner: &str,
        ttl: Duration,
        limit: i64,
        now: Option<OffsetDateTime>,
    ) -> Result<Vec<Claim>> {
        self.queue_admit_serving(queues, names, &Versions::Any, owner, ttl, limit, now)
            .await
    }

    /// [`queue_admit`](Self::queue_admit) of the runs whose version is one `versions` serves
    /// (`LeaseStore::queue_admit_serving`).
    ///
    /// # Errors
    ///
    /// As [`queue_admit`](Self::queue_admit).
    #[allow(clippy::too_many_arguments)] // queue_admit's, and the versions
    pub async fn queue_admit_serving(
        &self,
        queues: &[String],
        names: &[WorkflowName],
        versions: &Versions,
        owner: &str,
        ttl: Duration,
        limit: i64,
        now: Option<OffsetDateTime>,
    ) -> Result<Vec<Claim>> {
        let versions = versions.as_filter().map(<[String]>::to_vec);
        for queue in queues {
            storable::text(ADMIT, "queue name", queue)?;
        }
        let queues = queues.to_vec();
        let names: Vec<String> = names.iter().map(|n| n.as_str().to_owned()).collect();
        let owner = owner.to_owned();
        // The Postgres store passes the limit as an integer.
        let limit = limit.clamp(0, i64::from(i32::MAX));
        self.inner
            .writer
            .write(ADMIT, move |conn, clock| {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                queue::queue_admit(
                    conn,
                    clock,
                    &queues,
                    &names,
                    &owner,
                    span_ms(ttl),
                    limit,
                    now,
                    versions.as_deref(),
                )?
                .into_iter()
                .map(|(row, journal)| claim(&row, journal, ADMIT))
                .collect()
            })
            .await
    }

    /// A worker's claim and its queues' admission in one write transaction
    /// (`LeaseStore::claim_and_admit`).
    ///
    /// # Errors
    ///
    /// As [`instances_claim_batch`](Self::instances_claim_batch) and
    /// [`queue_admit`](Self::queue_admit); nothing is claimed when either fails.
    pub async fn claim_and_admit(
        &self,
        names: &[WorkflowName],
        queues: &[String],
        owner: &str,
        ttl: Duration,
        limit: i64,
        now: Option<OffsetDateTime>,
    ) -> Result<ClaimBatch> {
        self.claim_and_admit_serving(names, queues, &Versions::Any, owner, ttl, limit, now)
            .await
    }

    /// [`claim_and_admit`](Self::claim_and_admit) of the runs whose version is one
    /// `versions` serves (`LeaseStore::claim_and_admit_serving`).
    ///
    /// # Errors
    ///
    /// As [`claim_and_admit`](Self::claim_and_admit).
    #[allow(clippy::too_many_arguments)] // claim_and_admit's, and the versions
    pub async fn claim_and_admit_serving(
        &self,
        names: &[WorkflowName],
        queues: &[String],
        versions: &Versions,
        owner: &str,
        ttl: Duration,
        limit: i64,
        now: Option<OffsetDateTime>,
    ) -> Result<ClaimBatch> {
        let versions = versions.as_filter().map(<[String]>::to_vec);
        for queue in queues {
            storable::text(ADMIT, "queue name", queue)?;
        }
        let queues = queues.to_vec();
        let names: Vec<String> = names.iter().map(|n| n.as_str().to_owned()).collect();
        let owner = owner.to_owned();
        let limit = limit.clamp(0, i64::from(i32::MAX));
        self.inner
            .writer
            .write(ADMIT, move |conn, clock| {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                let (claimed, admitted) = queue::instances_claim_and_admit(
                    conn,
                    clock,
                    &names,
                    &queues,
                    &owner,
                    span_ms(ttl),
                    limit,
                    now,
                    versions.as_deref(),
                )?;
                let claims = |rows: Vec<(_, _)>| -> Result<Vec<Claim>> {
                    rows.into_iter()
                        .map(|(row, journal)| claim(&row, journal, ADMIT))
                        .collect()
                };
                Ok(ClaimBatch {
                    claimed: claims(claimed)?,
                    admitted: claims(admitted)?,
                })
            })
            .await
    }

    /// One run per burst of calls with `request.key`: the pending run pushed back with the
    /// last input, or a new one (`QueueStore::queue_debounce`).
    ///
    /// # Errors
    ///
    /// `ValueRefused` for a key holding a NUL or an input the store cannot keep;
    /// `Unavailable` when the file stayed locked or the commit failed.
    pub async fn queue_debounce(&self, request: &DebounceRequest) -> Result<Started> {
        storable::text(DEBOUNCE, "debounce key", &request.key)?;
        let request = request.clone();
        let (delay, max_wait) = (span_ms(request.delay), span_ms(request.max_wait));
        self.inner
            .writer
            .write(DEBOUNCE, move |conn, now| {
                let (created, row) = queue::queue_debounce(
                    conn,
                    now,
                    request.name.as_str(),
                    &request.key,
                    request.id.as_str(),
                    &request.input,
                    delay,
                    max_wait,
                    request.now,
                )?;
                Ok(Started {
                    created,
                    instance: row.instance(DEBOUNCE)?,
                })
            })
            .await
    }

    /// Every declared queue, or only `only`, in name order, with what it holds at `now`
    /// (`None`: the store's clock) (`QueueStore::queues_list`).
    ///
    /// # Errors
    ///
    /// `ValueRefused` for a name holding a NUL; `Malformed` for a stored queue keiro cannot
    /// read.
    pub async fn queues_list(
        &self,
        only: Option<&str>,
        now: Option<OffsetDateTime>,
    ) -> Result<Vec<QueueInfo>> {
        if let Some(only) = only {
            storable::text(queue::LIST, "queue name", only)?;
        }
        let only = only.map(str::to_owned);
        self.read(queue::LIST, move |conn, clock| {
            queue::queues_list(conn, now.unwrap_or(clock), only.as_deref())
        })
        .await
    }
}

#[async_trait::async_trait]
impl QueueStore for SqliteStore {
    async fn queue_declare(&self, spec: &QueueSpec) -> Result<()> {
        traced(
            store_span!("queue_declare"),
            SqliteStore::queue_declare(self, spec),
        )
        .await
    }

    async fn queue_set_paused(&self, queue: &str, paused: bool) -> Result<bool> {
        traced(
            store_span!("queue_set_paused"),
            SqliteStore::queue_set_paused(self, queue, paused),
        )
        .await
    }

    async fn queue_key_weight(&self, queue: &str, key: &str, weight: i32) -> Result<bool> {
        traced(
            store_span!("queue_key_weight"),
            SqliteStore::queue_key_weight(self, queue, key, weight),
        )
        .await
    }

    async fn queue_debounce(&self, request: &DebounceRequest) -> Result<Started> {
        traced(
            store_span!("queue_debounce"),
            SqliteStore::queue_debounce(self, request),
        )
        .await
    }

    async fn queues_list(
        &self,
        only: Option<&str>,
        now: Option<OffsetDateTime>,
    ) -> Result<Vec<QueueInfo>> {
        traced(
            store_span!("queues_list"),
            SqliteStore::queues_list(self, only, now),
        )
        .await
    }
}
