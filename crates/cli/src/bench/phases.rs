//! Where a step's time goes (issue 39 §1), printed by `throughput` and `direct`: for each
//! group-commit lane the runs call, how long a call waits in the lane's queue before its batch
//! leaves, how long the batch's statement takes (the round trip, its commit and WAL flush
//! included), and the hand-off back; how many batches are in flight and how full they are;
//! what is left of the runs' time outside the store's lanes (the engine, the worker, the
//! callers' own tasks); and how busy the machine's CPUs were, PostgreSQL's and keiro's apart.
//! All of it from the lanes' counters ([`LaneStats`]), always on.
//!
//! With `--phases` the bench also splits the statement's round trip on the server: every
//! connection of the bench's store runs with the session settings `track_functions = all` and
//! `track_wal_io_timing = on` (superuser settings, for those connections only; nothing of the
//! server's configuration changes), so `pg_stat_user_functions` gives the time the batch
//! functions of the bench's schema executed, and `pg_stat_wal` the time spent writing and
//! flushing WAL by those connections. What a statement takes beyond its function's execution is
//! its commit (the WAL flush, or the wait for another backend's flush that covers it), the wire
//! and the backend's and the caller's turns on the CPUs.

use std::time::Duration;

use keiro::postgres::LaneStats;
use serde::Serialize;

use super::server::Spent;
use super::BenchArgs;
use crate::common::{ms, round, Result, ResultExt};

/// The session settings `--phases` gives every connection of the bench's store.
const TRACKING_OPTIONS: &str = "-c track_functions=all -c track_wal_io_timing=on";

/// `url` with [`TRACKING_OPTIONS`] added to its startup options (after any it has), in the
/// URL's own form: a `postgres://` URL gets an `options` query parameter, a key/value string an
/// `options` key. A later `options` wins over an earlier one in both, so the merged value goes
/// last.
pub(super) fn with_tracking(url: &str) -> Result<String> {
    let existing = url
        .parse::<tokio_postgres::Config>()
        .context("reading the database URL")?
        .get_options()
        .map(str::to_owned);
    let options = match existing {
        Some(existing) if !existing.trim().is_empty() => format!("{existing} {TRACKING_OPTIONS}"),
        _ => TRACKING_OPTIONS.to_owned(),
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let separator = if url.contains('?') { '&' } else { '?' };
        Ok(format!(
            "{url}{separator}options={}",
            percent_encode(&options)
        ))
    } else {
        let quoted = options.replace('\\', r"\\").replace('\'', r"\'");
        Ok(format!("{url} options='{quoted}'"))
    }
}

/// `text` with every byte but unreserved URL characters percent-encoded.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The batch functions of the bench's schema, their calls and execution time so far.
const FUNCTIONS: &str = "SELECT funcname::text, calls, total_time FROM pg_stat_user_functions \
     WHERE schemaname = $1 ORDER BY funcname";

/// The server's WAL writes and flushes so far (every process's counts; the times only of the
/// processes that track them, which are the bench's connections under `--phases`).
const WAL: &str = "SELECT wal_write, wal_sync, wal_write_time, wal_sync_time FROM pg_stat_wal";

/// One reading of the server's function and WAL statistics.
pub(super) struct ServerStats {
    /// (function, calls, milliseconds executing).
    functions: Vec<(String, i64, f64)>,
    wal: (i64, i64, f64, f64),
}

impl ServerStats {
    /// Reads them now: after the store's idle connections have closed, so their backends have
    /// reported what they counted (`server::read_before` and `read_after` close them).
    pub(super) async fn read(db: &tokio_postgres::Client, schema: &str) -> Result<Self> {
        let functions = db
            .query(FUNCTIONS, &[&schema])
            .await
            .context("reading pg_stat_user_functions")?
            .iter()
            .map(|row| (row.get(0), row.get(1), row.get(2)))
            .collect();
        let wal = db
            .query_one(WAL, &[])
            .await
            .context("reading pg_stat_wal")?;
        Ok(Self {
            functions,
            wal: (wal.get(0), wal.get(1), wal.get(2), wal.get(3)),
        })
    }

