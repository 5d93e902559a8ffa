//! The page's script and style, embedded in the binary: nothing is fetched at run time.

use axum::http::header;
use axum::response::IntoResponse;

/// Live counts on the overview and a confirmation before every action.
const SCRIPT: &str = include_str!("assets/app.js");
/// The look.
const STYLE: &str = include_str!("assets/app.css");

/// `GET /assets/app.js`.
pub(crate) async fn script() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
}

/// `GET /assets/app.css`.
pub(crate) async fn style() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE)
}
