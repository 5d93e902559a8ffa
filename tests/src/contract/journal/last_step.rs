//! A run's last step shares its completion's commit (issue 15): the step's append is held back
//! until the body shows what it does next, and goes with the completion when the body returns.
//! Held back, it is still journaled before the body does anything else that lasts, and a
//! journal that holds another value for it is never completed. Both stores.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use crate::counting::CountingStore;
use crate::workflows::Sum;
use crate::{journal_steps, key, FastWorker, Harness, Ledger, TestResult};
use keiro::{
    store::Append, store::ClaimOutcome, store::Event, store::JournalStore, store::StepKind,
    workflow::workflow_fn, workflow::RunError, workflow::RunOptions, workflow::RunOutcome, Ctx,
    Status, WorkflowError,
};
use keiro_journal::store::StartRequest;
use serde_json::{json, Value};

const TTL: Duration = Duration::from_secs(60);

/// Starts `id` of workflow `name` with `input` and claims it for `owner`.
async fn claimed(
    h: &Harness,
    name: &str,
    id: &str,
    owner: &str,
) -> Result<Box<keiro_lease::Claim>, Box<dyn std::error::Error + Send + Sync>> {
    let k = key(name, id);
    h.store
        .instance_start(&StartRequest {
            attributes: Default::default(),
            key: k.clone(),
            input: json!(null),
            parent: None,
            priority: 0,
            queue: None,
        })
        .await?;
    match h.store.instance_claim(&k, owner, TTL, None).await? {
        ClaimOutcome::Acquired(claim) => Ok(claim),
        other => panic!("claim of {k} refused: {other:?}"),
    }
}

fn fenced(claim: &keiro_lease::Claim) -> RunOptions {
    RunOptions {
        fence: Some(claim.fence.clone()),
        ..RunOptions::new(TTL)
    }
}

pub async fn the_last_step_and_the_completion_are_one_store_call(h: Harness) -> TestResult {
    let counting = CountingStore::new(h.store.clone());
    let ledger = Ledger::default();
    let worker = keiro::WorkerBuilder::new(Arc::new(counting.clone()))
        .fast()
        .register_workflow_with(Sum {
            ledger: ledger.clone(),
        })
        .build()?;
    assert_eq!(worker.run_workflow::<Sum>("s-1", &10).await?, 13);

    // The first two steps alone; the third with the completion.
    assert_eq!(counting.calls("journal_append"), 2);
    assert_eq!(counting.calls("journal_append_closing"), 1);
    let k = key("sum", "s-1");
    let names: Vec<String> = journal_steps(&h, &k)
        .await?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        ["step-0", "step-1", "step-2", "__workflow_completed__"]
    );
    let row = h.store.instance_get(&k).await?.expect("row");
    assert_eq!(
        (row.status, row.output, row.lease_owner),
        (Status::Completed, Some(json!(13)), None)
    );
    assert_eq!(
        (
            ledger.count("step-0"),
            ledger.count("step-1"),
            ledger.count("step-2")
        ),
        (1, 1, 1)
    );
    Ok(())
}

pub async fn a_held_back_step_is_journaled_before_the_body_waits_on_anything_else(
    h: Harness,
) -> TestResult {
    let claim = claimed(&h, "waits", "w-1", "w").await?;
    let k = claim.instance.key.clone();
    let reached = Arc::new(tokio::sync::Notify::new());
    let (release, released) = tokio::sync::watch::channel(false);
    let workflow = {
        let reached = reached.clone();
        workflow_fn(move |ctx: Ctx, _: Value| {
            let (reached, mut released) = (reached.clone(), released.clone());
            async move {
                let a: u32 = ctx.step("a", || async { Ok::<_, Infallible>(1) }).await?;
                // Something of the body's own that takes long: not the context.
                reached.notify_one();
                released
                    .wait_for(|go| *go)
                    .await
                    .map_err(|e| WorkflowError::Halted {
                        reason: e.to_string(),
                    })?;
                let b: u32 = ctx.step("b", || async { Ok::<_, Infallible>(2) }).await?;
                Ok(a + b)
            }
        })
    };
    let store: Arc<dyn JournalStore> = h.store.clone();
    let options = fenced(&claim);
    let run = tokio::spawn({
        let claim = claim.clone();
        async move {
            keiro_journal::drive(store, &*workflow, &claim.instance, &claim.journal, options)
                .await
                .result
        }
    });
    reached.notified().await;
    // The body waits on its own; its step is journaled meanwhile.
    let mut journaled = Vec::new();
    for _ in 0..200 {
        journaled = journal_steps(&h, &k).await?;
        if !journaled.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(journaled, [("a".to_owned(), json!(1))]);
    release.send_replace(true);
    assert_eq!(run.await??, RunOutcome::Completed(json!(3)));
    let names: Vec<String> = journal_steps(&h, &k)
        .await?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["a", "b", "__workflow_completed__"]);
    Ok(())
}

