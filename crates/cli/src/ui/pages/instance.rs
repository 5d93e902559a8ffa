//! `GET /instances/{name}/{id}`: one instance; its actions' form posts; a stream's page.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::Form;
use maud::html;

use super::event::event_href;
use super::{error_page, instance_href, layout, urlencode, ActionForm, Notice};
use crate::ui::actions::{self, ACTIONS};
use crate::ui::error::ApiError;
use crate::ui::timeline;
use crate::ui::view::{timer_kind, update_state, InstanceView};
use crate::ui::when::when;
use crate::ui::AppState;

/// The most streams the instance page follows live (each is polled while it is open).
const STREAMS_FOLLOWED: usize = 8;

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
    let pretty = crate::ui::view::payload_text;
    let href = instance_href(&name, &id);
    let now = time::OffsetDateTime::now_utc();
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
            dt { "open refusals" } dd { (row.open_refusals) }
            dt { "last error" } dd.error #last-error { (row.last_error.as_deref().unwrap_or("-")) }
            dt { "next attempt" } dd #next-attempt { (when(row.next_attempt_at, now)) }
            dt { "lease" } dd { (row.lease_owner.as_deref().unwrap_or("free")) " (epoch " (row.lease_epoch) ")" }
            dt { "parent" } dd {
                @if let Some(parent) = &row.parent {
                    a href=(instance_href(parent.name.as_str(), parent.id.as_str())) { (parent.to_string()) }
                } @else { "-" }
            }
            dt { "created" } dd { (when(Some(row.created_at), now)) }
            dt { "updated" } dd { (when(Some(row.updated_at), now)) }
            dt { "completed" } dd { (when(row.completed_at, now)) }
            dt { "wake after" } dd { (when(row.wake_after, now)) }
        }
        h2 { "Input" } pre #input { (pretty(&row.input)) }
        h2 { "Output" } pre #output { (row.output.as_ref().map_or_else(|| "-".to_owned(), pretty)) }
        h2 { "Timeline" }
        @let chart = timeline::chart(row, &view.journal, &view.waits, &view.children, now);
        (timeline::svg(&chart))
        @if chart.truncated {
            p #timeline-truncated { "The first " (timeline::LANES_MAX) " lanes are drawn; the table lists every row." }
        }
        p.legend {
            span.key.ran { "ran" } span.key.parked { "parked (sleep, await, signal, awakeable, child, remote)" }
            span.key.attempt { "failed attempt" } span.key.failed { "failed" } span.key.open { "waiting now" }
        }
        table #timeline {
            thead { tr { th { "#" } th { "gen" } th { "offset ms" } th { "gap ms" } th { "spent" } th { "event" } th { "step" } th { "payload" } } }
            tbody {
                @for t in view.timeline() {
                    tr class=[t.is_step.then_some("step")] {
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
                            td { (when(Some(timer.fire_at), now)) } td { (when(timer.fired_at, now)) }
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
                            td { (when(Some(awakeable.created_at), now)) } td { (when(awakeable.settled_at, now)) }
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
                            td { (when(Some(wait.since), now)) } td { (when(wait.timeout_at, now)) }
                        }
                    }
                }
            }
        }
        @if view.waits.truncated {
            p #waits-truncated { "Only the newest " (keiro::operate::WAITS_LIMIT_DEFAULT) " of each kind are shown." }
        }
        h2 { "Attributes" }
        @if view.attributes.is_empty() {
            p #attributes.none { "None." }
        } @else {
            table #attributes {
                thead { tr { th { "name" } th { "kind" } th { "value" } } }
                tbody {
                    @for (name, value) in view.attributes.iter() {
                        tr {
                            td { a.attr-filter href=(same_attribute_href(name, value)) { code { (name) } } }
                            td { (value.kind()) }
                            td { code { (value.to_string()) } }
                        }
                    }
                }
            }
        }
        h2 { "Events" }
        // Refreshed by the script while the run is live: each event's latest value.
        div #events-box data-live=(format!("/api/v1{href}")) data-terminal=(row.status.is_terminal()) {
            @if view.messages.events.is_empty() {
                p #events.none { "None." }
            } @else {
                table #events {
                    thead { tr { th { "key" } th { "version" } th { "set" } th { "value" } } }
                    tbody {
                        @for event in &view.messages.events {
                            tr {
                                td { a.event-page href=(event_href(&href, &event.key)) { code { (event.key) } } } td { (event.version) }
                                td { (when(Some(event.updated_at), now)) }
                                td { code { (event.value.to_string()) } }
                            }
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
                            td { a.stream-page href=(stream_href(&href, &stream.key)) { code { (stream.key) } } } td { (stream.items) } td { (stream.bytes) }
                            td { (if stream.closed { "closed" } else { "open" }) }
                            td { (when(Some(stream.updated_at), now)) }
                        }
                    }
                }
            }
            @for stream in view.messages.streams.iter().take(STREAMS_FOLLOWED) {
                (follow(&href, &stream.key, stream.closed))
            }
        }
        h2 { "Updates" }
        @if view.updates.is_empty() {
            p #updates.none { "None." }
        } @else {
            table #updates {
                thead { tr { th { "id" } th { "name" } th { "state" } th { "request" } th { "answer" } th { "sent" } th { "settled" } } }
                tbody {
                    @for update in &view.updates {
                        @let (state, answer) = update_state(&update.state);
                        tr {
                            td { code { (update.id) } } td { (update.name) }
                            td class={ "update " (state) } { (state) }
                            td { code { (update.request.to_string()) } }
                            td { @if !answer.is_null() { code { (answer.to_string()) } } }
                            td { (when(Some(update.requested_at), now)) }
                            td { (when(update.settled_at, now)) }
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
                            td { (when(Some(child.created_at), now)) }
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

fn stream_href(instance: &str, key: &str) -> String {
    format!("{instance}/streams/{}", urlencode(key))
}

/// A stream the script follows live: its items appended as they come, until it ends.
fn follow(instance: &str, key: &str, closed: bool) -> maud::Markup {
    html! {
        div.stream data-follow=(format!("/api/v1{}", stream_href(instance, key))) {
            h3 { "Stream " code { (key) } " " span.stream-state { (if closed { "closed" } else { "open" }) } }
            ol.stream-items {}
        }
    }
}

/// `GET /instances/{name}/{id}/streams/{key}`: one stream of an instance, followed live from
/// its first item (the items come from the API, as on the instance page); 404 for an unknown
/// instance.
pub(crate) async fn stream(
    State(state): State<AppState>,
    Path((name, id, key)): Path<(String, String, String)>,
) -> Response {
    let page = state.keiro.stream_page((&*name, &*id), &key, 0).await;
    let closed = match page {
        Ok(Some(page)) => page.closed,
        Ok(None) => return error_page(ApiError::not_found(format!("no instance {name}/{id}"))),
        Err(error) => return error_page(error.into()),
    };
    let href = instance_href(&name, &id);
    let body = html! {
        h1 { "Stream " code #stream-key { (key) } }
        p { "Of " a href=(href) { (name) "/" (id) } ", each item as JSON, followed live until the stream ends." }
        (follow(&href, &key, closed))
    };
    Html(layout(&format!("Stream {key}"), body).into_string()).into_response()
}

/// The list of the runs with the same value of attribute `name`.
fn same_attribute_href(name: &str, value: &keiro::operate::AttrValue) -> String {
    let filter = keiro::operate::AttrFilter::eq(name, value.clone());
    format!("/instances?attr={}", super::urlencode(&filter.to_string()))
}
