//! `GET /instances/{name}/{id}/events/{key}`: one event of an instance, its current value and
//! every write of it, oldest first. Each write is a journal step of the run
//! (`event:<key>#<n>`), so the history is read from the journal, as `keiro show` reads it.

use axum::extract::{Path, State};
use axum::response::{Html, IntoResponse, Response};
use keiro::store::{Event, StepKind};
use maud::html;

use super::{error_page, instance_href, layout, urlencode};
use crate::ui::error::ApiError;
use crate::ui::when::when;
use crate::ui::AppState;

/// The link to event `key` of the instance at `instance` (an instance page's path).
pub(super) fn event_href(instance: &str, key: &str) -> String {
    format!("{instance}/events/{}", urlencode(key))
}

/// The page; 404 for an unknown instance, "never set" for an event the run did not write.
pub(crate) async fn event(
    State(state): State<AppState>,
    Path((name, id, key)): Path<(String, String, String)>,
) -> Response {
    let instance = match state.keiro.instance((&*name, &*id)).await {
        Ok(Some(instance)) => instance,
        Ok(None) => return error_page(ApiError::not_found(format!("no instance {name}/{id}"))),
        Err(error) => return error_page(error.into()),
    };
    let (messages, journal) = match (
        state.keiro.messages((&*name, &*id)).await,
        state.keiro.journal((&*name, &*id)).await,
    ) {
        (Ok(messages), Ok(journal)) => (messages, journal),
        (Err(error), _) | (_, Err(error)) => return error_page(error.into()),
    };
    let current = messages.events.iter().find(|event| event.key == key);
    let prefix = format!("event:{key}#");
    let writes: Vec<_> = journal
        .iter()
        .filter_map(|entry| match &entry.event {
            Event::StepRecorded {
                step,
                kind: StepKind::Event,
                result,
            } if step.starts_with(&prefix) => Some((entry, step, result)),
            _ => None,
        })
        .collect();
    let href = instance_href(&name, &id);
    let now = time::OffsetDateTime::now_utc();
    let body = html! {
        h1 { "Event " code #event-key { (key) } }
        p {
            "Of " a href=(href) { (name) "/" (id) } " (" (instance.status.as_str()) "). "
            "Its latest value is what `Keiro::get_event` answers; each write below is a step of the run's journal."
        }
        @match current {
            Some(event) => {
                dl.fields {
                    dt { "value" } dd { code #event-value { (event.value.to_string()) } }
                    dt { "version" } dd #event-version { (event.version) }
                    dt { "set" } dd { (when(Some(event.updated_at), now)) }
                }
            }
            None => { p #event-value.none { "Never set." } }
        }
        h2 { "Writes" }
        @if writes.is_empty() {
            p #event-writes.none { "None in the journal." }
        } @else {
            table #event-writes {
                thead { tr { th { "generation" } th { "step" } th { "written" } th { "value" } } }
                tbody {
                    @for (entry, step, value) in &writes {
                        tr {
                            td { (entry.generation) } td { code { (step) } }
                            td { (when(Some(entry.recorded_at), now)) }
                            td { code { (value.to_string()) } }
                        }
                    }
                }
            }
        }
    };
    Html(layout(&format!("Event {key}"), body).into_string()).into_response()
}