/// The body went on with its own value: a journal that recorded another for the step (a
/// writer racing the run) is not completed with an output computed from it. The next drive
/// replays the recorded value and completes with that.
pub async fn a_held_back_step_meeting_another_value_never_completes_the_run(
    h: Harness,
) -> TestResult {
    let claim = claimed(&h, "raced", "r-1", "w").await?;
    let k = claim.instance.key.clone();
    let workflow = {
        let store = h.store.clone();
        let k = k.clone();
        workflow_fn(move |ctx: Ctx, _: Value| {
            let (store, k) = (store.clone(), k.clone());
            async move {
                let x: String = ctx
                    .step("x", || async move {
                        // Another writer records this step first.
                        store
                            .journal_append(&Append::external(
                                k.clone(),
                                Event::StepRecorded {
                                    step: "x".into(),
                                    kind: StepKind::Step,
                                    result: json!("theirs"),
                                },
                            ))
                            .await
                            .map_err(|e| e.to_string())?;
                        Ok::<_, String>("mine".to_owned())
                    })
                    .await?;
                Ok(format!("out-{x}"))
            }
        })
    };
    let store: Arc<dyn JournalStore> = h.store.clone();
    let first = keiro_journal::drive(
        store.clone(),
        &*workflow,
        &claim.instance,
        &claim.journal,
        fenced(&claim),
    )
    .await
    .result;
    assert!(
        matches!(&first, Ok(RunOutcome::Completed(output)) if output == &json!("out-theirs"))
            || matches!(&first, Err(RunError::Conflict { .. })),
        "never completed with the body's own value: {first:?}"
    );
    if first.is_err() {
        assert_eq!(
            h.store.instance_get(&k).await?.expect("row").status,
            Status::Running
        );
        assert_eq!(
            journal_steps(&h, &k).await?,
            [("x".to_owned(), json!("theirs"))]
        );
        // Driven again (same lease): the recorded value wins.
        let journal = h.store.journal_load(&k, 0).await?;
        let again =
            keiro_journal::drive(store, &*workflow, &claim.instance, &journal, fenced(&claim))
                .await
                .result?;
        assert_eq!(again, RunOutcome::Completed(json!("out-theirs")));
    }
    let row = h.store.instance_get(&k).await?.expect("row");
    assert_eq!(
        (row.status, row.output),
        (Status::Completed, Some(json!("out-theirs")))
    );
    Ok(())
}

pub async fn a_stale_lease_writes_neither_the_last_step_nor_the_completion(
    h: Harness,
) -> TestResult {
    let claim = claimed(&h, "stale", "s-1", "w").await?;
    let k = claim.instance.key.clone();
    h.store.instance_lease_force_release(&k).await?;
    let ClaimOutcome::Acquired(_) = h.store.instance_claim(&k, "other", TTL, None).await? else {
        panic!("takeover refused")
    };
    let workflow = workflow_fn(|ctx: Ctx, _: Value| async move {
        let a: u32 = ctx.step("a", || async { Ok::<_, Infallible>(1) }).await?;
        Ok(a)
    });
    let store: Arc<dyn JournalStore> = h.store.clone();
    let result = keiro_journal::drive(
        store,
        &*workflow,
        &claim.instance,
        &claim.journal,
        fenced(&claim),
    )
    .await
    .result;
    assert!(
        matches!(result, Err(RunError::LeaseLost { .. })),
        "{result:?}"
    );
    assert_eq!(journal_steps(&h, &k).await?, []);
    let row = h.store.instance_get(&k).await?.expect("row");
    assert_eq!(
        (row.status, row.lease_owner.as_deref()),
        (Status::Running, Some("other"))
    );
    Ok(())
}

/// Every duration the step observer was told, in order.
#[derive(Debug, Default)]
struct StepDurations(std::sync::Mutex<Vec<Duration>>);

impl keiro_journal::StepObserver for StepDurations {
    fn step_finished(&self, _: &keiro::workflow::WorkflowName, _: StepKind, duration: Duration) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(duration);
    }
}

