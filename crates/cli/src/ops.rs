//! Operator commands on one instance: `show`, `cancel`, `resurrect`, `release`, `requeue`,
//! `redispatch`, `retry-with-input`. Each is a thin call of the facade; none migrates (that is
//! `keiro migrate`'s job). Listing, counts and retention are in `list.rs` and `gc.rs`.

use clap::Args;
use keiro::{
    operate::CancelOutcome, operate::InstanceSummary, operate::ListRequest, operate::Messages,
    operate::RequeueOutcome, operate::ResurrectOutcome, operate::TimerKind, operate::Waits,
    operate::WAITS_LIMIT_DEFAULT, store::Instance, store::JournalEntry, Keiro,
};
use time::format_description::FormatItem;
use time::macros::format_description;
use time::{OffsetDateTime, UtcOffset};

use crate::common::{Global, Outcome, Result, ResultExt};

/// Which instance: its workflow name and id.
#[derive(Debug, Clone, Args)]
pub(crate) struct KeyArgs {
    /// The workflow name, as registered.
    pub(crate) name: String,
    /// The instance id.
    pub(crate) id: String,
}

/// The facade validates the pair as it does any other, so a bad name or id is its typed error.
impl keiro::workflow::IntoInstanceKey for &KeyArgs {
    fn into_instance_key(
        self,
    ) -> std::result::Result<keiro::InstanceKey, keiro::workflow::IdError> {
        keiro::InstanceKey::parse(&self.name, &self.id)
    }
}

/// A facade on the operator's store. Two connections on PostgreSQL: `show` reads the row, the
/// journal and the remote tasks.
pub(crate) async fn keiro(global: &Global) -> Result<Keiro> {
    crate::common::keiro(global, 2).await
}

/// How many children `keiro show` prints (`keiro list --parent` has them all).
const CHILDREN_SHOWN: u32 = 100;

/// `keiro show`: the instance row, every journal event in append order, the journal as a
/// timeline (each step's duration and the time spent parked), then what it waits on (timers,
/// awakeables, signal waits), its events and streams, its remote tasks and its children.
pub(crate) async fn show(global: &Global, key: &KeyArgs) -> Result<Outcome> {
    let keiro = keiro(global).await?;
    let what = format!("{}/{}", key.name, key.id);
    let Some(instance) = keiro
        .instance(key)
        .await
        .context(format!("reading instance {what}"))?
    else {
        println!("no instance {what} in {}", global.place());
        return Ok(Outcome::Failed);
    };
    let journal = keiro
        .journal(key)
        .await
        .context(format!("reading the journal of {what}"))?;
    let waits = keiro
        .waits(key, WAITS_LIMIT_DEFAULT)
        .await
        .context(format!(
            "reading the timers, awakeables and signal waits of {what}"
        ))?;
    let messages = keiro
        .messages(key)
        .await
        .context(format!("reading the events and streams of {what}"))?;
    let updates = keiro
        .updates(key)
        .await
        .context(format!("reading the updates of {what}"))?;
    let attributes = keiro
        .attributes(key)
        .await
        .context(format!("reading the search attributes of {what}"))?;
    let tasks = keiro
        .remote_tasks(key)
        .await
        .context(format!("reading the remote tasks of {what}"))?;
    let children = keiro
        .list(&ListRequest {
            filter: keiro::operate::ListFilter {
                parent: Some(instance.key.clone()),
                ..keiro::operate::ListFilter::default()
            },
            limit: CHILDREN_SHOWN,
            ..ListRequest::default()
        })
        .await
        .context(format!("listing the children of {what}"))?;
    print_instance(&instance);
    print_attributes(&attributes);
    print_journal(&journal);
    crate::timeline::print(&instance, &journal);
    print_waits(&waits);
    print_messages(&messages);
    print_updates(&updates);
    print_tasks(&tasks);
    print_children(&children.instances, children.next_cursor.is_some());
    Ok(Outcome::Success)
}

