//! The HTML pages: the overview (counts, refreshed live by the embedded script), the instance
//! list with the filters of `Keiro::list` (queue and queue key among them), the instance page
//! (timeline, what it waits on, remote tasks, children) with its action forms, the queues
//! (limits, backlog, the limits each is at) and a queue's page (its busiest keys, pause and
//! resume).
//! Rendered with maud, which escapes every interpolated value.

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::Form;
use maud::{html, Markup, DOCTYPE};
use serde::Deserialize;

use super::actions::{self, ACTIONS, QUEUE_ACTIONS};
use super::api::{list_request, parse_query, read_queue};
use super::error::ApiError;
use super::view::{span, timer_kind, InstanceView, QueueView};
use super::AppState;
use crate::list::delayed_until;
use crate::ops::timestamp;

const STATUSES: [&str; 5] = ["running", "suspended", "completed", "failed", "cancelled"];

fn layout(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · keiro" }
                link rel="stylesheet" href="/assets/app.css";
                script src="/assets/app.js" defer {}
            }
            body {
                nav {
                    a href="/" { "keiro" }
                    a href="/instances" { "Instances" }
                    a href="/instances?status=failed" { "Failed" }
                    a href="/queues" { "Queues" }
                }
                main { (body) }
            }
        }
    }
}

/// An error as a page, with the same status the API would answer. A schema keiro's was never
/// migrated to gets its own page: the database is reachable, it just holds no keiro (yet).
pub(crate) fn error_page(error: ApiError) -> Response {
    let page = match &error.unmigrated_schema {
        Some(schema) => layout(
            "No keiro schema",
            html! {
                h1 #no-schema { "keiro's schema " code { (schema) } " is not in this database" }
                p.error { (error.message) }
                p { "Create it (or bring it up to this build) with" }
                pre #migrate { "keiro --database-url <the same URL> migrate --schema " (schema) }
                p {
                    "If your workers use another schema, start the dashboard with "
                    code { "keiro ui --schema <name>" } " (or " code { "KEIRO_SCHEMA" } ")."
                }
            },
        ),
        None => layout(
            "Error",
            html! {
                h1 { "Error " (error.status.as_u16()) }
                p.error { (error.message) }
                p { a href="/instances" { "Back to the list" } }
            },
        ),
    };
    (error.status, Html(page.into_string())).into_response()
}

/// `GET /`: instances by workflow and status, the timer backlog and remote tasks by group.
pub(crate) async fn overview(State(state): State<AppState>) -> Response {
    let counts = match state.keiro.counts().await {
        Ok(counts) => counts,
        Err(error) => return error_page(error.into()),
    };
    let mut names: Vec<&str> = counts.instances.iter().map(|c| c.name.as_str()).collect();
    names.dedup();
    let page = layout(
        "Overview",
        html! {
            h1 { "Overview" }
            table #counts data-live="/api/v1/counts" {
                thead { tr { th { "workflow" } @for status in STATUSES { th { (status) } } } }
                tbody {
                    @for name in &names {
                        tr {
                            td { (name) }
                            @for status in STATUSES {
                                @let n = counts.instances.iter()
                                    .find(|c| c.name.as_str() == *name && c.status.as_str() == status)
                                    .map_or(0, |c| c.count);
                                td {
                                    @if n > 0 {
                                        a href={ "/instances?name=" (urlencode(name)) "&status=" (status) } { (n) }
                                    } @else { "0" }
                                }
                            }
                        }
                    }
                }
            }
            p #timers { "Timers: " (counts.timers_due) " due, " (counts.timers_future) " scheduled later" }
            p #queues-link { a href="/queues" { "Queues" } ": their limits, what waits on them, pause and resume." }
            h2 { "Remote tasks" }
            table #remote {
                thead { tr { th { "group" } th { "pending" } th { "running" } } }
                tbody {
                    @for group in &counts.remote {
                        tr { td { (group.group) } td { (group.pending) } td { (group.running) } }
                    }
                }
            }
        },
    );
    Html(page.into_string()).into_response()
}

