//! The chaos workload: two workflows and the remote handler, every step writing a witness
//! before it works.
//!
//! Four instances in five run `chaos-local` (five local steps); every fifth runs `chaos-mixed`
//! (a local step, then two remote steps served by the remote worker processes). Every tenth
//! (a local one) is started and driven by a direct caller process instead of a resume worker.
//! Every step's value is a function of the instance number and the step's place, and the output
//! chains them in order, so the output of each instance is known in advance and a replay that
//! answered a step with another's result shows in it.

use std::sync::Arc;
use std::time::Duration;

use keiro::{
    remote::RemoteOptions, remote::TaskContext, remote::TaskError, Backoff, Ctx, WorkflowError,
};
use serde::{Deserialize, Serialize};

use super::witness::{Holder, Witness};
use crate::proof;

/// The five-local-step workflow.
pub(crate) const LOCAL: &str = "chaos-local";
/// The local-then-two-remote-steps workflow.
pub(crate) const MIXED: &str = "chaos-mixed";
/// The steps of `chaos-local`, in order.
pub(crate) const LOCAL_STEPS: [&str; 5] = ["reserve", "charge", "pack", "ship", "notify"];
/// The local step of `chaos-mixed`.
pub(crate) const MIXED_STEP: &str = "prepare";
/// The remote steps of `chaos-mixed`, in order; each is also its worker group.
pub(crate) const REMOTE_STEPS: [&str; 2] = ["enrich", "stamp"];

/// How many attempts a remote step gets. Every SIGKILL of a remote worker expires the claims
/// it held, and each expiry counts an attempt; the ceiling is not what this run tests.
const REMOTE_RETRIES: u32 = 1_000;

/// The workflow's input.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct Input {
    /// The instance number, from 1.
    pub(crate) n: u64,
}

/// The workflow's output: the chain of the step values in their places ([`proof::chain`]),
/// which the verification recomputes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Output {
    /// The instance number.
    pub(crate) n: u64,
    /// The step values, chained in order from the instance number.
    pub(crate) chain: u64,
}

/// Whether instance `n` is a mixed one: every fifth, so 20%.
pub(crate) fn is_mixed(n: u64) -> bool {
    n.is_multiple_of(5)
}

/// Whether instance `n` is run by the direct callers (`Worker::run_named`) rather than started
/// for the resume workers: every tenth, all of them local ones (never a fifth).
pub(crate) fn is_direct(n: u64) -> bool {
    n % 10 == 1
}

/// The direct instances among `1..=count`, in order.
pub(crate) fn direct_instances(count: u64) -> impl Iterator<Item = u64> {
    (1..=count).filter(|n| is_direct(*n))
}

/// The workflow instance `n` runs.
pub(crate) fn workflow_of(n: u64) -> &'static str {
    if is_mixed(n) {
        MIXED
    } else {
        LOCAL
    }
}

/// The id of instance `n`: zero-padded so ids sort like numbers.
pub(crate) fn instance_id(n: u64) -> String {
    format!("chaos-{n:05}")
}

/// The key of instance `n` on the queue of `--profile queue`, over `keys` keys: round robin,
/// so every key has runs waiting all along and a key's runs are started one after another.
pub(crate) fn queue_key(n: u64, keys: u64) -> String {
    format!("key-{}", n % keys.max(1))
}

/// How many steps instance `n` journals (local and remote).
pub(crate) fn steps_of(n: u64) -> u64 {
    if is_mixed(n) {
        1 + REMOTE_STEPS.len() as u64
    } else {
        LOCAL_STEPS.len() as u64
    }
}

/// The journal's name for remote step `step`.
pub(crate) fn remote_journal_step(step: &str) -> String {
    format!("remote:{step}")
}

/// The journal names of the steps instance `n` journals, in order.
pub(crate) fn journal_steps_of(n: u64) -> Vec<String> {
    if is_mixed(n) {
        std::iter::once(MIXED_STEP.to_owned())
            .chain(REMOTE_STEPS.iter().map(|step| remote_journal_step(step)))
            .collect()
    } else {
        LOCAL_STEPS.map(str::to_owned).to_vec()
    }
}

/// What local step `index` of instance `n` returns: distinct per step, so a mixed-up replay
/// shows in the output.
fn local_value(n: u64, index: u64) -> u64 {
    n * 10 + index
}

/// What the remote handler returns for `input`.
fn remote_value(input: u64) -> u64 {
    input * 3 + 1
}

/// The output a correct run of instance `n` returns.
pub(crate) fn expected_output(n: u64) -> Output {
    let chain = if is_mixed(n) {
        let base = local_value(n, 0);
        let first = remote_value(base);
        proof::chained(n, [base, first, remote_value(first)])
    } else {
        proof::chained(
            n,
            (0..LOCAL_STEPS.len() as u64).map(|index| local_value(n, index)),
        )
    };
    Output { n, chain }
}

