//! The operator's tools for remote steps and failed runs: redispatching open tasks, requeueing
//! a failed run (resetting its failed steps, cascading to failed children, guarding cycles),
//! and a fix started with new input whose success stands for the original.

use std::time::Duration;

use super::{
    arm, claim_one, claim_tasks, complete_instance, fail_instance, failure, resets, resurrections,
    spawn, task,
};
use crate::contract::support::{key, payload, recorded, start, status, Result, TestResult, QUIET};
use crate::Harness;
use keiro_journal::{
    store::child_result_step, store::remote_step_id, store::RemoteArm, store::RemoteArmOutcome,
    Append, AppendOutcome, Event, Status, StepKind,
};
use keiro_lease::LeaseStore;
use keiro_remote::{HeartbeatOutcome, ReportOutcome, RequeueOutcome, RetryOutcome, TaskStatus};
use serde_json::{json, Value};

/// The events of `k`'s history, in order.
async fn events(store: &dyn LeaseStore, k: &keiro_journal::InstanceKey) -> Result<Vec<Event>> {
    Ok(store
        .journal_history(k)
        .await?
        .into_iter()
        .map(|e| e.event)
        .collect())
}

pub async fn redispatch_pending_counts_the_open_tasks_of_the_current_generation(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    for step in ["a", "b", "c"] {
        store.remote_arm(&arm(&owner, step, json!(step))).await?;
    }
    h.transport
        .task_complete(&remote_step_id(&owner, 0, "a"), &json!(1))
        .await?;
    let claimed = claim_one(&*h.transport, "b").await?;
    let mut listener = h.notifications().await?;
    assert_eq!(h.admin.remote_redispatch_pending(&owner).await?, Some(2));
    let payloads = listener.drain(Duration::from_millis(200)).await;
    assert_eq!(payloads, ["remote"]);
    // The claimed task loses its claim, the pending one is dispatched again too, the
    // settled one is left alone.
    let b = task(&*h.admin, &owner, &claimed.step_id).await?;
    assert_eq!(
        (b.status, b.dispatches, b.claimed_by),
        (TaskStatus::Pending, 2, None)
    );
    let c = task(&*h.admin, &owner, &remote_step_id(&owner, 0, "c")).await?;
    assert_eq!((c.status, c.dispatches), (TaskStatus::Pending, 2));
    let a = task(&*h.admin, &owner, &remote_step_id(&owner, 0, "a")).await?;
    assert_eq!((a.status, a.dispatches), (TaskStatus::Completed, 1));
    assert_eq!(
        h.transport
            .task_heartbeat(&claimed.step_id, claimed.claim, Duration::from_secs(60))
            .await?,
        HeartbeatOutcome::Lost
    );
    assert_eq!(
        h.admin
            .remote_redispatch_pending(&key("owner", "ghost"))
            .await?,
        None
    );
    // Available again from the redispatch on.
    let again = claim_tasks(&*h.transport, &["b"], 5).await?;
    assert_eq!(again[0].dispatches, 2);
    assert!(
        again[0].available_at > claimed.available_at,
        "{} vs {}",
        again[0].available_at,
        claimed.available_at
    );

    // The tasks belong to generation 0; generation 1 has none, and nobody is told.
    let continued = store
        .journal_append(&Append::external(
            owner.clone(),
            Event::WorkflowContinuedAsNew {
                next_generation: 1,
                input: json!(null),
            },
        ))
        .await?;
    assert_eq!(continued, AppendOutcome::Appended);
    listener.drain(Duration::from_millis(200)).await;
    assert_eq!(h.admin.remote_redispatch_pending(&owner).await?, Some(0));
    assert!(listener.drain(Duration::from_millis(200)).await.is_empty());
    Ok(())
}