/// `GET /instances`: one page of the list, with the filter form.
pub(crate) async fn list(State(state): State<AppState>, RawQuery(query): RawQuery) -> Response {
    let pairs = parse_query(query.as_deref().unwrap_or(""));
    let value = |key: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == key)
            .map_or("", |(_, v)| v.as_str())
            .to_owned()
    };
    let page = match list_request(query.as_deref()) {
        Ok(request) => state.keiro.list(&request).await.map_err(ApiError::from),
        Err(error) => Err(error),
    };
    let page = match page {
        Ok(page) => page,
        Err(error) => return error_page(error),
    };
    let next = page.next_cursor.as_ref().map(|cursor| {
        let mut kept: Vec<String> = pairs
            .iter()
            .filter(|(k, v)| k != "cursor" && !v.is_empty())
            .map(|(k, v)| format!("{}={}", urlencode(k), urlencode(v)))
            .collect();
        kept.push(format!("cursor={}", urlencode(&cursor.to_string())));
        format!("/instances?{}", kept.join("&"))
    });
    let status = value("status");
    let now = time::OffsetDateTime::now_utc();
    let body = html! {
        h1 { "Instances" }
        form #filters method="get" action="/instances" {
            label { "Workflow " input name="name" value=(value("name")); }
            label { "Status "
                select name="status" {
                    option value="" { "any" }
                    @for s in STATUSES { option value=(s) selected[status == s] { (s) } }
                }
            }
            label { "Id prefix " input name="id_prefix" value=(value("id_prefix")); }
            label { "Parent " input name="parent" placeholder="name/id" value=(value("parent")); }
            label { "Created since " input name="created_since" placeholder="RFC 3339" value=(value("created_since")); }
            label { "Queue " input name="queue" value=(value("queue")); }
            label { "Queue key " input name="queue_key" value=(value("queue_key")); }
            label { "Failed remote tasks " input type="checkbox" name="failed_remote" value="true" checked[value("failed_remote") == "true"]; }
            button #apply type="submit" { "Filter" }
        }
        table #instances {
            thead { tr { th { "workflow" } th { "id" } th { "status" } th { "gen" } th { "attempts" } th { "created" } th { "updated" } th { "queue" } th { "last error" } } }
            tbody {
                @for row in &page.instances {
                    tr {
                        td { (row.key.name.as_str()) }
                        td { a.instance href=(instance_href(row.key.name.as_str(), row.key.id.as_str())) { (row.key.id.as_str()) } }
                        td { span class={ "status " (row.status.as_str()) } { (row.status.as_str()) } }
                        td { (row.generation) }
                        td { (row.attempts) }
                        td { (timestamp(Some(row.created_at))) }
                        td { (timestamp(Some(row.updated_at))) }
                        td.queue {
                            @if let Some(queue) = &row.queue {
                                a href=(queue_href(queue)) { (queue) }
                                @if let Some(key) = &row.queue_key {
                                    " · " a.key href=(queue_list_href(queue, Some(key))) { (key) }
                                }
                                @if let Some(at) = delayed_until(row, now) {
                                    br; span.delayed { "delayed until " (timestamp(Some(at))) }
                                }
                            }
                        }
                        td.error { (row.last_error.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
        p { (page.instances.len()) " row(s). "
            @if let Some(next) = &next { a #next href=(next) { "Next page" } } @else { "Last page." }
        }
    };
    Html(layout("Instances", body).into_string()).into_response()
}

fn instance_href(name: &str, id: &str) -> String {
    format!("/instances/{}/{}", urlencode(name), urlencode(id))
}

fn queue_href(name: &str) -> String {
    format!("/queues/{}", urlencode(name))
}

/// The instance list filtered on `queue`, and on `key` when given (the runs with no key cannot
/// be told apart by the filter: `None` lists the whole queue).
fn queue_list_href(queue: &str, key: Option<&str>) -> String {
    let mut href = format!("/instances?queue={}", urlencode(queue));
    if let Some(key) = key {
        href.push_str("&queue_key=");
        href.push_str(&urlencode(key));
    }
    href
}

/// Percent-encodes everything but unreserved characters, for links built from stored names.
fn urlencode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The `?notice=` an action's redirect carries.
#[derive(Debug, Deserialize)]
pub(crate) struct Notice {
    notice: Option<String>,
}

/// `GET /instances/{name}/{id}`.
pub(crate) async fn instance(
    State(state): State<AppState>,
    Path((name, id)): Path<(String, String)>,
    axum::extract::Query(notice): axum::extract::Query<Notice>,
) -> Response {
    let view = match InstanceView::read(&state.keiro, &name, &id).await {
        Ok(view) => view,
        Err(error) => return error_page(error),
    };
    let row = &view.instance;
    let pretty = |value: &serde_json::Value| {
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    };
    let href = instance_href(&name, &id);
    let body = html! {
        h1 { (row.key.name.as_str()) " / " span #instance-id { (row.key.id.as_str()) } }
        @if let Some(notice) = &notice.notice { p #notice.notice { (notice) } }
        @if !view.version_served {
            p #version-warning.notice.error {
                "No live worker serves version " (row.app_version.as_deref().unwrap_or("(unversioned)"))
                ": this run waits until one does (deploy a worker of that version, or hand its runs to another with keiro versions move)."
            }
        }
        dl.fields {
            dt { "status" } dd { span #status class={ "status " (row.status.as_str()) } { (row.status.as_str()) } }
            dt { "generation" } dd { (row.generation) }
            dt { "version" } dd #app-version { (row.app_version.as_deref().unwrap_or("(unversioned)")) }
            dt { "attempts" } dd { (row.attempts) }
            dt { "last error" } dd.error { (row.last_error.as_deref().unwrap_or("-")) }
            dt { "lease" } dd { (row.lease_owner.as_deref().unwrap_or("free")) " (epoch " (row.lease_epoch) ")" }
            dt { "parent" } dd {
                @if let Some(parent) = &row.parent {
                    a href=(instance_href(parent.name.as_str(), parent.id.as_str())) { (parent.to_string()) }
                } @else { "-" }
            }
            dt { "created" } dd { (timestamp(Some(row.created_at))) }
            dt { "updated" } dd { (timestamp(Some(row.updated_at))) }
            dt { "completed" } dd { (timestamp(row.completed_at)) }
            dt { "wake after" } dd { (timestamp(row.wake_after)) }
        }
        h2 { "Input" } pre #input { (pretty(&row.input)) }
        h2 { "Output" } pre #output { (row.output.as_ref().map_or_else(|| "-".to_owned(), pretty)) }
        h2 { "Timeline" }
        table #timeline {
            thead { tr { th { "#" } th { "gen" } th { "offset ms" } th { "gap ms" } th { "spent" } th { "event" } th { "step" } th { "payload" } } }
            tbody {
                @for t in view.timeline() {
                    tr {
                        td { (t.seq) } td { (t.generation) } td { (t.offset_ms) } td { (t.gap_ms) }
                        td { (t.spent) } td { (t.kind) } td { (t.step) }
                        td { code { (t.payload.to_string()) } }
                    }
                }
            }
        }
        h2 { "Timers" }
        @if view.waits.timers.is_empty() {
            p #timers.none { "None." }
        } @else {
            table #timers {
                thead { tr { th { "step" } th { "gen" } th { "kind" } th { "token" } th { "state" } th { "due" } th { "fired" } th { "attempts" } } }
                tbody {
                    @for timer in &view.waits.timers {
                        @let (kind, token) = timer_kind(timer);
                        tr {
                            td { (timer.step) } td { (timer.generation) } td { (kind) } td { (token) }
                            td { span class={ "state " (timer.state.as_str()) } { (timer.state.as_str()) } }
                            td { (timestamp(Some(timer.fire_at))) } td { (timestamp(timer.fired_at)) }
                            td { (timer.attempts) }
                        }
                    }
                }
            }
        }
        h2 { "Awakeables" }
        @if view.waits.awakeables.is_empty() {
            p #awakeables.none { "None." }
        } @else {
            table #awakeables {
                thead { tr { th { "id (token)" } th { "gen" } th { "status" } th { "created" } th { "settled" } } }
                tbody {
                    @for awakeable in &view.waits.awakeables {
                        tr {
                            td { code { (awakeable.id) } } td { (awakeable.generation) }
                            td { span class={ "state " (awakeable.status.as_str()) } { (awakeable.status.as_str()) } }
                            td { (timestamp(Some(awakeable.created_at))) } td { (timestamp(awakeable.settled_at)) }
                        }
                    }
                }
            }
        }
        h2 { "Signal waits" }
        @if view.waits.signal_waits.is_empty() {
            p #signal-waits.none { "None." }
        } @else {
            table #signal-waits {
                thead { tr { th { "token" } th { "step" } th { "gen" } th { "waiting since" } th { "times out" } } }
                tbody {
                    @for wait in &view.waits.signal_waits {
                        tr {
                            td { code { (wait.token) } } td { (wait.step) } td { (wait.generation) }
                            td { (timestamp(Some(wait.since))) } td { (timestamp(wait.timeout_at)) }
                        }
                    }
                }
            }
        }
        @if view.waits.truncated {
            p #waits-truncated { "Only the newest " (keiro::operate::WAITS_LIMIT_DEFAULT) " of each kind are shown." }
        }
        h2 { "Events" }
        @if view.messages.events.is_empty() {
            p #events.none { "None." }
        } @else {
            table #events {
                thead { tr { th { "key" } th { "version" } th { "set" } th { "value" } } }
                tbody {
                    @for event in &view.messages.events {
                        tr {
                            td { code { (event.key) } } td { (event.version) }
                            td { (timestamp(Some(event.updated_at))) }
                            td { code { (event.value.to_string()) } }
                        }
                    }
                }
            }
        }
        h2 { "Streams" }
        @if view.messages.streams.is_empty() {
            p #streams.none { "None." }
        } @else {
            table #streams {
                thead { tr { th { "key" } th { "items" } th { "bytes" } th { "state" } th { "written" } } }
                tbody {
                    @for stream in &view.messages.streams {
                        tr {
                            td { code { (stream.key) } } td { (stream.items) } td { (stream.bytes) }
                            td { (if stream.closed { "closed" } else { "open" }) }
                            td { (timestamp(Some(stream.updated_at))) }
                        }
                    }
                }
            }
        }
        h2 { "Remote tasks" }
        @if view.tasks.is_empty() {
            p #remote-tasks.none { "None." }
        } @else {
            table #remote-tasks {
                thead { tr { th { "step" } th { "group" } th { "status" } th { "attempts" } th { "dispatches" } th { "last error" } } }
                tbody {
                    @for task in &view.tasks {
                        tr {
                            td { (task.journal_step) } td { (task.group) } td { (task.status.as_str()) }
                            td { (task.attempts) "/" (task.max_attempts) } td { (task.dispatches) }
                            td.error { (task.last_error.as_ref().map(ToString::to_string).unwrap_or_default()) }
                        }
                    }
                }
            }
        }
        h2 { "Children" }
        @if view.children.is_empty() {
            p #children.none { "None." }
        } @else {
            table #children {
                thead { tr { th { "child" } th { "status" } th { "gen" } th { "attempts" } th { "created" } th { "last error" } } }
                tbody {
                    @for child in &view.children {
                        tr {
                            td { a href=(instance_href(child.key.name.as_str(), child.key.id.as_str())) { (child.key.to_string()) } }
                            td { span class={ "status " (child.status.as_str()) } { (child.status.as_str()) } }
                            td { (child.generation) } td { (child.attempts) }
                            td { (timestamp(Some(child.created_at))) }
                            td.error { (child.last_error.as_deref().unwrap_or("")) }
                        }
                    }
                }
            }
        }
        h2 { "Actions" }
        @if state.auth.read_only() {
            p { "Read-only: start " code { "keiro ui" } " with " code { "--token" } " or " code { "KEIRO_UI_TOKEN" } " to act." }
        } @else {
            form #actions method="post" action=(format!("{href}/requeue")) {
                input type="hidden" name="csrf" value=(state.auth.csrf());
                label { "Operator token " input #token type="password" name="token" autocomplete="off" required; }
                label.wide { "Corrected input (JSON, for retry with input) "
                    textarea #retry-input name="input" rows="4" data-json { (pretty(&row.input)) }
                }
                div.buttons {
                    @for (action, label) in ACTIONS {
                        button id={ "action-" (action) } type="submit" formaction={ (href) "/" (action) }
                            data-confirm={ (label) " " (row.key.to_string()) "?" } { (label) }
                    }
                }
            }
        }
    };
    Html(layout(&row.key.to_string(), body).into_string()).into_response()
}

