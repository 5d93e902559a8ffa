//! Journal and replay conformance: the same scenarios against every store.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::{key, run_inline, run_with, Harness, Ledger, TestResult};
use keiro::{
    operate::CancelOutcome, store::Append, store::AppendOutcome, store::Event, store::Marker,
    store::StepKind, workflow::workflow_fn, workflow::RunError, workflow::RunOptions,
    workflow::RunOutcome, Ctx, Status, WorkflowError,
};
use serde_json::json;

fn opts() -> RunOptions {
    RunOptions::default()
}

/// Three counted steps; the third fails while `fail_c` is set.
fn three_steps(ledger: Ledger, fail_c: Arc<AtomicBool>) -> Arc<dyn keiro::workflow::Workflow> {
    workflow_fn(move |ctx: Ctx, n: u64| {
        let (ledger, fail_c) = (ledger.clone(), fail_c.clone());
        async move {
            let a: u64 = ctx
                .step("a", || async {
                    ledger.bump("a");
                    Ok::<_, Infallible>(n + 1)
                })
                .await?;
            let b: u64 = ctx
                .step("b", || async {
                    ledger.bump("b");
                    Ok::<_, Infallible>(a * 10)
                })
                .await?;
            let c: u64 = ctx
                .step("c", || async {
                    ledger.bump("c");
                    if fail_c.load(Ordering::SeqCst) {
                        Err("c is down".to_owned())
                    } else {
                        Ok(b + 1)
                    }
                })
                .await?;
            Ok(c)
        }
    })
}

pub async fn journaled_steps_never_run_again(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let fail_c = Arc::new(AtomicBool::new(true));
    let wf = three_steps(ledger.clone(), fail_c.clone());
    let k = key("three", "t-1");
    h.keiro.start("three", "t-1", &4u64).await?;

    let first = run_inline(&h, &k, wf.as_ref()).await;
    assert!(matches!(first, Err(RunError::Crashed { .. })), "{first:?}");
    fail_c.store(false, Ordering::SeqCst);
    let second = run_inline(&h, &k, wf.as_ref()).await?;
    assert_eq!(second, RunOutcome::Completed(json!(51)));
    // A third drive of a completed instance runs nothing at all.
    let third = run_inline(&h, &k, wf.as_ref()).await?;
    assert_eq!(third, RunOutcome::Completed(json!(51)));

    assert_eq!(
        (ledger.count("a"), ledger.count("b"), ledger.count("c")),
        (1, 1, 2)
    );
    let steps: Vec<String> = h
        .keiro
        .journal(("three", "t-1"))
        .await?
        .into_iter()
        .map(|e| e.event.step_name().into_owned())
        .collect();
    assert_eq!(steps, ["a", "b", "c", "__workflow_completed__"]);
    let row = h.keiro.instance(("three", "t-1")).await?.expect("row");
    assert_eq!(row.status, Status::Completed);
    assert_eq!(row.output, Some(json!(51)));
    Ok(())
}

pub async fn repeated_step_name_reuses_the_first_result(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let l = ledger.clone();
    let wf = workflow_fn(move |ctx: Ctx, (): ()| {
        let l = l.clone();
        async move {
            let first: u32 = ctx
                .step("same", || async {
                    l.bump("same");
                    Ok::<_, Infallible>(1)
                })
                .await?;
            let second: u32 = ctx
                .step("same", || async {
                    l.bump("same");
                    Ok::<_, Infallible>(2)
                })
                .await?;
            Ok((first, second))
        }
    });
    h.keiro.start("rep", "r-1", &()).await?;
    let out = run_inline(&h, &key("rep", "r-1"), wf.as_ref()).await?;
    assert_eq!(out, RunOutcome::Completed(json!([1, 1])));
    assert_eq!(ledger.count("same"), 1);
    Ok(())
}

pub async fn first_run_returns_the_json_round_trip(h: Harness) -> TestResult {
    // f32 -> JSON -> f32 is exact, but a map with non-string keys is not representable: the
    // first run must already return what a replay would, so use a lossy newtype.
    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Lossy {
        kept: u32,
        #[serde(skip_serializing, default)]
        dropped: u32,
    }
    let wf = workflow_fn(|ctx: Ctx, (): ()| async move {
        let v: Lossy = ctx
            .step("lossy", || async {
                Ok::<_, Infallible>(Lossy {
                    kept: 1,
                    dropped: 99,
                })
            })
            .await?;
        Ok(v.dropped)
    });
    h.keiro.start("lossy", "l-1", &()).await?;
    let out = run_inline(&h, &key("lossy", "l-1"), wf.as_ref()).await?;
    assert_eq!(
        out,
        RunOutcome::Completed(json!(0)),
        "the first run sees the JSON round trip"
    );
    Ok(())
}

