//! `sqlite-baseline`: the machine's rate of durable one-row commits on a SQLite file, the
//! baseline a SQLite figure is compared with (as pgbench's one-row INSERT is for PostgreSQL).
//!
//! A fresh file in WAL mode with `synchronous = FULL` (keiro-sqlite's durable default), one
//! table; T threads, each with a connection of its own and the store's busy timeout, each
//! committing one row per transaction (`BEGIN IMMEDIATE`, one `INSERT`, `COMMIT`) for the
//! measured seconds. Run at 1 thread, then at 16 (or `-c`): what one writer's fsyncs allow, and
//! what many writers get when each commits alone. The file is made beside the `sqlite:PATH` of
//! `--database-url` when one is given (the same filesystem as the bench file), else in the
//! temporary directory, and removed at the end.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keiro::store::sqlite::BUSY_TIMEOUT_DEFAULT;
use rusqlite::Connection;
use serde::Serialize;

use super::BenchArgs;
use crate::common::{failure, round, Outcome, Result, ResultExt, Store};

/// The figures of one thread count.
#[derive(Debug, Serialize)]
struct Rate {
    threads: u64,
    commits: u64,
    /// `BEGIN IMMEDIATE`s that waited past the busy timeout and began again.
    busy_timeouts: u64,
    elapsed_s: f64,
    commits_per_s: f64,
}

/// The baseline's report; serialized as the last line.
#[derive(Debug, Serialize)]
struct BaselineReport {
    mode: &'static str,
    store: &'static str,
    synchronous: &'static str,
    rates: Vec<Rate>,
}

/// Opens a connection to `path` as each baseline thread does: WAL, `synchronous = FULL`, the
/// store's busy timeout; each setting read back.
fn connect(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path).context(format!("opening {}", path.display()))?;
    conn.busy_timeout(BUSY_TIMEOUT_DEFAULT)
        .context("setting the busy timeout")?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .context("setting WAL mode")?;
    conn.pragma_update(None, "synchronous", "FULL")
        .context("setting synchronous = FULL")?;
    let synchronous: i64 = conn
        .query_row("PRAGMA synchronous", [], |row| row.get(0))
        .context("reading the synchronous level")?;
    // 2 is FULL.
    if !mode.eq_ignore_ascii_case("wal") || synchronous != 2 {
        return Err(failure(format!(
            "the baseline file is in journal mode {mode} with synchronous {synchronous}, not WAL \
             and FULL"
        )));
    }
    Ok(conn)
}

/// One row per transaction until `stop`; counts the commits, and the `BEGIN IMMEDIATE`s that
/// gave up waiting for the lock (SQLite's busy handler sleeps and does not queue, so among many
/// threads one can wait past the timeout; it begins again, as a store's caller retries).
fn commit_rows(
    conn: &Connection,
    stop: &AtomicBool,
    commits: &AtomicU64,
    busy: &AtomicU64,
) -> Result<()> {
    let mut insert = conn
        .prepare("INSERT INTO one_row (v) VALUES (1)")
        .context("preparing the insert")?;
    while !stop.load(Ordering::Relaxed) {
        match conn.execute_batch("BEGIN IMMEDIATE") {
            Ok(()) => {}
            Err(error) if error.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) => {
                busy.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            Err(error) => return Err(error).context("beginning a transaction"),
        }
        insert.execute([]).context("inserting a row")?;
        conn.execute_batch("COMMIT").context("committing")?;
        commits.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// `threads` threads committing one row per transaction for `seconds`.
fn measure(path: &Path, threads: u64, seconds: Duration) -> Result<Rate> {
    let connections = (0..threads)
        .map(|_| connect(path))
        .collect::<Result<Vec<_>>>()?;
    let stop = Arc::new(AtomicBool::new(false));
    let commits = Arc::new(AtomicU64::new(0));
    let busy = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let handles: Vec<_> = connections
        .into_iter()
        .map(|conn| {
            let (stop, commits, busy) =
                (Arc::clone(&stop), Arc::clone(&commits), Arc::clone(&busy));
            std::thread::spawn(move || commit_rows(&conn, &stop, &commits, &busy))
        })
        .collect();
    std::thread::sleep(seconds);
    stop.store(true, Ordering::Relaxed);
    for handle in handles {
        handle
            .join()
            .map_err(|_| failure("a baseline thread panicked"))??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let commits = commits.load(Ordering::Relaxed);
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52 convert exactly
    let rate = commits as f64 / elapsed;
    Ok(Rate {
        threads,
        commits,
        busy_timeouts: busy.load(Ordering::Relaxed),
        elapsed_s: round(elapsed, 3),
        commits_per_s: round(rate, 1),
    })
}

/// Where the baseline file goes: beside the bench's SQLite file, or in the temporary directory.
fn baseline_file(store: &Store) -> PathBuf {
    let dir = match store {
        Store::Sqlite(path) => path
            .parent()
            .filter(|dir| !dir.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
        Store::Postgres => std::env::temp_dir(),
    };
    dir.join(format!(
        "keiro-bench-baseline-{}-{}.db",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ))
}

/// Removes the baseline file with its WAL and shared-memory files.
fn remove(path: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(name));
    }
}

/// The baseline mode: 1 thread, then `-c` threads (16 by default).
pub(super) async fn run(args: &BenchArgs, store: Store) -> Result<Outcome> {
    let path = baseline_file(&store);
    let seconds = Duration::from_secs(args.baseline_s);
    let threads = args.concurrency;
    println!(
        "bench: sqlite-baseline: one-row commits (BEGIN IMMEDIATE, INSERT, COMMIT) on {}, WAL, \
         synchronous FULL, {} s at 1 thread and at {threads}",
        path.display(),
        args.baseline_s
    );
    let measured = tokio::task::spawn_blocking({
        let path = path.clone();
        move || -> Result<Vec<Rate>> {
            connect(&path)?
                .execute_batch("CREATE TABLE one_row (v INTEGER)")
                .context("creating the table")?;
            let mut rates = vec![measure(&path, 1, seconds)?];
            if threads > 1 {
                rates.push(measure(&path, threads, seconds)?);
            }
            Ok(rates)
        }
    })
    .await;
    remove(&path);
    let rates = measured.context("the baseline threads")??;
    for rate in &rates {
        println!(
            "bench: {} thread(s): {} commits in {:.1} s = {:.0} commits/s ({} busy timeouts)",
            rate.threads, rate.commits, rate.elapsed_s, rate.commits_per_s, rate.busy_timeouts
        );
    }
    let report = BaselineReport {
        mode: "sqlite-baseline",
        store: "sqlite",
        synchronous: "FULL",
        rates,
    };
    super::emit(&report)?;
    Ok(Outcome::Success)
}
