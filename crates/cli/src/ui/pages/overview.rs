//! `GET /`: the overview.

use axum::extract::State;
use axum::response::{Html, IntoResponse, Response};
use maud::html;

use super::{error_page, layout, urlencode, STATUSES};
use crate::ui::AppState;

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
            div #charts {
                figure {
                    figcaption { "Instances by status" }
                    svg #status-chart xmlns="http://www.w3.org/2000/svg" role="img" viewBox="0 0 440 140" width="440" height="140" {
                        title { "Instances by status" }
                    }
                }
                figure {
                    figcaption { "Ended per minute, the last hour " span.legend { span.key.completed { "completed" } span.key.failed { "failed" } span.key.cancelled { "cancelled" } } }
                    svg #throughput-chart xmlns="http://www.w3.org/2000/svg" role="img" viewBox="0 0 640 140" width="640" height="140"
                        data-live="/api/v1/throughput?bucket=60&buckets=60" {
                        title { "Instances ended per minute over the last hour" }
                    }
                }
            }
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
