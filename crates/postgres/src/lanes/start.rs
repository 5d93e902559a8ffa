//! The start lane: starts of concurrent callers, sent as one call of `keiro_instances_start`
//! (`ops::instance`); a start alone is `keiro_instance_start`.

use keiro_journal::store::Result;
use keiro_journal::{store::StartRequest, Started};

use super::lane::{alone_by_instance, Batched};
use crate::db::Db;
use crate::ops::instance::{self as op, START};

impl Batched for StartRequest {
    type Output = Started;

    const OPERATION: &'static str = START;

    const NAME: &'static str = "instance_start";

    // A start with attributes is its own function (`keiro_instance_start_attributed`).
    fn batchable(&self) -> bool {
        self.attributes.is_empty()
    }

    async fn send_many(db: &Db, batch: &[Self]) -> Result<Vec<Option<Result<Started>>>> {
        op::instances_start(db, batch).await
    }

    async fn send_one(db: &Db, request: &Self) -> Result<Started> {
        op::instance_start(db, request).await
    }
}

/// Several starts at once: one statement when `batching` (falling back to one start at a time
/// when it fails as a whole), else one transaction each.
pub(super) async fn instances_start(
    batching: bool,
    db: &Db,
    requests: &[StartRequest],
) -> Vec<Result<Started>> {
    let mut outcomes: Vec<Option<Result<Started>>> = requests.iter().map(|_| None).collect();
    if batching && requests.len() > 1 {
        match op::instances_start(db, requests).await {
            Ok(answers) => outcomes = answers,
            Err(error) => {
                tracing::debug!(%error, starts = requests.len(), "a start batch failed as a whole; starting one by one");
            }
        }
    }
    let pending: Vec<usize> = (0..requests.len())
        .filter(|&i| outcomes[i].is_none())
        .collect();
    let sent = alone_by_instance(
        &pending,
        |i| &requests[i].key,
        |i| op::instance_start(db, &requests[i]),
    )
    .await;
    for (i, answer) in sent {
        outcomes[i] = Some(answer);
    }
    outcomes
        .into_iter()
        .map(|o| o.expect("every start was answered by the batch or alone"))
        .collect()
}