pub async fn a_requeue_resets_a_failed_remote_step(h: Harness) -> TestResult {
    let store = &*h.store;
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let a = RemoteArm {
        max_attempts: 2,
        redispatch_after: Some(Duration::from_secs(600)),
        ..arm(&owner, "x", json!(1))
    };
    let RemoteArmOutcome::Dispatched {
        deadline: Some(mut deadline),
    } = store.remote_arm(&a).await?
    else {
        return Err("expected the first arm's deadline".into());
    };
    let mut available_at = None;
    let ok = arm(&owner, "fine", json!(1));
    store.remote_arm(&ok).await?;
    h.transport
        .task_complete(&ok.step_id, &json!("good"))
        .await?;

    for revision in 1..=2u32 {
        let claimed = claim_one(&*h.transport, "x").await?;
        if let Some(before) = available_at {
            assert!(
                claimed.available_at > before,
                "available from the requeue on"
            );
        }
        available_at = Some(claimed.available_at);
        assert_eq!(
            h.transport
                .task_fail(
                    &a.step_id,
                    claimed.claim,
                    &failure("boom", None, false),
                    Duration::ZERO
                )
                .await?,
            ReportOutcome::Delivered
        );
        fail_instance(store, &owner, "remote step x failed").await?;
        let mut listener = h.notifications().await?;
        assert_eq!(
            h.admin.instance_requeue(&owner).await?,
            RequeueOutcome::Requeued {
                reset_steps: 1,
                children: Vec::new()
            }
        );
        let mut payloads = listener.drain(Duration::from_millis(200)).await;
        payloads.sort();
        assert_eq!(payloads, ["owner/o-1", "remote"]);
        let row = store.instance_get(&owner).await?.ok_or("missing")?;
        assert_eq!(row.status, Status::Running);
        assert_eq!((row.last_error, row.completed_at), (None, None));
        let superseded = if revision == 1 {
            "remote:x".to_owned()
        } else {
            format!("remote:x#{}", revision - 1)
        };
        assert_eq!(
            resets(store, &owner).await?.last(),
            Some(&("remote:x".to_owned(), superseded.clone()))
        );
        assert_eq!(
            resurrections(store, &owner).await?,
            usize::try_from(revision)?
        );
        // The reset is journaled before the resurrection, both after the failure.
        let history = events(store, &owner).await?;
        assert_eq!(
            history[history.len() - 3..],
            [
                Event::WorkflowFailed {
                    reason: "remote step x failed".into()
                },
                Event::StepReset {
                    step: "remote:x".into(),
                    superseded
                },
                Event::Resurrected,
            ]
        );
        let stored = task(&*h.admin, &owner, &a.step_id).await?;
        assert_eq!(stored.status, TaskStatus::Pending);
        assert_eq!(stored.journal_step, format!("remote:x#{revision}"));
        assert_eq!((stored.attempts, stored.dispatches), (0, 1));
        assert_eq!((stored.last_error, stored.output), (None, None));
        // The re-armed run waits for the next revision, with a deadline counted from the
        // requeue.
        let RemoteArmOutcome::Waiting {
            deadline: Some(fresh),
        } = store.remote_arm(&a).await?
        else {
            return Err("expected a wait with a deadline".into());
        };
        assert!(fresh > deadline, "{fresh} vs {deadline}");
        deadline = fresh;
    }
    // The successful step was not touched; the third attempt lands under revision 2.
    assert_eq!(resets(store, &owner).await?.len(), 2);
    let claimed = claim_one(&*h.transport, "x").await?;
    assert_eq!(claimed.attempt, 1);
    assert!(Some(claimed.available_at) > available_at);
    assert_eq!(
        h.transport
            .task_complete(&a.step_id, &json!("fixed"))
            .await?,
        ReportOutcome::Delivered
    );
    assert_eq!(
        recorded(store, &owner, "remote:x#2").await?,
        [json!({"ok": "fixed"})]
    );
    assert_eq!(
        store.remote_arm(&a).await?,
        RemoteArmOutcome::Settled {
            value: json!({"ok": "fixed"}),
            lost: false
        }
    );
    assert_eq!(
        h.admin.instance_requeue(&owner).await?,
        RequeueOutcome::NotFailed(Status::Running)
    );
    assert_eq!(
        h.admin.instance_requeue(&key("owner", "ghost")).await?,
        RequeueOutcome::NotFound
    );
    Ok(())
}

