//! Group commit on Postgres: concurrent appends and starts share statements and commits, a
//! batch is one round trip, and a batch that fails as a whole (a deadlock the server broke)
//! is sent again call by call, each call answered as if alone (issue 15, item 1).

use std::time::Duration;

use crate::common::{
    fenced_step as step, key, lease_ending_soon, lease_left, sql, start, start_parked,
    started_claimed, status, Listener, TestResult,
};
use keiro_journal::{
    Append, AppendOutcome, Event, Fence, InstanceKey, JournalStore, Status, StepKind,
};
use keiro_lease::{ClaimOutcome, LeaseStore};
use keiro_postgres::PgStore;
use keiro_tests::pg::TestDb;
use serde_json::json;

const TTL: Duration = Duration::from_secs(60);

/// `id` of workflow `gc`, started and claimed by `w`.
async fn claimed(
    store: &PgStore,
    id: &str,
) -> Result<(InstanceKey, Fence), Box<dyn std::error::Error + Send + Sync>> {
    started_claimed(store, key("gc", id)).await
}

/// `n` instances started and claimed, named `{prefix}00`, `{prefix}01`, ...
async fn claimed_runs(
    store: &PgStore,
    prefix: &str,
    n: usize,
) -> Result<Vec<(InstanceKey, Fence)>, Box<dyn std::error::Error + Send + Sync>> {
    let mut runs = Vec::with_capacity(n);
    for i in 0..n {
        runs.push(claimed(store, &format!("{prefix}{i:02}")).await?);
    }
    Ok(runs)
}

/// Appends step `name` to every run at once, one task each, and checks each was appended; fails
/// if that takes ten seconds (the lane waited for something it must not wait for).
async fn append_at_once(store: &PgStore, runs: &[(InstanceKey, Fence)], name: &str) -> TestResult {
    let mut tasks = tokio::task::JoinSet::new();
    for (k, fence) in runs {
        let (store, append) = (store.clone(), step(k, Some(fence), name));
        tasks.spawn(async move { store.journal_append(&append).await });
    }
    tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(joined) = tasks.join_next().await {
            assert_eq!(joined??, AppendOutcome::Appended);
        }
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    })
    .await
    .map_err(|_| format!("appending {name}: the lane waited for another transaction"))?
}

