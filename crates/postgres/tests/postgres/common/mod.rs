//! Helpers shared by the store's integration tests.

#![allow(dead_code)] // each test file uses a different subset

pub(crate) mod history;

use std::time::Duration;

use futures_util::StreamExt;
use keiro_journal::{store::StartRequest, InstanceKey};
use keiro_postgres::PgStore;
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, NoTls};

/// What a test returns: `?` works on every error.
pub(crate) type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Declares queue `q` with no limit of any kind, first in first out (its runs start free, 0027).
pub(crate) const DECLARE_LIGHT_QUEUE: &str = "SELECT keiro_queue_declare('q', NULL, NULL, NULL, \
     NULL, NULL, NULL, NULL, false, 'fifo', NULL, true)";

/// Parses a key, for brevity.
pub(crate) fn key(name: &str, id: &str) -> InstanceKey {
    InstanceKey::parse(name, id).expect("test keys are valid")
}

/// A start request with `input` and no parent.
pub(crate) fn start(key: &InstanceKey, input: serde_json::Value) -> StartRequest {
    StartRequest {
        attributes: Default::default(),
        key: key.clone(),
        input,
        parent: None,
        priority: 0,
        queue: None,
    }
}

/// A dedicated connection listening on a store's wake channel; payloads arrive on the receiver.
pub(crate) struct Listener {
    _client: tokio_postgres::Client,
    received: mpsc::UnboundedReceiver<(String, String)>,
}

impl Listener {
    /// Listens on `store`'s wake channel.
    pub(crate) async fn on(
        store: &PgStore,
    ) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        let (client, mut connection) = store.connection_config().connect(NoTls).await?;
        let (sender, received) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notification(n) = message {
                    if sender
                        .send((n.channel().to_owned(), n.payload().to_owned()))
                        .is_err()
                    {
                        break;
                    }
                }
            }
        });
        // The channel contains a dot, so it must be quoted.
        client
            .batch_execute(&format!("LISTEN \"{}\"", store.wake_channel()))
            .await?;
        Ok(Self {
            _client: client,
            received,
        })
    }

    /// Every notification that arrives within `quiet` of the previous one (or of the call).
    pub(crate) async fn drain(&mut self, quiet: Duration) -> Vec<(String, String)> {
        let mut got = Vec::new();
        while let Ok(Some(n)) = tokio::time::timeout(quiet, self.received.recv()).await {
            got.push(n);
        }
        got
    }
}

/// An external append of a step.
pub(crate) fn step(
    k: &InstanceKey,
    name: &str,
    kind: keiro_journal::StepKind,
    result: serde_json::Value,
) -> keiro_journal::Append {
    keiro_journal::Append::external(
        k.clone(),
        keiro_journal::Event::StepRecorded {
            step: name.into(),
            kind,
            result,
        },
    )
}

/// Step `name` of `k` on generation 0 by `fence`'s holder, renewing its lease for 60 s (as a
/// run's steps carry it); unfenced, no renewal.
pub(crate) fn fenced_step(
    k: &InstanceKey,
    fence: Option<&keiro_journal::Fence>,
    name: &str,
) -> keiro_journal::Append {
    keiro_journal::Append {
        key: k.clone(),
        generation: Some(0),
        event: keiro_journal::Event::StepRecorded {
            step: name.to_owned(),
            kind: keiro_journal::StepKind::Step,
            result: serde_json::json!(name),
        },
        fence: fence.cloned(),
        renew: fence.map(|_| Duration::from_secs(60)),
    }
}

/// Starts `k` (input null) and claims it for `w` with a 60 s lease.
pub(crate) async fn started_claimed(
    store: &PgStore,
    k: InstanceKey,
) -> Result<(InstanceKey, keiro_journal::Fence), Box<dyn std::error::Error + Send + Sync>> {
    use keiro_journal::JournalStore;
    store
        .instance_start(&start(&k, serde_json::Value::Null))
        .await?;
    let fence = claim(store, &k, "w").await?;
    Ok((k, fence))
}

/// Leaves `k`'s lease 10 s to run: under three quarters of a 60 s renewal, so its next
/// renewing append is due to renew it.
pub(crate) async fn lease_ending_soon(
    store: &PgStore,
    k: &InstanceKey,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    sql(store)
        .await?
        .execute(
            "UPDATE workflows SET lease_expires_at = now() + interval '10 seconds' \
             WHERE workflow_name = $1 AND workflow_id = $2",
            &[&k.name.as_str(), &k.id.as_str()],
        )
        .await?;
    Ok(())
}

/// Seconds left on `k`'s lease.
pub(crate) async fn lease_left(
    store: &PgStore,
    k: &InstanceKey,
) -> Result<f64, Box<dyn std::error::Error + Send + Sync>> {
    let row = sql(store)
        .await?
        .query_one(
            "SELECT extract(epoch FROM lease_expires_at - now())::float8 FROM workflows \
             WHERE workflow_name = $1 AND workflow_id = $2",
            &[&k.name.as_str(), &k.id.as_str()],
        )
        .await?;
    Ok(row.get(0))
}

