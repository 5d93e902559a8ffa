//! `GET /instances`: the instance list and its filter form.

use axum::extract::{RawQuery, State};
use axum::response::{Html, IntoResponse, Response};
use maud::html;

use super::{error_page, instance_href, layout, queue_href, queue_list_href, urlencode, STATUSES};
use crate::list::delayed_until;
use crate::ui::api::{list_request, parse_query};
use crate::ui::error::ApiError;
use crate::ui::when::{took, when};
use crate::ui::AppState;

/// The list's filters the form has no field for, carried over as hidden fields when the URL
/// sets them, so every filter stays in the URL.
const KEPT: [&str; 5] = [
    "created_until",
    "updated_since",
    "updated_until",
    "finished_since",
    "finished_until",
];

/// The page's own parameter, no filter of the list: the attributes shown as columns, by name
/// separated by commas (`columns=customer,amount`).
const COLUMNS: &str = "columns";

/// `GET /instances`: one page of the list, with the filter form. Rows show their search
/// attributes: the ones named in `columns` each in a column of its own, or else all of them in
/// one column.
pub(crate) async fn list(State(state): State<AppState>, RawQuery(query): RawQuery) -> Response {
    let pairs = parse_query(query.as_deref().unwrap_or(""));
    let value = |key: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == key)
            .map_or("", |(_, v)| v.as_str())
            .to_owned()
    };
    let filters: Vec<String> = pairs
        .iter()
        .filter(|(k, _)| k != COLUMNS)
        .map(|(k, v)| format!("{}={}", urlencode(k), urlencode(v)))
        .collect();
    let columns: Vec<String> = value(COLUMNS)
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect();
    let attr_filters: Vec<String> = pairs
        .iter()
        .filter(|(k, v)| k == "attr" && !v.is_empty())
        .map(|(_, v)| v.clone())
        .collect();
    let page = match list_request(Some(&filters.join("&"))) {
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
    let all_attributes =
        columns.is_empty() && page.instances.iter().any(|row| !row.attributes.is_empty());
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
            // One field per attribute filter the URL has, and one more for a new one.
            @for attr in &attr_filters {
                label { "Attribute " input name="attr" value=(attr); }
            }
            label { "Attribute " input name="attr" placeholder="customer=acme, amount>=1000" value=""; }
            label { "Columns " input name=(COLUMNS) placeholder="customer,amount" value=(value(COLUMNS)); }
            label { "Failed remote tasks " input type="checkbox" name="failed_remote" value="true" checked[value("failed_remote") == "true"]; }
            @let order = value("order");
            label { "Order "
                select name="order" {
                    option value="newest_first" selected[order != "oldest_first"] { "newest first" }
                    option value="oldest_first" selected[order == "oldest_first"] { "oldest first" }
                }
            }
            label { "Per page " input name="limit" size="4" placeholder="50" value=(value("limit")); }
            // The list's other filters, when the URL sets them: kept through a new filtering.
            @for field in KEPT {
                @let kept = value(field);
                @if !kept.is_empty() { input type="hidden" name=(field) value=(kept); }
            }
            button #apply type="submit" { "Filter" }
        }
        table #instances {
            thead { tr { th { "workflow" } th { "id" } th { "status" } th { "gen" } th { "attempts" } th { "created" } th { "updated" } th { "took" } th { "queue" }
                @for column in &columns { th.attr { (column) } }
                @if all_attributes { th { "attributes" } }
                th { "last error" } } }
            tbody {
                @for row in &page.instances {
                    tr {
                        td { (row.key.name.as_str()) }
                        td { a.instance href=(instance_href(row.key.name.as_str(), row.key.id.as_str())) { (row.key.id.as_str()) } }
                        td { span class={ "status " (row.status.as_str()) } { (row.status.as_str()) } }
                        td { (row.generation) }
                        td { (row.attempts) }
                        td { (when(Some(row.created_at), now)) }
                        td { (when(Some(row.updated_at), now)) }
                        td.took {
                            @match row.completed_at {
                                Some(done) => (took(row.created_at, done)),
                                None => span.live title="still live: since it was started" { (took(row.created_at, now)) " so far" },
                            }
                        }
                        td.queue {
                            @if let Some(queue) = &row.queue {
                                a href=(queue_href(queue)) { (queue) }
                                @if let Some(key) = &row.queue_key {
                                    " · " a.key href=(queue_list_href(queue, Some(key))) { (key) }
                                }
                                @if let Some(at) = delayed_until(row, now) {
                                    br; span.delayed { "delayed until " (when(Some(at), now)) }
                                }
                            }
                        }
                        @for column in &columns {
                            td.attr { (row.attributes.get(column).map(ToString::to_string).unwrap_or_default()) }
                        }
                        @if all_attributes {
                            td.attrs {
                                @for (name, value) in row.attributes.iter() {
                                    span.attr { (name) "=" (value.to_string()) } " "
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