pub async fn a_requeue_cascades_to_a_failed_child_which_then_delivers_to_the_next_revision(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let (parent, child) = (key("parent", "p-1"), key("child", "c-1"));
    store.instance_start(&start(&parent, Value::Null)).await?;
    spawn(store, &parent, &child).await?;
    fail_instance(store, &child, "child broke").await?;
    assert_eq!(
        recorded(store, &parent, "child:child/c-1:result").await?,
        [json!({"failed": "child broke"})]
    );
    fail_instance(store, &parent, "child failed").await?;

    assert_eq!(
        h.admin.instance_requeue(&parent).await?,
        RequeueOutcome::Requeued {
            reset_steps: 1,
            children: vec![child.clone()]
        }
    );
    assert_eq!(status(store, &parent).await?, Status::Running);
    assert_eq!(status(store, &child).await?, Status::Running);
    assert_eq!(resurrections(store, &child).await?, 1);
    assert_eq!(
        resets(store, &parent).await?,
        [(
            "child:child/c-1:result".to_owned(),
            "child:child/c-1:result".to_owned()
        )]
    );
    complete_instance(store, &child, json!("shipped")).await?;
    assert_eq!(
        recorded(store, &parent, "child:child/c-1:result#1").await?,
        [json!({"ok": "shipped"})]
    );
    Ok(())
}

pub async fn a_requeue_guards_a_cycle_of_parent_links(h: Harness) -> TestResult {
    let store = &*h.store;
    let (p, c) = (key("node", "p"), key("node", "c"));
    store.instance_start(&start(&p, Value::Null)).await?;
    spawn(store, &p, &c).await?;
    // The child adopts its own parent: p -> c -> p.
    spawn(store, &c, &p).await?;
    for (k, other) in [(&p, &c), (&c, &p)] {
        store
            .journal_append(&crate::contract::support::step(
                k,
                &child_result_step(other),
                StepKind::Child,
                json!({"failed": "boom"}),
            ))
            .await?;
    }
    fail_instance(store, &p, "p failed").await?;
    fail_instance(store, &c, "c failed").await?;

    assert_eq!(
        h.admin.instance_requeue(&p).await?,
        RequeueOutcome::Requeued {
            reset_steps: 2,
            children: vec![c.clone()]
        }
    );
    assert_eq!(status(store, &p).await?, Status::Running);
    assert_eq!(status(store, &c).await?, Status::Running);
    assert_eq!(resurrections(store, &p).await?, 1);
    assert_eq!(resurrections(store, &c).await?, 1);
    assert_eq!(resets(store, &p).await?.len(), 1, "each is reached once");
    assert_eq!(resets(store, &c).await?.len(), 1, "each is reached once");
    // Each link now names the next revision. A fix of each (which takes its origin's link)
    // delivers its success there while both runs are live.
    for (origin, fix) in [
        (&p, key("node", "p~retry~0000aaaa")),
        (&c, key("node", "c~retry~0000aaaa")),
    ] {
        assert_eq!(
            h.admin
                .instance_retry_with_input(origin, &fix, &json!(null))
                .await?,
            RetryOutcome::Started(fix.clone())
        );
        complete_instance(store, &fix, json!(fix.id.as_str())).await?;
    }
    assert_eq!(
        recorded(store, &c, "child:node/p:result#1").await?,
        [json!({"ok": "p~retry~0000aaaa"})]
    );
    assert_eq!(
        recorded(store, &p, "child:node/c:result#1").await?,
        [json!({"ok": "c~retry~0000aaaa"})]
    );
    Ok(())
}

