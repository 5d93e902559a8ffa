//! Wake-source edge cases, on both stores: signal tokens no wait could take, a buffered
//! signal's lifetime, a running child spawned again (by another parent, or by its own parent
//! after it continued as new), and trees of children too deep for recursion.

use std::sync::Arc;
use std::time::Duration;

use keiro::{
    store::Event, store::LeaseStore, worker::Registry, worker::ResumeOptions,
    workflow::SignalSendOutcome, Ctx, InstanceKey, Keiro, SignalOptions, Status, WorkflowError,
};
use keiro_journal::{store::child_result_step, store::ChildSpawn, Append, AppendOutcome, StepKind};
use keiro_remote::RequeueOutcome;
use keiro_tests::{key, on_both_stores, Harness, TestResult};
use serde_json::json;

on_both_stores!(
    a_signal_token_no_wait_could_take_is_refused_before_anything_is_sent,
    an_expired_buffered_signal_is_never_delivered,
    a_running_child_of_another_parent_refuses_the_spawn,
    a_parent_that_continued_as_new_takes_its_running_child_back,
    a_cascading_cancel_reaches_the_bottom_of_a_chain_1000_deep,
    a_requeue_reaches_the_bottom_of_a_chain_1000_deep,
);

fn options(h: &Harness) -> ResumeOptions {
    h.fast_options()
}

async fn drain(h: &Harness, registry: &Registry) -> TestResult {
    keiro::worker::drain(&h.store, registry, &options(h)).await?;
    Ok(())
}

async fn status(keiro: &Keiro, name: &str, id: &str) -> Result<Status, keiro::Error> {
    Ok(keiro
        .instance((name, id))
        .await?
        .expect("the instance exists")
        .status)
}

async fn output(keiro: &Keiro, name: &str, id: &str) -> Result<serde_json::Value, keiro::Error> {
    let row = keiro
        .instance((name, id))
        .await?
        .expect("the instance exists");
    assert_eq!(row.status, Status::Completed, "{name}/{id}: {row:?}");
    Ok(row.output.unwrap_or_default())
}

// ----- Signal tokens ------------------------------------------------------------------------

/// A run that waits for two signals on the token it is given.
fn listener() -> Result<Registry, keiro::worker::RegistryError> {
    let mut registry = Registry::new();
    registry.register("listener", |ctx: Ctx, token: String| async move {
        let first: u32 = ctx.wait_signal(&token, None).await?;
        let second: u32 = ctx.wait_signal(&token, None).await?;
        Ok((first, second))
    })?;
    Ok(registry)
}

async fn a_signal_token_no_wait_could_take_is_refused_before_anything_is_sent(
    h: Harness,
) -> TestResult {
    let long = "x".repeat(keiro_journal::ID_LEN_MAX + 1);
    for bad in ["", long.as_str(), "line\nbreak", "tab\there", "del\u{7f}"] {
        let sent = h.keiro.signal(bad, &1).await;
        assert!(
            matches!(sent, Err(keiro::Error::InvalidId(_))),
            "{bad:?}: {sent:?}"
        );
        let stored = h.store.signal_send(bad, &json!(1)).await;
        assert!(
            matches!(&stored, Err(e) if e.is_value_refused()),
            "{bad:?}: {stored:?}"
        );
    }
    // The longest token a wait takes is sent, and reaches a wait.
    let longest = "x".repeat(keiro_journal::ID_LEN_MAX);
    assert_eq!(
        h.keiro.signal(&longest, &7).await?,
        SignalSendOutcome::Buffered
    );
    h.keiro.start("listener", "l-long", &longest).await?;
    drain(&h, &listener()?).await?;
    let journal = h.keiro.journal(("listener", "l-long")).await?;
    let first = format!("signal:{longest}:1");
    assert!(
        journal.iter().any(|e| e.event.step_name() == first
            && e.event
                == Event::StepRecorded {
                    step: first.clone(),
                    kind: StepKind::Signal,
                    result: json!({"ok": 7}),
                }),
        "{journal:?}"
    );
    Ok(())
}

/// The signal steps `listener/<id>` has journaled, as `(step, payload)`.
async fn signals(
    keiro: &Keiro,
    id: &str,
) -> Result<Vec<(String, serde_json::Value)>, keiro::Error> {
    Ok(keiro
        .journal(("listener", id))
        .await?
        .into_iter()
        .filter_map(|entry| match entry.event {
            Event::StepRecorded {
                step,
                kind: StepKind::Signal,
                result,
            } => Some((step, result)),
            _ => None,
        })
        .collect())
}

