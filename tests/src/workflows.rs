//! Workflows more than one test file drives.

use std::convert::Infallible;

use keiro::{Ctx, WorkflowDef, WorkflowError};

use crate::Ledger;

/// Three counted steps (`step-0` to `step-2`, returning 0, 1 and 2), then the sum of the input
/// and the step results.
pub struct Sum {
    /// Where each step's action counts its runs.
    pub ledger: Ledger,
}

impl WorkflowDef for Sum {
    const NAME: &'static str = "sum";
    type Input = u64;
    type Output = u64;

    async fn run(&self, ctx: Ctx, base: u64) -> Result<u64, WorkflowError> {
        let mut total = base;
        for i in 0..3_u64 {
            let ledger = self.ledger.clone();
            total += ctx
                .step(&format!("step-{i}"), || async move {
                    ledger.bump(&format!("step-{i}"));
                    Ok::<_, Infallible>(i)
                })
                .await?;
        }
        Ok(total)
    }
}
