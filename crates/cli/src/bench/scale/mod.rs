//! `scale`: keiro against tables of production size, to find what grows faster than it
//! should. Two parts, each in a fresh scratch schema:
//!
//! - [`table`]: N finished (default 1,000,000) and L live (default 100,000) instances written
//!   by SQL; the latency of a worker's claim and discovery, of `list` with each filter (and
//!   whether the server's plan for it scans a table), of `counts`, and retention's deletion
//!   rate over the oldest tenth.
//! - [`parked`]: P runs (default 100,000) parked on an awakeable each; an idle worker's queries
//!   per second and one run's wake latency; then W (default 10,000) concurrent `Keiro::result`
//!   waiters in this process: memory, connections, reads while nothing happens, wake latency.

mod parked;
mod table;

use serde::Serialize;

use super::{BenchArgs, Setup};
use crate::common::{Global, Outcome, Result};

/// The report, last line.
#[derive(Debug, Serialize)]
struct ScaleReport {
    mode: &'static str,
    quick: bool,
    table: table::TableFigures,
    parked: parked::ParkedFigures,
    waiters: parked::WaiterFigures,
}

/// The scale mode.
pub(super) async fn run(global: &Global, args: &BenchArgs) -> Result<Outcome> {
    let (finished, live, parked_n, waiters) = if args.quick {
        (2000, 200, 200, 100)
    } else {
        (args.workflows(), args.live, args.parked, args.waiters)
    };
    let mut setup = Setup::new(global, args, 8).await?;
    let table = table::run(&mut setup, finished, live).await?;
    drop(setup);
    let (parked, waiters) = parked::run(global, args, parked_n, waiters).await?;
    super::emit(&ScaleReport {
        mode: "scale",
        quick: args.quick,
        table,
        parked,
        waiters,
    })?;
    Ok(Outcome::Success)
}
