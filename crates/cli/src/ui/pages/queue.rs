//! `GET /queues` and `GET /queues/{name}`: the queues and one queue, with pause and resume.

use axum::extract::{Path, State};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::Form;
use maud::{html, Markup};

use super::{error_page, layout, queue_href, queue_list_href, urlencode, ActionForm, Notice};
use crate::ui::actions::{self, QUEUE_ACTIONS};
use crate::ui::api::read_queue;
use crate::ui::error::ApiError;
use crate::ui::view::{span, QueueView};
use crate::ui::when::when;
use crate::ui::AppState;

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
            (Some(at), Some(wait)) => { (when(Some(at), now)) " (waiting " (span(wait)) ")" }
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
