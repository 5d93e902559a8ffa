//! The JSON API under `/api/v1`: what the pages show, for scripts.
//!
//! - `GET /counts`: `Keiro::counts`.
//! - `GET /instances?name=&status=&created_since=&...&cursor=`: `Keiro::list`, the query
//!   pairs read by `ListRequest::from_pairs` (an unknown filter or a malformed cursor is 400).
//! - `GET /instances/{name}/{id}`: the row, the timeline, timers, awakeables, signal waits
//!   (`Keiro::waits`; `waits_truncated` when a kind was cut), events and streams
//!   (`Keiro::messages`), remote tasks and children.
//! - `POST /instances/{name}/{id}/{action}` with `Authorization: Bearer <token>` (and, for
//!   `retry-with-input`, a body `{"input": ...}`).
//! - `GET /instances/{name}/{id}/streams/{key}?from=N`: one page of a stream from offset `N`
//!   (`Keiro::stream_page`): its items with their offsets, `next` (the offset to ask for next),
//!   `closed`, the instance's `status` and `ends` (nothing more will come); 404 for an unknown
//!   instance, 400 (`invalid`) for a bad key or offset. The instance page follows a stream live
//!   by polling it.
//! - `GET /throughput?bucket=S&buckets=N`: `Keiro::throughput`, the instances that went
//!   terminal per bucket of `S` seconds (60 unless given), `N` buckets (60 unless given) up to
//!   now; 400 (`filter`) for an unknown parameter or a value out of bounds.
//! - `GET /queues`: every declared queue (`Keiro::queues`) with its figures, its limits, which
//!   of them it is at now and its admissions per second (`QueueView::to_json`).
//! - `GET /queues/{name}`: one queue, the same way; 404 (`not_found`) for an undeclared one.
//! - `POST /queues/{name}/{action}` (`pause`, `resume`) with `Authorization: Bearer <token>`,
//!   as the instance actions.

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::Json;
use keiro::{operate::Counts, operate::ListRequest, operate::Page, operate::Throughput};
use serde_json::{json, Value};

use super::actions::{self, Done};
use super::error::ApiError;
use super::view::{InstanceView, QueueView};
use super::AppState;

/// `GET /api/v1/counts`.
pub(crate) async fn counts(State(state): State<AppState>) -> Result<Json<Counts>, ApiError> {
    Ok(Json(state.keiro.counts().await?))
}

/// Reads the list's filters from a query string, keeping empty values out (an HTML form
/// sends every field, filled or not).
pub(crate) fn list_request(query: Option<&str>) -> Result<ListRequest, ApiError> {
    let pairs = parse_query(query.unwrap_or(""));
    let pairs = pairs
        .iter()
        .filter(|(_, value)| !value.is_empty())
        .map(|(key, value)| (key.as_str(), value.as_str()));
    Ok(ListRequest::from_pairs(pairs).map_err(keiro::Error::from)?)
}

