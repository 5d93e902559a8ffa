//! Updates (update.sql): a caller's request into a run, taken first in first out per name
//! through the instance's update token, answered once by the run's step with the row in one
//! transaction, idempotent by update id, refused for unknown and finished runs, settled
//! `unanswered` when the run ends, and sent with a start in one transaction.

#[allow(clippy::wildcard_imports)] // the shared tools, some of them per scenario
use crate::contract::support::*;
use crate::Harness;
use keiro_journal::store::{SignalWait, SignalWaitOutcome, StartRequest};
use keiro_journal::update::{
    update_token, UpdateAnswer, UpdateAnswerOutcome, UpdateSend, UpdateSendOutcome, UpdateState,
};
use keiro_journal::{
    Append, AppendOutcome, Event, Fence, InstanceKey, SignalOptions, SignalSendOutcome, Status,
    StepKind,
};
use serde_json::{json, Value};

/// Update `id` named `name` with `request` for `k`, without a start.
pub(super) fn send(k: &InstanceKey, name: &str, id: &str, request: Value) -> UpdateSend {
    UpdateSend {
        key: k.clone(),
        name: name.into(),
        id: id.into(),
        request,
        start: None,
    }
}

/// The `n`-th take of updates named `name` by `k`'s generation 0.
fn take(k: &InstanceKey, name: &str, n: u32, fence: Option<&Fence>) -> SignalWait {
    SignalWait {
        key: k.clone(),
        generation: 0,
        step: format!("update:{name}:{n}"),
        token: update_token(k, name),
        fence: fence.cloned(),
    }
}

/// The run's answer step to update `id` named `name`: `value` is the journaled answer.
fn answer_step(
    k: &InstanceKey,
    fence: Option<&Fence>,
    name: &str,
    id: &str,
    value: Value,
) -> Append {
    Append {
        key: k.clone(),
        generation: Some(0),
        event: Event::StepRecorded {
            step: format!("update:{name}#{id}"),
            kind: StepKind::Update,
            result: value,
        },
        fence: fence.cloned(),
        renew: None,
    }
}

fn answer(name: &str, id: &str, rejected: bool) -> UpdateAnswer {
    UpdateAnswer {
        name: name.into(),
        id: id.into(),
        rejected,
    }
}

fn sent(created: bool, state: UpdateState) -> UpdateSendOutcome {
    UpdateSendOutcome::Sent {
        created,
        state,
        started: false,
    }
}

async fn state_of(h: &Harness, k: &InstanceKey, id: &str) -> Result<Option<UpdateState>> {
    let read = h.inspect.update_get(k, id).await?.expect("the instance");
    Ok(read.update.map(|(_, state)| state))
}

pub async fn an_update_is_taken_in_order_answered_once_and_a_resend_gets_the_answer(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let k = started(store, "u-1").await?;
    let fence = claim(store, &k, "w-1").await?;
    for (id, n) in [("a", 1), ("b", 2)] {
        assert_eq!(
            store
                .update_send(&send(&k, "approve", id, json!(n)))
                .await?,
            sent(true, UpdateState::Requested)
        );
    }
    // Taken first in first out, each journaled under its take.
    assert_eq!(
        store
            .signal_wait(&take(&k, "approve", 1, Some(&fence)))
            .await?,
        SignalWaitOutcome::Delivered(json!({"ok": {"id": "a", "name": "approve", "request": 1}}))
    );
    assert_eq!(
        store
            .signal_wait(&take(&k, "approve", 2, Some(&fence)))
            .await?,
        SignalWaitOutcome::Delivered(json!({"ok": {"id": "b", "name": "approve", "request": 2}}))
    );
    assert_eq!(state_of(&h, &k, "a").await?, Some(UpdateState::Requested));

    let reply = answer_step(&k, Some(&fence), "approve", "a", json!({"ok": "yes"}));
    assert_eq!(
        store
            .update_answer(&reply, &answer("approve", "a", false))
            .await?,
        UpdateAnswerOutcome::Append(AppendOutcome::Appended)
    );
    assert_eq!(
        state_of(&h, &k, "a").await?,
        Some(UpdateState::Replied(json!("yes")))
    );
    // A replayed answer (another value, as a changed body would send) writes nothing.
    let replayed = answer_step(&k, Some(&fence), "approve", "a", json!({"ok": "no"}));
    assert_eq!(
        store
            .update_answer(&replayed, &answer("approve", "a", false))
            .await?,
        UpdateAnswerOutcome::Append(AppendOutcome::AlreadyPresent(json!({"ok": "yes"})))
    );
    let reject = answer_step(
        &k,
        Some(&fence),
        "approve",
        "b",
        json!({"rejected": "too big"}),
    );
    assert_eq!(
        store
            .update_answer(&reject, &answer("approve", "b", true))
            .await?,
        UpdateAnswerOutcome::Append(AppendOutcome::Appended)
    );
    assert_eq!(
        state_of(&h, &k, "b").await?,
        Some(UpdateState::Rejected("too big".into()))
    );

    // The caller retrying with the same id gets the same answer; nothing new is offered.
    assert_eq!(
        store
            .update_send(&send(&k, "approve", "a", json!(1)))
            .await?,
        sent(false, UpdateState::Replied(json!("yes")))
    );
    assert_eq!(
        store
            .signal_wait(&take(&k, "approve", 3, Some(&fence)))
            .await?,
        SignalWaitOutcome::Waiting,
        "a resend offers nothing"
    );
    // The instance's updates, oldest first, as an operator reads them.
    let listed = h.inspect.instance_updates(&k, 10).await?;
    let listed: Vec<(&str, &str, &Value, &UpdateState)> = listed
        .iter()
        .map(|u| (u.id.as_str(), u.name.as_str(), &u.request, &u.state))
        .collect();
    assert_eq!(
        listed,
        [
            (
                "a",
                "approve",
                &json!(1),
                &UpdateState::Replied(json!("yes"))
            ),
            (
                "b",
                "approve",
                &json!(2),
                &UpdateState::Rejected("too big".into())
            ),
        ]
    );
    assert_eq!(h.inspect.instance_updates(&k, 1).await?.len(), 1, "bounded");
    assert!(h
        .inspect
        .instance_updates(&key("wf", "nobody"), 10)
        .await?
        .is_empty());
    // Another request, or another name, under a taken id is a conflict.
    assert_eq!(
        store
            .update_send(&send(&k, "approve", "a", json!(9)))
            .await?,
        UpdateSendOutcome::Conflict
    );
    assert_eq!(
        store
            .update_send(&send(&k, "cancel", "a", json!(1)))
            .await?,
        UpdateSendOutcome::Conflict
    );
    Ok(())
}