/// Statements `store` sent while `work` ran, after a warm-up of the same work prepared them.
async fn round_trips_of<F, Fut>(
    store: &PgStore,
    work: F,
) -> Result<u64, Box<dyn std::error::Error + Send + Sync>>
where
    F: Fn(u32) -> Fut,
    Fut: std::future::Future<Output = Result<(), Box<dyn std::error::Error + Send + Sync>>>,
{
    work(0).await?;
    let before = store.round_trips();
    work(1).await?;
    Ok(store.round_trips() - before)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_appends_is_one_statement() -> TestResult {
    let db = TestDb::new().await;
    let batched = db.store();
    let unbatched = PgStore::connect(db.config().batching(false)).await?;
    let mut runs = Vec::new();
    for i in 0..8 {
        runs.push(claimed(&batched, &format!("i{i}")).await?);
    }
    for (store, expected) in [(&batched, 1), (&unbatched, 8)] {
        let runs = runs.clone();
        let sent = round_trips_of(store, |round| {
            let appends: Vec<Append> = runs
                .iter()
                .map(|(k, f)| step(k, Some(f), &format!("s{round}-{expected}")))
                .collect();
            async move {
                for outcome in store.journal_append_batch(&appends).await {
                    assert_eq!(outcome?, AppendOutcome::Appended);
                }
                Ok(())
            }
        })
        .await?;
        assert_eq!(sent, expected, "batching {}", store.batching());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batched_step_wakes_a_parked_row_and_renews_a_lease_due() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let mut wakes = Listener::on(&store).await?;
    let parked = key("gc", "parked");
    start_parked(&store, &parked).await?;
    let (due, due_fence) = claimed(&store, "due").await?;
    let (fresh, fresh_fence) = claimed(&store, "fresh").await?;
    // `due`'s lease has 10 s left, under 3/4 of the 60 s renewal: the append renews it.
    lease_ending_soon(&store, &due).await?;
    wakes.drain(Duration::from_millis(200)).await;
    let appends = [
        step(&parked, None, "s"),
        step(&due, Some(&due_fence), "s"),
        step(&fresh, Some(&fresh_fence), "s"),
    ];
    for outcome in store.journal_append_batch(&appends).await {
        assert_eq!(outcome?, AppendOutcome::Appended);
    }
    assert_eq!(status(&store, &parked).await?, Status::Running);
    let woken: Vec<String> = wakes
        .drain(Duration::from_millis(300))
        .await
        .into_iter()
        .map(|(_, payload)| payload)
        .collect();
    assert_eq!(woken, ["gc/parked"], "one wake, for the parked row only");
    assert!(
        lease_left(&store, &due).await? > 50.0,
        "the lease due was renewed"
    );
    assert!(lease_left(&store, &fresh).await? > 50.0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_share_statements() -> TestResult {
    const RUNS: usize = 64;
    let db = TestDb::new().await;
    let store = db.store();
    let runs = claimed_runs(&store, "c", RUNS).await?;
    // Warm the statements on every pooled connection.
    let warm: Vec<Append> = runs.iter().map(|(k, f)| step(k, Some(f), "warm")).collect();
    store.journal_append_batch(&warm).await;
    let before = store.round_trips();
    append_at_once(&store, &runs, "s").await?;
    let sent = store.round_trips() - before;
    // One statement each without batching; the appends that queue while earlier batches are
    // in flight leave together. (Prepares on connections the warm-up did not reach count too,
    // so the bound leaves room for them.)
    assert!(
        sent < u64::try_from(RUNS / 2)?,
        "{RUNS} concurrent appends took {sent} round trips"
    );
    for (k, _) in &runs {
        assert_eq!(store.journal_load(k, 0).await?.len(), 2, "{k}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_starts_share_statements_and_start_many_is_one() -> TestResult {
    const STARTS: usize = 64;
    let db = TestDb::new().await;
    let store = db.store();
    let warm: Vec<_> = (0..4)
        .map(|i| start(&key("warm", &format!("w{i}")), json!(i)))
        .collect();
    store.instances_start(&warm).await;
    let before = store.round_trips();
    let many: Vec<_> = (0..STARTS)
        .map(|i| start(&key("many", &format!("m{i:02}")), json!(i)))
        .collect();
    for outcome in store.instances_start(&many).await {
        assert!(outcome?.created);
    }
    assert_eq!(
        store.round_trips() - before,
        1,
        "start_many is one statement"
    );

    let before = store.round_trips();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..STARTS {
        let store = store.clone();
        tasks.spawn(async move {
            store
                .instance_start(&start(&key("one", &format!("o{i:02}")), json!(i)))
                .await
        });
    }
    while let Some(joined) = tasks.join_next().await {
        assert!(joined??.created);
    }
    let sent = store.round_trips() - before;
    assert!(
        sent < u64::try_from(STARTS / 2)?,
        "{STARTS} concurrent starts took {sent} round trips"
    );
    Ok(())
}

/// A dedicated connection with an open transaction that holds `k`'s instance row.
async fn holding(
    store: &PgStore,
    k: &InstanceKey,
) -> Result<tokio_postgres::Client, Box<dyn std::error::Error + Send + Sync>> {
    let (client, connection) = store
        .connection_config()
        .connect(tokio_postgres::NoTls)
        .await?;
    tokio::spawn(connection);
    client.batch_execute("BEGIN").await?;
    client
        .execute(
            "SELECT 1 FROM workflows WHERE workflow_name = $1 AND workflow_id = $2 FOR UPDATE",
            &[&k.name.as_str(), &k.id.as_str()],
        )
        .await?;
    Ok(client)
}

/// The stored step names of `k`'s generation 0, read on a connection of its own (so only
/// committed rows count).
async fn committed_steps(
    store: &PgStore,
    k: &InstanceKey,
) -> Result<Vec<String>, Box<dyn std::error::Error + Send + Sync>> {
    Ok(store
        .journal_load(k, 0)
        .await?
        .into_iter()
        .map(|e| e.event.step_name().into_owned())
        .collect())
}

async fn eventually<F, Fut>(what: &str, mut check: F) -> TestResult
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool, Box<dyn std::error::Error + Send + Sync>>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !check().await? {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_held_elsewhere_never_holds_up_its_batch() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let (a, a_fence) = claimed(&store, "a").await?;
    let (b, b_fence) = claimed(&store, "b").await?;
    // Someone's long transaction holds b's row (a delivery inside a caller's transaction).
    let other = holding(&store, &b).await?;
    let batch = {
        let store = store.clone();
        let appends = [step(&a, Some(&a_fence), "s"), step(&b, Some(&b_fence), "s")];
        tokio::spawn(async move { store.journal_append_batch(&appends).await })
    };
    // a's append commits with its batch while b's waits, alone, for the other transaction.
    eventually("a's append never committed", || async {
        Ok(committed_steps(&store, &a).await? == ["s"])
    })
    .await?;
    assert!(committed_steps(&store, &b).await?.is_empty());
    assert!(!batch.is_finished());
    other.batch_execute("COMMIT").await?;
    for outcome in batch.await? {
        assert_eq!(outcome?, AppendOutcome::Appended);
    }
    assert_eq!(committed_steps(&store, &b).await?, ["s"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_kept_waiting_never_holds_up_the_lane() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let (held, held_fence) = claimed(&store, "held").await?;
    let others = claimed_runs(&store, "o", 8).await?;
    let other = holding(&store, &held).await?;
    // Alone in the lane, it waits for the other transaction...
    let waiting = {
        let store = store.clone();
        let append = step(&held, Some(&held_fence), "s");
        tokio::spawn(async move { store.journal_append(&append).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    // ... while the appends of other runs come and go through the same lane.
    for round in 0..3 {
        let mut tasks = tokio::task::JoinSet::new();
        for (k, fence) in others.clone() {
            let store = store.clone();
            let append = step(&k, Some(&fence), &format!("r{round}"));
            tasks.spawn(async move { store.journal_append(&append).await });
        }
        while let Some(joined) = tasks.join_next().await {
            assert_eq!(joined??, AppendOutcome::Appended);
        }
    }
    assert!(!waiting.is_finished());
    other.batch_execute("COMMIT").await?;
    assert_eq!(waiting.await??, AppendOutcome::Appended);
    Ok(())
}

/// Plans the append batch function on two of the pool's connections: one left waiting for a
/// lock and one sending batches meanwhile, as the scenarios about appends kept waiting use
/// them. A batch on a fresh connection plans the function first, which alone can outlast the
/// few milliseconds after which a running batch gives its lane's slot back anyway.
async fn warm_two_connections(store: &PgStore, others: &[(InstanceKey, Fence)]) -> TestResult {
    let (warm, warm_fence) = claimed(store, "warm").await?;
    let warm_holder = holding(store, &warm).await?;
    let warm_waiting = {
        let store = store.clone();
        let append = step(&warm, Some(&warm_fence), "s");
        tokio::spawn(async move { store.journal_append(&append).await })
    };
    for round in 0..3 {
        append_at_once(store, others, &format!("warm{round}")).await?;
    }
    warm_holder.batch_execute("COMMIT").await?;
    assert_eq!(warm_waiting.await??, AppendOutcome::Appended);
    Ok(())
}

/// An append whose row another transaction holds, carried by a batch: the batch answers it
/// busy and sends it alone afterwards, where it waits for the lock. That wait must not keep
/// the lane's slot, or every append of every run in the process waits for that transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_append_sent_alone_after_its_batch_never_holds_up_the_lane() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let (first, first_fence) = claimed(&store, "first").await?;
    let (held, held_fence) = claimed(&store, "held").await?;
    let others = claimed_runs(&store, "o", 8).await?;
    warm_two_connections(&store, &others).await?;
    let first_holder = holding(&store, &first).await?;
    let held_holder = holding(&store, &held).await?;
    // The idle lane sends this one alone; it waits for its lock and keeps the slot a moment.
    let first_waiting = {
        let store = store.clone();
        let append = step(&first, Some(&first_fence), "s");
        tokio::spawn(async move { store.journal_append(&append).await })
    };
    tokio::time::sleep(Duration::from_millis(5)).await;
    // Meanwhile these queue, and leave as one batch: `held` in it, busy.
    let held_waiting = {
        let store = store.clone();
        let append = step(&held, Some(&held_fence), "s");
        tokio::spawn(async move { store.journal_append(&append).await })
    };
    append_at_once(&store, &others, "batched").await?;
    // The other runs go on appending while `held` waits.
    for round in 0..3 {
        append_at_once(&store, &others, &format!("r{round}")).await?;
    }
    assert!(!held_waiting.is_finished());
    first_holder.batch_execute("COMMIT").await?;
    held_holder.batch_execute("COMMIT").await?;
    assert_eq!(first_waiting.await??, AppendOutcome::Appended);
    assert_eq!(held_waiting.await??, AppendOutcome::Appended);
    Ok(())
}

/// A run's last step and its completion, alone in an idle lane, whose row another transaction
/// holds: the pair's statement answers it busy, and its two appends then wait for the lock one
/// after the other, without keeping the lane's slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closing_pair_kept_waiting_never_holds_up_the_lane() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let (held, held_fence) = claimed(&store, "held").await?;
    let others = claimed_runs(&store, "o", 8).await?;
    warm_two_connections(&store, &others).await?;
    let held_holder = holding(&store, &held).await?;
    let closing = {
        let store = store.clone();
        let last = step(&held, Some(&held_fence), "last");
        let completion = Append {
            event: Event::WorkflowCompleted { output: json!(1) },
            ..step(&held, Some(&held_fence), "unused")
        };
        tokio::spawn(async move { store.journal_append_closing(&last, &completion).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    for round in 0..3 {
        append_at_once(&store, &others, &format!("r{round}")).await?;
    }
    assert!(!closing.is_finished());
    held_holder.batch_execute("COMMIT").await?;
    let closed = closing.await??;
    assert_eq!(
        (closed.step, closed.completion),
        (AppendOutcome::Appended, Some(AppendOutcome::Appended))
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_kept_waiting_on_a_parent_is_sent_again_append_by_append() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let parent = key("gc", "parent");
    store.instance_start(&start(&parent, json!(null))).await?;
    let child = key("gc", "child");
    let spawn = Append::external(
        parent.clone(),
        Event::StepRecorded {
            step: "child:gc/child".into(),
            kind: StepKind::Child,
            result: json!({"name": "gc", "id": "child"}),
        },
    );
    let spawned = store
        .child_spawn(
            &spawn,
            &keiro_journal::store::ChildSpawn {
                child: child.clone(),
                input: json!(null),
                await_step: keiro_journal::store::child_result_step(&child),
            },
        )
        .await?;
    assert_eq!(spawned, AppendOutcome::Appended);
    let ClaimOutcome::Acquired(claim) = store.instance_claim(&child, "w", TTL, None).await? else {
        panic!("claimable");
    };
    let (x, x_fence) = claimed(&store, "x").await?;
    // The child's completion journals into its parent, whose row someone holds: the batch
    // waits for it only as long as the lock timeout, then its appends go one by one.
    let other = holding(&store, &parent).await?;
    let batch = {
        let store = store.clone();
        let done = Append {
            event: Event::WorkflowCompleted { output: json!(7) },
            ..step(&child, Some(&claim.fence), "unused")
        };
        let appends = [done, step(&x, Some(&x_fence), "s")];
        tokio::spawn(async move { store.journal_append_batch(&appends).await })
    };
    eventually("x's append never committed", || async {
        Ok(committed_steps(&store, &x).await? == ["s"])
    })
    .await?;
    assert!(!batch.is_finished(), "the completion waits for the parent");
    other.batch_execute("COMMIT").await?;
    for outcome in batch.await? {
        assert_eq!(outcome?, AppendOutcome::Appended);
    }
    let delivered = store
        .journal_load(&parent, 0)
        .await?
        .into_iter()
        .find(|e| e.event.step_name() == keiro_journal::store::child_result_step(&child))
        .map(|e| e.event);
    assert!(
        matches!(&delivered, Some(Event::StepRecorded { result, .. }) if result == &json!({"ok": 7})),
        "{delivered:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_lane_counts_its_batches_and_the_calls_they_carried() -> TestResult {
    const RUNS: usize = 64;
    let db = TestDb::new().await;
    let store = db.store();
    assert_eq!(store.batch_stats(), keiro_postgres::BatchStats::default());
    let runs = claimed_runs(&store, "n", RUNS).await?;
    // The starts above came one at a time: each found its lane idle and went alone.
    let after_starts = store.batch_stats();
    assert_eq!(
        (after_starts.starts.batches, after_starts.starts.requests),
        (64, 64)
    );
    assert_eq!(after_starts.appends, keiro_postgres::LaneStats::default());

    // A lone append: a batch of one.
    let (k, fence) = &runs[0];
    store.journal_append(&step(k, Some(fence), "lone")).await?;
    let lone = store.batch_stats().since(&after_starts);
    assert_eq!((lone.appends.batches, lone.appends.requests), (1, 1));
    assert_eq!(lone.appends.mean_len(), Some(1.0));

    // Concurrent appends: every call counted once, in fewer batches than calls.
    let before = store.batch_stats();
    append_at_once(&store, &runs, "s").await?;
    let shared = store.batch_stats().since(&before);
    assert_eq!(shared.appends.requests, u64::try_from(RUNS)?);
    assert!(
        shared.appends.batches < u64::try_from(RUNS)?,
        "{RUNS} concurrent appends in {} batches",
        shared.appends.batches
    );
    assert_eq!(
        (shared.starts, shared.parks, shared.direct_starts),
        Default::default()
    );

    // Without batching no lane sends anything.
    let unbatched = PgStore::connect(db.config().batching(false)).await?;
    let (k, fence) = &runs[1];
    unbatched
        .journal_append(&step(k, Some(fence), "unbatched"))
        .await?;
    unbatched
        .instance_start(&start(&key("gc", "unbatched"), json!(null)))
        .await?;
    assert_eq!(
        unbatched.batch_stats(),
        keiro_postgres::BatchStats::default()
    );
    Ok(())
}

/// The batch shape a worker's runs make, on a current-thread runtime where the turns are
/// deterministic: 16 runs take two steps each (the first steps in two batches, one alone on
/// the idle lane and 15 behind it; the second steps in one batch, the lone one's joined by
/// the 15 answered while it waited), and the 16 runs started as those end (the worker's hops:
/// a task ends, the worker starts the next) append their first steps in one batch. A guard:
/// it fails if the lane gives its slot back before its answered callers asked again. It
/// cannot show the linger's turns (one `yield_now` on this runtime already waits until every
/// ready task ran; the split they prevent shows on the multi-thread runtime, in `keiro
/// bench`), which the unit tests of `linger` cover.
#[tokio::test(flavor = "current_thread")]
async fn runs_started_after_a_batch_is_answered_share_the_next_one() -> TestResult {
    const RUNS: usize = 16;
    let db = TestDb::new().await;
    let store = db.store();
    let runs = claimed_runs(&store, "h", RUNS).await?;
    let before = store.batch_stats();
    // The worker: a task of its own that starts a successor as each run ends.
    let worker = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut first = tokio::task::JoinSet::new();
            for (k, fence) in runs {
                let store = store.clone();
                first.spawn(async move {
                    for name in ["a", "b"] {
                        let outcome = store.journal_append(&step(&k, Some(&fence), name)).await;
                        assert_eq!(outcome.expect("a step"), AppendOutcome::Appended);
                    }
                    (k, fence)
                });
            }
            let mut next = tokio::task::JoinSet::new();
            while let Some(joined) = first.join_next().await {
                let (k, fence) = joined.expect("run");
                let store = store.clone();
                next.spawn(async move { store.journal_append(&step(&k, Some(&fence), "c")).await });
            }
            while let Some(joined) = next.join_next().await {
                assert_eq!(
                    joined.expect("run").expect("next run's step"),
                    AppendOutcome::Appended
                );
            }
        })
    };
    worker.await?;
    let sent = store.batch_stats().since(&before).appends;
    assert_eq!(sent.requests, u64::try_from(3 * RUNS)?);
    assert_eq!(
        sent.batches, 4,
        "first steps: one alone and 15 together; second steps: one batch; the next runs' \
         steps: one batch"
    );
    Ok(())
}

/// Direct starts take their slot from the append lane's: a direct run's start and its steps
/// are one caller's sequence, and callers that wait for one commit come back together, so on
/// one slot they stay together (BENCHMARKS.md, issue 15, stop 20: on two slots `keiro bench
/// --mode direct` at C=16 split its runs over two commits in flight, 0.8 commits a workflow
/// against 0.37). On a current-thread runtime the order is fixed: the append finds the lanes
/// idle and goes alone, holding the slot; the direct starts behind it cannot take a slot of
/// their own, queue, and leave together once the append is answered.
#[tokio::test(flavor = "current_thread")]
async fn direct_starts_wait_for_the_append_lanes_slot_and_leave_together() -> TestResult {
    const STARTS: usize = 8;
    let db = TestDb::new().await;
    let store = db.store();
    let (k, fence) = claimed(&store, "slot").await?;
    let before = store.batch_stats();
    let mut tasks = tokio::task::JoinSet::new();
    {
        let store = store.clone();
        tasks.spawn(async move {
            let outcome = store.journal_append(&step(&k, Some(&fence), "a")).await;
            assert_eq!(outcome.expect("the append"), AppendOutcome::Appended);
        });
    }
    for i in 0..STARTS {
        let store = store.clone();
        tasks.spawn(async move {
            let request = start(&key("direct", &format!("d{i}")), json!(i));
            let started = store.instance_start_claimed(&request, "w", TTL, None).await;
            let started = started.expect("a direct start");
            assert!(started.created);
            assert!(matches!(started.claim, ClaimOutcome::Acquired(_)));
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined?;
    }
    let sent = store.batch_stats().since(&before);
    assert_eq!((sent.appends.batches, sent.appends.requests), (1, 1));
    assert_eq!(
        (sent.direct_starts.batches, sent.direct_starts.requests),
        (1, u64::try_from(STARTS)?),
        "the direct starts queued behind the append's slot and left in one batch"
    );
    Ok(())
}

/// The store sends an append batch sorted by instance key, one request per instance, the form
/// `keiro_journal_append_batch` journals without sorting. A batch in any other form (an older
/// build's store during a rolling deploy, a request out of order or an instance named twice)
/// goes request by request in key order, each as `keiro_journal_append_to` answers it alone:
/// a step behind its instance's completion in the same batch is refused, never journaled after
/// the completion marker.
/// Calls `keiro_journal_append_batch` directly with unfenced requests of workflow `gc` on
/// generation 0, `(id, step, kind, payload)` in the order given; its `(n, outcome)` rows.
async fn unfenced_batch(
    store: &PgStore,
    requests: &[(&str, &str, &str, serde_json::Value)],
) -> Result<Vec<(i32, String)>, Box<dyn std::error::Error + Send + Sync>> {
    let len = requests.len();
    let names = vec!["gc"; len];
    let ids: Vec<&str> = requests.iter().map(|r| r.0).collect();
    let generations = vec![Some(0_i32); len];
    let steps: Vec<&str> = requests.iter().map(|r| r.1).collect();
    let kinds: Vec<&str> = requests.iter().map(|r| r.2).collect();
    let payloads: Vec<&serde_json::Value> = requests.iter().map(|r| &r.3).collect();
    let unfenced: Vec<Option<&str>> = vec![None; len];
    let no_numbers: Vec<Option<i64>> = vec![None; len];
    let rows = sql(store)
        .await?
        .query(
            "SELECT n, outcome FROM keiro_journal_append_batch($1, $2, $3, $4, $5, $6, $7, \
             $8, $9) ORDER BY n",
            &[
                &names,
                &ids,
                &generations,
                &steps,
                &kinds,
                &payloads,
                &unfenced,
                &no_numbers,
                &no_numbers,
            ],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

#[tokio::test]
async fn a_batch_out_of_key_order_or_naming_an_instance_twice_goes_request_by_request() -> TestResult
{
    let db = TestDb::new().await;
    let store = db.store();
    let a = key("gc", "a");
    let b = key("gc", "b");
    store.instance_start(&start(&a, json!(null))).await?;
    store.instance_start(&start(&b, json!(null))).await?;

    // b before a, and a twice: its completion, then a step.
    let outcomes = unfenced_batch(
        &store,
        &[
            ("b", "s1", "step", json!("s1")),
            ("a", "__workflow_completed__", "completed", json!("done")),
            ("a", "s2", "step", json!("s2")),
        ],
    )
    .await?;
    assert_eq!(
        outcomes,
        [
            (1, "appended".to_owned()),
            (2, "appended".to_owned()),
            (3, "refused_terminal".to_owned()),
        ]
    );
    assert_eq!(status(&store, &a).await?, Status::Completed);
    assert_eq!(
        committed_steps(&store, &a).await?,
        ["__workflow_completed__"]
    );
    assert_eq!(committed_steps(&store, &b).await?, ["s1"]);
    Ok(())
}

/// Whatever order its callers came in, the store sends an append batch in the one form the
/// batch functions journal at once (sorted by instance, one append per instance): none of the
/// batch's requests falls back to `keiro_journal_append_to`, and only the second append to an
/// instance goes alone, after the batch. Counted by PostgreSQL itself (`track_functions`), on
/// the store's one connection.
#[tokio::test]
async fn appends_in_any_order_share_the_batch_path_but_a_repeated_instance() -> TestResult {
    let db = TestDb::new().await;
    let mut config = db.config();
    config.pool_size = 1;
    let separator = if config.url.contains('?') { '&' } else { '?' };
    config.url = format!("{}{separator}options=-c%20track_functions%3Dpl", config.url);
    let store = PgStore::connect(config).await?;
    let mut runs = Vec::new();
    for id in ["c", "b", "a"] {
        runs.push(claimed(&store, id).await?);
    }
    // Callers in reverse key order, and a second step of `a`.
    let mut appends: Vec<Append> = runs
        .iter()
        .map(|(k, fence)| step(k, Some(fence), "s"))
        .collect();
    appends.push(step(&runs[2].0, Some(&runs[2].1), "t"));
    for outcome in store.journal_append_batch(&appends).await {
        assert!(matches!(outcome?, AppendOutcome::Appended), "each appended");
    }

    let client = sql(&store).await?;
    client
        .batch_execute("SELECT pg_stat_force_next_flush()")
        .await?;
    let calls = |function: &'static str| {
        let client = &client;
        let schema = db.schema().to_owned();
        async move {
            let row = client
                .query_opt(
                    "SELECT calls FROM pg_stat_user_functions \
                     WHERE schemaname = $1 AND funcname = $2",
                    &[&schema, &function],
                )
                .await?;
            Ok::<i64, tokio_postgres::Error>(row.map_or(0, |r| r.get(0)))
        }
    };
    // Steps only: the batch is the steps function's (`append_steps`).
    assert_eq!(calls("keiro_journal_append_steps").await?, 1, "one batch");
    assert_eq!(calls("keiro_journal_append_batch").await?, 0);
    assert_eq!(
        calls("keiro_journal_append_to").await?,
        1,
        "only the repeated instance's second append went alone"
    );
    Ok(())
}

fn completion(k: &InstanceKey, fence: Option<&Fence>, output: serde_json::Value) -> Append {
    Append {
        key: k.clone(),
        generation: Some(0),
        event: Event::WorkflowCompleted { output },
        fence: fence.cloned(),
        renew: fence.map(|_| TTL),
    }
}

/// How many transactions wrote `k`'s journal rows (their distinct `xmin`).
async fn journal_transactions(
    store: &PgStore,
    k: &InstanceKey,
) -> Result<i64, tokio_postgres::Error> {
    let row = sql(store)
        .await
        .expect("a connection")
        .query_one(
            "SELECT count(DISTINCT xmin::text) FROM journal \
             WHERE workflow_name = $1 AND workflow_id = $2",
            &[&k.name.as_str(), &k.id.as_str()],
        )
        .await?;
    Ok(row.get(0))
}

/// A run's last step and its completion are one statement, one transaction and the batch
/// function's fast path (no call of `keiro_journal_append_to`), with batching on or off.
#[tokio::test]
async fn a_closing_pair_is_one_statement_and_one_transaction() -> TestResult {
    let db = TestDb::new().await;
    for batching in [true, false] {
        let mut config = db.config().batching(batching);
        config.pool_size = 1;
        let separator = if config.url.contains('?') { '&' } else { '?' };
        config.url = format!("{}{separator}options=-c%20track_functions%3Dpl", config.url);
        let store = PgStore::connect(config).await?;
        let mut runs = Vec::new();
        for i in 0..2 {
            runs.push(claimed(&store, &format!("pair-{batching}-{i}")).await?);
        }
        let calls = |function: &'static str| {
            let (store, schema) = (store.clone(), db.schema().to_owned());
            async move {
                let client = sql(&store).await.expect("a connection");
                client
                    .batch_execute("SELECT pg_stat_force_next_flush()")
                    .await?;
                let row = client
                    .query_opt(
                        "SELECT calls FROM pg_stat_user_functions \
                         WHERE schemaname = $1 AND funcname = $2",
                        &[&schema, &function],
                    )
                    .await?;
                Ok::<i64, tokio_postgres::Error>(row.map_or(0, |r| r.get(0)))
            }
        };
        let slow_before = calls("keiro_journal_append_to").await?;
        let sent = round_trips_of(&store, |i| {
            let (k, fence) = runs[usize::try_from(i).expect("0 or 1")].clone();
            let store = store.clone();
            async move {
                let outcome = store
                    .journal_append_closing(
                        &step(&k, Some(&fence), "last"),
                        &completion(&k, Some(&fence), json!("done")),
                    )
                    .await?;
                assert_eq!(outcome.step, AppendOutcome::Appended);
                assert_eq!(outcome.completion, Some(AppendOutcome::Appended));
                Ok(())
            }
        })
        .await?;
        assert_eq!(sent, 1, "one round trip, batching {batching}");
        assert_eq!(
            calls("keiro_journal_append_to").await? - slow_before,
            0,
            "the fast path, batching {batching}"
        );
        for (k, _) in &runs {
            assert_eq!(status(&store, k).await?, Status::Completed);
            assert_eq!(
                committed_steps(&store, k).await?,
                ["last", "__workflow_completed__"]
            );
            assert_eq!(journal_transactions(&store, k).await?, 1, "{k}");
        }
    }
    Ok(())
}

/// Runs ending at once share statements, each pair still in one transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_closing_pairs_share_statements() -> TestResult {
    const RUNS: usize = 48;
    let db = TestDb::new().await;
    let store = db.store();
    let runs = claimed_runs(&store, "p", RUNS).await?;
    let warm: Vec<Append> = runs.iter().map(|(k, f)| step(k, Some(f), "warm")).collect();
    store.journal_append_batch(&warm).await;
    let before = store.round_trips();
    let mut tasks = tokio::task::JoinSet::new();
    for (k, fence) in runs.clone() {
        let store = store.clone();
        tasks.spawn(async move {
            store
                .journal_append_closing(
                    &step(&k, Some(&fence), "last"),
                    &completion(&k, Some(&fence), json!(k.id.clone())),
                )
                .await
        });
    }
    while let Some(joined) = tasks.join_next().await {
        let outcome = joined??;
        assert_eq!(outcome.step, AppendOutcome::Appended);
        assert_eq!(outcome.completion, Some(AppendOutcome::Appended));
    }
    let sent = store.round_trips() - before;
    assert!(
        sent < u64::try_from(RUNS / 2)?,
        "{RUNS} concurrent closing pairs took {sent} round trips"
    );
    for (k, _) in &runs {
        assert_eq!(status(&store, k).await?, Status::Completed, "{k}");
        assert_eq!(
            committed_steps(&store, k).await?,
            ["warm", "last", "__workflow_completed__"]
        );
        assert_eq!(
            journal_transactions(&store, k).await?,
            2,
            "the warm-up, the pair: {k}"
        );
    }
    Ok(())
}

/// A batch the function takes request by request (here out of key order) keeps a closing
/// pair's condition: the completion of a step whose journal holds another value is not tried
/// (`skipped`); a pair whose step recorded its own value closes its row.
#[tokio::test]
async fn a_closing_pair_taken_request_by_request_completes_only_over_its_own_value() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let (a, b, c) = (key("gc", "a"), key("gc", "b"), key("gc", "c"));
    for k in [&a, &b, &c] {
        store.instance_start(&start(k, json!(null))).await?;
    }
    store.journal_append(&step(&a, None, "x")).await?;

    // c, then a's pair (its step `x` recorded with another value), then b's pair.
    let outcomes = unfenced_batch(
        &store,
        &[
            ("c", "s", "step", json!("s")),
            ("a", "x", "step", json!("other")),
            ("a", "__workflow_completed__", "completed", json!("a")),
            ("b", "x", "step", json!("x")),
            ("b", "__workflow_completed__", "completed", json!("b")),
        ],
    )
    .await?;
    assert_eq!(
        outcomes,
        [
            (1, "appended".to_owned()),
            (2, "already_present".to_owned()),
            (3, "skipped".to_owned()),
            (4, "appended".to_owned()),
            (5, "appended".to_owned()),
        ]
    );
    assert_eq!(status(&store, &a).await?, Status::Running);
    assert_eq!(committed_steps(&store, &a).await?, ["x"]);
    assert_eq!(status(&store, &b).await?, Status::Completed);
    assert_eq!(
        committed_steps(&store, &b).await?,
        ["x", "__workflow_completed__"]
    );
    Ok(())
}