/// The events the run set (each with its latest value) and the streams it wrote (`keiro
/// stream` prints their items).
fn print_messages(messages: &Messages) {
    if !messages.events.is_empty() {
        println!("events {}", messages.events.len());
    }
    for event in &messages.events {
        println!(
            "  {:<32} v{:<4} set {}  {}",
            event.key,
            event.version,
            timestamp(Some(event.updated_at)),
            shown(&event.value)
        );
    }
    if !messages.streams.is_empty() {
        println!("streams {}", messages.streams.len());
    }
    for stream in &messages.streams {
        println!(
            "  {:<32} {:>8} items {:>10} bytes  {}  written {}",
            stream.key,
            stream.items,
            stream.bytes,
            if stream.closed { "closed" } else { "open  " },
            timestamp(Some(stream.updated_at)),
        );
    }
}

/// The updates sent to the run, with their state and answer.
fn print_updates(updates: &[keiro::workflow::UpdateRecord]) {
    use keiro::workflow::UpdateState;
    if !updates.is_empty() {
        println!("updates {}", updates.len());
    }
    for update in updates {
        let state = match &update.state {
            UpdateState::Requested => "requested".to_owned(),
            UpdateState::Replied(reply) => format!("replied {reply}"),
            UpdateState::Rejected(message) => format!("rejected: {message}"),
            UpdateState::Unanswered(status) => format!("unanswered (run {status})"),
        };
        println!(
            "  {:<24} {:<16} sent {}  {}  {state}",
            update.id,
            update.name,
            timestamp(Some(update.requested_at)),
            update.request,
        );
    }
}

fn print_waits(waits: &Waits) {
    if !waits.timers.is_empty() {
        println!("timers {}", waits.timers.len());
    }
    for timer in &waits.timers {
        let kind = match &timer.kind {
            TimerKind::SignalTimeout { token } => format!("signal timeout, token {token}"),
            _ => "sleep".to_owned(),
        };
        println!(
            "  {:<32} gen {:<3} {:<9} due {}  fired {}  attempts {}  {kind}",
            timer.step,
            timer.generation,
            timer.state.as_str(),
            timestamp(Some(timer.fire_at)),
            timestamp(timer.fired_at),
            timer.attempts,
        );
    }
    if !waits.awakeables.is_empty() {
        println!("awakeables {}", waits.awakeables.len());
    }
    for awakeable in &waits.awakeables {
        println!(
            "  {}  gen {:<3} {:<9} created {}  settled {}",
            awakeable.id,
            awakeable.generation,
            awakeable.status.as_str(),
            timestamp(Some(awakeable.created_at)),
            timestamp(awakeable.settled_at),
        );
    }
    if !waits.signal_waits.is_empty() {
        println!("signal waits {}", waits.signal_waits.len());
    }
    for wait in &waits.signal_waits {
        println!(
            "  {:<32} gen {:<3} token {}  since {}  times out {}",
            wait.step,
            wait.generation,
            wait.token,
            timestamp(Some(wait.since)),
            timestamp(wait.timeout_at),
        );
    }
    if waits.truncated {
        println!("  (only the newest {WAITS_LIMIT_DEFAULT} of each kind)");
    }
}

fn print_children(children: &[InstanceSummary], more: bool) {
    if children.is_empty() {
        return;
    }
    println!("children {}{}", children.len(), if more { "+" } else { "" });
    for child in children {
        println!(
            "  {:<40} {:<9} gen {:<3} attempts {}{}",
            child.key.to_string(),
            child.status.as_str(),
            child.generation,
            child.attempts,
            child
                .last_error
                .as_ref()
                .map_or_else(String::new, |e| format!("  last error {e}"))
        );
    }
    if more {
        println!("  (the first {CHILDREN_SHOWN}; keiro list --parent lists them all)");
    }
}

