//! Who may reach the dashboard at all, checked on every request before any route runs.
//!
//! - `Host` must name the dashboard: a loopback name (`127.0.0.1`, `localhost`, `[::1]`), the
//!   address it is bound to, or a name given with `--public-host`; anything else is 421
//!   Misdirected Request, reads included. A page on another site whose DNS name was rebound to
//!   127.0.0.1 reaches the port, but its requests still say its own name, so it reads nothing.
//! - An action (`POST`) whose `Origin` is not the dashboard's own (the `Host` it was sent to,
//!   or a `--public-host`) is 403, as is a browser's `Sec-Fetch-Site: cross-site` without an
//!   `Origin`, and `Origin: null` unless the browser says the request is `same-origin`; a
//!   client that sends neither header (curl, scripts) is judged by its token alone.
//! - Bound beyond loopback, every request needs the token: `Authorization: Bearer <token>`, or
//!   Basic credentials whose password is the token (a browser asks once, after a 401 with
//!   `WWW-Authenticate`). `keiro ui` refuses to start there without a token.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::AppState;

/// The names the dashboard answers to, and whether reads need the token.
#[derive(Debug, Clone)]
pub(crate) struct Access {
    /// Every accepted host name, lowercase, an IPv6 address in brackets.
    hosts: Vec<String>,
    /// The `--public-host` names: an `Origin` naming one is the dashboard's own, whatever
    /// `Host` a proxy in front passed on.
    public: Vec<String>,
    /// Bound beyond loopback: every request needs the token.
    reads_need_token: bool,
}

/// The loopback names a local browser or client uses.
const LOOPBACK_NAMES: [&str; 3] = ["127.0.0.1", "localhost", "[::1]"];

impl Access {
    /// For a dashboard bound to `listen`, also answering to `public` (names, with or without a
    /// port).
    ///
    /// # Errors
    ///
    /// A message naming a `--public-host` that is not a host name.
    pub(crate) fn new(listen: SocketAddr, public: &[String]) -> Result<Self, String> {
        let mut hosts: Vec<String> = LOOPBACK_NAMES.iter().map(|&n| n.to_owned()).collect();
        if !listen.ip().is_unspecified() {
            hosts.push(ip_name(listen.ip()));
        }
        let mut names = Vec::with_capacity(public.len());
        for given in public {
            let name = host_name(given)
                .filter(|n| !n.is_empty() && !n.contains(['/', '@', ' ']))
                .ok_or_else(|| {
                    format!("--public-host {given:?} is not a host name (like dash.example)")
                })?;
            names.push(name.clone());
            hosts.push(name);
        }
        Ok(Self {
            hosts,
            public: names,
            reads_need_token: !listen.ip().is_loopback(),
        })
    }

    /// Whether every request needs the token.
    pub(crate) fn reads_need_token(&self) -> bool {
        self.reads_need_token
    }

    fn host_allowed(&self, host: &str) -> bool {
        host_name(host).is_some_and(|name| self.hosts.contains(&name))
    }

    /// Whether `origin` (`scheme://host[:port]`) is the dashboard's own for a request sent to
    /// `host`.
    fn origin_allowed(&self, origin: &str, host: &str) -> bool {
        let Some((_, authority)) = origin.split_once("://") else {
            return false; // `null`, or not an origin at all
        };
        if authority.contains('/') {
            return false;
        }
        authority.eq_ignore_ascii_case(host)
            || host_name(authority).is_some_and(|name| self.public.contains(&name))
    }
}