pub async fn start_is_idempotent_by_id(h: Harness) -> TestResult {
    let first = h.keiro.start("s", "s-1", &json!({"v": 1})).await?;
    let second = h.keiro.start("s", "s-1", &json!({"v": 2})).await?;
    assert!(first.created);
    assert!(!second.created);
    assert_eq!(second.instance.input, json!({"v": 1}));
    assert_eq!(second.instance.status, Status::Running);
    Ok(())
}

fn step_event(step: &str, value: serde_json::Value) -> Event {
    Event::StepRecorded {
        step: step.to_owned(),
        kind: StepKind::Step,
        result: value,
    }
}

pub async fn racing_writers_converge_on_one_result(h: Harness) -> TestResult {
    for i in 0..20 {
        let id = format!("race-{i}");
        h.keiro.start("race", &id, &()).await?;
        let k = key("race", &id);
        let mut tasks = Vec::new();
        for writer in 0..4 {
            let store = h.store.clone();
            let k = k.clone();
            tasks.push(tokio::spawn(async move {
                let append = Append {
                    generation: Some(0),
                    ..Append::external(k, step_event("s", json!(writer)))
                };
                store.journal_append(&append).await
            }));
        }
        let mut appended = Vec::new();
        let mut present = Vec::new();
        for (writer, task) in tasks.into_iter().enumerate() {
            match task.await?? {
                AppendOutcome::Appended => appended.push(json!(writer)),
                AppendOutcome::AlreadyPresent(v) => present.push(v),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(appended.len(), 1, "exactly one writer records the step");
        assert!(
            present.iter().all(|v| *v == appended[0]),
            "every other writer adopts it"
        );
        let journal = h.store.journal_load(&k, 0).await?;
        assert_eq!(journal.len(), 1);
    }
    Ok(())
}

pub async fn racing_runs_converge_on_one_result(h: Harness) -> TestResult {
    // Two unfenced runs of one instance race; each step's value is random, yet both runs must
    // return the same output because losers adopt the recorded value.
    let wf = workflow_fn(|ctx: Ctx, (): ()| async move {
        let a: String = ctx
            .step("a", || async {
                Ok::<_, Infallible>(uuid::Uuid::new_v4().to_string())
            })
            .await?;
        tokio::task::yield_now().await;
        let b: String = ctx
            .step("b", || async {
                Ok::<_, Infallible>(uuid::Uuid::new_v4().to_string())
            })
            .await?;
        Ok(format!("{a}/{b}"))
    });
    for i in 0..10 {
        let id = format!("rr-{i}");
        h.keiro.start("rr", &id, &()).await?;
        let k = key("rr", &id);
        let (x, y) = tokio::join!(
            run_inline(&h, &k, wf.as_ref()),
            run_inline(&h, &k, wf.as_ref())
        );
        let (x, y) = (x?, y?);
        let recorded = h.keiro.instance(("rr", &id)).await?.and_then(|r| r.output);
        assert_eq!(x, y);
        assert_eq!(x, RunOutcome::Completed(recorded.expect("completed")));
    }
    Ok(())
}

pub async fn appends_after_failed_or_cancelled_are_refused(h: Harness) -> TestResult {
    h.keiro.start("t", "cancelled", &()).await?;
    assert_eq!(
        h.keiro.cancel(("t", "cancelled")).await?,
        CancelOutcome::Recorded
    );
    let refused = h
        .store
        .journal_append(&Append::external(
            key("t", "cancelled"),
            step_event("x", json!(1)),
        ))
        .await?;
    assert_eq!(refused, AppendOutcome::RefusedTerminal(Marker::Cancelled));

    h.keiro.start("t", "failed", &()).await?;
    let failed = Event::WorkflowFailed {
        reason: "operator".into(),
    };
    let outcome = h
        .store
        .journal_append(&Append::external(key("t", "failed"), failed.clone()))
        .await?;
    assert_eq!(outcome, AppendOutcome::Appended);
    let refused = h
        .store
        .journal_append(&Append::external(
            key("t", "failed"),
            step_event("x", json!(1)),
        ))
        .await?;
    assert_eq!(refused, AppendOutcome::RefusedTerminal(Marker::Failed));
    // An exact retry of the winning marker is idempotent; a different marker is refused.
    let again = h
        .store
        .journal_append(&Append::external(key("t", "failed"), failed))
        .await?;
    assert_eq!(again, AppendOutcome::AlreadyPresent(json!("operator")));
    let other = h
        .store
        .journal_append(&Append::external(
            key("t", "failed"),
            Event::WorkflowCancelled,
        ))
        .await?;
    assert_eq!(other, AppendOutcome::RefusedTerminal(Marker::Failed));
    assert_eq!(h.store.journal_load(&key("t", "failed"), 0).await?.len(), 1);
    Ok(())
}

pub async fn late_append_never_resurrects_a_terminal_row(h: Harness) -> TestResult {
    h.keiro.start("t", "done", &()).await?;
    let k = key("t", "done");
    h.store
        .journal_append(&Append::external(
            k.clone(),
            Event::WorkflowCompleted {
                output: json!("ok"),
            },
        ))
        .await?;
    let late = h
        .store
        .journal_append(&Append::external(k.clone(), step_event("late", json!(1))))
        .await?;
    assert_eq!(late, AppendOutcome::RefusedTerminal(Marker::Completed));
    let row = h.store.instance_get(&k).await?.expect("row");
    assert_eq!(row.status, Status::Completed);
    assert_eq!(row.output, Some(json!("ok")));
    Ok(())
}

pub async fn completion_and_cancellation_have_one_winner(h: Harness) -> TestResult {
    for i in 0..25 {
        let id = format!("cc-{i}");
        h.keiro.start("cc", &id, &()).await?;
        let k = key("cc", &id);
        let complete = {
            let (store, k) = (h.store.clone(), k.clone());
            tokio::spawn(async move {
                store
                    .journal_append(&Append::external(
                        k,
                        Event::WorkflowCompleted { output: json!(1) },
                    ))
                    .await
            })
        };
        let cancel = {
            let (keiro, id) = (h.keiro.clone(), id.clone());
            tokio::spawn(async move { keiro.cancel(("cc", &id)).await })
        };
        let completed = complete.await?? == AppendOutcome::Appended;
        let cancelled = cancel.await?? == CancelOutcome::Recorded;
        assert!(
            completed ^ cancelled,
            "exactly one marker wins (completed {completed}, cancelled {cancelled})"
        );
        let row = h.store.instance_get(&k).await?.expect("row");
        assert_eq!(
            row.status,
            if completed {
                Status::Completed
            } else {
                Status::Cancelled
            }
        );
        let markers = h
            .store
            .journal_load(&k, 0)
            .await?
            .into_iter()
            .filter(|e| e.event.marker().is_some())
            .count();
        assert_eq!(markers, 1);
    }
    Ok(())
}

pub async fn cancel_stops_the_run_at_its_next_boundary(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let (l, keiro) = (ledger.clone(), h.keiro.clone());
    let wf = workflow_fn(move |ctx: Ctx, (): ()| {
        let (l, keiro) = (l.clone(), keiro.clone());
        async move {
            ctx.step("one", || async {
                l.bump("one");
                // Cancelled from outside while this step is in flight.
                keiro
                    .cancel(("cx", "c-1"))
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(())
            })
            .await?;
            ctx.step("two", || async {
                l.bump("two");
                Ok::<_, Infallible>(())
            })
            .await?;
            Ok(())
        }
    });
    h.keiro.start("cx", "c-1", &()).await?;
    let out = run_inline(&h, &key("cx", "c-1"), wf.as_ref()).await?;
    assert_eq!(out, RunOutcome::Cancelled);
    assert_eq!((ledger.count("one"), ledger.count("two")), (1, 0));
    let names: Vec<String> = h
        .keiro
        .journal(("cx", "c-1"))
        .await?
        .iter()
        .map(|e| e.event.step_name().into_owned())
        .collect();
    assert_eq!(
        names,
        ["__workflow_cancelled__"],
        "the in-flight step's result is refused"
    );
    Ok(())
}

pub async fn cancel_is_idempotent_and_refuses_unknown_instances(h: Harness) -> TestResult {
    h.keiro.start("c", "c-1", &()).await?;
    assert_eq!(h.keiro.cancel(("c", "c-1")).await?, CancelOutcome::Recorded);
    assert_eq!(
        h.keiro.cancel(("c", "c-1")).await?,
        CancelOutcome::AlreadyTerminal(Status::Cancelled)
    );
    let unknown = h.keiro.cancel(("c", "nope")).await;
    assert!(
        matches!(&unknown, Err(keiro::Error::Store(e)) if e.is_not_found()),
        "{unknown:?}"
    );
    assert!(
        h.keiro.instance(("c", "nope")).await?.is_none(),
        "cancel mints no state"
    );
    Ok(())
}

fn named_steps(
    names: &'static [&'static str],
    ledger: Ledger,
) -> Arc<dyn keiro::workflow::Workflow> {
    workflow_fn(move |ctx: Ctx, crash: bool| {
        let ledger = ledger.clone();
        async move {
            for name in names {
                ctx.step(name, || async {
                    ledger.bump(name);
                    Ok::<_, Infallible>(())
                })
                .await?;
            }
            if crash {
                // A failing step crashes the run (a business failure would fail it for good).
                ctx.step("crash", || async { Err::<(), _>("simulated crash") })
                    .await?;
            }
            Ok(())
        }
    })
}

pub async fn renamed_step_is_caught_as_non_determinism(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    h.keiro.start("d", "d-1", &true).await?;
    let k = key("d", "d-1");
    let v1 = named_steps(&["charge", "ship"], ledger.clone());
    assert!(run_inline(&h, &k, v1.as_ref()).await.is_err());
    let before = h.store.journal_history(&k).await?;

    let v2 = named_steps(&["charge-card", "ship"], ledger.clone());
    let out = run_inline(&h, &k, v2.as_ref()).await;
    assert!(
        matches!(&out, Err(RunError::NonDeterminism { step, .. }) if step == "charge-card"),
        "{out:?}"
    );
    assert_eq!(
        ledger.count("charge-card"),
        0,
        "the diverged step never ran"
    );
    assert_eq!(
        h.store.journal_history(&k).await?,
        before,
        "nothing was appended"
    );
    let row = h.store.instance_get(&k).await?.expect("row");
    assert_eq!(row.status, Status::Failed);
    assert!(row
        .last_error
        .unwrap_or_default()
        .contains("non-determinism"));
    Ok(())
}

pub async fn removed_step_is_caught_when_the_body_returns(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    h.keiro.start("d", "d-2", &true).await?;
    let k = key("d", "d-2");
    let v1 = named_steps(&["a", "b"], ledger.clone());
    assert!(run_inline(&h, &k, v1.as_ref()).await.is_err());
    let v2 = named_steps(&["a"], ledger.clone());
    // Input says crash; v2 would crash too, so give it a body that returns normally instead.
    let v2_ok = workflow_fn({
        let v2 = v2.clone();
        move |ctx: Ctx, _crash: bool| {
            let v2 = v2.clone();
            async move {
                let _ = v2.call(ctx, json!(false)).await?;
                Ok(())
            }
        }
    });
    let out = run_inline(&h, &k, v2_ok.as_ref()).await;
    assert!(
        matches!(&out, Err(RunError::NonDeterminism { step, .. }) if step == "b"),
        "{out:?}"
    );
    let markers = h
        .store
        .journal_history(&k)
        .await?
        .into_iter()
        .filter(|e| e.event.marker().is_some())
        .count();
    assert_eq!(markers, 0, "no completion was appended");
    Ok(())
}

pub async fn kind_mismatch_is_caught_as_non_determinism(h: Harness) -> TestResult {
    h.keiro.start("km", "k-1", &()).await?;
    let k = key("km", "k-1");
    // An await's value under the bare step name, as keiro journaled deliveries before they got
    // their own namespace (a delivery can no longer collide with a `ctx.step`).
    let recorded = keiro::store::Append::external(
        k.clone(),
        keiro::store::Event::StepRecorded {
            step: "approval".into(),
            kind: keiro::store::StepKind::Await,
            result: json!(true),
        },
    );
    h.store.journal_append(&recorded).await?;
    let wf = workflow_fn(|ctx: Ctx, (): ()| async move {
        let v: bool = ctx
            .step("approval", || async { Ok::<_, Infallible>(false) })
            .await?;
        Ok(v)
    });
    let out = run_inline(&h, &k, wf.as_ref()).await;
    assert!(
        matches!(out, Err(RunError::NonDeterminism { .. })),
        "{out:?}"
    );
    Ok(())
}

pub async fn concurrent_steps_in_a_join_are_not_divergence(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let crash = Arc::new(AtomicBool::new(true));
    let (l, c) = (ledger.clone(), crash.clone());
    let wf = workflow_fn(move |ctx: Ctx, (): ()| {
        let (l, c) = (l.clone(), c.clone());
        async move {
            let left = async {
                let a: u32 = ctx
                    .step("left-a", || async {
                        l.bump("left-a");
                        Ok::<_, Infallible>(1)
                    })
                    .await?;
                let b: u32 = ctx
                    .step("left-b", || async {
                        l.bump("left-b");
                        if c.load(Ordering::SeqCst) {
                            Err("down")
                        } else {
                            Ok(a + 1)
                        }
                    })
                    .await?;
                Ok::<_, WorkflowError>(b)
            };
            let right = async {
                let x: u32 = ctx
                    .step("right-x", || async {
                        l.bump("right-x");
                        Ok::<_, Infallible>(10)
                    })
                    .await?;
                let y: u32 = ctx
                    .step("right-y", || async {
                        l.bump("right-y");
                        Ok::<_, Infallible>(x + 1)
                    })
                    .await?;
                Ok::<_, WorkflowError>(y)
            };
            let (b, y) = tokio::join!(left, right);
            Ok(b? + y?)
        }
    });
    h.keiro.start("join", "j-1", &()).await?;
    let k = key("join", "j-1");
    assert!(matches!(
        run_inline(&h, &k, wf.as_ref()).await,
        Err(RunError::Crashed { .. })
    ));
    crash.store(false, Ordering::SeqCst);
    let out = run_inline(&h, &k, wf.as_ref()).await?;
    assert_eq!(out, RunOutcome::Completed(json!(13)));
    assert_eq!(ledger.count("left-a"), 1);
    assert_eq!(ledger.count("right-x"), 1);
    assert_eq!(ledger.count("right-y"), 1);
    Ok(())
}

fn approval_flow(ledger: Ledger) -> Arc<dyn keiro::workflow::Workflow> {
    workflow_fn(move |ctx: Ctx, (): ()| {
        let ledger = ledger.clone();
        async move {
            ctx.step("ask", || async {
                ledger.bump("ask");
                Ok::<_, Infallible>(())
            })
            .await?;
            let approved: bool = ctx.await_step("approval").await?;
            ctx.step("after", || async {
                ledger.bump("after");
                Ok::<_, Infallible>(())
            })
            .await?;
            Ok(approved)
        }
    })
}

pub async fn await_suspends_and_resumes_with_the_delivered_value(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let wf = approval_flow(ledger.clone());
    h.keiro.start("appr", "a-1", &()).await?;
    let k = key("appr", "a-1");
    assert_eq!(
        run_inline(&h, &k, wf.as_ref()).await?,
        RunOutcome::Suspended
    );
    let row = h.store.instance_get(&k).await?.expect("row");
    assert_eq!(row.status, Status::Suspended);
    assert!(
        !h.store
            .journal_load(&k, 0)
            .await?
            .iter()
            .any(|e| e.event.marker().is_some()),
        "suspension journals no completion"
    );
    assert_eq!(
        h.keiro.deliver(("appr", "a-1"), "approval", &true).await?,
        AppendOutcome::Appended
    );
    assert_eq!(
        h.store.instance_get(&k).await?.expect("row").status,
        Status::Running,
        "delivery wakes it"
    );
    assert_eq!(
        run_inline(&h, &k, wf.as_ref()).await?,
        RunOutcome::Completed(json!(true))
    );
    assert_eq!((ledger.count("ask"), ledger.count("after")), (1, 1));
    Ok(())
}

pub async fn duplicate_delivery_is_idempotent(h: Harness) -> TestResult {
    h.keiro.start("appr", "a-2", &()).await?;
    assert_eq!(
        h.keiro.deliver(("appr", "a-2"), "approval", &true).await?,
        AppendOutcome::Appended
    );
    assert_eq!(
        h.keiro.deliver(("appr", "a-2"), "approval", &false).await?,
        AppendOutcome::AlreadyPresent(json!(true))
    );
    Ok(())
}

pub async fn wake_before_park_is_never_masked(h: Harness) -> TestResult {
    // The value lands after the run read its journal but before it parks: the park must see it
    // and leave the row running, or the run would sleep forever.
    let keiro = h.keiro.clone();
    let wf = workflow_fn(move |ctx: Ctx, (): ()| {
        let keiro = keiro.clone();
        async move {
            ctx.step("deliver-early", || async {
                keiro
                    .deliver(("early", "e-1"), "value", &7)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(())
            })
            .await?;
            let v: u32 = ctx.await_step("value").await?;
            Ok(v)
        }
    });
    h.keiro.start("early", "e-1", &()).await?;
    let k = key("early", "e-1");
    assert_eq!(
        run_inline(&h, &k, wf.as_ref()).await?,
        RunOutcome::Suspended
    );
    assert_eq!(
        h.store.instance_get(&k).await?.expect("row").status,
        Status::Running
    );
    assert_eq!(
        run_inline(&h, &k, wf.as_ref()).await?,
        RunOutcome::Completed(json!(7))
    );
    Ok(())
}

pub async fn undecodable_recorded_value_is_a_typed_error(h: Harness) -> TestResult {
    h.keiro.start("dec", "d-1", &()).await?;
    h.keiro
        .deliver(("dec", "d-1"), "n", &"not a number")
        .await?;
    let wf = workflow_fn(|ctx: Ctx, (): ()| async move {
        match ctx.await_step::<u64>("n").await {
            Err(WorkflowError::Decode { step, .. }) => Ok(format!("decode error at {step}")),
            other => Ok(format!("unexpected {other:?}")),
        }
    });
    let out = run_inline(&h, &key("dec", "d-1"), wf.as_ref()).await?;
    assert_eq!(out, RunOutcome::Completed(json!("decode error at n")));
    // Invalid identities are typed errors too, never panics.
    assert!(matches!(
        h.keiro.start("bad:name", "x", &()).await,
        Err(keiro::Error::InvalidId(_))
    ));
    assert!(matches!(
        h.keiro.start("ok", " padded", &()).await,
        Err(keiro::Error::InvalidId(_))
    ));
    assert!(matches!(
        h.keiro.deliver(("dec", "d-1"), "sleep:x", &1).await,
        Err(keiro::Error::InvalidId(_))
    ));
    Ok(())
}

pub async fn oversized_payloads_are_refused_and_lose_nothing(h: Harness) -> TestResult {
    let small = h.keiro.clone().with_payload_len_max(64);
    let big = "x".repeat(100);
    assert!(matches!(
        small.start("big", "b-1", &big).await,
        Err(keiro::Error::Payload(_))
    ));
    assert!(
        small.instance(("big", "b-1")).await?.is_none(),
        "a refused start writes nothing"
    );

    h.keiro.start("big", "b-2", &()).await?;
    let wf = workflow_fn(|ctx: Ctx, (): ()| async move {
        ctx.step("huge", || async { Ok::<_, Infallible>("y".repeat(100)) })
            .await?;
        Ok(())
    });
    let mut options = opts();
    options.payload_len_max = 64;
    let k = key("big", "b-2");
    let out = run_with(&h, &k, wf.as_ref(), options).await;
    // The action ran and its result is over the limit: running it again would only make the
    // same result, so the run fails at once (no crash, no retry) and the step is not journaled.
    assert!(matches!(&out, Ok(RunOutcome::Failed)), "{out:?}");
    let journal = h.store.journal_load(&k, 0).await?;
    assert!(
        matches!(&journal[..], [e] if matches!(&e.event, Event::WorkflowFailed { reason } if reason.contains("limit"))),
        "{journal:?}"
    );
    assert_eq!(
        h.store.instance_get(&k).await?.expect("row").status,
        Status::Failed
    );
    Ok(())
}

pub async fn panicking_step_is_a_crash_not_a_process_abort(h: Harness) -> TestResult {
    let wf = workflow_fn(|ctx: Ctx, (): ()| async move {
        ctx.step("boom", || async {
            if true {
                panic!("step exploded");
            }
            Ok::<_, Infallible>(())
        })
        .await?;
        Ok(())
    });
    h.keiro.start("panic", "p-1", &()).await?;
    let out = run_inline(&h, &key("panic", "p-1"), wf.as_ref()).await;
    assert!(
        matches!(&out, Err(RunError::Crashed { message, .. }) if message.contains("step exploded")),
        "{out:?}"
    );
    Ok(())
}

fn patched_flow(ledger: Ledger) -> Arc<dyn keiro::workflow::Workflow> {
    workflow_fn(move |ctx: Ctx, (): ()| {
        let ledger = ledger.clone();
        async move {
            ctx.step("first", || async {
                ledger.bump("first");
                Ok::<_, Infallible>(())
            })
            .await?;
            let new = ctx.patched("extra-check").await?;
            if new {
                ctx.step("extra", || async {
                    ledger.bump("extra");
                    Ok::<_, Infallible>(())
                })
                .await?;
            }
            ctx.step("second", || async { Ok::<_, Infallible>(()) })
                .await?;
            let _: bool = ctx.await_step("go").await?;
            Ok(new)
        }
    })
}

pub async fn patched_takes_old_branch_in_flight_and_new_branch_fresh(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    // In flight: the old code (no patch) already recorded "first" and, past the patch's
    // place, "second", then parked.
    let old = workflow_fn(|ctx: Ctx, (): ()| async move {
        ctx.step("first", || async { Ok::<_, Infallible>(()) })
            .await?;
        ctx.step("second", || async { Ok::<_, Infallible>(()) })
            .await?;
        let _: bool = ctx.await_step("go").await?;
        Ok(false)
    });
    h.keiro.start("patch", "in-flight", &()).await?;
    h.keiro.start("patch", "fresh", &()).await?;
    let in_flight = key("patch", "in-flight");
    assert_eq!(
        run_inline(&h, &in_flight, old.as_ref()).await?,
        RunOutcome::Suspended
    );

    let new = patched_flow(ledger.clone());
    h.keiro.deliver(("patch", "in-flight"), "go", &true).await?;
    assert_eq!(
        run_inline(&h, &in_flight, new.as_ref()).await?,
        RunOutcome::Completed(json!(false))
    );
    let fresh = key("patch", "fresh");
    assert_eq!(
        run_inline(&h, &fresh, new.as_ref()).await?,
        RunOutcome::Suspended
    );
    h.keiro.deliver(("patch", "fresh"), "go", &true).await?;
    assert_eq!(
        run_inline(&h, &fresh, new.as_ref()).await?,
        RunOutcome::Completed(json!(true))
    );
    assert_eq!(
        ledger.count("extra"),
        1,
        "only the fresh run took the new branch, once"
    );
    let decisions = h
        .store
        .journal_history(&fresh)
        .await?
        .into_iter()
        .filter(|e| e.event.step_name() == "patch:extra-check")
        .count();
    assert_eq!(decisions, 1, "the decision is journaled once");
    Ok(())
}

pub async fn continue_as_new_bounds_the_journal(h: Harness) -> TestResult {
    let wf = workflow_fn(|ctx: Ctx, n: u32| async move {
        let next: u32 = ctx
            .step("tick", || async move { Ok::<_, Infallible>(n + 1) })
            .await?;
        if next < 5 {
            return Err(ctx.continue_as_new(&next));
        }
        Ok(next)
    });
    h.keiro.start("loop", "l-1", &0u32).await?;
    let k = key("loop", "l-1");
    let mut generations = Vec::new();
    loop {
        match run_inline(&h, &k, wf.as_ref()).await? {
            RunOutcome::ContinuedAsNew { generation } => generations.push(generation),
            RunOutcome::Completed(v) => {
                assert_eq!(v, json!(5));
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(generations, [1, 2, 3, 4]);
    let row = h.store.instance_get(&k).await?.expect("row");
    assert_eq!(row.generation, 4);
    assert_eq!(row.input, json!(4));
    // Each generation holds one step and one marker, whatever the number of generations.
    for g in 0..=4 {
        assert_eq!(
            h.store.journal_load(&k, g).await?.len(),
            2,
            "generation {g}"
        );
    }
    Ok(())
}
