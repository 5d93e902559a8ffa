//! Replay verification: re-drive a recorded history against the current code, doing nothing
//! fresh, and report where the code no longer matches it.

use std::sync::Arc;

use keiro_journal::{
    store::StartRequest, Append, Event, InstanceKey, JournalEntry, JournalStore, Marker, RunError,
    RunOptions, RunOutcome, Workflow,
};
use keiro_sqlite::SqliteStore;
use serde_json::Value;

/// Why a recorded history does not replay against the current code.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayMismatch {
    /// The code diverged from the journal: a renamed, removed, reordered or new step, another
    /// kind of call, or fresh work the history does not hold.
    #[error("non-determinism at step {step:?}: {detail}")]
    NonDeterminism {
        /// Where.
        step: String,
        /// What the replay found.
        detail: String,
    },
    /// The replay finished with another ending than the recorded one.
    #[error("the history ended {recorded}, the replay ended {replayed}")]
    Ending {
        /// The recorded ending (`completed with ..`, `failed`, ...).
        recorded: String,
        /// The replay's.
        replayed: String,
    },
    /// The history cannot be replayed (no completed generation, an unknown workflow).
    #[error("cannot replay: {0}")]
    Unreplayable(String),
}

/// Re-drives the last generation of `history` (an instance's journal, as
/// [`Keiro::journal`](crate::Keiro::journal) returns it) with `input` against `workflow`, in a
/// scratch store (a temporary SQLite file) and in replay-only mode: no action runs, no await arms, so nothing
/// outside the scratch store happens. Passes when the code consumes the recorded steps and
/// ends as the history ended.
///
/// ```
/// use keiro::testing::TestEnv;
/// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
/// #     Ok(format!("hello {name}"))
/// # }
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let env = TestEnv::sqlite()?.register("hello", hello).build()?;
/// env.start("hello", "h-1", &"ada").await?;
/// env.run_until_idle().await?;
/// let row = env.instance(("hello", "h-1")).await?;
/// let history = env.journal(&row.key).await?;
/// let workflow = env.worker().registry().get(&row.key.name).expect("registered");
/// let replayed = keiro::testing::verify_replay(workflow.as_ref(), &row.key, &row.input, &history).await;
/// assert!(replayed.is_ok());
/// # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
/// ```
///
/// # Errors
///
/// The [`ReplayMismatch`] found.
pub async fn verify_replay(
    workflow: &dyn Workflow,
    key: &InstanceKey,
    input: &Value,
    history: &[JournalEntry],
) -> Result<(), ReplayMismatch> {
    let generation = history.iter().map(|e| e.generation).max().unwrap_or(0);
    let entries: Vec<&JournalEntry> = history
        .iter()
        .filter(|e| e.generation == generation)
        .collect();
    let recorded = entries
        .iter()
        .find_map(|e| e.event.marker().map(|m| (m, e.event.clone())))
        .map(|(marker, event)| ending_of_marker(marker, &event));
    let unreplayable = |e: &dyn std::fmt::Display| ReplayMismatch::Unreplayable(e.to_string());
    let store = SqliteStore::temporary().map_err(|e| unreplayable(&e))?;
    store
        .instance_start(&StartRequest {
            attributes: Default::default(),
            key: key.clone(),
            input: input.clone(),
            parent: None,
            priority: 0,
            queue: None,
        })
        .await
        .map_err(|e| unreplayable(&e))?;
    for entry in &entries {
        if let Event::StepRecorded { .. } = entry.event {
            store
                .journal_append(&Append::external(key.clone(), entry.event.clone()))
                .await
                .map_err(|e| unreplayable(&e))?;
        }
    }
    let options = RunOptions {
        replay_only: true,
        reconcile: None,
        ..RunOptions::default()
    };
    let store: Arc<dyn JournalStore> = Arc::new(store);
    let replayed = match keiro_journal::run(store, key, workflow, options)
        .await
        .result
    {
        Err(RunError::NonDeterminism { step, detail, .. }) => {
            return Err(ReplayMismatch::NonDeterminism { step, detail })
        }
        Ok(outcome) => ending_of_outcome(&outcome),
        Err(other) => format!("with an error: {other}"),
    };
    match recorded {
        Some(recorded) if recorded == replayed => Ok(()),
        Some(recorded) => Err(ReplayMismatch::Ending { recorded, replayed }),
        None if replayed == "suspended" => Ok(()),
        None => Err(ReplayMismatch::Ending {
            recorded: "still running".into(),
            replayed,
        }),
    }
}

fn ending_of_marker(marker: Marker, event: &Event) -> String {
    match (marker, event) {
        (Marker::Completed, Event::WorkflowCompleted { output }) => {
            format!("completed with {output}")
        }
        (marker, _) => marker.kind_str().to_owned(),
    }
}

fn ending_of_outcome(outcome: &RunOutcome) -> String {
    match outcome {
        RunOutcome::Completed(output) => format!("completed with {output}"),
        RunOutcome::Suspended => "suspended".into(),
        RunOutcome::Failed => Marker::Failed.kind_str().into(),
        RunOutcome::Cancelled => Marker::Cancelled.kind_str().into(),
        RunOutcome::ContinuedAsNew { .. } => Marker::ContinuedAsNew.kind_str().into(),
    }
}

/// Checks the live runs of `version` (up to `limit`, by key) against the workflows `registry`
/// holds, as [`verify_replay`] does, before they are handed to another version
/// ([`Keiro::versions_move`](crate::Keiro::versions_move)): each run's journal must replay on
/// this code to its last recorded step, with no divergence (what it does past that step is
/// free: fresh steps, its completion). Returns the runs that do not, with why (a workflow
/// `registry` does not hold is [`ReplayMismatch::Unreplayable`]); empty when every run checked
/// replays.
///
/// ```
/// use keiro::testing::{verify_version, TestEnv};
/// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
/// #     Ok(format!("hello {name}"))
/// # }
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let env = TestEnv::sqlite()?.register("hello", hello).build()?;
/// env.start("hello", "h-1", &"ada").await?;
/// let refused = verify_version(env.keiro(), env.worker().registry(), "", 100).await?;
/// assert!(refused.is_empty());
/// # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
/// ```
///
/// # Errors
///
/// [`Error`](crate::Error) when the runs or their journals cannot be read.
pub async fn verify_version(
    keiro: &crate::Keiro,
    registry: &keiro_resume::Registry,
    version: &str,
    limit: i64,
) -> Result<Vec<(InstanceKey, ReplayMismatch)>, crate::Error> {
    let mut refused = Vec::new();
    for key in keiro.version_live_runs(version, limit).await? {
        let Some(row) = keiro.instance(&key).await? else {
            // Gone meanwhile (retention): nothing to hand over.
            continue;
        };
        let Some(workflow) = registry.get(&key.name) else {
            let why = format!("workflow {} is not registered here", key.name);
            refused.push((key, ReplayMismatch::Unreplayable(why)));
            continue;
        };
        let history = keiro.journal(&key).await?;
        match verify_replay(workflow.as_ref(), &key, &row.input, &history).await {
            // A live run's history has no ending: once every recorded step was consumed, the
            // code may go on as it likes (fresh steps, an await, its completion). The run
            // driver reports fresh work in replay-only mode with this detail, and only after
            // its check that no recorded step was skipped (keiro-journal's `state::fresh`).
            Ok(()) | Err(ReplayMismatch::Ending { .. }) => {}
            Err(ReplayMismatch::NonDeterminism { detail, .. })
                if detail.starts_with("replay only:") => {}
            Err(mismatch) => refused.push((key, mismatch)),
        }
    }
    Ok(refused)
}