pub async fn a_fix_copies_the_parent_link_and_delivers_only_its_success(h: Harness) -> TestResult {
    let store = &*h.store;
    let (parent, child) = (key("parent", "p-1"), key("child", "c-1"));
    store
        .instance_start(&keiro_journal::store::StartRequest {
            attributes: Default::default(),
            priority: 3,
            ..start(&parent, Value::Null)
        })
        .await?;
    spawn(store, &parent, &child).await?;
    fail_instance(store, &child, "bad input").await?;
    fail_instance(store, &parent, "child failed").await?;
    // The parent's requeue requeues the child; both now wait on revision 1.
    h.admin.instance_requeue(&parent).await?;

    let fix = key("child", "c-1~retry~0000aaaa");
    let mut listener = h.notifications().await?;
    assert_eq!(
        h.admin
            .instance_retry_with_input(&child, &fix, &json!({"fixed": true}))
            .await?,
        RetryOutcome::Started(fix.clone())
    );
    assert_eq!(
        listener.drain(QUIET).await,
        [payload(&fix)],
        "the fix is runnable"
    );
    assert_eq!(
        h.admin
            .instance_retry_with_input(&child, &fix, &json!({"other": true}))
            .await?,
        RetryOutcome::Exists(fix.clone())
    );
    assert_eq!(
        h.admin
            .instance_retry_with_input(&key("child", "ghost"), &fix, &json!(1))
            .await?,
        RetryOutcome::OriginNotFound
    );
    let row = store.instance_get(&fix).await?.ok_or("missing")?;
    assert_eq!(row.status, Status::Running);
    assert_eq!(row.input, json!({"fixed": true}));
    assert_eq!(row.parent, Some(parent.clone()));

    // A failed fix is not the child's result.
    fail_instance(store, &fix, "still bad").await?;
    assert!(recorded(store, &parent, "child:child/c-1:result#1")
        .await?
        .is_empty());
    // A cancelled one neither.
    let fix2 = key("child", "c-1~retry~0000bbbb");
    h.admin
        .instance_retry_with_input(&child, &fix2, &json!(2))
        .await?;
    store.instance_cancel(&fix2, false).await?;
    assert!(recorded(store, &parent, "child:child/c-1:result#1")
        .await?
        .is_empty());
    // A completed one is.
    let fix3 = key("child", "c-1~retry~0000cccc");
    h.admin
        .instance_retry_with_input(&child, &fix3, &json!(3))
        .await?;
    complete_instance(store, &fix3, json!("fixed output")).await?;
    assert_eq!(
        recorded(store, &parent, "child:child/c-1:result#1").await?,
        [json!({"ok": "fixed output"})]
    );
    assert_eq!(status(store, &parent).await?, Status::Running);
    // The origin's own late result finds the step taken.
    fail_instance(store, &child, "late").await?;
    assert_eq!(
        recorded(store, &parent, "child:child/c-1:result#1").await?,
        [json!({"ok": "fixed output"})]
    );

    // A fix of a top-level instance has no parent link and keeps the origin's priority.
    let parent_fix = key("parent", "p-1~retry~0000dddd");
    h.admin
        .instance_retry_with_input(&parent, &parent_fix, &json!(4))
        .await?;
    let row = store.instance_get(&parent_fix).await?.ok_or("missing")?;
    assert_eq!((row.parent, row.priority), (None, 3));
    Ok(())
}