/// Claims `k` for `owner`, failing the test when refused.
pub(crate) async fn claim(
    store: &PgStore,
    k: &InstanceKey,
    owner: &str,
) -> Result<keiro_journal::Fence, Box<dyn std::error::Error + Send + Sync>> {
    use keiro_lease::{ClaimOutcome, LeaseStore};
    match store
        .instance_claim(k, owner, Duration::from_secs(60), None)
        .await?
    {
        ClaimOutcome::Acquired(claim) => Ok(claim.fence),
        refused => Err(format!("claim of {k} refused: {refused:?}").into()),
    }
}

/// Starts `k` and parks it `suspended` on generation 0 (no lease, no deadline), as a run
/// waiting on a wake source leaves it.
pub(crate) async fn start_parked(
    store: &PgStore,
    k: &InstanceKey,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use keiro_journal::{store::Park, store::ParkOutcome, JournalStore};
    store
        .instance_start(&start(k, serde_json::Value::Null))
        .await?;
    let parked = store
        .instance_park(&Park {
            key: k.clone(),
            generation: 0,
            fence: None,
            awaited: Vec::new(),
            wake_after: None,
        })
        .await?;
    assert_eq!(parked, ParkOutcome::Suspended);
    Ok(())
}

/// Starts `k` and completes it with output 1, as an operator's append would: a finished run.
pub(crate) async fn start_completed(
    store: &PgStore,
    k: &InstanceKey,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use keiro_journal::{Append, Event, JournalStore};
    store
        .instance_start(&start(k, serde_json::Value::Null))
        .await?;
    store
        .journal_append(&Append::external(
            k.clone(),
            Event::WorkflowCompleted {
                output: serde_json::json!(1),
            },
        ))
        .await?;
    Ok(())
}

/// The instance's status, failing the test when it is missing.
pub(crate) async fn status(
    store: &PgStore,
    k: &InstanceKey,
) -> Result<keiro_journal::Status, Box<dyn std::error::Error + Send + Sync>> {
    use keiro_journal::JournalStore;
    let row = store.instance_get(k).await?;
    Ok(row.ok_or_else(|| format!("{k} is missing"))?.status)
}

/// The values journaled under `step` in any generation of `k` (a step is journaled at most
/// once per generation, so more than one entry in one generation would be a bug).
pub(crate) async fn recorded(
    store: &PgStore,
    k: &InstanceKey,
    step: &str,
) -> Result<Vec<serde_json::Value>, Box<dyn std::error::Error + Send + Sync>> {
    use keiro_journal::{Event, JournalStore};
    Ok(store
        .journal_history(k)
        .await?
        .into_iter()
        .filter_map(|entry| match entry.event {
            Event::StepRecorded {
                step: name, result, ..
            } if name == step => Some(result),
            _ => None,
        })
        .collect())
}

/// A pooled connection for SQL of the test's own (backdating, inspecting tables).
pub(crate) async fn sql(
    store: &PgStore,
) -> Result<deadpool_postgres::Object, Box<dyn std::error::Error + Send + Sync>> {
    Ok(store.pool().get().await?)
}

/// The backend process id of a test's own transaction, to wait for others blocked by it.
pub(crate) async fn backend_pid(
    tx: &tokio_postgres::Transaction<'_>,
) -> Result<i32, Box<dyn std::error::Error + Send + Sync>> {
    Ok(tx.query_one("SELECT pg_backend_pid()", &[]).await?.get(0))
}

/// Waits until some backend waits for a lock that backend `pid` holds: the call under test has
/// reached the row a test transaction holds. Fails with `what` after ten seconds.
pub(crate) async fn blocked_by(
    store: &PgStore,
    pid: i32,
    what: &str,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let watcher = sql(store).await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let blocked: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))",
                &[&pid],
            )
            .await?
            .get(0);
        if blocked > 0 {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(what.into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The arm of remote step `step` of `k`'s generation 0, one attempt, no redispatch.
pub(crate) fn remote_arm(
    k: &InstanceKey,
    step: &str,
    input: serde_json::Value,
) -> keiro_journal::store::RemoteArm {
    keiro_journal::store::RemoteArm {
        step_id: keiro_journal::store::remote_step_id(k, 0, step),
        key: k.clone(),
        generation: 0,
        step: step.into(),
        journal_step: format!("remote:{step}"),
        group: step.into(),
        input,
        priority: 0,
        traceparent: None,
        max_attempts: 1,
        backoff: keiro_journal::Backoff::default(),
        redispatch_after: None,
        redispatch_max: 10,
        queue: None,
        queue_key: None,
        fence: None,
    }
}
