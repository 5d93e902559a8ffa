//! The machine block of the suite's table: what a reader needs to weigh the figures (cores,
//! memory, the PostgreSQL server and its durability setting, the disk under its data, the load
//! the run shared the machine with), read from `/proc`, the server and `df`.

use serde::Serialize;

use crate::common::{round, Result, ResultExt};

/// The machine the suite ran on; serialized into the suite's report.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Machine {
    /// Cores this process may run on.
    pub(super) cores: usize,
    /// `MemTotal` of `/proc/meminfo`, in GiB; `null` without it.
    pub(super) memory_gib: Option<f64>,
    /// The server's `SELECT version()`.
    pub(super) postgres: String,
    /// The server's `synchronous_commit`.
    pub(super) synchronous_commit: String,
    /// The filesystem under the server's data directory, as `df` reports it, or "unknown"
    /// (a server elsewhere, or a directory this user may not see).
    pub(super) disk: String,
    /// The one-minute load average when the suite started and when it ended.
    pub(super) load_before: Option<f64>,
    pub(super) load_after: Option<f64>,
}

impl Machine {
    /// Reads the machine and the server `db` is connected to.
    pub(super) async fn read(db: &tokio_postgres::Client) -> Result<Self> {
        let postgres: String = db
            .query_one("SELECT version()", &[])
            .await
            .context("reading the server's version")?
            .get(0);
        let synchronous_commit: String = db
            .query_one("SHOW synchronous_commit", &[])
            .await
            .context("reading synchronous_commit")?
            .get(0);
        // Only superusers and pg_read_all_settings may read it; without, the disk is unknown.
        let data_directory = db
            .query_one("SHOW data_directory", &[])
            .await
            .ok()
            .map(|row| row.get::<_, String>(0));
        Ok(Self {
            cores: std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            memory_gib: memory_gib(),
            postgres,
            synchronous_commit,
            disk: data_directory
                .as_deref()
                .and_then(disk)
                .unwrap_or_else(|| "unknown".to_owned()),
            load_before: load_average(),
            load_after: None,
        })
    }

    /// The block's lines, for the table's header.
    pub(super) fn lines(&self) -> Vec<String> {
        let load = |load: Option<f64>| load.map_or_else(|| "n/a".to_owned(), |l| format!("{l:.2}"));
        vec![
            format!(
                "machine: {} cores, {} memory",
                self.cores,
                self.memory_gib
                    .map_or_else(|| "unknown".to_owned(), |gib| format!("{gib:.1} GiB"))
            ),
            format!("postgres: {}", self.postgres),
            format!("synchronous_commit: {}", self.synchronous_commit),
            format!("disk: {}", self.disk),
            format!(
                "load average (1 min): {} at the start, {} at the end",
                load(self.load_before),
                load(self.load_after)
            ),
        ]
    }
}

/// `MemTotal` in GiB.
fn memory_gib() -> Option<f64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(round(kib / 1024.0 / 1024.0, 1))
}

/// The one-minute load average.
pub(super) fn load_average() -> Option<f64> {
    let loadavg = std::fs::read_to_string("/proc/loadavg").ok()?;
    loadavg.split_whitespace().next()?.parse().ok()
}

/// `df`'s line for `path`: device, type, size and free space.
fn disk(path: &str) -> Option<String> {
    let output = std::process::Command::new("df")
        .args(["-hT", "--", path])
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text.lines().nth(1)?;
    let fields: Vec<&str> = line.split_whitespace().collect();
    let [device, kind, size, _used, free, ..] = fields.as_slice() else {
        return None;
    };
    Some(format!("{kind} on {device}, {size} ({free} free)"))
}
