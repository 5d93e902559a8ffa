//! Migration 0028 moves the refusals a build before it counted in `attempts` (a run whose last
//! error is a refusal to open its payload) to `open_refusals`, for live runs only, so that such
//! a run's first crash under a worker with the key does not fail it. The rule itself is the
//! contract suite's (`keiro_tests::contract::lease::refuse`).

use crate::common::{key, TestResult};
use keiro_journal::JournalStore;
use keiro_postgres::builds::OtherBuild as _;
use keiro_postgres::PgStore;
use keiro_tests::pg::TestDb;

/// How a refusal's last error begins (`keiro::codec::OPEN_REFUSED`).
const REFUSED: &str = "payload cannot be opened by this worker: payload sealed with key \"k2\"";

#[tokio::test]
async fn the_refusals_counted_as_attempts_move_to_their_own_count() -> TestResult {
    let db = TestDb::new().await;
    let schema = db.schema().to_owned();
    let admin = db.store().pool().get().await?;
    admin
        .batch_execute(&format!(
            "DROP SCHEMA \"{schema}\" CASCADE; CREATE SCHEMA \"{schema}\""
        ))
        .await?;
    // The schema as the build before 0028 left it, with the rows it wrote.
    PgStore::connect(db.config()).await?.migrate_to(27).await?;
    let rows = [
        ("refused", "running", 4, Some(REFUSED)),
        ("refused-parked", "suspended", 2, Some(REFUSED)),
        ("crashed", "running", 2, Some("boom")),
        ("fresh", "running", 0, None),
        ("failed", "failed", 3, Some(REFUSED)),
    ];
    for (id, status, attempts, error) in rows {
        admin
            .execute(
                &format!(
                    "INSERT INTO \"{schema}\".workflows \
                     (workflow_name, workflow_id, input, status, attempts, last_error) \
                     VALUES ('wf', $1, 'null', $2, $3, $4)"
                ),
                &[&id, &status, &attempts, &error],
            )
            .await?;
    }
    let store = PgStore::connect(db.config()).await?;
    store.migrate().await?;
    let mut counts = Vec::new();
    for (id, ..) in rows {
        let row = store.instance_get(&key("wf", id)).await?.expect("kept");
        counts.push((id, row.attempts, row.open_refusals));
    }
    assert_eq!(
        counts,
        [
            ("refused", 0, 4),
            ("refused-parked", 0, 2),
            ("crashed", 2, 0),
            ("fresh", 0, 0),
            ("failed", 3, 0),
        ]
    );
    Ok(())
}
