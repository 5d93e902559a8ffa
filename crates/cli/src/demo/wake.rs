//! The demo's wake-source workflows: `demo-sleeper` parks on durable sleeps, `demo-waiter` on
//! an awakeable that the demo completes from its own process.
//!
//! Both are started with the crash workflows, so they sit parked (costing nothing) while the
//! first worker is killed, and are resumed by push afterwards: a fired timer or a completed
//! awakeable flips the instance row and notifies in one transaction, and the worker's LISTEN
//! connection turns that into a pass within milliseconds. The step after each wait stamps the
//! store's clock into `demo_waits`, so the demo measures how long after the deadline (or the
//! completion) each run woke, on the same clock that stamps `timers` and `awakeables`.

use std::sync::Arc;
use std::time::Duration;

use keiro::{Ctx, WorkflowError};
use serde::{Deserialize, Serialize};

use super::workflow::Ledger;

/// The sleeper's registered name.
pub(crate) const SLEEPER: &str = "demo-sleeper";

/// The waiter's registered name.
pub(crate) const WAITER: &str = "demo-waiter";

/// How many times each sleeper sleeps, with a step after each sleep.
pub(crate) const NAPS: u32 = 2;

/// The name of the waiter's awakeable, and of its row in `demo_waits`.
pub(crate) const APPROVAL: &str = "approval";

/// The sleeper's input.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct Nap {
    /// How long each sleep lasts, in milliseconds.
    pub(crate) sleep_ms: u64,
}

/// The waiter's input.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct Wait {
    /// The waiter's number; the demo completes its awakeable with [`approval_value`] of it.
    pub(crate) waiter: u64,
}

/// The value the demo completes waiter `n`'s awakeable with, and so its expected output:
/// distinct per waiter, so a value delivered to the wrong run shows.
pub(crate) fn approval_value(waiter: u64) -> u64 {
    1000 + waiter
}

/// The instance id of sleeper `n`.
pub(crate) fn sleeper_id(n: u64) -> String {
    format!("sleeper-{n:02}")
}

/// The instance id of waiter `n`.
pub(crate) fn waiter_id(n: u64) -> String {
    format!("waiter-{n:02}")
}

/// The `demo_waits` row (and the sleep's name) of nap `n`.
pub(crate) fn nap_name(n: u32) -> String {
    format!("nap-{n}")
}

/// The body of `demo-sleeper`: sleeps [`NAPS`] times, recording after each sleep when it woke.
/// Returns how many naps it took.
pub(crate) async fn sleeper(ctx: Ctx, input: Nap, log: Arc<Ledger>) -> Result<u32, WorkflowError> {
    let id = ctx.key().id.as_str().to_owned();
    for n in 1..=NAPS {
        let nap = nap_name(n);
        ctx.sleep(&nap, Duration::from_millis(input.sleep_ms))
            .await?;
        ctx.step(&format!("{nap}-woke"), || log.db().record_wake(&id, &nap))
            .await?;
    }
    Ok(NAPS)
}

/// The body of `demo-waiter`: creates an awakeable, announces its id from a step (so it is
/// announced once), parks until the demo completes it, records when it woke, and returns the
/// value it was completed with.
pub(crate) async fn waiter(ctx: Ctx, _input: Wait, log: Arc<Ledger>) -> Result<u64, WorkflowError> {
    let id = ctx.key().id.as_str().to_owned();
    let approval = ctx.awakeable::<u64>(APPROVAL).await?;
    let awakeable = approval.id();
    ctx.step("announce", || log.db().announce(&id, APPROVAL, awakeable))
        .await?;
    let value = approval.value().await?;
    ctx.step("approved", || log.db().record_wake(&id, APPROVAL))
        .await?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_values_are_distinct_per_run() {
        assert_eq!(sleeper_id(3), "sleeper-03");
        assert_eq!(waiter_id(3), "waiter-03");
        assert_ne!(approval_value(1), approval_value(2));
        assert_eq!(nap_name(2), "nap-2");
    }
}