/// An action form's fields.
#[derive(Debug, Deserialize)]
pub(crate) struct ActionForm {
    token: Option<String>,
    csrf: Option<String>,
    input: Option<String>,
}

/// `POST /instances/{name}/{id}/{action}`: runs the action, then back to the instance page
/// with what it did (post/redirect/get, so a reload does not act twice).
pub(crate) async fn action(
    State(state): State<AppState>,
    Path((name, id, action)): Path<(String, String, String)>,
    form: Result<Form<ActionForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let form = match form {
        Ok(Form(form)) => form,
        Err(rejection) => {
            return error_page(ApiError::new(
                rejection.status(),
                "body",
                rejection.body_text(),
            ))
        }
    };
    if let Err(error) = state
        .auth
        .check_form(form.token.as_deref(), form.csrf.as_deref())
    {
        return error_page(error);
    }
    let input = if action == "retry-with-input" {
        match form.input.as_deref().map(serde_json::from_str) {
            Some(Ok(input)) => Some(input),
            Some(Err(error)) => {
                return error_page(ApiError::bad_request(
                    "input",
                    format!("the input is not JSON: {error}"),
                ))
            }
            None => None,
        }
    } else {
        None
    };
    match actions::run(&state.keiro, &action, &name, &id, input).await {
        Ok(done) => Redirect::to(&format!(
            "{}?notice={}",
            instance_href(&name, &id),
            urlencode(&done.message)
        ))
        .into_response(),
        Err(error) if error.status == StatusCode::CONFLICT => Redirect::to(&format!(
            "{}?notice={}",
            instance_href(&name, &id),
            urlencode(&error.message)
        ))
        .into_response(),
        Err(error) => error_page(error),
    }
}