    /// What the server counted from `self` to `after`.
    fn until(&self, after: &Self) -> ServerPhases {
        let functions = after
            .functions
            .iter()
            .filter_map(|(name, calls, total)| {
                let (calls_before, total_before) = self
                    .functions
                    .iter()
                    .find(|(n, _, _)| n == name)
                    .map_or((0, 0.0), |(_, c, t)| (*c, *t));
                let calls = u64::try_from(calls - calls_before)
                    .ok()
                    .filter(|c| *c > 0)?;
                #[allow(clippy::cast_precision_loss)] // counts far below 2^52 convert exactly
                let per_call = (total - total_before) / calls as f64;
                Some(FunctionTime {
                    name: name.clone(),
                    calls,
                    exec_ms_per_call: round(per_call, 4),
                })
            })
            .collect();
        let (writes, syncs, write_ms, sync_ms) = after.wal;
        ServerPhases {
            functions,
            wal_writes: u64::try_from(writes - self.wal.0).unwrap_or(0),
            wal_syncs: u64::try_from(syncs - self.wal.1).unwrap_or(0),
            wal_write_ms: round(write_ms - self.wal.2, 2),
            wal_sync_ms: round(sync_ms - self.wal.3, 2),
        }
    }
}

/// A batch function's calls in the phase and its mean execution time (`pg_stat_user_functions`).
#[derive(Debug, Serialize)]
pub(super) struct FunctionTime {
    name: String,
    calls: u64,
    exec_ms_per_call: f64,
}

/// What `--phases` read on the server for the phase.
#[derive(Debug, Serialize)]
pub(super) struct ServerPhases {
    functions: Vec<FunctionTime>,
    /// Every process's WAL writes and flushes (`pg_stat_wal`, the whole server).
    wal_writes: u64,
    wal_syncs: u64,
    /// Milliseconds the bench's connections spent writing and flushing WAL.
    wal_write_ms: f64,
    wal_sync_ms: f64,
}

/// One lane's phases.
#[derive(Debug, Serialize)]
pub(super) struct LanePhases {
    lane: &'static str,
    batches: u64,
    calls: u64,
    calls_per_batch: f64,
    /// Mean per call: in the queue, in the batch's statement, in the hand-off, in all.
    queue_ms: f64,
    statement_ms: f64,
    hand_off_ms: f64,
    call_ms: f64,
    /// Mean round trip of a batch's statement.
    statement_ms_per_batch: f64,
    /// Mean statements of the lane in flight, and slots held, over the phase.
    statements_in_flight: f64,
    slots_held: f64,
}

/// The phases of a measured run, as the report carries them.
#[derive(Debug, Serialize)]
pub(super) struct Phases {
    lanes: Vec<LanePhases>,
    /// The runs' calls of their lanes in flight on average (their call time over the phase).
    calls_in_flight: Option<f64>,
    /// The runs' time outside the lanes (engine, worker, tasks), per lane call: runs in flight
    /// times the phase, less the lanes' call time, over the calls; for a closed loop of
    /// callers (`direct`) only, whose runs are each in one call or none at a time.
    outside_ms_per_call: Option<f64>,
    /// Shares of the machine's CPU time (every core) over the phase: busy in all, by
    /// PostgreSQL's processes of the bench's database, by this process.
    host_busy: Option<f64>,
    pg_busy: Option<f64>,
    keiro_busy: Option<f64>,
    cores: usize,
    server: Option<ServerPhases>,
}