pub async fn a_send_wakes_the_run_parked_on_its_take(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = key("approval", "u-2");
    start_parked(store, &k).await?;
    assert_eq!(
        store.signal_wait(&take(&k, "approve", 1, None)).await?,
        SignalWaitOutcome::Waiting
    );
    park_on(store, &k, "update:approve:1").await?;
    assert_eq!(status(store, &k).await?, Status::Suspended);
    store
        .update_send(&send(&k, "approve", "x", json!({"amount": 3})))
        .await?;
    assert_eq!(
        status(store, &k).await?,
        Status::Running,
        "woken by the send"
    );
    assert_eq!(
        recorded(store, &k, "update:approve:1").await?,
        vec![json!({"ok": {"id": "x", "name": "approve", "request": {"amount": 3}}})]
    );
    // Names are separate queues: an update of another name is not taken by this wait.
    store.update_send(&send(&k, "other", "y", json!(0))).await?;
    assert_eq!(
        store.signal_wait(&take(&k, "approve", 2, None)).await?,
        SignalWaitOutcome::Waiting
    );
    Ok(())
}

pub async fn an_update_to_an_unknown_or_finished_run_is_refused_and_a_run_that_ends_settles_its_updates(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let unknown = key("approval", "nope");
    assert_eq!(
        store
            .update_send(&send(&unknown, "approve", "a", json!(1)))
            .await?,
        UpdateSendOutcome::NotFound
    );
    assert!(h.inspect.update_get(&unknown, "a").await?.is_none());

    let k = started(store, "u-3").await?;
    store
        .update_send(&send(&k, "approve", "a", json!(1)))
        .await?;
    // Taken, not answered: still unanswered when the run ends.
    store
        .update_send(&send(&k, "approve", "b", json!(2)))
        .await?;
    store.signal_wait(&take(&k, "approve", 1, None)).await?;
    append(
        store,
        &k,
        None,
        Event::WorkflowCompleted {
            output: json!(null),
        },
        None,
    )
    .await?;
    for id in ["a", "b"] {
        assert_eq!(
            state_of(&h, &k, id).await?,
            Some(UpdateState::Unanswered(Status::Completed)),
            "update {id}"
        );
    }
    // Update b, never taken, left the buffer with the run: a wait on its token (as no other
    // instance's could be, but a store would serve one) finds nothing.
    let stray = key("approval", "u-3-other");
    start_parked(store, &stray).await?;
    let on_token = SignalWait {
        key: stray.clone(),
        ..take(&k, "approve", 1, None)
    };
    assert_eq!(
        store.signal_wait(&on_token).await?,
        SignalWaitOutcome::Waiting,
        "nothing buffered for a finished run"
    );
    assert_eq!(
        store
            .update_send(&send(&k, "approve", "c", json!(3)))
            .await?,
        UpdateSendOutcome::Finished(Status::Completed)
    );
    assert_eq!(state_of(&h, &k, "c").await?, None, "nothing written");
    // A resend of a settled update gets its settlement.
    assert_eq!(
        store
            .update_send(&send(&k, "approve", "a", json!(1)))
            .await?,
        sent(false, UpdateState::Unanswered(Status::Completed))
    );
    // An answer to a settled update is refused.
    let late = answer_step(&k, None, "approve", "a", json!({"ok": 1}));
    assert_eq!(
        store
            .update_answer(&late, &answer("approve", "a", false))
            .await?,
        UpdateAnswerOutcome::Answered
    );
    Ok(())
}

