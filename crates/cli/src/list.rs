//! `keiro list` and `keiro stats`: the operators' list (filters, keyset pages) and overview
//! counts, through the facade's `Keiro::list` and `Keiro::counts` (the dashboard's calls too).

use clap::Args;
use keiro::{
    operate::Counts, operate::InstanceSummary, operate::ListRequest, operate::Page, Status,
};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::common::{failure, Global, Outcome, Result, ResultExt};
use crate::ops::{keiro, timestamp};

/// The filters and paging of `keiro list`.
#[derive(Debug, Clone, Args)]
pub(crate) struct ListArgs {
    /// Only this workflow.
    #[arg(long)]
    name: Option<String>,
    /// Only this status: running, suspended, completed, failed or cancelled.
    #[arg(long)]
    status: Option<String>,
    /// Only instances started within this age (`90s`, `15m`, `1h`, `30d`).
    #[arg(long)]
    since: Option<String>,
    /// Only the children of this instance, as `<name>/<id>`.
    #[arg(long)]
    parent: Option<String>,
    /// Only ids starting with this text.
    #[arg(long)]
    id_prefix: Option<String>,
    /// Only runs started on this queue.
    #[arg(long)]
    queue: Option<String>,
    /// Only runs with this key on their queue (with --queue).
    #[arg(long)]
    queue_key: Option<String>,
    /// Only runs whose search attribute compares so: `name=value`, or `>`, `>=`, `<`, `<=` on
    /// a number or an RFC 3339 time; quote to compare text (`zip="02139"`). Repeatable (all
    /// must hold).
    #[arg(long = "attr", value_name = "FILTER")]
    attrs: Vec<String>,
    /// Only instances with a remote task that failed for good.
    #[arg(long)]
    failed_remote: bool,
    /// Oldest first instead of newest first.
    #[arg(long)]
    oldest_first: bool,
    /// Rows per page (1 to 1000).
    #[arg(long, default_value_t = keiro::operate::LIST_LIMIT_DEFAULT)]
    limit: u32,
    /// Start after this cursor (printed under the previous page).
    #[arg(long)]
    cursor: Option<String>,
    /// One JSON object (`instances`, `next_cursor`) instead of a table.
    #[arg(long)]
    json: bool,
}

impl ListArgs {
    /// The request, checked the way the facade and a JSON API check theirs.
    fn request(&self, now: OffsetDateTime) -> Result<ListRequest> {
        let since = match &self.since {
            Some(age) => {
                let age = time::Duration::try_from(crate::age::parse(age)?)
                    .map_err(|_| failure(format!("--since {age:?} is too large")))?;
                Some(
                    now.checked_sub(age)
                        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
                        .format(&Rfc3339)
                        .context("formatting --since")?,
                )
            }
            None => None,
        };
        let limit = self.limit.to_string();
        let mut pairs: Vec<(&str, &str)> = vec![("limit", &limit)];
        let optional = [
            ("name", self.name.as_deref()),
            ("status", self.status.as_deref()),
            ("created_since", since.as_deref()),
            ("parent", self.parent.as_deref()),
            ("id_prefix", self.id_prefix.as_deref()),
            ("queue", self.queue.as_deref()),
            ("queue_key", self.queue_key.as_deref()),
            ("cursor", self.cursor.as_deref()),
        ];
        pairs.extend(
            optional
                .into_iter()
                .filter_map(|(key, value)| value.map(|value| (key, value))),
        );
        pairs.extend(self.attrs.iter().map(|attr| ("attr", attr.as_str())));
        if self.failed_remote {
            pairs.push(("failed_remote", "true"));
        }
        if self.oldest_first {
            pairs.push(("order", "oldest_first"));
        }
        ListRequest::from_pairs(pairs).context("reading the filters")
    }
}

/// `keiro list`.
pub(crate) async fn list(global: &Global, args: &ListArgs) -> Result<Outcome> {
    let request = args.request(OffsetDateTime::now_utc())?;
    let page = keiro(global)
        .await?
        .list(&request)
        .await
        .context("listing instances")?;
    if args.json {
        println!("{}", serde_json::to_string(&page)?);
    } else {
        print_page(&page);
    }
    Ok(Outcome::Success)
}

/// The longest error text a table row shows; `keiro show` has the whole of it.
const ERROR_COLUMN_LEN: usize = 60;

/// When a run started with a delay may first be admitted, while that is still ahead of `now`:
/// `None` once it passed, and for a run whose `not_before` is a crash's backoff (attempts
/// counted). `keiro list` and the dashboard's list say "delayed until" it.
pub(crate) fn delayed_until(row: &InstanceSummary, now: OffsetDateTime) -> Option<OffsetDateTime> {
    row.not_before.filter(|at| *at > now && row.attempts == 0)
}

