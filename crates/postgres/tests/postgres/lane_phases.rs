//! The lanes' phase counters (issue 39 §1): where a call's time went, counted as the batches
//! leave and are answered. On a current-thread runtime the order is fixed (as in
//! `group_commit::direct_starts_wait_for_the_append_lanes_slot_and_leave_together`): an append
//! finds the lanes idle and goes alone, holding the slot its lane shares with direct starts;
//! the starts queue behind it and leave together once it is answered.

use std::time::Duration;

use crate::common::{key, start, TestResult};
use keiro_journal::{Append, AppendOutcome, Event, JournalStore, StepKind};
use keiro_lease::{ClaimOutcome, LeaseStore};
use keiro_tests::pg::TestDb;
use serde_json::json;

const TTL: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "current_thread")]
async fn a_call_behind_a_batch_counts_its_queue_and_a_lone_call_none() -> TestResult {
    const STARTS: u64 = 8;
    let db = TestDb::new().await;
    let store = db.store();
    let k = key("gc", "phases");
    store.instance_start(&start(&k, json!(null))).await?;
    let ClaimOutcome::Acquired(claim) = store.instance_claim(&k, "w", TTL, None).await? else {
        panic!("claimable");
    };
    let before = store.batch_stats();
    let mut tasks = tokio::task::JoinSet::new();
    {
        let store = store.clone();
        let append = Append {
            key: k.clone(),
            generation: Some(0),
            event: Event::StepRecorded {
                step: "a".to_owned(),
                kind: StepKind::Step,
                result: json!(1),
            },
            fence: Some(claim.fence.clone()),
            renew: Some(TTL),
        };
        tasks.spawn(async move {
            let outcome = store.journal_append(&append).await;
            assert_eq!(outcome.expect("the append"), AppendOutcome::Appended);
        });
    }
    for i in 0..STARTS {
        let store = store.clone();
        tasks.spawn(async move {
            let request = start(&key("direct", &format!("p{i}")), json!(i));
            let started = store.instance_start_claimed(&request, "w", TTL, None).await;
            assert!(started.expect("a direct start").created);
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined?;
    }
    // A batch counts its slot when it gives it back, after its callers had their turns to ask
    // again (the linger): a few more turns here.
    for _ in 0..100 {
        if store.batch_stats().since(&before).direct_starts.slot_ns > 0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    let sent = store.batch_stats().since(&before);

    // The append found the lanes idle: no queue, one statement, which its slot covered.
    let append = sent.appends;
    assert_eq!((append.batches, append.requests), (1, 1));
    assert_eq!(
        append.queued_ns, 0,
        "a lone call on an idle lane never queues"
    );
    assert!(append.statement_ns > 0);
    assert_eq!(append.request_statement_ns, append.statement_ns);
    assert!(append.call_ns >= append.statement_ns, "{append:?}");
    assert!(append.slot_ns >= append.statement_ns, "{append:?}");

    // The starts waited for the append's slot, then shared one statement.
    let starts = sent.direct_starts;
    assert_eq!((starts.batches, starts.requests), (1, STARTS));
    assert!(
        starts.queued_ns / STARTS >= append.statement_ns / 2,
        "each start queued for about the append's statement: {starts:?} behind {append:?}"
    );
    assert_eq!(starts.request_statement_ns, starts.statement_ns * STARTS);
    assert!(
        starts.call_ns >= starts.queued_ns + starts.request_statement_ns,
        "a call is its queue, its statement and the hand-off: {starts:?}"
    );
    assert!(starts.slot_ns >= starts.statement_ns, "{starts:?}");
    let per_call = starts.per_call().expect("calls were made");
    assert_eq!(
        per_call.call,
        per_call.queued + per_call.statement + per_call.hand_off
    );
    Ok(())
}
