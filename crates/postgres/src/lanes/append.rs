//! The append lane: journal appends and closing pairs (a run's last step with its completion)
//! of concurrent runs, sent as one call of `keiro_journal_append_batch` (`lane` for the lane,
//! `ops::journal` and `crates/migrations/functions/journal.sql` for the statement), or of
//! `keiro_journal_append_steps` when the batch holds fenced steps only.
//!
//! A closing pair is one request: its two rows travel side by side in the statement's arrays,
//! the step first, and the statement journals both in one transaction, the completion only if
//! the step left its own value. Sent alone (its lane was idle, or its batch failed as a whole)
//! it is still one statement; should that statement fail as a whole too, the step and then the
//! completion go one after the other, with the same condition.

use std::sync::Arc;

use keiro_journal::store::{
    closing_one_after_the_other, Append, AppendOutcome, ClosingOutcome, Result,
};
use keiro_journal::{Event, InstanceKey};

use super::lane::{alone_by_instance, Batched, Lane};
use crate::db::Db;
use crate::ops::journal::{self as op, appendable, RowAnswer, APPEND};
use crate::row::malformed;

/// One request of the append lane.
#[derive(Debug, Clone)]
pub(super) enum AppendRequest {
    /// An append, as `journal_append` makes it.
    One(Append),
    /// A run's last step and its completion (`journal_append_closing`): the completion only if
    /// the step left its own value.
    Closing {
        /// The step.
        step: Append,
        /// The completion of the same instance, generation and fence.
        completion: Append,
    },
}

/// What the lane answers a request.
#[derive(Debug)]
pub(super) enum AppendAnswer {
    /// To [`AppendRequest::One`].
    One(AppendOutcome),
    /// To [`AppendRequest::Closing`].
    Closing(ClosingOutcome),
}

impl AppendRequest {
    fn key(&self) -> &InstanceKey {
        match self {
            Self::One(append) => &append.key,
            Self::Closing { step, .. } => &step.key,
        }
    }

    /// The rows the request puts in the statement's arrays, in order.
    fn rows(&self) -> Vec<&Append> {
        match self {
            Self::One(append) => vec![append],
            Self::Closing { step, completion } => vec![step, completion],
        }
    }
}

/// Requests of several callers in one statement (see `lane`): an answer per request, in the
/// batch's order, each what the request alone would have been answered. The statement carries
/// the requests sorted by instance key, one per instance (a closing pair's two rows side by
/// side: the form the function journals without sorting, `crates/migrations/functions/journal.sql`); a
/// second request to an instance is answered `None`, so it is sent alone once the batch has
/// committed, after the first.
async fn append_many(db: &Db, all: &[AppendRequest]) -> Result<Vec<Option<Result<AppendAnswer>>>> {
    let sent = first_per_instance_in_key_order(all, AppendRequest::key);
    let rows: Vec<&Append> = sent.iter().flat_map(|&i| all[i].rows()).collect();
    let mut outcomes: Vec<Option<Result<AppendAnswer>>> = all.iter().map(|_| None).collect();
    if rows.len() == sent.len() && rows.iter().all(|a| op::plain_step(a)) {
        // The common batch, steps only: the statement that journals them and nothing else;
        // the requests it leaves (`None`) go alone, as busy ones do.
        let answers = op::journal_append_steps(db, &rows).await?;
        for (&i, answer) in sent.iter().zip(answers) {
            outcomes[i] = answer.map(|outcome| outcome.map(AppendAnswer::One));
        }
        return Ok(outcomes);
    }
    let answers = op::journal_append_batch(db, &rows).await?;
    let mut answers = answers.into_iter();
    for &i in &sent {
        outcomes[i] = match &all[i] {
            AppendRequest::One(_) => match answers.next().flatten() {
                Some(Ok(Some(outcome))) => Some(Ok(AppendAnswer::One(outcome))),
                Some(Ok(None)) => Some(Err(malformed(APPEND, "a lone append was skipped"))),
                Some(Err(error)) => Some(Err(error)),
                None => None,
            },
            AppendRequest::Closing { .. } => {
                let (step, completion) = (answers.next().flatten(), answers.next().flatten());
                closing_answer(step, completion)
            }
        };
    }
    Ok(outcomes)
}