/// The limits the queue is at, as badges.
fn at_limit_badges(view: &QueueView) -> Markup {
    html! {
        @for limit in view.at_limits() {
            span class={ "badge at-limit " (limit) } { "at " (limit.replace('_', " ")) }
        }
    }
}

/// Paused or admitting, as a badge.
fn paused_badge(view: &QueueView) -> Markup {
    html! {
        @if view.info.paused {
            span.badge.paused { "paused" }
        } @else {
            span.badge.admitting { "admitting" }
        }
    }
}

/// When the oldest waiting run was started, and how long ago.
fn oldest_waiting(view: &QueueView, now: time::OffsetDateTime) -> Markup {
    html! {
        @match (view.info.oldest_waiting, view.oldest_wait(now)) {
            (Some(at), Some(wait)) => { (timestamp(Some(at))) " (" (span(wait)) " ago)" }
            _ => "-",
        }
    }
}

/// `GET /queues`: every declared queue with its limits, backlog and the limits it is at.
pub(crate) async fn queues(State(state): State<AppState>) -> Response {
    let queues = match state.keiro.queues().await {
        Ok(queues) => queues,
        Err(error) => return error_page(error.into()),
    };
    let now = time::OffsetDateTime::now_utc();
    let views: Vec<QueueView> = queues.into_iter().map(|info| QueueView { info }).collect();
    let body = html! {
        h1 { "Queues" }
        @if views.is_empty() {
            p #queues.none { "No queue is declared (" code { "Keiro::declare_queue" } ")." }
        } @else {
            table #queues {
                thead { tr {
                    th { "queue" } th { "state" } th { "limits" } th { "waiting" } th { "delayed" }
                    th { "running" } th { "admitted/s" } th { "at limit" } th { "oldest waiting" }
                } }
                tbody {
                    @for view in &views {
                        tr data-queue=(view.name()) {
                            td { a.queue href=(queue_href(view.name())) { (view.name()) } }
                            td { (paused_badge(view)) }
                            td { (crate::queue::limits(&view.info.spec)) }
                            td.waiting { (view.info.waiting) }
                            td.delayed { (view.info.delayed) }
                            td.running { (view.info.running) }
                            td { (format!("{:.2}", view.admitted_per_second())) }
                            td { (at_limit_badges(view)) }
                            td { (oldest_waiting(view, now)) }
                        }
                    }
                }
            }
        }
    };
    Html(layout("Queues", body).into_string()).into_response()
}

