//! A batch claim hands each run the journal as it stands once the claim holds the row, never
//! the one its statement's snapshot saw. FOR UPDATE locks the newest version of a row another
//! transaction changed after that snapshot (re-checking the WHERE clause on it), so a claim
//! that began before another worker claimed the row, journaled a step and let the row go could
//! take the row with a journal missing that step, and run the step again (found by `keiro
//! chaos` as a step witnessed after it was journaled).

use std::time::{Duration, Instant};

use crate::common::{key, sql, start, TestResult};
use keiro_journal::{Append, Event, JournalStore, StepKind, WorkflowName};
use keiro_lease::{ClaimOutcome, LeaseStore};
use keiro_tests::pg::TestDb;
use serde_json::json;

const TTL: Duration = Duration::from_secs(60);

/// Rows leased elsewhere sit ahead in claim order, so the batch claim's scan takes a while to
/// reach the claimable row; meanwhile another worker claims that row by key, journals a step
/// and releases it. The batch claim then takes the row, and must carry that step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_claim_carries_what_was_journaled_while_it_scanned() -> TestResult {
    const AHEAD: i64 = 400_000;
    let db = TestDb::new().await;
    let store = db.store();
    sql(&store)
        .await?
        .execute(
            "INSERT INTO workflows (workflow_name, workflow_id, input, status, priority, \
             lease_owner, lease_epoch, lease_expires_at) \
             SELECT 'turns', 'ahead-' || g, 'null', 'running', 1, 'elsewhere', 1, \
                    now() + interval '1 day' \
             FROM generate_series(1, $1::bigint) g",
            &[&AHEAD],
        )
        .await?;
    sql(&store)
        .await?
        .batch_execute("ANALYZE workflows")
        .await?;
    let names = [WorkflowName::new("turns")?];
    // Warm: the claim's plan cached, the rows ahead in the buffer cache.
    assert!(store
        .instances_claim_batch(&names, "warm", TTL, 0, None)
        .await?
        .is_empty());

    // The timing is the host's: a turn that did not fit in the scan, or a scan that met the
    // row while the other worker held it (it skips it), proves nothing, and is tried again.
    let mut meaningful = 0;
    for attempt in 0..6 {
        let k = key("turns", &format!("t{attempt}"));
        store.instance_start(&start(&k, json!(null))).await?;
        let scanning = {
            let (store, names) = (store.clone(), names.clone());
            tokio::spawn(async move {
                let started = Instant::now();
                let claims = store
                    .instances_claim_batch(&names, "batch", TTL, 1, None)
                    .await;
                (claims, started.elapsed())
            })
        };
        tokio::time::sleep(Duration::from_millis(15)).await;
        let turn = Instant::now();
        let ClaimOutcome::Acquired(other) = store.instance_claim(&k, "other", TTL, None).await?
        else {
            // The scan was quicker: it holds the row.
            scanning.await?.0?;
            continue;
        };
        store
            .journal_append(&Append {
                key: k.clone(),
                generation: Some(0),
                event: Event::StepRecorded {
                    step: "done-by-other".into(),
                    kind: StepKind::Step,
                    result: json!(1),
                },
                fence: Some(other.fence.clone()),
                renew: Some(TTL),
            })
            .await?;
        store.instance_release(&k, &other.fence, true).await?;
        let turn = turn.elapsed();

        let (claims, scanned) = scanning.await?;
        let claims = claims?;
        let [claim] = claims.as_slice() else {
            // Out of the next attempt's way (it comes first in claim order).
            store.instance_claim(&k, "aside", TTL, None).await?;
            continue;
        };
        if scanned < turn + Duration::from_millis(15) {
            continue;
        }
        meaningful += 1;
        assert_eq!(claim.instance.key, k);
        assert_eq!(claim.fence.epoch, other.fence.epoch + 1);
        assert_eq!(claim.journal, store.journal_load(&k, 0).await?);
        assert_eq!(claim.journal.len(), 1, "the step journaled meanwhile");
        if meaningful == 2 {
            break;
        }
    }
    assert!(
        meaningful > 0,
        "no attempt's scan outlasted the other worker's turn: raise AHEAD"
    );
    Ok(())
}