/// Splits and percent-decodes `a=b&c=d` (`+` is a space, as forms encode it).
pub(crate) fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(key), decode(value))
        })
        .collect()
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(byte) => {
                        out.push(byte);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            byte => out.push(byte),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `GET /api/v1/instances`.
pub(crate) async fn list(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Json<Page>, ApiError> {
    let request = list_request(query.as_deref())?;
    Ok(Json(state.keiro.list(&request).await?))
}

/// `GET /api/v1/instances/{name}/{id}`.
pub(crate) async fn instance(
    State(state): State<AppState>,
    Path((name, id)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(
        InstanceView::read(&state.keiro, &name, &id)
            .await?
            .to_json(),
    ))
}

/// `POST /api/v1/instances/{name}/{id}/{action}`.
pub(crate) async fn action(
    State(state): State<AppState>,
    Path((name, id, action)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Done>, ApiError> {
    // The token first: nothing about the body is told to a caller who may not act.
    state.auth.check_bearer(&headers)?;
    let input = match body {
        Ok(Json(body)) => body.get("input").cloned(),
        Err(JsonRejection::MissingJsonContentType(_)) if action != "retry-with-input" => None,
        Err(rejection) => {
            return Err(ApiError::new(
                rejection.status(),
                "body",
                rejection.body_text(),
            ))
        }
    };
    Ok(Json(
        actions::run(&state.keiro, &action, &name, &id, input).await?,
    ))
}

/// `GET /api/v1/instances/{name}/{id}/streams/{key}?from=N`.
pub(crate) async fn stream(
    State(state): State<AppState>,
    Path((name, id, key)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let mut from = 0_u64;
    for (field, value) in parse_query(query.as_deref().unwrap_or("")) {
        match field.as_str() {
            "from" => {
                from = value.parse().map_err(|_| {
                    ApiError::bad_request("invalid", format!("from {value:?} is no offset"))
                })?;
            }
            _ => {
                return Err(ApiError::bad_request(
                    "invalid",
                    format!("unknown parameter {field:?}"),
                ))
            }
        }
    }
    let Some(page) = state.keiro.stream_page((&*name, &*id), &key, from).await? else {
        return Err(ApiError::not_found(format!("no instance {name}/{id}")));
    };
    let next = page.items.last().map_or(from, |item| item.offset + 1);
    Ok(Json(json!({
        "key": key,
        "from": from,
        "items": page.items.iter().map(|item| json!({"offset": item.offset, "value": item.value})).collect::<Vec<_>>(),
        "next": next,
        "closed": page.closed,
        "status": page.status.as_str(),
        "ends": page.ends(STREAM_PAGE_ITEMS),
    })))
}

/// The most items [`Keiro::stream_page`](keiro::Keiro::stream_page) returns at once: a page
/// with fewer ends the stream when it is closed.
const STREAM_PAGE_ITEMS: usize = 256;

/// `GET /api/v1/throughput?bucket=S&buckets=N`.
pub(crate) async fn throughput(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Json<Throughput>, ApiError> {
    let request = throughput_request(query.as_deref())?;
    Ok(Json(state.keiro.throughput(&request).await?))
}

/// Reads `bucket` (seconds) and `buckets` from a query string, the last hour by minute unless
/// told; anything else is a typed 400.
pub(crate) fn throughput_request(
    query: Option<&str>,
) -> Result<keiro::operate::ThroughputRequest, ApiError> {
    let mut request = keiro::operate::ThroughputRequest::last_hour();
    for (field, value) in parse_query(query.unwrap_or("")) {
        let number = || {
            value.parse::<u32>().map_err(|_| {
                ApiError::bad_request("filter", format!("{field} {value:?} is no count"))
            })
        };
        match field.as_str() {
            "bucket" => request.bucket = std::time::Duration::from_secs(number()?.into()),
            "buckets" => request.buckets = number()?,
            _ => {
                return Err(ApiError::bad_request(
                    "filter",
                    format!("unknown parameter {field:?}"),
                ))
            }
        }
    }
    Ok(request)
}

/// `GET /api/v1/queues`.
pub(crate) async fn queues(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let now = time::OffsetDateTime::now_utc();
    let queues = state.keiro.queues().await?;
    Ok(Json(Value::Array(
        queues
            .into_iter()
            .map(|info| QueueView { info }.to_json(now))
            .collect(),
    )))
}

/// Reads queue `name`; 404 when it was never declared.
pub(crate) async fn read_queue(state: &AppState, name: &str) -> Result<QueueView, ApiError> {
    match state.keiro.queue(name).await? {
        Some(info) => Ok(QueueView { info }),
        None => Err(ApiError::not_found(format!("no queue {name}"))),
    }
}

/// `GET /api/v1/queues/{name}`.
pub(crate) async fn queue(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let view = read_queue(&state, &name).await?;
    Ok(Json(view.to_json(time::OffsetDateTime::now_utc())))
}

/// `POST /api/v1/queues/{name}/{action}`: the bearer token first, as for an instance; the
/// body, if any, is not read.
pub(crate) async fn queue_action(
    State(state): State<AppState>,
    Path((name, action)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Json<Done>, ApiError> {
    state.auth.check_bearer(&headers)?;
    Ok(Json(
        actions::run_queue(&state.keiro, &action, &name).await?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_decode_as_forms_encode_them() {
        assert_eq!(
            parse_query("status=failed&name=a+b&id_prefix=x%2Fy&empty=&bad=%zz&end=%4"),
            vec![
                ("status".into(), "failed".into()),
                ("name".into(), "a b".into()),
                ("id_prefix".into(), "x/y".into()),
                ("empty".into(), String::new()),
                ("bad".into(), "%zz".into()),
                ("end".into(), "%4".into()),
            ]
        );
    }
}