fn print_page(page: &Page) {
    println!(
        "{:<20} {:<36} {:<9} {:>3} {:>3}  {:<27} {:<27} error",
        "name", "id", "status", "gen", "att", "created_at", "updated_at"
    );
    let now = OffsetDateTime::now_utc();
    for row in &page.instances {
        let mut error: String = row
            .last_error
            .as_deref()
            .unwrap_or("")
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .take(ERROR_COLUMN_LEN)
            .collect();
        if let Some(queue) = &row.queue {
            // A run on a queue says where it waits, and until when when it is delayed.
            let key = row
                .queue_key
                .as_deref()
                .map(|k| format!(" key {k}"))
                .unwrap_or_default();
            let delayed = delayed_until(row, now)
                .map(|at| format!(" delayed until {}", timestamp(Some(at))))
                .unwrap_or_default();
            error = format!("[queue {queue}{key}{delayed}] {error}");
        }
        if !row.attributes.is_empty() {
            // The run's search attributes, before the error.
            let attrs: Vec<String> = row
                .attributes
                .iter()
                .map(|(name, value)| format!("{name}={value}"))
                .collect();
            error = format!("{{{}}} {error}", attrs.join(" "));
        }
        println!(
            "{:<20} {:<36} {:<9} {:>3} {:>3}  {:<27} {:<27} {error}",
            row.key.name.as_str(),
            row.key.id.as_str(),
            row.status.as_str(),
            row.generation,
            row.attempts,
            timestamp(Some(row.created_at)),
            timestamp(Some(row.updated_at)),
        );
    }
    match &page.next_cursor {
        Some(cursor) => println!(
            "{} row(s); next page: --cursor {cursor}",
            page.instances.len()
        ),
        None => println!("{} row(s); last page", page.instances.len()),
    }
}

/// Options of `keiro stats`.
#[derive(Debug, Clone, Args)]
pub(crate) struct StatsArgs {
    /// One JSON object instead of tables.
    #[arg(long)]
    json: bool,
}

/// `keiro stats`.
pub(crate) async fn stats(global: &Global, args: &StatsArgs) -> Result<Outcome> {
    let keiro = keiro(global).await?;
    let counts = keiro.counts().await.context("counting instances")?;
    // The live runs whose version no live worker serves (`keiro versions`).
    let versions = keiro
        .versions_count()
        .await
        .context("counting runs per version")?;
    let workers = keiro.workers().await.context("listing workers")?;
    let alive = keiro::versions::live(
        &workers,
        OffsetDateTime::now_utc(),
        keiro::versions::LIVE_WINDOW_DEFAULT,
    );
    if args.json {
        let mut value = serde_json::to_value(&counts)?;
        let unserved: Vec<serde_json::Value> = keiro::versions::unserved(&versions, &alive)
            .iter()
            .map(|c| {
                serde_json::json!({
                    "app_version": c.app_version,
                    "status": c.status.as_str(),
                    "runs": c.runs,
                })
            })
            .collect();
        if let Some(object) = value.as_object_mut() {
            object.insert("unserved".into(), unserved.into());
        }
        println!("{value}");
    } else {
        print_counts(&counts);
        crate::versions::print_unserved(&versions, &alive);
    }
    Ok(Outcome::Success)
}

const STATUSES: [Status; 5] = [
    Status::Running,
    Status::Suspended,
    Status::Completed,
    Status::Failed,
    Status::Cancelled,
];

fn print_counts(counts: &Counts) {
    print!("{:<24}", "workflow");
    for status in STATUSES {
        print!(" {:>10}", status.as_str());
    }
    println!();
    let mut names: Vec<&str> = counts.instances.iter().map(|c| c.name.as_str()).collect();
    names.dedup();
    for name in names {
        print!("{name:<24}");
        for status in STATUSES {
            let n = counts
                .instances
                .iter()
                .find(|c| c.name.as_str() == name && c.status == status)
                .map_or(0, |c| c.count);
            print!(" {n:>10}");
        }
        println!();
    }
    println!(
        "timers       {} due, {} scheduled later",
        counts.timers_due, counts.timers_future
    );
    if counts.remote.is_empty() {
        println!("remote tasks none pending or running");
    }
    for group in &counts.remote {
        println!(
            "remote group {:<24} {} pending, {} running",
            group.group, group.pending, group.running
        );
    }
}