pub async fn a_requeue_journals_a_fix_that_already_completed(h: Harness) -> TestResult {
    let store = &*h.store;
    let (parent, child) = (key("parent", "p-1"), key("child", "c-1"));
    store.instance_start(&start(&parent, Value::Null)).await?;
    spawn(store, &parent, &child).await?;
    fail_instance(store, &child, "bad input").await?;
    fail_instance(store, &parent, "child failed").await?;
    let fix = key("child", "c-1~retry~0000aaaa");
    h.admin
        .instance_retry_with_input(&child, &fix, &json!({"fixed": true}))
        .await?;
    // Its success reaches a failed parent, which refuses it.
    complete_instance(store, &fix, json!("fixed output")).await?;

    assert_eq!(
        h.admin.instance_requeue(&parent).await?,
        RequeueOutcome::Requeued {
            reset_steps: 1,
            children: Vec::new()
        }
    );
    assert_eq!(status(store, &parent).await?, Status::Running);
    assert_eq!(
        status(store, &child).await?,
        Status::Failed,
        "a child with a buffered success stays as it is"
    );
    assert_eq!(
        recorded(store, &parent, "child:child/c-1:result#1").await?,
        [json!({"ok": "fixed output"})]
    );
    // The reset comes before the delivered revision, so replay reads the success.
    let history = store.journal_history(&parent).await?;
    let position = |wanted: &dyn Fn(&Event) -> bool| history.iter().position(|e| wanted(&e.event));
    let reset = position(&|e| matches!(e, Event::StepReset { .. })).ok_or("no reset")?;
    let revision = position(
        &|e| matches!(e, Event::StepRecorded { step, .. } if step == "child:child/c-1:result#1"),
    )
    .ok_or("no revision")?;
    assert!(reset < revision);
    Ok(())
}

pub async fn a_requeue_resets_failures_in_journal_order(h: Harness) -> TestResult {
    let store = &*h.store;
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    // A failed child that does not exist (never spawned here): its failure is reset all the
    // same, and there is no child to requeue.
    let gone = key("child", "gone");
    store
        .journal_append(&crate::contract::support::step(
            &owner,
            &child_result_step(&gone),
            StepKind::Child,
            json!({"failed": "boom"}),
        ))
        .await?;
    let a = arm(&owner, "label", json!(1));
    store.remote_arm(&a).await?;
    let claimed = claim_one(&*h.transport, "label").await?;
    h.transport
        .task_fail(
            &a.step_id,
            claimed.claim,
            &failure("jammed", None, false),
            Duration::ZERO,
        )
        .await?;
    fail_instance(store, &owner, "failed").await?;

    assert_eq!(
        h.admin.instance_requeue(&owner).await?,
        RequeueOutcome::Requeued {
            reset_steps: 2,
            children: Vec::new()
        }
    );
    let steps: Vec<String> = resets(store, &owner)
        .await?
        .into_iter()
        .map(|(step, _)| step)
        .collect();
    assert_eq!(steps, [child_result_step(&gone), "remote:label".to_owned()]);
    Ok(())
}

pub async fn a_requeue_cascades_down_the_tree_and_relinks_every_level(h: Harness) -> TestResult {
    let store = &*h.store;
    let (root, child, grandchild) = (key("root", "r"), key("child", "c"), key("child", "g"));
    store.instance_start(&start(&root, Value::Null)).await?;
    spawn(store, &root, &child).await?;
    spawn(store, &child, &grandchild).await?;
    let (child_step, grandchild_step) = (child_result_step(&child), child_result_step(&grandchild));
    fail_instance(store, &grandchild, "boom").await?;
    fail_instance(store, &child, "grandchild failed").await?;
    fail_instance(store, &root, "child failed").await?;
    assert_eq!(
        recorded(store, &root, &child_step).await?,
        [json!({"failed": "grandchild failed"})]
    );

    assert_eq!(
        h.admin.instance_requeue(&root).await?,
        RequeueOutcome::Requeued {
            reset_steps: 2,
            children: vec![child.clone(), grandchild.clone()]
        }
    );
    for k in [&root, &child, &grandchild] {
        assert_eq!(status(store, k).await?, Status::Running, "{k}");
        let last = store.journal_history(k).await?.pop().map(|e| e.event);
        assert_eq!(last, Some(Event::Resurrected), "{k}");
    }
    assert_eq!(
        resets(store, &root).await?,
        [(child_step.clone(), child_step.clone())]
    );
    assert_eq!(
        resets(store, &child).await?,
        [(grandchild_step.clone(), grandchild_step.clone())]
    );
    // Each level's result goes to the next revision of its parent's step.
    complete_instance(store, &grandchild, json!("g")).await?;
    assert_eq!(
        recorded(store, &child, &format!("{grandchild_step}#1")).await?,
        [json!({"ok": "g"})]
    );
    complete_instance(store, &child, json!("c")).await?;
    assert_eq!(
        recorded(store, &root, &format!("{child_step}#1")).await?,
        [json!({"ok": "c"})]
    );
    Ok(())
}

