//! Remote steps on a queue: a task armed with a queue (and a key) is claimed only within the
//! queue's limits, across worker groups and workers, and together with the runs of that queue;
//! its slot comes back when it completes, fails or its claim expires; a paused queue gives
//! nothing; an undeclared queue is refused at the arm and nothing is written.

use std::time::Duration;

use keiro::queue::{Fairness, QueueRefusal, QueueSpec, Rate};
use keiro_journal::store::{Park, RemoteArm};
use keiro_journal::{InstanceKey, StoreError};
use keiro_remote::{ClaimedTask, ReportOutcome};
use serde_json::{json, Value};

use super::{arm, claim_request, failure};
use crate::contract::queue::{admit, declare, ids, start_on};
use crate::contract::support::{key, start, start_parked, status, Result, TestResult};
use crate::Harness;

/// The arm of step `step` of `owner` in group `group`, on `queue` under `queue_key`.
fn queued(
    owner: &InstanceKey,
    step: &str,
    group: &str,
    queue: &str,
    queue_key: Option<&str>,
) -> RemoteArm {
    RemoteArm {
        group: group.into(),
        queue: Some(queue.into()),
        queue_key: queue_key.map(str::to_owned),
        ..arm(owner, step, json!(step))
    }
}

/// What `worker` claims of `groups`, at most `limit`, with a claim of `ttl`.
async fn claim(
    h: &Harness,
    groups: &[&str],
    worker: &str,
    limit: u32,
    ttl: Duration,
) -> Result<Vec<ClaimedTask>> {
    let request = claim_request(groups, worker, limit, ttl);
    Ok(h.transport.tasks_claim(&request).await?)
}

/// A one-minute claim.
const MINUTE: Duration = Duration::from_secs(60);

/// The steps of `tasks`, sorted.
fn steps(tasks: &[ClaimedTask]) -> Vec<String> {
    let mut steps: Vec<String> = tasks.iter().map(|t| t.step.clone()).collect();
    steps.sort();
    steps
}

/// Starts the owner `owner/<id>` parked, so its tasks can be armed.
async fn owner(h: &Harness, id: &str) -> Result<InstanceKey> {
    let k = key("owner", id);
    start_parked(&*h.store, &k).await?;
    Ok(k)
}

pub async fn concurrency_holds_across_groups_and_workers(h: Harness) -> TestResult {
    declare(&h, QueueSpec::new("payments")?.concurrency(2)).await?;
    let o = owner(&h, "o-1").await?;
    for (step, group) in [
        ("a1", "charge"),
        ("a2", "charge"),
        ("b1", "refund"),
        ("b2", "refund"),
    ] {
        h.store
            .remote_arm(&queued(&o, step, group, "payments", None))
            .await?;
    }
    // An unqueued task of the same group is claimed as ever, beside the queue's limit.
    h.store
        .remote_arm(&RemoteArm {
            group: "charge".into(),
            ..arm(&o, "free", json!(0))
        })
        .await?;
    let first = claim(&h, &["charge"], "w-1", 10, MINUTE).await?;
    assert_eq!(steps(&first), ["a1", "a2", "free"]);
    let second = claim(&h, &["refund"], "w-2", 10, MINUTE).await?;
    assert!(
        second.is_empty(),
        "another group on another worker waits for the queue's slots"
    );
    let both = claim(&h, &["charge", "refund"], "w-3", 10, MINUTE).await?;
    assert!(both.is_empty());
    Ok(())
}

pub async fn worker_concurrency_counts_each_remote_worker_alone(h: Harness) -> TestResult {
    declare(&h, QueueSpec::new("q")?.worker_concurrency(1)).await?;
    let o = owner(&h, "o-1").await?;
    for step in ["s1", "s2", "s3"] {
        h.store
            .remote_arm(&queued(&o, step, "g", "q", None))
            .await?;
    }
    assert_eq!(claim(&h, &["g"], "w-1", 10, MINUTE).await?.len(), 1);
    assert!(claim(&h, &["g"], "w-1", 10, MINUTE).await?.is_empty());
    assert_eq!(claim(&h, &["g"], "w-2", 10, MINUTE).await?.len(), 1);
    Ok(())
}