/// `GET /queues/{name}`: one queue, its busiest keys (each a link to its runs), and the pause
/// and resume form.
pub(crate) async fn queue(
    State(state): State<AppState>,
    Path(name): Path<String>,
    axum::extract::Query(notice): axum::extract::Query<Notice>,
) -> Response {
    let view = match read_queue(&state, &name).await {
        Ok(view) => view,
        Err(error) => return error_page(error),
    };
    let now = time::OffsetDateTime::now_utc();
    let info = &view.info;
    let href = queue_href(view.name());
    let window = span(view.window());
    let body = html! {
        h1 { "Queue " span #queue-name { (view.name()) } }
        @if let Some(notice) = &notice.notice { p #notice.notice { (notice) } }
        dl.fields {
            dt { "state" } dd #queue-state { (paused_badge(&view)) }
            dt { "limits" } dd #limits { (crate::queue::limits(&view.info.spec)) }
            dt { "at limit" } dd #at-limit { (at_limit_badges(&view)) }
            dt { "waiting" } dd #waiting { (info.waiting) " (" (info.delayed) " delayed, " (view.ready()) " ready)" }
            dt { "running" } dd #running { (info.running) }
            dt { "admitted" } dd #admitted {
                (info.admitted_recently) " in the last " (window) " ("
                (format!("{:.2}", view.admitted_per_second())) "/s)"
            }
            dt { "oldest waiting" } dd #oldest-waiting { (oldest_waiting(&view, now)) }
        }
        p { a #queue-runs href=(queue_list_href(view.name(), None)) { "Every run on this queue" } }
        h2 { "Busiest keys" }
        @let keys = view.keys();
        @if keys.is_empty() {
            p #keys.none { "No run is waiting." }
        } @else {
            table #keys {
                thead { tr { th { "key" } th { "waiting" } th { "running" } th { "at per-key limit" } } }
                tbody {
                    @for key in &keys {
                        tr {
                            td {
                                a.key href=(queue_list_href(view.name(), key.key)) {
                                    (key.key.unwrap_or("(no key)"))
                                }
                            }
                            td { (key.waiting) } td { (key.running) }
                            td {
                                @match key.at_key_concurrency {
                                    Some(true) => span.badge.at-limit { "yes" },
                                    Some(false) => "no",
                                    None => "-",
                                }
                            }
                        }
                    }
                }
            }
        }
        h2 { "Actions" }
        @if state.auth.read_only() {
            p { "Read-only: start " code { "keiro ui" } " with " code { "--token" } " or " code { "KEIRO_UI_TOKEN" } " to act." }
        } @else {
            // The one that applies: pause while admitting, resume while paused.
            @let (action, label) = if info.paused { QUEUE_ACTIONS[1] } else { QUEUE_ACTIONS[0] };
            form #actions method="post" action={ (href) "/" (action) } {
                input type="hidden" name="csrf" value=(state.auth.csrf());
                label { "Operator token " input #token type="password" name="token" autocomplete="off" required; }
                div.buttons {
                    button id={ "action-" (action) } type="submit"
                        data-confirm={ (label) " queue " (view.name()) "?" } { (label) }
                }
            }
        }
    };
    Html(layout(&format!("Queue {}", view.name()), body).into_string()).into_response()
}

/// `POST /queues/{name}/{action}`: pauses or resumes, then back to the queue's page with what
/// it did (post/redirect/get), checked as an instance action's form is.
pub(crate) async fn queue_action(
    State(state): State<AppState>,
    Path((name, action)): Path<(String, String)>,
    form: Result<Form<ActionForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let form = match form {
        Ok(Form(form)) => form,
        Err(rejection) => {
            return error_page(ApiError::new(
                rejection.status(),
                "body",
                rejection.body_text(),
            ))
        }
    };
    if let Err(error) = state
        .auth
        .check_form(form.token.as_deref(), form.csrf.as_deref())
    {
        return error_page(error);
    }
    match actions::run_queue(&state.keiro, &action, &name).await {
        Ok(done) => Redirect::to(&format!(
            "{}?notice={}",
            queue_href(&name),
            urlencode(&done.message)
        ))
        .into_response(),
        Err(error) => error_page(error),
    }
}
