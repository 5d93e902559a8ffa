//! Small tools the contract scenarios share: requests, claims and reads through the store
//! traits, so each scenario says only what it checks.

use std::time::Duration;

use keiro_journal::{
    store::Park, store::ParkOutcome, store::StartRequest, Append, Event, Fence, InstanceKey,
    Status, StepKind,
};
use keiro_lease::{ClaimOutcome, LeaseStore};

pub use crate::TestResult;

/// What a helper returns: `?` works on every error.
pub type Result<T, E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

/// Parses a key, for brevity.
pub fn key(name: &str, id: &str) -> InstanceKey {
    InstanceKey::parse(name, id).expect("test keys are valid")
}

/// A start request with `input` and no parent.
pub fn start(key: &InstanceKey, input: serde_json::Value) -> StartRequest {
    StartRequest {
        attributes: Default::default(),
        key: key.clone(),
        input,
        parent: None,
        priority: 0,
        queue: None,
    }
}

/// An external append of a step.
pub fn step(k: &InstanceKey, name: &str, kind: StepKind, result: serde_json::Value) -> Append {
    Append::external(
        k.clone(),
        Event::StepRecorded {
            step: name.into(),
            kind,
            result,
        },
    )
}

/// Claims `k` for `owner` with a one-minute lease, failing the test when refused.
pub async fn claim(store: &dyn LeaseStore, k: &InstanceKey, owner: &str) -> Result<Fence> {
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
pub async fn start_parked(store: &dyn LeaseStore, k: &InstanceKey) -> Result<()> {
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

/// The instance's status, failing the test when it is missing.
pub async fn status(store: &dyn LeaseStore, k: &InstanceKey) -> Result<Status> {
    let row = store.instance_get(k).await?;
    Ok(row.ok_or_else(|| format!("{k} is missing"))?.status)
}

/// The values journaled under `step` in any generation of `k` (a step is journaled at most
/// once per generation, so more than one entry in one generation would be a bug).
pub async fn recorded(
    store: &dyn LeaseStore,
    k: &InstanceKey,
    step: &str,
) -> Result<Vec<serde_json::Value>> {
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

/// The lease a helper's claims take, and the renewal a scenario asks for.
pub const TTL: Duration = Duration::from_secs(60);

/// How long a notification may take to arrive, and how long silence means none comes.
pub const QUIET: Duration = Duration::from_millis(200);

/// How far a store's clock (the database's, on Postgres) may be from the test's when a
/// scenario compares a time the store wrote with its own.
pub const SLACK: Duration = Duration::from_secs(1);

/// Starts `wf/<id>` with no input and returns its key.
pub async fn started(store: &dyn LeaseStore, id: &str) -> Result<InstanceKey> {
    let k = key("wf", id);
    store
        .instance_start(&start(&k, serde_json::Value::Null))
        .await?;
    Ok(k)
}

/// Appends `event` to `k`, on `generation` (the current one when `None`), under `fence`.
pub async fn append(
    store: &dyn LeaseStore,
    k: &InstanceKey,
    generation: Option<keiro_journal::Generation>,
    event: Event,
    fence: Option<&Fence>,
) -> Result<keiro_journal::AppendOutcome, keiro_journal::StoreError> {
    let append = Append {
        key: k.clone(),
        generation,
        event,
        fence: fence.cloned(),
        renew: None,
    };
    store.journal_append(&append).await
}

/// An event recording step `name` with `result`.
pub fn step_event(name: &str, result: serde_json::Value) -> Event {
    Event::StepRecorded {
        step: name.to_owned(),
        kind: StepKind::Step,
        result,
    }
}

/// The wake payload that says instance `k` became runnable
/// ([`Notifications`](crate::notifications::Notifications)).
pub fn payload(k: &InstanceKey) -> String {
    format!("{}/{}", k.name, k.id)
}

/// `(stored step name, payload)` of every journal row of `k`, in order.
pub async fn journal_rows(
    store: &dyn LeaseStore,
    k: &InstanceKey,
) -> Result<Vec<(String, serde_json::Value)>> {
    Ok(store
        .journal_history(k)
        .await?
        .into_iter()
        .map(|entry| {
            let encoded = entry.event.encode();
            (encoded.step_name, encoded.payload)
        })
        .collect())
}

/// A fixed time well ahead of the wall clock: timers due from here fire only when a scenario
/// passes a `now` past them.
pub const T0: time::OffsetDateTime = time::macros::datetime!(2030-01-01 0:00 UTC);

/// Parks `k` on `awaited` with no lease and a wake an hour after [`T0`], as a run that found
/// nothing would.
pub async fn park_on(store: &dyn LeaseStore, k: &InstanceKey, awaited: &str) -> Result<()> {
    let park = Park {
        key: k.clone(),
        generation: 0,
        fence: None,
        awaited: vec![awaited.to_owned()],
        wake_after: Some(T0 + time::Duration::hours(1)),
    };
    store.instance_park(&park).await?;
    Ok(())
}

/// `parent` spawns `child/<id>` with input `{"from": <parent id>}`: the child's key, the step
/// its result goes to in the parent, and what the spawn answered.
pub async fn spawn_child(
    store: &dyn LeaseStore,
    parent: &InstanceKey,
    id: &str,
) -> Result<(InstanceKey, String, keiro_journal::AppendOutcome)> {
    let child = key("child", id);
    let await_step = keiro_journal::store::child_result_step(&child);
    let append = Append::external(
        parent.clone(),
        Event::StepRecorded {
            step: format!("child:{}/{}", child.name, child.id),
            kind: StepKind::Child,
            result: serde_json::json!({"name": child.name, "id": child.id}),
        },
    );
    let request = keiro_journal::store::ChildSpawn {
        child: child.clone(),
        input: serde_json::json!({"from": parent.id}),
        await_step: await_step.clone(),
    };
    let outcome = store.child_spawn(&append, &request).await?;
    Ok((child, await_step, outcome))
}