fn print_tasks(tasks: &[keiro::remote::RemoteTask]) {
    if tasks.is_empty() {
        return;
    }
    println!("remote tasks {}", tasks.len());
    for task in tasks {
        println!(
            "  {:<40} {:<9} attempts {}/{}  dispatches {}  group {}  journal {}{}",
            task.step_id,
            task.status.as_str(),
            task.attempts,
            task.max_attempts,
            task.dispatches,
            task.group,
            task.journal_step,
            task.last_error
                .as_ref()
                .map_or_else(String::new, |e| format!("  last error {e}"))
        );
    }
}

fn print_instance(row: &Instance) {
    let lease = match &row.lease_owner {
        Some(owner) => format!(
            "{owner} (epoch {}, expires {})",
            row.lease_epoch,
            timestamp(row.lease_expires_at)
        ),
        None => format!("free (epoch {})", row.lease_epoch),
    };
    let parent = row
        .parent
        .as_ref()
        .map_or_else(|| "-".to_owned(), ToString::to_string);
    println!("instance     {}", row.key);
    println!("status       {}", row.status);
    println!("generation   {}", row.generation);
    println!("attempts     {}", row.attempts);
    println!("open_refusals {}", row.open_refusals);
    println!("last_error   {}", row.last_error.as_deref().unwrap_or("-"));
    println!("next_attempt {}", timestamp(row.next_attempt_at));
    println!("lease        {lease}");
    println!("wake_after   {}", timestamp(row.wake_after));
    println!("parent       {parent}");
    println!("priority     {}", row.priority);
    println!("created_at   {}", timestamp(Some(row.created_at)));
    println!("updated_at   {}", timestamp(Some(row.updated_at)));
    println!("completed_at {}", timestamp(row.completed_at));
    println!("input        {}", shown(&row.input));
    println!(
        "output       {}",
        row.output.as_ref().map_or_else(|| "-".to_owned(), shown)
    );
}

/// The run's search attributes, one a line with its kind.
fn print_attributes(attributes: &keiro::operate::Attributes) {
    if attributes.is_empty() {
        println!("attributes   -");
        return;
    }
    println!("attributes   {}", attributes.len());
    for (name, value) in attributes.iter() {
        println!("  {name:<32} {:<5} {value}", value.kind());
    }
}

/// A payload as `keiro show` prints it: its JSON, or `encrypted (key "k1")` for a value sealed
/// with a key this process was not given (`KEIRO_ENCRYPTION_KEYS`).
fn shown(value: &serde_json::Value) -> String {
    match keiro::codec::first_sealed_key_id(value) {
        Some(key_id) => format!("encrypted (key {key_id:?})"),
        None => value.to_string(),
    }
}

fn print_journal(journal: &[JournalEntry]) {
    println!("journal      {} event(s)", journal.len());
    for entry in journal {
        let row = entry.event.encode();
        println!(
            "  #{:<8} gen {:<3} {}  {:<11} {:<24} {}",
            entry.seq,
            entry.generation,
            timestamp(Some(entry.recorded_at)),
            row.kind,
            row.step_name,
            shown(&row.payload)
        );
    }
}