async fn an_expired_buffered_signal_is_never_delivered(h: Harness) -> TestResult {
    let registry = listener()?;
    let brief = SignalOptions::default().ttl(Duration::from_millis(100));
    assert_eq!(
        h.keiro.signal_with("fleeting", &1, brief).await?,
        SignalSendOutcome::Buffered
    );
    assert_eq!(
        h.keiro.signal("fleeting", &2).await?,
        SignalSendOutcome::Buffered
    );
    tokio::time::sleep(Duration::from_millis(250)).await;

    // The older signal expired, so the first wait takes the younger one.
    h.keiro.start("listener", "l-ttl", &"fleeting").await?;
    drain(&h, &registry).await?;
    assert_eq!(
        signals(&h.keiro, "l-ttl").await?,
        [("signal:fleeting:1".to_owned(), json!({"ok": 2}))]
    );
    assert_eq!(
        h.keiro.signal("fleeting", &3).await?,
        SignalSendOutcome::Delivered {
            to: key("listener", "l-ttl")
        }
    );
    drain(&h, &registry).await?;
    assert_eq!(output(&h.keiro, "listener", "l-ttl").await?, json!([2, 3]));

    // A zero TTL: a signal for the runs waiting now, or for nobody.
    let now_or_never = SignalOptions::default().ttl(Duration::ZERO);
    assert_eq!(
        h.keiro.signal_with("fleeting", &4, now_or_never).await?,
        SignalSendOutcome::Buffered
    );
    h.keiro.start("listener", "l-late", &"fleeting").await?;
    drain(&h, &registry).await?;
    assert_eq!(
        status(&h.keiro, "listener", "l-late").await?,
        Status::Suspended
    );
    assert!(signals(&h.keiro, "l-late").await?.is_empty());
    Ok(())
}

/// The SQLite store's clock moves a week on: a signal sent with the default TTL expires then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_buffered_signal_lives_seven_days_by_default() -> TestResult {
    let sqlite = Arc::new(keiro_sqlite::SqliteStore::temporary()?);
    let store: Arc<dyn LeaseStore> = sqlite.clone();
    let keiro = Keiro::builder((*sqlite).clone()).without_push().build();
    let registry = listener()?;
    let t0 = sqlite.now();
    let week = time::Duration::days(7);
    sqlite.pin_clock(Some(t0));
    keiro.signal("weekly", &1).await?;
    sqlite.pin_clock(Some(t0 + week - time::Duration::seconds(1)));
    keiro.signal("weekly", &2).await?;
    sqlite.pin_clock(Some(t0 + week));

    keiro.start("listener", "l-week", &"weekly").await?;
    keiro::worker::drain(&store, &registry, &ResumeOptions::default()).await?;
    assert_eq!(
        signals(&keiro, "l-week").await?,
        [("signal:weekly:1".to_owned(), json!({"ok": 2}))]
    );
    Ok(())
}

/// In Postgres: a buffered signal's expiry is a week out by default; a wait never takes an
/// expired one and deletes its token's; a send deletes expired ones of other tokens too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_expired_signals_are_deleted_by_waits_and_sends() -> TestResult {
    let h = Harness::postgres().await;
    let registry = listener()?;
    let db = h.db.as_ref().expect("a postgres harness");
    let client = db.store().pool().get().await?;
    let buffered = |token: &'static str| {
        let client = &client;
        async move {
            let row = client
                .query_one(
                    "SELECT count(*) FROM signal_buffer WHERE token = $1",
                    &[&token],
                )
                .await?;
            Ok::<i64, tokio_postgres::Error>(row.get(0))
        }
    };
    let expire = |token: &'static str| {
        let client = &client;
        async move {
            client
                .execute(
                    "UPDATE signal_buffer SET expires_at = now() - interval '1 second' \
                     WHERE token = $1",
                    &[&token],
                )
                .await
        }
    };

    for token in ["kept", "waited", "swept"] {
        h.keiro.signal(token, &1).await?;
    }
    let week = client
        .query_one(
            "SELECT bool_and(expires_at BETWEEN now() + interval '7 days' - interval '1 hour' \
                                        AND now() + interval '7 days') \
             FROM signal_buffer",
            &[],
        )
        .await?;
    assert_eq!(week.get::<_, Option<bool>>(0), Some(true));

    expire("waited").await?;
    h.keiro.start("listener", "l-expired", &"waited").await?;
    drain(&h, &registry).await?;
    assert!(signals(&h.keiro, "l-expired").await?.is_empty());
    assert_eq!(buffered("waited").await?, 0, "the wait deleted it");

    expire("swept").await?;
    h.keiro.signal("other", &2).await?;
    assert_eq!(
        buffered("swept").await?,
        0,
        "the send on another token swept it"
    );
    assert_eq!(buffered("kept").await?, 1);
    Ok(())
}

