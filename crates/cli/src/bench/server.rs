//! What the database server spent on a measured phase: commits of the bench's database
//! (`pg_stat_database.xact_commit`) and, when the server runs on this machine, the CPU time of
//! its processes that serve that database (read from `/proc`).
//!
//! Commits are counted by the server, not by keiro, so they include every transaction the
//! phase caused (starts, claims, appends, timer polls, the bench's own reads). A backend
//! reports its counts when it goes idle, at most about once a second, and an idle one may keep
//! them for up to ten seconds, so both readings are taken after the store's idle connections
//! are closed (a backend reports everything as it exits).
//!
//! CPU is the user and system time of the backends connected to the bench's database plus the
//! server's own background processes (WAL writer, checkpointer, ...), summed from
//! `/proc/<pid>/stat` before and after: backends of other databases on the same server are
//! left out, so a busy neighbour does not count. A backend that both started and exited
//! within the phase is missed; the bench's pool keeps its connections, so that is rare.

use std::collections::HashMap;
use std::time::Duration;

use keiro::postgres::PgStore;

use crate::common::{Result, ResultExt};

/// The kernel's unit for `/proc/<pid>/stat` times (`USER_HZ`), fixed at 100 on Linux.
const TICKS_PER_SECOND: u64 = 100;

/// One reading of the server's counters.
pub(super) struct Reading {
    commits: i64,
    /// CPU ticks by server process, or `None` when the server's processes are not visible
    /// from here (another machine or container).
    cpu: Option<HashMap<i32, u64>>,
}

/// What the server spent between two readings.
pub(super) struct Spent {
    /// Transactions committed in the bench's database.
    pub(super) commits: u64,
    /// CPU time of its processes, when the server is local.
    pub(super) cpu: Option<Duration>,
}

// The backends of this database and the server's background processes (no database).
const SERVER_PIDS: &str = "SELECT pid FROM pg_stat_activity \
     WHERE datname = current_database() OR datname IS NULL";

const COMMITS: &str = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()";

/// Drops the store's idle pooled connections, so their backends report their counts (the
/// pool opens new ones on demand), and waits a moment for them to do so.
async fn flush_counts(store: &PgStore) {
    drop(store.pool().retain(|_, _| false));
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// Reads the counters before the measured phase, once `store`'s idle connections are closed
/// (see the module docs). The pool opens connections again as the phase needs them, as it
/// would without the reading: opening them all at once here made the phase slower (each new
/// backend warms its caches on its first calls).
pub(super) async fn read_before(db: &tokio_postgres::Client, store: &PgStore) -> Result<Reading> {
    flush_counts(store).await;
    read_now(db).await
}

/// Reads the counters after the measured phase: the CPU of the processes still open, then the
/// commits once `store`'s idle connections are closed.
pub(super) async fn read_after(db: &tokio_postgres::Client, store: &PgStore) -> Result<Reading> {
    let cpu = cpu_by_pid(db).await?;
    flush_counts(store).await;
    Ok(Reading {
        commits: read_now(db).await?.commits,
        cpu,
    })
}

async fn read_now(db: &tokio_postgres::Client) -> Result<Reading> {
    let cpu = cpu_by_pid(db).await?;
    let commits = db
        .query_one(COMMITS, &[])
        .await
        .context("reading the database's commit count")?
        .get(0);
    Ok(Reading { commits, cpu })
}

impl Reading {
    /// What the server spent from `self` to `after`.
    pub(super) fn spent_until(&self, after: &Reading) -> Spent {
        let commits = u64::try_from(after.commits - self.commits).unwrap_or(0);
        let cpu = match (&self.cpu, &after.cpu) {
            (Some(before), Some(after)) => {
                let ticks: u64 = after
                    .iter()
                    .map(|(pid, t)| t.saturating_sub(before.get(pid).copied().unwrap_or(0)))
                    .sum();
                Some(Duration::from_millis(ticks * 1000 / TICKS_PER_SECOND))
            }
            _ => None,
        };
        Spent { commits, cpu }
    }
}

/// CPU ticks of the server's processes that serve this database, or `None` when this
/// connection's own backend is not a process of this machine.
async fn cpu_by_pid(db: &tokio_postgres::Client) -> Result<Option<HashMap<i32, u64>>> {
    let own: i32 = db
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .context("reading the backend's pid")?
        .get(0);
    if process_ticks(own).is_none() {
        return Ok(None);
    }
    let rows = db
        .query(SERVER_PIDS, &[])
        .await
        .context("listing the server's processes")?;
    Ok(Some(
        rows.iter()
            .filter_map(|row| {
                let pid: i32 = row.get(0);
                process_ticks(pid).map(|ticks| (pid, ticks))
            })
            .collect(),
    ))
}

/// CPU time this process (the bench: worker, producers, driver) has used so far, from
/// `/proc/self/stat`; `None` where there is no `/proc`.
fn own_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 1000 / TICKS_PER_SECOND))
}