/// A closing pair's answer from its two rows' answers; `None` (send it alone) when either was
/// busy.
fn closing_answer(step: RowAnswer, completion: RowAnswer) -> Option<Result<AppendAnswer>> {
    let (step, completion) = (step?, completion?);
    Some(match (step, completion) {
        (Err(error), _) | (Ok(Some(_)), Err(error)) => Err(error),
        (Ok(None), _) => Err(malformed(APPEND, "a closing pair's step was skipped")),
        (Ok(Some(step)), Ok(completion)) => {
            Ok(AppendAnswer::Closing(ClosingOutcome { step, completion }))
        }
    })
}

/// The positions of `requests` a batch statement carries: sorted by instance key in byte order
/// (the order of `COLLATE "C"`, in which the batch locks instance rows), the first request of
/// each instance only.
fn first_per_instance_in_key_order<T>(
    requests: &[T],
    key_of: impl Fn(&T) -> &InstanceKey,
) -> Vec<usize> {
    let key = |i: usize| {
        let k = key_of(&requests[i]);
        (k.name.as_str(), k.id.as_str())
    };
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by(|&a, &b| key(a).cmp(&key(b)).then(a.cmp(&b)));
    order.dedup_by(|later, first| key(*later) == key(*first));
    order
}

/// A closing pair alone: one statement; if that fails as a whole, the step and then (if it
/// left its value) the completion, each alone.
async fn closing_alone(db: &Db, step: &Append, completion: &Append) -> Result<ClosingOutcome> {
    let pair = [AppendRequest::Closing {
        step: step.clone(),
        completion: completion.clone(),
    }];
    match append_many(db, &pair).await {
        Ok(mut answers) => match answers.pop().flatten() {
            Some(Ok(AppendAnswer::Closing(outcome))) => return Ok(outcome),
            Some(Err(error)) => return Err(error),
            // Busy (its row is held by another transaction), or an answer of the wrong kind:
            // one append at a time, which waits for the lock as a single append does.
            Some(Ok(AppendAnswer::One(_))) | None => {}
        },
        Err(error) => {
            tracing::debug!(%error, key = %step.key, "a closing pair failed as a whole; appending its step and then its completion");
        }
    }
    closing_one_after_the_other(step, completion, |append| op::journal_append(db, append)).await
}

impl Batched for AppendRequest {
    type Output = AppendAnswer;

    const OPERATION: &'static str = APPEND;

    const NAME: &'static str = "journal_append";

    /// The markers that close a generation by cancel or continue-as-new lock the live remote
    /// tasks of the instance before its row (migration 0010), an order a batch sorted by
    /// instance cannot keep: they go alone (they are rare).
    fn batchable(&self) -> bool {
        match self {
            Self::One(append) => matches!(
                append.event,
                Event::StepRecorded { .. }
                    | Event::WorkflowCompleted { .. }
                    | Event::WorkflowFailed { .. }
            ),
            Self::Closing { .. } => true,
        }
    }

    async fn send_many(db: &Db, batch: &[Self]) -> Result<Vec<Option<Result<AppendAnswer>>>> {
        append_many(db, batch).await
    }

    async fn send_one(db: &Db, request: &Self) -> Result<AppendAnswer> {
        match request {
            Self::One(append) => op::journal_append(db, append).await.map(AppendAnswer::One),
            Self::Closing { step, completion } => closing_alone(db, step, completion)
                .await
                .map(AppendAnswer::Closing),
        }
    }
}

/// `journal_append` through the store's append lane: concurrent appends share a transaction.
pub(super) async fn journal_append(
    lane: &Lane<AppendRequest>,
    db: &Arc<Db>,
    append: &Append,
) -> Result<AppendOutcome> {
    appendable(append)?;
    match lane.call(db, AppendRequest::One(append.clone())).await? {
        AppendAnswer::One(outcome) => Ok(outcome),
        AppendAnswer::Closing(_) => Err(malformed(APPEND, "a closing answer to an append")),
    }
}