// ----- Children spawned again ---------------------------------------------------------------

/// `sync` holds until it is given a number; `owner` awaits `sync/tenant-1` and reports what
/// it got; `latecomer` ignores a refused spawn and awaits the child anyway; `rotor` spawns
/// `sync/tenant-2`, continues as new, and awaits it from its next generation.
fn custody() -> Result<Registry, keiro::worker::RegistryError> {
    let mut registry = Registry::new();
    registry.register("sync", |ctx: Ctx, (): ()| async move {
        let n: u32 = ctx.await_step("hold").await?;
        Ok(n)
    })?;
    registry.register("owner", |ctx: Ctx, (): ()| async move {
        match ctx.child::<_, u32>("sync", "tenant-1", &()).await {
            Ok(n) => Ok(format!("got {n}")),
            Err(WorkflowError::ChildTaken { child, parent }) => {
                // A park after the refusal: the next drive replays the spawn, and must meet
                // the refusal again to get here.
                let _: bool = ctx.await_step("ack").await?;
                Ok(format!("{child} taken by {parent}"))
            }
            Err(e) => Err(e),
        }
    })?;
    registry.register("latecomer", |ctx: Ctx, (): ()| async move {
        let refused = matches!(
            ctx.spawn_child("sync", "tenant-1", &()).await,
            Err(WorkflowError::ChildTaken { .. })
        );
        match ctx.await_child::<u32>("sync", "tenant-1").await {
            Err(WorkflowError::ChildTaken { parent, .. }) if refused => {
                Ok(format!("refused, held by {parent}"))
            }
            Ok(n) => Ok(format!("got {n}")),
            Err(e) => Err(e),
        }
    })?;
    registry.register("rotor", |ctx: Ctx, generation: u32| async move {
        if generation == 0 {
            ctx.spawn_child("sync", "tenant-2", &()).await?;
            return Err(ctx.continue_as_new(&1u32));
        }
        let n: u32 = ctx.child("sync", "tenant-2", &()).await?;
        Ok(format!("generation {generation} got {n}"))
    })?;
    Ok(registry)
}

async fn a_running_child_of_another_parent_refuses_the_spawn(h: Harness) -> TestResult {
    let registry = custody()?;
    h.keiro.start("owner", "o-1", &()).await?;
    drain(&h, &registry).await?;
    assert_eq!(
        status(&h.keiro, "sync", "tenant-1").await?,
        Status::Suspended
    );

    // A second parent: refused at once, not left waiting for a result that goes to o-1.
    h.keiro.start("owner", "o-2", &()).await?;
    drain(&h, &registry).await?;
    h.keiro.deliver(("owner", "o-2"), "ack", &true).await?;
    drain(&h, &registry).await?;
    assert_eq!(
        output(&h.keiro, "owner", "o-2").await?,
        json!("sync/tenant-1 taken by owner/o-1")
    );
    // A body that awaits the child after a refused spawn is answered too.
    h.keiro.start("latecomer", "late-1", &()).await?;
    drain(&h, &registry).await?;
    assert_eq!(
        output(&h.keiro, "latecomer", "late-1").await?,
        json!("refused, held by owner/o-1")
    );

    // The child still answers its own parent, and only it.
    let row = h.keiro.instance(("sync", "tenant-1")).await?.expect("row");
    assert_eq!(row.parent, Some(key("owner", "o-1")));
    h.keiro.deliver(("sync", "tenant-1"), "hold", &7).await?;
    drain(&h, &registry).await?;
    assert_eq!(output(&h.keiro, "owner", "o-1").await?, json!("got 7"));
    assert_eq!(
        output(&h.keiro, "owner", "o-2").await?,
        json!("sync/tenant-1 taken by owner/o-1")
    );

    // Once the child has finished, a spawn reads its result, whoever its parent was.
    h.keiro.start("owner", "o-3", &()).await?;
    drain(&h, &registry).await?;
    assert_eq!(output(&h.keiro, "owner", "o-3").await?, json!("got 7"));
    Ok(())
}

