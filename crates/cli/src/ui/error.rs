//! The dashboard's error: an HTTP status with a machine-readable kind and a message, answered
//! as `{"error": kind, "message": ...}` by the API and as an error page by the HTML routes.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::common::error_chain;

/// A refused or failed request.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    /// The HTTP status.
    pub(crate) status: StatusCode,
    /// What kind of refusal: `filter`, `unauthorized`, `token`, `not_found`, ...
    pub(crate) kind: &'static str,
    /// For people.
    pub(crate) message: String,
    /// The schema, when keiro's schema is missing from the database or not migrated for this
    /// build: the page says how to migrate it.
    pub(crate) unmigrated_schema: Option<String>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
            unmigrated_schema: None,
        }
    }

    pub(crate) fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub(crate) fn forbidden(kind: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, kind, message)
    }

    pub(crate) fn bad_request(kind: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, kind, message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }
}

impl From<keiro::Error> for ApiError {
    fn from(error: keiro::Error) -> Self {
        match &error {
            keiro::Error::Filter(filter) => {
                let kind = match filter {
                    keiro::operate::FilterError::MalformedCursor { .. } => "cursor",
                    _ => "filter",
                };
                Self::bad_request(kind, filter.to_string())
            }
            keiro::Error::InvalidId(_) | keiro::Error::Payload(_) => {
                Self::bad_request("invalid", error_chain(&error))
            }
            keiro::Error::Admin(keiro::operate::AdminError::NotFound { key }) => {
                Self::not_found(format!("no instance {key}"))
            }
            keiro::Error::Admin(
                keiro::operate::AdminError::Payload(_) | keiro::operate::AdminError::InvalidId(_),
            ) => Self::bad_request("invalid", error_chain(&error)),
            keiro::Error::Store(keiro::store::Error::QueueRefused { queue, refusal }) => {
                match refusal {
                    keiro::queue::QueueRefusal::Unknown => {
                        Self::not_found(format!("no queue {queue}"))
                    }
                    _ => Self::new(StatusCode::CONFLICT, "refused", error_chain(&error)),
                }
            }
            keiro::Error::Queue(_) => Self::bad_request("invalid", error_chain(&error)),
            keiro::Error::Store(keiro::store::Error::SchemaNotMigrated {
                schema, problem, ..
            }) => Self {
                unmigrated_schema: Some(schema.clone()),
                ..Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "schema_not_migrated",
                    format!(
                        "keiro's schema {schema} {problem} in this database: run `keiro \
                         migrate --schema {schema}` with the same --database-url, or start \
                         `keiro ui` with the --schema your workers use"
                    ),
                )
            },
            _ => {
                tracing::warn!(error = %error_chain(&error), "a dashboard request failed");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "store",
                    error_chain(&error),
                )
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": self.kind, "message": self.message});
        (self.status, Json(body)).into_response()
    }
}