/// What a measured run hands to [`report`].
pub(super) struct Measured<'a> {
    /// The lanes the runs in flight call, named, over the phase.
    pub(super) lanes: &'a [(&'static str, LaneStats)],
    /// Lanes other callers use (producers' starts, result waiters), over the phase: printed,
    /// and left out of the runs' time outside the lanes.
    pub(super) others: &'a [(&'static str, LaneStats)],
    pub(super) elapsed: Duration,
    /// Runs in flight (C) when each is a caller in a closed loop, in at most one lane call at a
    /// time (`direct`); `None` where a run's closing write outlives its worker slot
    /// (`throughput`), so the calls in flight may outnumber C.
    pub(super) in_flight: Option<u64>,
    pub(super) own_cpu: Option<Duration>,
    pub(super) host_idle: Option<f64>,
    pub(super) spent: &'a Spent,
    /// The server's statistics before and after the phase, with `--phases`.
    pub(super) server: Option<(&'a ServerStats, &'a ServerStats)>,
}

/// Prints the phases and returns them for the report.
pub(super) fn report(measured: &Measured<'_>) -> Phases {
    let phase = measured.elapsed;
    let secs = phase.as_secs_f64();
    let lanes: Vec<LanePhases> = measured
        .lanes
        .iter()
        .chain(measured.others)
        .filter(|(_, lane)| lane.requests > 0)
        .filter_map(|(name, lane)| lane_phases(name, lane, phase))
        .collect();
    for lane in &lanes {
        println!(
            "bench: phases: {}: {} batches of {:.1} calls; a call: queue {:.3} ms, statement \
             {:.3} ms, hand-off {:.3} ms (in all {:.3} ms); a batch's statement {:.3} ms; \
             {:.2} statements in flight, a slot held {:.0}% of the phase",
            lane.lane,
            lane.batches,
            lane.calls_per_batch,
            lane.queue_ms,
            lane.statement_ms,
            lane.hand_off_ms,
            lane.call_ms,
            lane.statement_ms_per_batch,
            lane.statements_in_flight,
            lane.slots_held * 100.0
        );
    }
    let calls: u64 = measured.lanes.iter().map(|(_, l)| l.requests).sum();
    let call_ns: u64 = measured.lanes.iter().map(|(_, l)| l.call_ns).sum();
    #[allow(clippy::cast_precision_loss)] // a mean; rounding is immaterial
    let calls_in_flight = (calls > 0 && secs > 0.0).then(|| call_ns as f64 / 1e9 / secs);
    #[allow(clippy::cast_precision_loss)] // a mean; rounding is immaterial
    let outside_ms_per_call = measured.in_flight.filter(|_| calls > 0).map(|runs| {
        let runs_ms = secs * 1000.0 * runs as f64;
        (runs_ms - call_ns as f64 / 1e6).max(0.0) / calls as f64
    });
    if let Some(in_flight) = calls_in_flight {
        println!(
            "bench: phases: the runs' lane calls in flight: {in_flight:.1} on average{}",
            outside_ms_per_call.map_or_else(String::new, |outside| format!(
                "; outside the lanes (the engine, the tasks' turns) {outside:.3} ms per call"
            ))
        );
    }
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    #[allow(clippy::cast_precision_loss)] // a core count
    let capacity = secs * cores as f64;
    let share = |cpu: Option<Duration>| {
        cpu.filter(|_| capacity > 0.0)
            .map(|cpu| round(cpu.as_secs_f64() / capacity, 3))
    };
    let (pg_busy, keiro_busy) = (share(measured.spent.cpu), share(measured.own_cpu));
    let host_busy = measured.host_idle.map(|idle| round(1.0 - idle, 3));
    let percent =
        |s: Option<f64>| s.map_or_else(|| "n/a".to_owned(), |s| format!("{:.0}%", s * 100.0));
    println!(
        "bench: phases: the machine's {cores} cores were {} busy: PostgreSQL {}, the bench \
         process {}",
        percent(host_busy),
        percent(pg_busy),
        percent(keiro_busy)
    );
    let server = measured.server.map(|(before, after)| before.until(after));
    if let Some(server) = &server {
        let commits: u64 = measured
            .lanes
            .iter()
            .chain(measured.others)
            .map(|(_, l)| l.batches)
            .sum();
        print_server(server, commits);
    }
    Phases {
        lanes,
        calls_in_flight: calls_in_flight.map(|n| round(n, 2)),
        outside_ms_per_call: outside_ms_per_call.map(|ms| round(ms, 4)),
        host_busy,
        pg_busy,
        keiro_busy,
        cores,
        server,
    }
}

