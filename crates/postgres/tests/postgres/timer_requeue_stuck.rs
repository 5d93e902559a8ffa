//! Timers left `firing` (by an interrupted operator action, say) go back to `scheduled` once
//! they are older than the threshold, and then fire normally.

use std::time::Duration;

use crate::common::{key, recorded, sql, start_parked, TestResult};
use keiro_journal::{store::TimerArm, JournalStore, TimerKind};
use keiro_tests::pg::TestDb;
use serde_json::json;
use time::OffsetDateTime;

#[tokio::test]
async fn only_timers_stuck_longer_than_the_threshold_are_requeued() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let k = key("sleeper", "s-1");
    start_parked(&store, &k).await?;
    let due = OffsetDateTime::now_utc() - time::Duration::seconds(1);
    for step in ["sleep:stuck", "sleep:busy", "sleep:fired"] {
        store
            .timer_arm(&TimerArm {
                key: k.clone(),
                generation: 0,
                step: step.into(),
                due: keiro_journal::store::TimerDue::At(due),
                kind: TimerKind::Sleep,
            })
            .await?;
    }
    let client = sql(&store).await?;
    // Backdated, never slept on: one stuck for ten minutes, one picked up a moment ago.
    client
        .execute(
            "UPDATE timers SET status = 'firing', updated_at = now() - interval '10 minutes' \
             WHERE step = 'sleep:stuck'",
            &[],
        )
        .await?;
    client
        .execute(
            "UPDATE timers SET status = 'firing', updated_at = now() WHERE step = 'sleep:busy'",
            &[],
        )
        .await?;
    client
        .execute(
            "UPDATE timers SET status = 'fired', updated_at = now() - interval '1 hour' \
             WHERE step = 'sleep:fired'",
            &[],
        )
        .await?;
    assert_eq!(store.timers_due_count(None).await?, 0);

    assert_eq!(
        store.timers_requeue_stuck(Duration::from_secs(300)).await?,
        1
    );
    let statuses: Vec<(String, String)> = client
        .query("SELECT step, status FROM timers ORDER BY step", &[])
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(
        statuses,
        [
            ("sleep:busy".to_owned(), "firing".to_owned()),
            ("sleep:fired".to_owned(), "fired".to_owned()),
            ("sleep:stuck".to_owned(), "scheduled".to_owned()),
        ]
    );
    assert_eq!(
        store.timers_requeue_stuck(Duration::from_secs(300)).await?,
        0
    );

    // Requeued, it fires like any due timer.
    let firing = store.timers_fire_due(None, 10).await?;
    let steps: Vec<_> = firing
        .fired
        .iter()
        .map(|t| (t.step.as_str(), t.delivered))
        .collect();
    assert_eq!(steps, [("sleep:stuck", true)]);
    assert_eq!(
        recorded(&store, &k, "sleep:stuck").await?,
        vec![json!(null)]
    );
    Ok(())
}