/// The step observer times a step from its action's start to the end of its append; a
/// held-back step's append ends later (sent by the next step, or with the completion), and its
/// duration says so.
pub async fn a_held_back_step_is_timed_to_the_end_of_its_append(h: Harness) -> TestResult {
    const APPEND: Duration = Duration::from_millis(150);
    let claim = claimed(&h, "timed", "t-1", "w").await?;
    let counting = CountingStore::new(h.store.clone()).with_append_delay(APPEND);
    let workflow = workflow_fn(|ctx: Ctx, _: Value| async move {
        let a: u32 = ctx.step("a", || async { Ok::<_, Infallible>(1) }).await?;
        let b: u32 = ctx.step("b", || async { Ok::<_, Infallible>(2) }).await?;
        Ok(a + b)
    });
    let durations = Arc::new(StepDurations::default());
    let options = RunOptions {
        observer: Some(durations.clone()),
        ..fenced(&claim)
    };
    let store: Arc<dyn JournalStore> = Arc::new(counting.clone());
    let outcome = keiro_journal::drive(store, &*workflow, &claim.instance, &claim.journal, options)
        .await
        .result?;
    assert_eq!(outcome, RunOutcome::Completed(json!(3)));
    // Both were held back: "a" sent by the call of "b", "b" with the completion.
    assert_eq!(
        (
            counting.calls("journal_append"),
            counting.calls("journal_append_closing")
        ),
        (1, 1)
    );
    let durations = durations
        .0
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    assert_eq!(durations.len(), 2, "{durations:?}");
    assert!(
        durations.iter().all(|d| *d >= APPEND),
        "each step timed to the end of its append: {durations:?}"
    );
    Ok(())
}

/// Drives `claim`'s run once over a store whose appends each take 200 ms (so a context call
/// given 20 ms gives up while it sends), failing if the run has not ended in 20 s.
async fn drive_with_slow_appends(
    h: &Harness,
    claim: &keiro_lease::Claim,
    workflow: &dyn keiro::workflow::Workflow,
) -> Result<RunOutcome, Box<dyn std::error::Error + Send + Sync>> {
    let store: Arc<dyn JournalStore> =
        Arc::new(CountingStore::new(h.store.clone()).with_append_delay(Duration::from_millis(200)));
    let driven = keiro_journal::drive(
        store,
        workflow,
        &claim.instance,
        &claim.journal,
        fenced(claim),
    );
    Ok(tokio::time::timeout(Duration::from_secs(20), driven)
        .await
        .map_err(|_| "the run never ended: a call waited for an abandoned send")?
        .result?)
}

/// A body that gives up on a context call (a `timeout` around it) while that call is sending
/// the held-back step before it: the step goes back to be held, and the body's next call sends
/// it, instead of waiting forever for the abandoned send.
pub async fn a_context_call_dropped_while_it_sends_a_held_back_step_loses_nothing(
    h: Harness,
) -> TestResult {
    let claim = claimed(&h, "impatient", "i-1", "w").await?;
    let k = claim.instance.key.clone();
    let workflow = workflow_fn(|ctx: Ctx, _: Value| async move {
        let a: u32 = ctx.step("a", || async { Ok::<_, Infallible>(1) }).await?;
        // Gives up on "b" while it still sends "a".
        let b = tokio::time::timeout(
            Duration::from_millis(20),
            ctx.step("b", || async { Ok::<_, Infallible>(2u32) }),
        )
        .await
        .ok()
        .transpose()?;
        let c: u32 = ctx.step("c", || async { Ok::<_, Infallible>(3) }).await?;
        Ok(a + b.unwrap_or(0) + c)
    });
    let outcome = drive_with_slow_appends(&h, &claim, &*workflow).await?;
    assert_eq!(outcome, RunOutcome::Completed(json!(4)));
    let names: Vec<String> = journal_steps(&h, &k)
        .await?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["a", "c", "__workflow_completed__"]);
    Ok(())
}

/// The same abandoned call, then the body returns at once: the completion carries the step
/// back, so the journal holds every value the output was made from.
pub async fn a_body_returning_after_dropping_that_call_still_journals_the_step(
    h: Harness,
) -> TestResult {
    let claim = claimed(&h, "hasty", "h-1", "w").await?;
    let k = claim.instance.key.clone();
    let workflow = workflow_fn(|ctx: Ctx, _: Value| async move {
        let a: u32 = ctx.step("a", || async { Ok::<_, Infallible>(1) }).await?;
        let gave_up = tokio::time::timeout(
            Duration::from_millis(20),
            ctx.step("b", || async { Ok::<_, Infallible>(2u32) }),
        )
        .await
        .is_err();
        Ok(if gave_up { a } else { 0 })
    });
    let outcome = drive_with_slow_appends(&h, &claim, &*workflow).await?;
    assert_eq!(outcome, RunOutcome::Completed(json!(1)));
    assert_eq!(
        journal_steps(&h, &k).await?,
        [
            ("a".to_owned(), json!(1)),
            ("__workflow_completed__".to_owned(), json!(1))
        ]
    );
    Ok(())
}