/// `journal_append_closing` through the store's append lane, as one request. A pair the
/// statement cannot carry (a step that is not a step, a completion that is not one, or of
/// another instance, generation or fence) goes one append at a time, as the trait's default.
pub(super) async fn journal_append_closing(
    lane: &Lane<AppendRequest>,
    db: &Arc<Db>,
    step: &Append,
    completion: &Append,
) -> Result<ClosingOutcome> {
    let pairs = matches!(step.event, Event::StepRecorded { .. })
        && matches!(completion.event, Event::WorkflowCompleted { .. })
        && step.key == completion.key
        && step.generation == completion.generation
        && step.fence == completion.fence;
    if !pairs {
        return closing_one_after_the_other(step, completion, |append| {
            journal_append(lane, db, append)
        })
        .await;
    }
    let request = AppendRequest::Closing {
        step: step.clone(),
        completion: completion.clone(),
    };
    match lane.call(db, request).await? {
        AppendAnswer::Closing(outcome) => Ok(outcome),
        AppendAnswer::One(_) => Err(malformed(APPEND, "an append's answer to a closing pair")),
    }
}

/// Several appends at once: one statement when batching is on (falling back to one append at
/// a time when it fails as a whole), else one transaction each. An instance with an append a
/// batch may not carry has all its appends sent alone, in their order, after the batch.
pub(super) async fn journal_append_batch(
    batching: bool,
    db: &Db,
    appends: &[Append],
) -> Vec<Result<AppendOutcome>> {
    let mut outcomes: Vec<Option<Result<AppendOutcome>>> = appends
        .iter()
        .map(|a| appendable(a).err().map(Err))
        .collect();
    let requests: Vec<AppendRequest> = appends.iter().cloned().map(AppendRequest::One).collect();
    let alone: std::collections::HashSet<&InstanceKey> = requests
        .iter()
        .filter(|r| !r.batchable())
        .map(AppendRequest::key)
        .collect();
    let batched: Vec<usize> = (0..appends.len())
        .filter(|&i| outcomes[i].is_none() && !alone.contains(&appends[i].key))
        .collect();
    if batching && batched.len() > 1 {
        let batch: Vec<AppendRequest> = batched.iter().map(|&i| requests[i].clone()).collect();
        match append_many(db, &batch).await {
            Ok(answers) => {
                for (&i, answer) in batched.iter().zip(answers) {
                    outcomes[i] = answer.map(|answer| match answer? {
                        AppendAnswer::One(outcome) => Ok(outcome),
                        AppendAnswer::Closing(_) => {
                            Err(malformed(APPEND, "a closing answer to an append"))
                        }
                    });
                }
            }
            Err(error) => {
                tracing::debug!(%error, appends = batch.len(), "an append batch failed as a whole; appending one by one");
            }
        }
    }
    let pending: Vec<usize> = (0..appends.len())
        .filter(|&i| outcomes[i].is_none())
        .collect();
    let sent = alone_by_instance(
        &pending,
        |i| &appends[i].key,
        |i| op::journal_append(db, &appends[i]),
    )
    .await;
    for (i, answer) in sent {
        outcomes[i] = Some(answer);
    }
    outcomes
        .into_iter()
        .map(|o| o.expect("every append was answered by the batch or alone"))
        .collect()
}

#[cfg(test)]
mod tests {
    use keiro_journal::store::Append;
    use keiro_journal::{Event, InstanceKey, StepKind};
    use serde_json::json;

    use super::first_per_instance_in_key_order;

    fn append(name: &str, id: &str) -> Append {
        Append {
            key: InstanceKey::parse(name, id).expect("a valid key"),
            generation: Some(0),
            event: Event::StepRecorded {
                step: "s".to_owned(),
                kind: StepKind::Step,
                result: json!(null),
            },
            fence: None,
            renew: None,
        }
    }

    #[test]
    fn a_batch_carries_the_first_append_of_each_instance_in_byte_order() {
        // Byte order, as `COLLATE "C"`: upper case before lower case, "a-2" before "a2".
        let appends = [
            append("w", "b"),
            append("w", "a2"),
            append("W", "z"),
            append("w", "b"),
            append("w", "a-2"),
        ];
        assert_eq!(
            first_per_instance_in_key_order(&appends, |a| &a.key),
            [2, 4, 1, 0]
        );
    }
}
