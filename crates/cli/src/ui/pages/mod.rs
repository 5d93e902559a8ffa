//! The HTML pages: the overview (counts and charts, refreshed live by the embedded script),
//! the instance list with the filters of `Keiro::list` (queue and queue key among them), the
//! instance page (timeline, what it waits on, events, streams followed live, remote tasks,
//! children) with its action forms, a stream's own page, the queues (limits, backlog, the
//! limits each is at) and a queue's page (its busiest keys, pause and resume).
//! Rendered with maud, which escapes every interpolated value. This file holds what every page
//! shares (the layout, the error page, links); each page is a file of its own.

mod event;
mod instance;
mod list;
mod overview;
mod queue;

pub(crate) use event::event;
pub(crate) use instance::{action, instance, stream};
pub(crate) use list::list;
pub(crate) use overview::overview;
pub(crate) use queue::{queue, queue_action, queues};

use axum::response::{Html, IntoResponse, Response};
use maud::{html, Markup, DOCTYPE};
use serde::Deserialize;

use super::error::ApiError;

pub(crate) const STATUSES: [&str; 5] = ["running", "suspended", "completed", "failed", "cancelled"];

pub(crate) fn layout(title: &str, body: Markup) -> Markup {
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

pub(crate) fn instance_href(name: &str, id: &str) -> String {
    format!("/instances/{}/{}", urlencode(name), urlencode(id))
}

pub(crate) fn queue_href(name: &str) -> String {
    format!("/queues/{}", urlencode(name))
}

/// The instance list filtered on `queue`, and on `key` when given (the runs with no key cannot
/// be told apart by the filter: `None` lists the whole queue).
pub(crate) fn queue_list_href(queue: &str, key: Option<&str>) -> String {
    let mut href = format!("/instances?queue={}", urlencode(queue));
    if let Some(key) = key {
        href.push_str("&queue_key=");
        href.push_str(&urlencode(key));
    }
    href
}

/// Percent-encodes everything but unreserved characters, for links built from stored names.
pub(crate) fn urlencode(text: &str) -> String {
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
    pub(crate) notice: Option<String>,
}

/// An action form's fields.
#[derive(Debug, Deserialize)]
pub(crate) struct ActionForm {
    pub(crate) token: Option<String>,
    pub(crate) csrf: Option<String>,
    pub(crate) input: Option<String>,
}
