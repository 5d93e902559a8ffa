//! The common append batch, fenced steps only, on its own statement
//! (`keiro_journal_append_steps`, issue 39 §1): it journals the steps of runs whose lease is
//! held and not due and writes nothing else; every other request is left to the single append,
//! which the store sends after the batch.

use crate::common::{
    fenced_step, key, lease_ending_soon, lease_left, sql, start_parked, started_claimed, status,
    TestResult,
};
use keiro_journal::{Append, AppendOutcome, Event, Fence, InstanceKey, JournalStore, Status};
use keiro_postgres::PgStore;
use keiro_tests::pg::TestDb;
use serde_json::json;

/// One request of a direct call of `keiro_journal_append_steps`, with the outcome it must get.
struct Request {
    key: InstanceKey,
    generation: i32,
    kind: &'static str,
    owner: Option<String>,
    epoch: Option<i64>,
    renew_ms: Option<i64>,
    expected: &'static str,
}

/// The function's contract, called as SQL: one request of each kind it must leave alone, and
/// one it journals.
#[tokio::test]
async fn the_steps_function_journals_only_steps_of_leases_held_and_not_due() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let (fresh, fresh_fence) = started_claimed(&store, key("steps", "fresh")).await?;
    let (due, due_fence) = started_claimed(&store, key("steps", "due")).await?;
    let (stale, stale_fence) = started_claimed(&store, key("steps", "stale")).await?;
    let (unfenced, _) = started_claimed(&store, key("steps", "unfenced")).await?;
    let (later, later_fence) = started_claimed(&store, key("steps", "generation")).await?;
    let (marker, marker_fence) = started_claimed(&store, key("steps", "marker")).await?;
    let (held, held_fence) = started_claimed(&store, key("steps", "held")).await?;
    let parked = key("steps", "parked");
    start_parked(&store, &parked).await?;
    let missing = key("steps", "missing");
    lease_ending_soon(&store, &due).await?;
    let client = sql(&store).await?;
    let xmin = "SELECT xmin::text FROM workflows WHERE workflow_id = 'fresh'";
    let fresh_version: String = client.query_one(xmin, &[]).await?.get(0);
    // Another transaction holds `held`'s row.
    let (holder, connection) = store
        .connection_config()
        .connect(tokio_postgres::NoTls)
        .await?;
    tokio::spawn(connection);
    holder
        .batch_execute("BEGIN; SELECT 1 FROM workflows WHERE workflow_id = 'held' FOR UPDATE")
        .await?;

    let fenced = |k: &InstanceKey, f: &Fence, expected: &'static str| Request {
        key: k.clone(),
        generation: 0,
        kind: "step",
        owner: Some(f.owner.clone()),
        epoch: Some(f.epoch),
        renew_ms: Some(60_000),
        expected,
    };
    let requests = [
        fenced(&due, &due_fence, "slow"),
        fenced(&fresh, &fresh_fence, "appended"),
        Request {
            generation: 1,
            ..fenced(&later, &later_fence, "slow")
        },
        fenced(&held, &held_fence, "busy"),
        Request {
            kind: "completed",
            ..fenced(&marker, &marker_fence, "slow")
        },
        Request {
            owner: Some("w".to_owned()),
            epoch: Some(1),
            ..fenced(&missing, &fresh_fence, "busy")
        },
        Request {
            owner: Some("w".to_owned()),
            epoch: Some(0),
            ..fenced(&parked, &fresh_fence, "slow")
        },
        Request {
            epoch: Some(stale_fence.epoch + 1),
            ..fenced(&stale, &stale_fence, "slow")
        },
        Request {
            owner: None,
            epoch: None,
            renew_ms: None,
            ..fenced(&unfenced, &fresh_fence, "slow")
        },
    ];
    let names: Vec<&str> = requests.iter().map(|r| r.key.name.as_str()).collect();
    let ids: Vec<&str> = requests.iter().map(|r| r.key.id.as_str()).collect();
    let generations: Vec<i32> = requests.iter().map(|r| r.generation).collect();
    let steps: Vec<&str> = requests.iter().map(|_| "s").collect();
    let kinds: Vec<&str> = requests.iter().map(|r| r.kind).collect();
    let payloads: Vec<serde_json::Value> = requests.iter().map(|_| json!(1)).collect();
    let owners: Vec<Option<String>> = requests.iter().map(|r| r.owner.clone()).collect();
    let epochs: Vec<Option<i64>> = requests.iter().map(|r| r.epoch).collect();
    let renew_ms: Vec<Option<i64>> = requests.iter().map(|r| r.renew_ms).collect();
    let answered = client
        .query(
            "SELECT n, outcome FROM keiro_journal_append_steps($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            &[
                &names,
                &ids,
                &generations,
                &steps,
                &kinds,
                &payloads,
                &owners,
                &epochs,
                &renew_ms,
            ],
        )
        .await?;
    let outcomes: Vec<(i32, String)> = answered.iter().map(|r| (r.get(0), r.get(1))).collect();
    let expected: Vec<(i32, String)> = requests
        .iter()
        .zip(1..)
        .map(|(r, n)| (n, r.expected.to_owned()))
        .collect();
    assert_eq!(outcomes, expected);
    holder.batch_execute("ROLLBACK").await?;

    // Only the fresh run's step is journaled, and no instance row changed: the fresh row's
    // version is the one before, the lease due is as short as it was, the parked run parked.
    let journaled: Vec<String> = client
        .query(
            "SELECT workflow_id FROM journal WHERE step_name = 's' ORDER BY workflow_id",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(journaled, ["fresh"]);
    let version: String = client.query_one(xmin, &[]).await?.get(0);
    assert_eq!(
        version, fresh_version,
        "the fresh run's row was not written"
    );
    assert!(lease_left(&store, &due).await? < 11.0, "nothing renewed");
    assert_eq!(status(&store, &parked).await?, Status::Suspended);
    Ok(())
}