/// UTC with a fixed number of digits, so journal lines stay aligned.
const TIMESTAMP: &[FormatItem<'static>] =
    format_description!("[year]-[month]-[day] [hour]:[minute]:[second].[subsecond digits:6]Z");

pub(crate) fn timestamp(at: Option<OffsetDateTime>) -> String {
    at.and_then(|at| at.to_offset(UtcOffset::UTC).format(TIMESTAMP).ok())
        .unwrap_or_else(|| "-".to_owned())
}

/// `keiro cancel`: appends the cancel marker; first writer wins against completion.
pub(crate) async fn cancel(global: &Global, key: &KeyArgs) -> Result<Outcome> {
    let what = format!("{}/{}", key.name, key.id);
    let outcome = keiro(global)
        .await?
        .cancel(key)
        .await
        .context(format!("cancelling {what}"))?;
    Ok(match outcome {
        CancelOutcome::Recorded => {
            println!("{what}: cancelled; a running worker stops at its next step boundary");
            Outcome::Success
        }
        CancelOutcome::AlreadyTerminal(status) => {
            println!("{what}: not cancelled, it is already {status}");
            Outcome::Failed
        }
    })
}

/// `keiro resurrect`: returns a failed instance to running.
pub(crate) async fn resurrect(global: &Global, key: &KeyArgs) -> Result<Outcome> {
    let what = format!("{}/{}", key.name, key.id);
    let outcome = keiro(global)
        .await?
        .resurrect(key)
        .await
        .context(format!("resurrecting {what}"))?;
    Ok(match outcome {
        ResurrectOutcome::Resurrected => {
            println!("{what}: running again; its failure stays in the journal");
            Outcome::Success
        }
        ResurrectOutcome::NotFailed(status) => {
            println!("{what}: not resurrected, it is {status}, not failed");
            Outcome::Failed
        }
        ResurrectOutcome::NotFound => {
            println!("no instance {what} in {}", global.place());
            Outcome::Failed
        }
    })
}

/// `keiro release`: drops the instance's lease whoever holds it.
pub(crate) async fn release(global: &Global, key: &KeyArgs) -> Result<Outcome> {
    let what = format!("{}/{}", key.name, key.id);
    let dropped = keiro(global)
        .await?
        .force_release(key)
        .await
        .context(format!("releasing the lease of {what}"))?;
    if dropped {
        println!("{what}: lease dropped; its holder stops at its next step boundary");
    } else {
        println!("{what}: no lease was held");
    }
    Ok(Outcome::Success)
}

/// `keiro requeue`: the operator's retry of a failed instance (and its failed children).
pub(crate) async fn requeue(global: &Global, key: &KeyArgs) -> Result<Outcome> {
    let what = format!("{}/{}", key.name, key.id);
    let outcome = keiro(global)
        .await?
        .requeue(key)
        .await
        .context(format!("requeueing {what}"))?;
    Ok(match outcome {
        RequeueOutcome::Requeued {
            reset_steps,
            children,
        } => {
            let children: Vec<String> = children.iter().map(ToString::to_string).collect();
            println!(
                "{what}: running again; {reset_steps} step(s) reset, children requeued: [{}]",
                children.join(", ")
            );
            Outcome::Success
        }
        RequeueOutcome::NotFailed(status) => {
            println!("{what}: not requeued, it is {status}, not failed");
            Outcome::Failed
        }
        RequeueOutcome::NotFound => {
            println!("no instance {what} in {}", global.place());
            Outcome::Failed
        }
    })
}

/// `keiro redispatch`: re-dispatches every pending remote step of an instance.
pub(crate) async fn redispatch(global: &Global, key: &KeyArgs) -> Result<Outcome> {
    let what = format!("{}/{}", key.name, key.id);
    let count = keiro(global)
        .await?
        .redispatch_pending(key)
        .await
        .context(format!("re-dispatching the remote steps of {what}"))?;
    println!("{what}: {count} remote step(s) re-dispatched");
    Ok(Outcome::Success)
}

/// Which instance to fix, and its corrected input.
#[derive(Debug, Clone, Args)]
pub(crate) struct RetryArgs {
    #[command(flatten)]
    pub(crate) key: KeyArgs,
    /// The corrected input, as JSON.
    pub(crate) input: String,
}

/// `keiro retry-with-input`: starts `<id>~retry~<8 hex>` with a corrected input.
pub(crate) async fn retry_with_input(global: &Global, args: &RetryArgs) -> Result<Outcome> {
    let key = &args.key;
    let what = format!("{}/{}", key.name, key.id);
    let input: serde_json::Value =
        serde_json::from_str(&args.input).context("reading the input as JSON")?;
    let retry = keiro(global)
        .await?
        .retry_with_input(key, &input)
        .await
        .context(format!("starting a fix of {what}"))?;
    println!("{what}: started {retry} with the corrected input");
    Ok(Outcome::Success)
}
