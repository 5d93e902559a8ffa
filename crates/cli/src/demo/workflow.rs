//! The demo's workflow, `demo-order`: five steps, each of which first writes a side-effect row
//! to the ledger and then works for a few milliseconds.
//!
//! The ledger is deliberately *not* written in the journal's transaction: it is the outside
//! world (a payment provider, an e-mail), and it records every execution of a step, so the
//! verification can see exactly which steps ran more than once and when.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keiro::{Ctx, WorkflowError};
use serde::{Deserialize, Serialize};

use super::db::Db;
use crate::proof;

/// The registered workflow name.
pub(crate) const WORKFLOW: &str = "demo-order";

/// The steps of one order, in order.
pub(crate) const STEPS: [&str; 5] = ["reserve", "charge", "pack", "ship", "notify"];

/// The workflow's input.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct Order {
    /// The order number.
    pub(crate) order: u64,
}

/// The workflow's output: the chain of its step results in their places
/// ([`proof::chain`]), which the verification recomputes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Receipt {
    /// The order number.
    pub(crate) order: u64,
    /// The five step results, chained in order from the order number.
    pub(crate) chain: u64,
}

/// What step `index` of `order` returns: distinct per step, so a mixed-up replay shows.
fn step_value(order: u64, index: u64) -> u64 {
    order * 10 + index
}

/// The receipt a correct run of `order` returns.
pub(crate) fn expected_receipt(order: u64) -> Receipt {
    let values = (0..STEPS.len() as u64).map(|i| step_value(order, i));
    Receipt {
        order,
        chain: proof::chained(order, values),
    }
}

/// The instance id of order `n`: zero-padded so ids sort like numbers.
pub(crate) fn instance_id(order: u64) -> String {
    format!("order-{order:04}")
}

/// How long step `index` of `order` works after its side effect: 5 to 20 ms, spread
/// deterministically so runs interleave without a random source.
fn work(order: u64, index: u64) -> Duration {
    Duration::from_millis(5 + (order * 7 + index * 13) % 16)
}

/// The side-effect ledger of one worker process: the demo's own connection (outside the
/// store's pool or writer, so its writes share no transaction with the journal), and this
/// process's id, written beside each execution.
pub(crate) struct Ledger {
    db: Db,
    pid: i64,
}

impl Ledger {
    /// The ledger on `db`, for this process.
    pub(crate) fn new(db: Db) -> Self {
        Self {
            db,
            pid: i64::from(std::process::id()),
        }
    }

    /// Records one execution of `step` of `workflow_id` by this process.
    async fn record(&self, workflow_id: &str, step: &str) -> Result<(), String> {
        self.db.record_execution(workflow_id, step, self.pid).await
    }

    /// The connection, for the wait log beside the ledger.
    pub(crate) fn db(&self) -> &Db {
        &self.db
    }
}

/// How many step calls this process answered by running the action, and how many from the
/// journal. Printed in the worker's report.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Actions run (journal misses).
    pub(crate) executed: AtomicU64,
    /// Steps answered from the journal without running (journal hits).
    pub(crate) replayed: AtomicU64,
}

/// The body of `demo-order`.
pub(crate) async fn order(
    ctx: Ctx,
    input: Order,
    ledger: Arc<Ledger>,
    counters: Arc<Counters>,
) -> Result<Receipt, WorkflowError> {
    let id = ctx.key().id.as_str().to_owned();
    let mut chain = input.order;
    for (index, step) in (0u64..).zip(STEPS) {
        // Set inside the action, so a journal hit (the action never runs) is told apart.
        let ran = AtomicBool::new(false);
        let value: u64 = ctx
            .step(step, || {
                let (ran, ledger, id) = (&ran, &ledger, &id);
                async move {
                    ran.store(true, Ordering::Relaxed);
                    // The side effect comes first and the work after it, so a kill during the
                    // work leaves an execution in the ledger that the journal never recorded:
                    // the at-least-once re-run the verification expects to find.
                    ledger.record(id, step).await?;
                    tokio::time::sleep(work(input.order, index)).await;
                    Ok::<_, String>(step_value(input.order, index))
                }
            })
            .await?;
        let counter = if ran.load(Ordering::Relaxed) {
            &counters.executed
        } else {
            &counters.replayed
        };
        counter.fetch_add(1, Ordering::Relaxed);
        chain = proof::chain(chain, index, value);
    }
    Ok(Receipt {
        order: input.order,
        chain,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_expected_receipt_chains_the_step_values_in_order() {
        let receipt = expected_receipt(7);
        assert_eq!(receipt.order, 7);
        assert_eq!(receipt.chain, proof::chained(7, [70, 71, 72, 73, 74]));
        // A replay that answered `charge` with `reserve`'s result and the other way round.
        assert_ne!(receipt.chain, proof::chained(7, [71, 70, 72, 73, 74]));
    }

    #[test]
    fn steps_work_between_5_and_20_ms() {
        for order in 0..50 {
            for index in 0..5 {
                let ms = work(order, index).as_millis();
                assert!((5..=20).contains(&ms), "{ms}");
            }
        }
    }

    #[test]
    fn ids_sort_like_order_numbers() {
        assert!(instance_id(9) < instance_id(10));
        assert_eq!(instance_id(200), "order-0200");
    }
}