pub async fn bad_update_requests_are_typed_outcomes_and_write_nothing(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = started(store, "u-4").await?;
    let fence = claim(store, &k, "w-1").await?;
    // An answer to an update id that does not exist, or under another name.
    let stray = answer_step(&k, Some(&fence), "approve", "ghost", json!({"ok": 1}));
    assert_eq!(
        store
            .update_answer(&stray, &answer("approve", "ghost", false))
            .await?,
        UpdateAnswerOutcome::Unknown
    );
    assert!(recorded(store, &k, "update:approve#ghost")
        .await?
        .is_empty());
    store
        .update_send(&send(&k, "approve", "a", json!(1)))
        .await?;
    let misnamed = answer_step(&k, Some(&fence), "cancel", "a", json!({"ok": 1}));
    assert_eq!(
        store
            .update_answer(&misnamed, &answer("cancel", "a", false))
            .await?,
        UpdateAnswerOutcome::Unknown
    );
    // A stale holder answers nothing.
    let stale = Fence {
        owner: "w-0".into(),
        epoch: fence.epoch,
    };
    let reply = answer_step(&k, Some(&stale), "approve", "a", json!({"ok": 1}));
    let refused = store
        .update_answer(&reply, &answer("approve", "a", false))
        .await;
    assert!(
        matches!(&refused, Err(e) if e.is_lease_lost()),
        "{refused:?}"
    );
    assert_eq!(state_of(&h, &k, "a").await?, Some(UpdateState::Requested));
    // A request the store refuses (a NUL) is a typed error, with nothing written.
    let refused = store
        .update_send(&send(&k, "approve", "nul", json!("a\u{0}b")))
        .await;
    assert!(
        matches!(
            &refused,
            Err(keiro_journal::StoreError::ValueRefused { .. })
        ),
        "{refused:?}"
    );
    assert_eq!(state_of(&h, &k, "nul").await?, None);
    Ok(())
}

pub async fn update_and_signal_with_start_start_and_deliver_in_one_call(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = key("approval", "u-5");
    let with_start = UpdateSend {
        start: Some(StartRequest {
            attributes: Default::default(),
            key: k.clone(),
            input: json!({"limit": 10}),
            parent: None,
            priority: 0,
            queue: None,
        }),
        ..send(&k, "approve", "a", json!(1))
    };
    assert_eq!(
        store.update_send(&with_start).await?,
        UpdateSendOutcome::Sent {
            created: true,
            state: UpdateState::Requested,
            started: true
        }
    );
    assert_eq!(status(store, &k).await?, Status::Running);
    // Again with the same id: found, not started again, not sent again.
    assert_eq!(
        store.update_send(&with_start).await?,
        sent(false, UpdateState::Requested)
    );
    let second = UpdateSend {
        id: "b".into(),
        ..with_start.clone()
    };
    assert_eq!(
        store.update_send(&second).await?,
        sent(true, UpdateState::Requested)
    );
    assert_eq!(
        store.signal_wait(&take(&k, "approve", 1, None)).await?,
        SignalWaitOutcome::Delivered(json!({"ok": {"id": "a", "name": "approve", "request": 1}}))
    );

    let s = key("approval", "u-6");
    let start = StartRequest {
        attributes: Default::default(),
        key: s.clone(),
        input: json!(null),
        parent: None,
        priority: 0,
        queue: None,
    };
    let first = store
        .signal_with_start(&start, "u-6/go", &json!(1), &SignalOptions::default())
        .await?;
    assert!(first.started);
    assert_eq!(first.signal, SignalSendOutcome::Buffered);
    let again = store
        .signal_with_start(&start, "u-6/go", &json!(2), &SignalOptions::default())
        .await?;
    assert!(!again.started, "an existing instance is not started again");
    assert_eq!(status(store, &s).await?, Status::Running);
    let wait = SignalWait {
        key: s.clone(),
        generation: 0,
        step: "signal:u-6/go:1".into(),
        token: "u-6/go".into(),
        fence: None,
    };
    assert_eq!(
        store.signal_wait(&wait).await?,
        SignalWaitOutcome::Delivered(json!({"ok": 1}))
    );
    // A start on a queue is refused before anything is written.
    let queued = StartRequest {
        attributes: Default::default(),
        key: key("approval", "u-7"),
        queue: Some(keiro_journal::queue::QueueStart::new("q")),
        ..start.clone()
    };
    let refused = store
        .signal_with_start(&queued, "u-7/go", &json!(1), &SignalOptions::default())
        .await;
    assert!(
        matches!(
            &refused,
            Err(keiro_journal::StoreError::ValueRefused { .. })
        ),
        "{refused:?}"
    );
    assert!(store.instance_get(&key("approval", "u-7")).await?.is_none());
    Ok(())
}