/// Calls of `function` in the test's schema so far, on a store tracking them.
async fn calls(
    store: &PgStore,
    schema: &str,
    function: &str,
) -> Result<i64, Box<dyn std::error::Error + Send + Sync>> {
    let client = sql(store).await?;
    client
        .batch_execute("SELECT pg_stat_force_next_flush()")
        .await?;
    let row = client
        .query_opt(
            "SELECT calls FROM pg_stat_user_functions WHERE schemaname = $1 AND funcname = $2",
            &[&schema, &function],
        )
        .await?;
    Ok(row.map_or(0, |r| r.get(0)))
}

/// Through the store: a batch of fenced steps is one call of the steps function, and the step
/// it leaves (a lease due) is appended alone, renewing the lease; a batch with a completion
/// goes to `keiro_journal_append_batch` as before.
#[tokio::test]
async fn a_batch_of_fenced_steps_takes_the_steps_function_and_its_lease_due_goes_alone(
) -> TestResult {
    let db = TestDb::new().await;
    let mut config = db.config();
    // Function calls counted on the store's connections (the statistics are server-wide).
    let separator = if config.url.contains('?') { '&' } else { '?' };
    config.url = format!("{}{separator}options=-c%20track_functions%3Dpl", config.url);
    let store = PgStore::connect(config).await?;
    let schema = db.schema();
    let mut runs = Vec::new();
    for i in 0..4 {
        runs.push(started_claimed(&store, key("steps", &format!("run{i}"))).await?);
    }
    let (due, due_fence) = started_claimed(&store, key("steps", "due")).await?;
    lease_ending_soon(&store, &due).await?;
    let count = |function: &'static str| calls(&store, schema, function);
    let before = (
        count("keiro_journal_append_steps").await?,
        count("keiro_journal_append_batch").await?,
        count("keiro_journal_append_to").await?,
    );
    let mut appends: Vec<Append> = runs
        .iter()
        .map(|(k, f)| fenced_step(k, Some(f), "a"))
        .collect();
    appends.push(fenced_step(&due, Some(&due_fence), "a"));
    for outcome in store.journal_append_batch(&appends).await {
        assert_eq!(outcome?, AppendOutcome::Appended);
    }
    let after = (
        count("keiro_journal_append_steps").await?,
        count("keiro_journal_append_batch").await?,
        count("keiro_journal_append_to").await?,
    );
    assert_eq!(
        (after.0 - before.0, after.1 - before.1, after.2 - before.2),
        (1, 0, 1),
        "(steps, batch, single) calls"
    );
    assert!(lease_left(&store, &due).await? > 50.0, "renewed alone");
    for (k, _) in runs.iter().chain([(due.clone(), due_fence.clone())].iter()) {
        assert_eq!(store.journal_load(k, 0).await?.len(), 1, "{k}");
    }

    // A completion in the batch: the general function carries it all.
    let (k0, f0) = &runs[0];
    let (k1, f1) = &runs[1];
    let mixed = [
        fenced_step(k0, Some(f0), "b"),
        Append {
            event: Event::WorkflowCompleted { output: json!(1) },
            ..fenced_step(k1, Some(f1), "done")
        },
    ];
    for outcome in store.journal_append_batch(&mixed).await {
        assert_eq!(outcome?, AppendOutcome::Appended);
    }
    let last = (
        count("keiro_journal_append_steps").await?,
        count("keiro_journal_append_batch").await?,
    );
    assert_eq!((last.0 - after.0, last.1 - after.1), (0, 1));
    assert_eq!(status(&store, k1).await?, Status::Completed);
    Ok(())
}