/// This process's CPU time and the machine's CPU ticks when a measured phase began.
pub(super) struct PhaseCpu {
    own: Option<Duration>,
    host: Option<HostTicks>,
}

impl PhaseCpu {
    /// Readings now, at the start of the phase.
    pub(super) fn start() -> Self {
        Self {
            own: own_cpu(),
            host: HostTicks::now(),
        }
    }

    /// This process's CPU time since the start, and the share of the machine's CPU time that
    /// was idle meanwhile; `None` for what this platform cannot read.
    pub(super) fn finish(&self) -> (Option<Duration>, Option<f64>) {
        let own = own_cpu()
            .zip(self.own)
            .map(|(after, before)| after.saturating_sub(before));
        let idle = self
            .host
            .zip(HostTicks::now())
            .and_then(|(before, after)| before.idle_share_until(&after));
        (own, idle)
    }
}

/// The whole machine's CPU time so far, from the first line of `/proc/stat`: how much of it
/// was idle (`idle` + `iowait`) out of all of it, in ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HostTicks {
    idle: u64,
    total: u64,
}

impl HostTicks {
    /// A reading now; `None` where there is no `/proc/stat`.
    fn now() -> Option<Self> {
        Self::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// The `cpu` line of a `/proc/stat` text: user nice system idle iowait irq softirq steal
    /// (guest time is already in user).
    fn parse(stat: &str) -> Option<Self> {
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let ticks: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .take(8)
            .map(str::parse)
            .collect::<std::result::Result<_, _>>()
            .ok()?;
        let [user, nice, system, idle, iowait, irq, softirq, steal] = ticks[..] else {
            return None;
        };
        Some(Self {
            idle: idle + iowait,
            total: user + nice + system + idle + iowait + irq + softirq + steal,
        })
    }

    /// The share of the machine's CPU time that was idle from `self` to `after` (0 to 1): near
    /// 0 when the phase was CPU-bound, well above it when the runs waited on each other.
    fn idle_share_until(&self, after: &Self) -> Option<f64> {
        let total = after.total.checked_sub(self.total).filter(|t| *t > 0)?;
        let idle = after.idle.checked_sub(self.idle)?;
        #[allow(clippy::cast_precision_loss)] // tick counts far below 2^52 convert exactly
        Some(idle as f64 / total as f64)
    }
}

/// utime + stime of a local PostgreSQL process, from `/proc/<pid>/stat`; `None` when there is
/// no such process here or it is not PostgreSQL.
fn process_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`: the command may hold spaces, so split after its `)`.
    let (head, rest) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1;
    if !comm.starts_with("postgres") && !comm.starts_with("postmaster") {
        return None;
    }
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3 of the line, utime 14, stime 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_share_is_idle_and_iowait_over_every_tick() {
        let before = HostTicks::parse("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3\n");
        let after = HostTicks::parse("cpu  160 0 90 860 60 0 0 0 0 0\n");
        let (before, after) = (before.expect("parsed"), after.expect("parsed"));
        // 170 ticks passed, 70 of them idle or waiting on I/O.
        let share = before.idle_share_until(&after).expect("time passed");
        assert!((share - 70.0 / 170.0).abs() < 1e-9, "{share}");
        assert_eq!(after.idle_share_until(&after), None, "no time passed");
        assert_eq!(HostTicks::parse("intr 1 2 3\n"), None);
        assert_eq!(HostTicks::parse("cpu  1 2\n"), None);
    }

    #[test]
    fn a_process_that_is_not_postgres_has_no_ticks() {
        let own = i32::try_from(std::process::id()).unwrap();
        assert_eq!(
            process_ticks(own),
            None,
            "the test binary is not PostgreSQL"
        );
        assert_eq!(process_ticks(i32::MAX), None);
    }
}