/// An address as a `Host` names it.
fn ip_name(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

/// The host name of a `Host` value (`name`, `name:port`, `[v6]:port`), lowercase and without
/// a trailing dot; `None` when it is not one.
fn host_name(host: &str) -> Option<String> {
    let host = host.trim();
    let name = if host.starts_with('[') {
        let end = host.find(']')?;
        let rest = &host[end + 1..];
        if !rest.is_empty() && !rest.starts_with(':') {
            return None;
        }
        &host[..=end]
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
            Some(_) => return None,
            None => host,
        }
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    (!name.is_empty()).then_some(name)
}

/// The check every request passes first (see the module's documentation).
pub(crate) async fn guard(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let api = request.uri().path().starts_with("/api/");
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| request.uri().authority().map(ToString::to_string));
    let Some(host) = host.filter(|h| state.access.host_allowed(h)) else {
        return refused(
            api,
            ApiError::new(
                StatusCode::MISDIRECTED_REQUEST,
                "host",
                "this dashboard does not answer to that host name; start it with \
                 --public-host to add one",
            ),
        );
    };
    if request.method() != Method::GET && request.method() != Method::HEAD {
        if let Err(error) = check_origin(&state, headers, &host) {
            return refused(api, error);
        }
    }
    if state.access.reads_need_token() {
        if let Err(error) = state.auth.check_reader(headers) {
            let mut response = refused(api, error);
            if response.status() == StatusCode::UNAUTHORIZED {
                response.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Basic realm=\"keiro\", charset=\"UTF-8\""),
                );
            }
            return response;
        }
    }
    next.run(request).await
}

fn check_origin(state: &AppState, headers: &HeaderMap, host: &str) -> Result<(), ApiError> {
    let forbidden = || {
        ApiError::forbidden(
            "origin",
            "an action must come from the dashboard's own pages (another origin sent it)",
        )
    };
    // Set by the browser itself, never by a page's script.
    let fetch_site = headers.get("sec-fetch-site").map(HeaderValue::as_bytes);
    match headers.get(header::ORIGIN) {
        Some(origin) => match origin.to_str() {
            Ok(origin) if state.access.origin_allowed(origin, host) => Ok(()),
            // A browser hiding the origin of the page's own form post.
            Ok("null") if fetch_site == Some(b"same-origin") => Ok(()),
            _ => Err(forbidden()),
        },
        None => {
            if fetch_site.is_some_and(|site| site.eq_ignore_ascii_case(b"cross-site")) {
                Err(forbidden())
            } else {
                Ok(())
            }
        }
    }
}

/// A refusal as the route would answer it: JSON on the API, a page elsewhere.
fn refused(api: bool, error: ApiError) -> Response {
    if api {
        error.into_response()
    } else {
        super::pages::error_page(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(listen: &str, public: &[&str]) -> Access {
        let public: Vec<String> = public.iter().map(|&p| p.to_owned()).collect();
        Access::new(listen.parse().expect("an address"), &public).expect("valid")
    }

    #[test]
    fn hosts_are_the_loopback_names_the_bound_address_and_the_public_ones() {
        let local = access("127.0.0.1:8080", &["Dash.Example:443"]);
        for host in [
            "127.0.0.1:8080",
            "localhost",
            "LOCALHOST.:8080",
            "[::1]:8080",
            "dash.example",
            "dash.example:8443",
        ] {
            assert!(local.host_allowed(host), "{host}");
        }
        for host in [
            "attacker.example",
            "attacker.example:8080",
            "127.0.0.1.attacker.example",
            "localhost:80x",
            "[::1]x",
            "",
            "10.0.0.5:8080",
        ] {
            assert!(!local.host_allowed(host), "{host}");
        }
        assert!(!local.reads_need_token());
        let bound = access("10.0.0.5:8080", &[]);
        assert!(bound.host_allowed("10.0.0.5:8080") && bound.reads_need_token());
        let v6 = access("[fd00::5]:8080", &[]);
        assert!(v6.host_allowed("[fd00::5]:8080"));
        let any = access("0.0.0.0:8080", &[]);
        assert!(!any.host_allowed("0.0.0.0:8080") && any.reads_need_token());
        assert!(Access::new("127.0.0.1:1".parse().expect("addr"), &["a/b".into()]).is_err());
    }

    #[test]
    fn an_origin_is_the_host_it_was_sent_to_or_a_public_name() {
        let a = access("127.0.0.1:8080", &["dash.example"]);
        assert!(a.origin_allowed("http://127.0.0.1:8080", "127.0.0.1:8080"));
        assert!(a.origin_allowed("https://dash.example", "127.0.0.1:8080"));
        assert!(!a.origin_allowed("http://localhost:8080", "127.0.0.1:8080"));
        assert!(!a.origin_allowed("http://attacker.example", "127.0.0.1:8080"));
        assert!(!a.origin_allowed("null", "127.0.0.1:8080"));
        assert!(!a.origin_allowed("http://127.0.0.1:8080/x", "127.0.0.1:8080"));
    }
}