pub async fn key_concurrency_admits_other_keys_past_a_busy_one(h: Harness) -> TestResult {
    declare(&h, QueueSpec::new("payments")?.key_concurrency(1)).await?;
    let o = owner(&h, "o-1").await?;
    for (step, merchant) in [("m1-a", "m1"), ("m1-b", "m1"), ("m2-a", "m2")] {
        h.store
            .remote_arm(&queued(&o, step, "charge", "payments", Some(merchant)))
            .await?;
    }
    let first = claim(&h, &["charge"], "w-1", 10, MINUTE).await?;
    assert_eq!(
        steps(&first),
        ["m1-a", "m2-a"],
        "one at a time per merchant"
    );
    assert!(claim(&h, &["charge"], "w-2", 10, MINUTE).await?.is_empty());
    let m1 = first.iter().find(|t| t.step == "m1-a").ok_or("m1-a")?;
    h.transport.task_complete(&m1.step_id, &json!("ok")).await?;
    let next = claim(&h, &["charge"], "w-2", 10, MINUTE).await?;
    assert_eq!(steps(&next), ["m1-b"], "the merchant's slot came back");
    Ok(())
}

pub async fn weighted_fairness_interleaves_the_keys(h: Harness) -> TestResult {
    declare(
        &h,
        QueueSpec::new("q")?
            .concurrency(3)
            .fairness(Fairness::Weighted),
    )
    .await?;
    let o = owner(&h, "o-1").await?;
    // The busy key's tasks are all older than the quiet key's.
    for step in ["big-1", "big-2", "big-3", "big-4"] {
        h.store
            .remote_arm(&queued(&o, step, "g", "q", Some("big")))
            .await?;
    }
    h.store
        .remote_arm(&queued(&o, "small-1", "g", "q", Some("small")))
        .await?;
    let first = claim(&h, &["g"], "w-1", 10, MINUTE).await?;
    assert_eq!(
        steps(&first),
        ["big-1", "big-2", "small-1"],
        "the keys take turns instead of oldest first"
    );
    Ok(())
}

pub async fn a_rate_limit_counts_first_claims_over_a_window(h: Harness) -> TestResult {
    let window = Duration::from_millis(800);
    declare(&h, QueueSpec::new("q")?.rate(Rate::new(2, window)?)).await?;
    let o = owner(&h, "o-1").await?;
    for step in ["s1", "s2", "s3"] {
        h.store
            .remote_arm(&queued(&o, step, "g", "q", None))
            .await?;
    }
    let first = claim(&h, &["g"], "w-1", 10, MINUTE).await?;
    assert_eq!(first.len(), 2);
    for task in &first {
        h.transport.task_complete(&task.step_id, &json!(1)).await?;
    }
    assert!(
        claim(&h, &["g"], "w-1", 10, MINUTE).await?.is_empty(),
        "free slots, but the window is full"
    );
    tokio::time::sleep(window + Duration::from_millis(200)).await;
    assert_eq!(steps(&claim(&h, &["g"], "w-1", 10, MINUTE).await?), ["s3"]);
    Ok(())
}

pub async fn a_slot_comes_back_on_completion_failure_and_claim_expiry(h: Harness) -> TestResult {
    declare(&h, QueueSpec::new("q")?.concurrency(1)).await?;
    let o = owner(&h, "o-1").await?;
    for (step, group) in [("s1", "g"), ("s2", "g"), ("s3", "g"), ("s4", "g2")] {
        let a = RemoteArm {
            max_attempts: 2,
            ..queued(&o, step, group, "q", None)
        };
        h.store.remote_arm(&a).await?;
    }
    // Completed.
    let held = claim(&h, &["g"], "w-1", 10, MINUTE).await?;
    assert_eq!(steps(&held), ["s1"]);
    assert!(claim(&h, &["g", "g2"], "w-1", 10, MINUTE).await?.is_empty());
    h.transport
        .task_complete(&held[0].step_id, &json!(1))
        .await?;
    // Failed for good.
    let held = claim(&h, &["g"], "w-1", 10, MINUTE).await?;
    assert_eq!(steps(&held), ["s2"]);
    assert!(claim(&h, &["g2"], "w-2", 10, MINUTE).await?.is_empty());
    let fail = failure("declined", None, false);
    let outcome = h
        .transport
        .task_fail(&held[0].step_id, held[0].claim, &fail, Duration::ZERO)
        .await?;
    assert_ne!(outcome, ReportOutcome::Stale);
    // Its claim expired: the slot is free, even before a claimer of its group counts the
    // expired claim as a failed attempt (a claimer of another group leaves it running).
    let held = claim(&h, &["g"], "w-1", 10, Duration::from_millis(100)).await?;
    assert_eq!(steps(&held), ["s3"]);
    assert!(claim(&h, &["g2"], "w-2", 10, MINUTE).await?.is_empty());
    tokio::time::sleep(Duration::from_millis(250)).await;
    let taken = claim(&h, &["g2"], "w-2", 10, MINUTE).await?;
    assert_eq!(steps(&taken), ["s4"]);
    assert!(
        claim(&h, &["g"], "w-3", 10, MINUTE).await?.is_empty(),
        "s3's expired claim was counted, and s4 holds the slot"
    );
    Ok(())
}