pub async fn a_requeue_delivers_a_success_the_failed_parent_could_not_take(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let (parent, child) = (key("parent", "p-1"), key("child", "c-1"));
    store.instance_start(&start(&parent, Value::Null)).await?;
    spawn(store, &parent, &child).await?;
    let child_step = child_result_step(&child);
    fail_instance(store, &child, "boom").await?;
    fail_instance(store, &parent, "child failed").await?;
    // The child itself is resurrected and completes; its failed parent refuses the success.
    store.instance_resurrect(&child).await?;
    complete_instance(store, &child, json!("fixed")).await?;
    let before = events(store, &parent).await?;

    assert_eq!(
        h.admin.instance_requeue(&parent).await?,
        RequeueOutcome::Requeued {
            reset_steps: 1,
            children: Vec::new()
        }
    );
    // The reset, the resurrection, then the success under the next revision.
    let after = events(store, &parent).await?;
    assert_eq!(after[..before.len()], before[..]);
    assert_eq!(
        after[before.len()..],
        [
            Event::StepReset {
                step: child_step.clone(),
                superseded: child_step.clone()
            },
            Event::Resurrected,
            Event::StepRecorded {
                step: format!("{child_step}#1"),
                kind: StepKind::Child,
                result: json!({"ok": "fixed"})
            },
        ]
    );
    assert_eq!(status(store, &parent).await?, Status::Running);
    assert_eq!(status(store, &child).await?, Status::Completed);
    Ok(())
}

pub async fn a_handled_child_failure_is_not_reset_unless_the_run_failed_on_it(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let gone = key("child", "gone");
    let failed_child = |k: &keiro_journal::InstanceKey| {
        Append::external(
            k.clone(),
            Event::StepRecorded {
                step: child_result_step(&gone),
                kind: StepKind::Child,
                result: json!({"failed": "boom"}),
            },
        )
    };
    let fallback = |k: &keiro_journal::InstanceKey| {
        Append::external(
            k.clone(),
            Event::StepRecorded {
                step: "fallback".into(),
                kind: StepKind::Step,
                result: json!(1),
            },
        )
    };
    // The body went on past the child's failure (a fallback ran), and failed for another
    // reason: the handled failure stays.
    let handled = key("owner", "handled");
    store.instance_start(&start(&handled, Value::Null)).await?;
    store.journal_append(&failed_child(&handled)).await?;
    store.journal_append(&fallback(&handled)).await?;
    fail_instance(store, &handled, "something else").await?;
    assert_eq!(
        h.admin.instance_requeue(&handled).await?,
        RequeueOutcome::Requeued {
            reset_steps: 0,
            children: vec![]
        }
    );
    // The same, but the run failed on the child after all: it is reset.
    let failed_on = key("owner", "failed-on");
    store
        .instance_start(&start(&failed_on, Value::Null))
        .await?;
    store.journal_append(&failed_child(&failed_on)).await?;
    store.journal_append(&fallback(&failed_on)).await?;
    fail_instance(store, &failed_on, "child workflow child/gone failed: boom").await?;
    assert_eq!(
        h.admin.instance_requeue(&failed_on).await?,
        RequeueOutcome::Requeued {
            reset_steps: 1,
            children: vec![]
        }
    );
    assert_eq!(resets(store, &failed_on).await?.len(), 1);
    assert!(resets(store, &handled).await?.is_empty());
    Ok(())
}