fn lane_phases(name: &'static str, lane: &LaneStats, phase: Duration) -> Option<LanePhases> {
    let per_call = lane.per_call()?;
    let (statements, slots) = lane.in_flight(phase)?;
    let batches = u32::try_from(lane.batches).ok().filter(|b| *b > 0)?;
    Some(LanePhases {
        lane: name,
        batches: lane.batches,
        calls: lane.requests,
        calls_per_batch: round(lane.mean_len().unwrap_or(0.0), 2),
        queue_ms: round(ms(per_call.queued), 4),
        statement_ms: round(ms(per_call.statement), 4),
        hand_off_ms: round(ms(per_call.hand_off), 4),
        call_ms: round(ms(per_call.call), 4),
        statement_ms_per_batch: round(ms(Duration::from_nanos(lane.statement_ns) / batches), 4),
        statements_in_flight: round(statements, 3),
        slots_held: round(slots, 3),
    })
}

/// Prints what `--phases` read on the server: each batch function's execution against its
/// lane's round trip, and the WAL flushes against the lanes' commits.
fn print_server(server: &ServerPhases, commits: u64) {
    for function in &server.functions {
        println!(
            "bench: phases: server: {} executed {} times, {:.3} ms a call",
            function.name, function.calls, function.exec_ms_per_call
        );
    }
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52 convert exactly
    let per_commit = |total: f64| {
        if commits > 0 {
            total / commits as f64
        } else {
            0.0
        }
    };
    println!(
        "bench: phases: server: WAL flushes {} and writes {} (the whole server); the bench's \
         connections spent {:.3} ms flushing and {:.3} ms writing WAL per lane commit ({} \
         commits)",
        server.wal_syncs,
        server.wal_writes,
        per_commit(server.wal_sync_ms),
        per_commit(server.wal_write_ms),
        commits
    );
}

/// The server's function and WAL statistics with `--phases`, read once the store's idle
/// connections have reported them.
pub(super) async fn server_stats(
    db: &tokio_postgres::Client,
    args: &BenchArgs,
) -> Result<Option<ServerStats>> {
    if !args.phases {
        return Ok(None);
    }
    Ok(Some(ServerStats::read(db, &args.bench_schema).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracking_options_join_a_url_in_its_own_form() {
        let plain = with_tracking("postgres://postgres@127.0.0.1:5432/postgres").unwrap();
        assert_eq!(
            plain,
            "postgres://postgres@127.0.0.1:5432/postgres?options=-c%20track_functions%3Dall%20-c%20track_wal_io_timing%3Don"
        );
        let config: tokio_postgres::Config = plain.parse().unwrap();
        assert_eq!(config.get_options(), Some(TRACKING_OPTIONS));

        let with_query = with_tracking(
            "postgres://postgres@127.0.0.1/postgres?sslmode=disable&options=-c%20work_mem%3D8MB",
        )
        .unwrap();
        let config: tokio_postgres::Config = with_query.parse().unwrap();
        assert_eq!(
            config.get_options(),
            Some(format!("-c work_mem=8MB {TRACKING_OPTIONS}").as_str())
        );

        let key_value = with_tracking("host=127.0.0.1 user=postgres").unwrap();
        let config: tokio_postgres::Config = key_value.parse().unwrap();
        assert_eq!(config.get_options(), Some(TRACKING_OPTIONS));
    }
}
