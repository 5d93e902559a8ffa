//! `keiro ui`: the operators' dashboard. A JSON API under `/api/v1` and HTML pages over the
//! same facade calls the CLI makes (`Keiro::counts`, `list`, `instance`, `journal`,
//! `remote_tasks`, `messages`, `stream_page`, `throughput`, `queues` and the operator actions, queue pause and resume among them),
//! served by axum on 127.0.0.1 by default.
//!
//! Security: every request must name the dashboard in its `Host` (a loopback name, the bound
//! address or a `--public-host`), so a page whose DNS name was rebound to 127.0.0.1 reads
//! nothing, and an action must come from the dashboard's own origin (see [`access`]). Without
//! a token the dashboard is read-only (actions answer 403); with one (`--token` or
//! `KEIRO_UI_TOKEN`) an action needs it, as `Authorization: Bearer <token>` on the API or typed
//! into the page's action form. Bound beyond loopback, every read needs the token too, and
//! `keiro ui` does not start without one. Forms also carry a per-process CSRF value (see
//! [`auth`]). Every page is rendered by maud, which escapes every value it interpolates, and
//! served under a Content-Security-Policy that allows no inline script; the page's script and
//! style are embedded in the binary. A schema keiro was never migrated to shows a page saying
//! so, with the `keiro migrate` command that fixes it.

mod access;
mod actions;
mod api;
mod assets;
mod auth;
mod error;
mod pages;
mod timeline;
mod view;
mod when;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::{header, HeaderValue};
use axum::routing::{get, post};
use axum::Router;
use clap::Args;
use keiro::Keiro;

use crate::common::{failure, Global, Outcome, Result, ResultExt};

/// The largest request body accepted (an action form, a retry's corrected input): a larger one
/// is answered 413 and never kept.
pub(crate) const BODY_LEN_MAX: usize = 64 * 1024;

/// The largest declared body that is read and thrown away before the 413, so the client has
/// finished sending when the answer comes. Closing a connection with unread bytes in its
/// buffer resets it, and a client still writing then loses the 413 (a lingering close, as
/// web servers do). A larger declared body is refused without reading it.
const DISCARD_LEN_MAX: usize = 1024 * 1024;

/// Options of `keiro ui`.
#[derive(Debug, Clone, Args)]
pub(crate) struct UiArgs {
    /// The address to serve on; keep it on loopback unless a proxy with TLS is in front.
    /// Beyond loopback every request needs the token, so one must be given.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The operator token that actions require (and, beyond loopback, every read); without it
    /// the dashboard is read-only.
    #[arg(long, env = "KEIRO_UI_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Another host name the dashboard answers to (the name a proxy in front serves it
    /// under); repeat for several. Requests naming any other host are refused.
    #[arg(long = "public-host", value_name = "NAME")]
    public_hosts: Vec<String>,
}

/// What every handler shares.
#[derive(Clone)]
pub(crate) struct AppState {
    /// The facade on the operator schema.
    pub(crate) keiro: Keiro,
    /// The token and the CSRF value.
    pub(crate) auth: Arc<auth::Auth>,
    /// The host names it answers to, and whether reads need the token.
    pub(crate) access: Arc<access::Access>,
}

/// `keiro ui`: serves until interrupted (Ctrl-C or SIGTERM).
pub(crate) async fn run(global: &Global, args: &UiArgs) -> Result<Outcome> {
    let access = access::Access::new(args.listen, &args.public_hosts).map_err(failure)?;
    let auth = auth::Auth::new(args.token.clone());
    if access.reads_need_token() && auth.read_only() {
        return Err(failure(format!(
            "keiro ui would listen on {}, which is not a loopback address: every instance \
             would be readable from the network, so it needs an operator token (--token or \
             KEIRO_UI_TOKEN), which every request must then carry; or listen on 127.0.0.1 \
             behind a proxy",
            args.listen
        )));
    }
    let keiro = crate::common::keiro(global, 4).await?;
    let state = AppState {
        keiro,
        auth: Arc::new(auth),
        access: Arc::new(access),
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .context(format!("listening on {}", args.listen))?;
    let address = listener.local_addr().context("reading the bound address")?;
    // The one stdout line: scripts and tests read the address from it (port 0 picks one).
    println!("keiro ui listening on http://{address}");
    if state.auth.read_only() {
        eprintln!("no --token or KEIRO_UI_TOKEN: the dashboard is read-only");
    } else if state.access.reads_need_token() {
        eprintln!("not on loopback: every request needs the operator token");
    }
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown())
        .await
        .context("serving the dashboard")?;
    Ok(Outcome::Success)
}

async fn shutdown() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// The routes, with the body limit and the security headers on every response.
pub(crate) fn router(state: AppState) -> Router {
    let api = Router::new()
        .route("/counts", get(api::counts))
        .route("/instances", get(api::list))
        .route("/instances/{name}/{id}", get(api::instance))
        .route("/instances/{name}/{id}/{action}", post(api::action))
        .route("/instances/{name}/{id}/streams/{key}", get(api::stream))
        .route("/throughput", get(api::throughput))
        .route("/queues", get(api::queues))
        .route("/queues/{name}", get(api::queue))
        .route("/queues/{name}/{action}", post(api::queue_action));
    Router::new()
        .route("/", get(pages::overview))
        .route("/instances", get(pages::list))
        .route("/instances/{name}/{id}", get(pages::instance))
        .route("/instances/{name}/{id}/{action}", post(pages::action))
        .route("/instances/{name}/{id}/streams/{key}", get(pages::stream))
        .route("/instances/{name}/{id}/events/{key}", get(pages::event))
        .route("/queues", get(pages::queues))
        .route("/queues/{name}", get(pages::queue))
        .route("/queues/{name}/{action}", post(pages::queue_action))
        .route("/assets/app.js", get(assets::script))
        .route("/assets/app.css", get(assets::style))
        .nest("/api/v1", api)
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(BODY_LEN_MAX))
        .layer(axum::middleware::from_fn(refuse_oversized))
        // Outside the body limit: a request for another host is refused before its body is
        // read; the fallback makes an unknown path pass the guard too.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            access::guard,
        ))
        .layer(axum::middleware::map_response(security_headers))
        .with_state(state)
}

/// Any other path: 404, after the guard like every route.
async fn not_found(uri: axum::http::Uri) -> error::ApiError {
    error::ApiError::not_found(format!("no page {}", uri.path()))
}

/// Answers 413 to a body declared larger than [`BODY_LEN_MAX`], after discarding it when it is
/// at most [`DISCARD_LEN_MAX`]. Bodies without a declared length (chunked) are cut off by the
/// `DefaultBodyLimit` as they are read.
async fn refuse_oversized(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<usize>().ok());
    match declared {
        Some(len) if len > BODY_LEN_MAX => {
            if len <= DISCARD_LEN_MAX {
                // Read to the end and dropped; its error (over the cap, a client gone) changes
                // nothing about the answer.
                let _ = axum::body::to_bytes(request.into_body(), DISCARD_LEN_MAX).await;
            }
            error::ApiError::new(
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("the body is {len} bytes, the limit is {BODY_LEN_MAX}"),
            )
            .into_response()
        }
        _ => next.run(request).await,
    }
}

/// No inline script or style may run (an escaping slip stays inert), no framing
/// (clickjacking of the action buttons), no MIME sniffing, no referrer leaking ids to another
/// site (`same-origin`: under `no-referrer` a browser sends `Origin: null` with the page's own
/// form posts, which the origin check could not tell from another site's).
async fn security_headers(mut response: axum::response::Response) -> axum::response::Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
             img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    response
}