async fn a_parent_that_continued_as_new_takes_its_running_child_back(h: Harness) -> TestResult {
    let registry = custody()?;
    h.keiro.start("rotor", "r-1", &0u32).await?;
    drain(&h, &registry).await?;
    let rotor = h.keiro.instance(("rotor", "r-1")).await?.expect("row");
    assert_eq!((rotor.generation, rotor.status), (1, Status::Suspended));
    assert_eq!(
        status(&h.keiro, "sync", "tenant-2").await?,
        Status::Suspended
    );

    h.keiro.deliver(("sync", "tenant-2"), "hold", &5).await?;
    drain(&h, &registry).await?;
    assert_eq!(
        output(&h.keiro, "rotor", "r-1").await?,
        json!("generation 1 got 5")
    );
    Ok(())
}

// ----- Deep trees ---------------------------------------------------------------------------

/// How deep the chains below go: each instance has one child, down to this depth.
const DEPTH: usize = 1000;

/// Builds `name/<prefix>-0` -> `name/<prefix>-1` -> ... -> `name/<prefix>-DEPTH` through the
/// store's spawn operation, each link awaited by its parent, and returns the keys root first.
async fn chain(
    h: &Harness,
    prefix: &str,
) -> Result<Vec<InstanceKey>, Box<dyn std::error::Error + Send + Sync>> {
    let keys: Vec<InstanceKey> = (0..=DEPTH)
        .map(|i| key("deep", &format!("{prefix}-{i}")))
        .collect();
    h.keiro.start("deep", keys[0].id.as_str(), &()).await?;
    for pair in keys.windows(2) {
        let (parent, child) = (&pair[0], &pair[1]);
        let spawn = Append::external(
            parent.clone(),
            Event::StepRecorded {
                step: format!("child:{}/{}", child.name, child.id),
                kind: StepKind::Child,
                result: json!({"name": child.name, "id": child.id}),
            },
        );
        let outcome = h
            .store
            .child_spawn(
                &spawn,
                &ChildSpawn {
                    child: child.clone(),
                    input: json!(null),
                    await_step: child_result_step(child),
                },
            )
            .await?;
        assert_eq!(outcome, AppendOutcome::Appended, "spawning {child}");
    }
    Ok(keys)
}

async fn statuses(
    h: &Harness,
    keys: &[InstanceKey],
) -> Result<Vec<Status>, keiro::store::StoreError> {
    let mut statuses = Vec::with_capacity(keys.len());
    for k in keys {
        let row = h.store.instance_get(k).await?.expect("every link exists");
        statuses.push(row.status);
    }
    Ok(statuses)
}

async fn a_cascading_cancel_reaches_the_bottom_of_a_chain_1000_deep(h: Harness) -> TestResult {
    let keys = chain(&h, "cancel").await?;
    assert_eq!(
        h.store.instance_cancel(&keys[0], true).await?,
        AppendOutcome::Appended
    );
    let statuses = statuses(&h, &keys).await?;
    let live: Vec<_> = keys
        .iter()
        .zip(&statuses)
        .filter(|(_, s)| **s != Status::Cancelled)
        .map(|(k, _)| k.to_string())
        .collect();
    assert!(live.is_empty(), "not cancelled: {live:?}");
    Ok(())
}

async fn a_requeue_reaches_the_bottom_of_a_chain_1000_deep(h: Harness) -> TestResult {
    let keys = chain(&h, "requeue").await?;
    // The deepest fails; each ancestor then fails on its child's failure, as a body that
    // propagates `ChildFailed` would.
    for (depth, k) in keys.iter().enumerate().rev() {
        let reason = if depth == DEPTH {
            "the bottom broke".to_owned()
        } else {
            format!("child of depth {} failed", depth + 1)
        };
        let failed = h
            .store
            .journal_append(&Append::external(
                k.clone(),
                Event::WorkflowFailed { reason },
            ))
            .await?;
        assert_eq!(failed, AppendOutcome::Appended, "failing {k}");
    }
    let journal = h.store.journal_load(&keys[DEPTH - 1], 0).await?;
    assert!(
        journal
            .iter()
            .any(|e| e.event.step_name() == child_result_step(&keys[DEPTH])),
        "the bottom's failure reached its parent"
    );

    match h.admin.instance_requeue(&keys[0]).await? {
        RequeueOutcome::Requeued {
            reset_steps,
            children,
        } => {
            assert_eq!(reset_steps, u64::try_from(DEPTH)?);
            assert_eq!(children, keys[1..]);
        }
        other => panic!("not requeued: {other:?}"),
    }
    let statuses = statuses(&h, &keys).await?;
    assert!(
        statuses.iter().all(|s| *s == Status::Running),
        "{statuses:?}"
    );
    Ok(())
}