/// How long a step works after its witness: 5 to 20 ms, spread deterministically, so a SIGKILL
/// often lands between a witness and its journal row.
fn work(n: u64, index: u64) -> Duration {
    Duration::from_millis(5 + (n * 7 + index * 13) % 16)
}

/// A local step's action: the witness first, then the work, then (`--profile queue`) the
/// witness's end.
async fn witnessed(
    ctx: &Ctx,
    witness: &Witness,
    step: &str,
    work: Duration,
    value: u64,
) -> crate::common::Result<u64> {
    let begun = witness
        .record(ctx.key(), ctx.generation(), step, &Holder::of_run(ctx))
        .await?;
    tokio::time::sleep(work).await;
    if witness.records_ends() {
        witness.end(&begun).await?;
    }
    Ok(value)
}

/// The body of `chaos-local`.
pub(crate) async fn local(
    ctx: Ctx,
    input: Input,
    witness: Arc<Witness>,
) -> Result<Output, WorkflowError> {
    let mut chain = input.n;
    for (index, step) in (0u64..).zip(LOCAL_STEPS) {
        let value = local_value(input.n, index);
        let got = ctx
            .step(step, || {
                witnessed(&ctx, &witness, step, work(input.n, index), value)
            })
            .await?;
        chain = proof::chain(chain, index, got);
    }
    Ok(Output { n: input.n, chain })
}

/// The remote steps' options: many retries with a short backoff (see [`REMOTE_RETRIES`]).
fn remote_options() -> RemoteOptions {
    RemoteOptions::default().retries(
        REMOTE_RETRIES,
        Backoff::exponential(Duration::from_millis(50), Duration::from_millis(500)),
    )
}

/// The body of `chaos-mixed`.
pub(crate) async fn mixed(
    ctx: Ctx,
    input: Input,
    witness: Arc<Witness>,
) -> Result<Output, WorkflowError> {
    let value = local_value(input.n, 0);
    let base: u64 = ctx
        .step(MIXED_STEP, || {
            witnessed(&ctx, &witness, MIXED_STEP, work(input.n, 0), value)
        })
        .await?;
    let options = remote_options();
    let first: u64 = ctx.remote(REMOTE_STEPS[0], &base, &options).await?;
    let second: u64 = ctx.remote(REMOTE_STEPS[1], &first, &options).await?;
    let chain = [base, first, second]
        .into_iter()
        .zip(0u64..)
        .fold(input.n, |chain, (value, index)| {
            proof::chain(chain, index, value)
        });
    Ok(Output { n: input.n, chain })
}

/// The remote handler of `step` (both remote steps run it): the witness first, then the work.
/// A witness that cannot be written is a retryable failure, as an unreachable service is.
pub(crate) async fn remote(
    witness: Arc<Witness>,
    worker: Arc<str>,
    step: &'static str,
    input: u64,
    task: TaskContext,
) -> Result<u64, TaskError> {
    let holder = Holder::of_task(&worker, &task);
    witness
        .record(
            &task.key,
            task.generation,
            &remote_journal_step(step),
            &holder,
        )
        .await
        .map_err(|error| TaskError::retryable(format!("writing the witness: {error}")))?;
    tokio::time::sleep(work(input, u64::from(task.attempt))).await;
    Ok(remote_value(input))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_instance_in_five_is_mixed() {
        let mixed = (1..=1000).filter(|n| is_mixed(*n)).count();
        assert_eq!(mixed, 200);
        assert_eq!(workflow_of(5), MIXED);
        assert_eq!(workflow_of(6), LOCAL);
    }

    #[test]
    fn one_instance_in_ten_is_direct_and_local() {
        let direct: Vec<u64> = direct_instances(30).collect();
        assert_eq!(direct, [1, 11, 21]);
        assert_eq!(direct_instances(1000).count(), 100);
        assert!(direct_instances(1000).all(|n| workflow_of(n) == LOCAL));
    }

    #[test]
    fn expected_outputs_chain_the_step_values_in_order() {
        assert_eq!(
            expected_output(1).chain,
            proof::chained(1, [10, 11, 12, 13, 14])
        );
        // 50, then 151, then 454.
        assert_eq!(expected_output(5).chain, proof::chained(5, [50, 151, 454]));
        // A replay that swapped the two remote results would not pass.
        assert_ne!(expected_output(5).chain, proof::chained(5, [50, 454, 151]));
        assert_eq!(steps_of(1) * 4 + steps_of(5), 23);
        assert_eq!(journal_steps_of(1).len() as u64, steps_of(1));
        assert_eq!(
            journal_steps_of(5),
            ["prepare", "remote:enrich", "remote:stamp"]
        );
    }

    #[test]
    fn queue_keys_go_round_robin() {
        let keys: Vec<String> = (1..=4).map(|n| queue_key(n, 3)).collect();
        assert_eq!(keys, ["key-1", "key-2", "key-0", "key-1"]);
    }

    #[test]
    fn ids_sort_like_instance_numbers() {
        assert!(instance_id(99) < instance_id(100));
        assert_eq!(instance_id(7), "chaos-00007");
    }
}