pub async fn a_paused_queue_gives_no_task_until_resumed(h: Harness) -> TestResult {
    declare(&h, QueueSpec::new("q")?).await?;
    let o = owner(&h, "o-1").await?;
    h.store
        .remote_arm(&queued(&o, "s1", "g", "q", None))
        .await?;
    h.keiro.pause_queue("q").await?;
    assert!(claim(&h, &["g"], "w-1", 10, MINUTE).await?.is_empty());
    h.keiro.resume_queue("q").await?;
    assert_eq!(steps(&claim(&h, &["g"], "w-1", 10, MINUTE).await?), ["s1"]);
    Ok(())
}

pub async fn runs_and_steps_share_one_queues_limits(h: Harness) -> TestResult {
    declare(&h, QueueSpec::new("q")?.concurrency(2)).await?;
    let o = owner(&h, "o-1").await?;
    start_on(&h, "q", "r-1", "").await?;
    let runs = admit(&*h.store, "q", "w", 10, None).await?;
    assert_eq!(ids(&runs), ["r-1"]);
    for step in ["s1", "s2"] {
        h.store
            .remote_arm(&queued(&o, step, "g", "q", None))
            .await?;
    }
    let tasks = claim(&h, &["g"], "rw-1", 10, MINUTE).await?;
    assert_eq!(tasks.len(), 1, "the run holds one of the two slots");
    start_on(&h, "q", "r-2", "").await?;
    assert!(
        admit(&*h.store, "q", "w", 10, None).await?.is_empty(),
        "the task holds the other"
    );
    h.transport
        .task_complete(&tasks[0].step_id, &json!(1))
        .await?;
    assert_eq!(ids(&admit(&*h.store, "q", "w", 10, None).await?), ["r-2"]);
    assert!(claim(&h, &["g"], "rw-1", 10, MINUTE).await?.is_empty());

    // The rate window counts first admissions and first claims alike.
    let window = Duration::from_secs(60);
    declare(&h, QueueSpec::new("rated")?.rate(Rate::new(2, window)?)).await?;
    start_on(&h, "rated", "r-3", "").await?;
    assert_eq!(
        ids(&admit(&*h.store, "rated", "w", 10, None).await?),
        ["r-3"]
    );
    for step in ["t1", "t2"] {
        h.store
            .remote_arm(&queued(&o, step, "h", "rated", None))
            .await?;
    }
    assert_eq!(claim(&h, &["h"], "rw-1", 10, MINUTE).await?.len(), 1);
    start_on(&h, "rated", "r-4", "").await?;
    assert!(admit(&*h.store, "rated", "w", 10, None).await?.is_empty());
    Ok(())
}

pub async fn an_undeclared_queue_is_refused_and_nothing_is_written(h: Harness) -> TestResult {
    let o = key("owner", "o-1");
    h.store.instance_start(&start(&o, Value::Null)).await?;
    let refused = h
        .store
        .remote_arm(&queued(&o, "s1", "g", "nowhere", None))
        .await;
    assert!(
        matches!(
            &refused,
            Err(StoreError::QueueRefused { queue, refusal: QueueRefusal::Unknown })
                if queue == "nowhere"
        ),
        "{refused:?}"
    );
    assert!(h.admin.remote_tasks(&o).await?.is_empty());

    // A park whose second arm names an undeclared queue arms nothing and does not park.
    declare(&h, QueueSpec::new("q")?).await?;
    let park = Park {
        key: o.clone(),
        generation: 0,
        fence: None,
        awaited: vec!["remote:s2".to_owned()],
        wake_after: None,
    };
    let arms = [
        queued(&o, "s2", "g", "q", None),
        queued(&o, "s3", "g", "elsewhere", Some("k")),
    ];
    let refused = h.store.instance_park_dispatch(&park, &arms).await;
    assert!(
        matches!(
            &refused,
            Err(StoreError::QueueRefused { queue, refusal: QueueRefusal::Unknown })
                if queue == "elsewhere"
        ),
        "{refused:?}"
    );
    assert!(h.admin.remote_tasks(&o).await?.is_empty());
    assert_eq!(
        status(&*h.store, &o).await?,
        keiro_journal::Status::Running,
        "not parked"
    );
    Ok(())
}
