//! Who may act: the operator token and the CSRF value.
//!
//! - No token configured: read-only; every action is refused with 403.
//! - API actions need `Authorization: Bearer <token>`: a header a cross-site page cannot send
//!   without a CORS preflight, which this server never grants, so the header is itself the
//!   CSRF protection there.
//! - Form actions (the HTML page) need the token typed into the form *and* the per-process
//!   CSRF value the page embeds in a hidden field: a cross-site form post cannot read it. The
//!   token is never written into a page (no inline secrets).

use axum::http::{header, HeaderMap};

use super::error::ApiError;

/// The dashboard's credentials.
pub(crate) struct Auth {
    token: Option<String>,
    csrf: String,
}

impl Auth {
    /// With `token` (an empty one counts as none), and a fresh random CSRF value.
    pub(crate) fn new(token: Option<String>) -> Self {
        Self {
            token: token.filter(|t| !t.is_empty()),
            csrf: uuid::Uuid::new_v4().simple().to_string(),
        }
    }

    /// No token was configured.
    pub(crate) fn read_only(&self) -> bool {
        self.token.is_none()
    }

    /// The CSRF value forms carry.
    pub(crate) fn csrf(&self) -> &str {
        &self.csrf
    }

    /// Checks a request's credentials where every request needs the token (a dashboard bound
    /// beyond loopback): `Authorization: Bearer <token>`, or Basic credentials whose password
    /// is the token (what a browser sends once asked).
    pub(crate) fn check_reader(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(expected) = &self.token else {
            return Ok(());
        };
        let authorization = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let given = authorization.and_then(|v| {
            if let Some(token) = v.strip_prefix("Bearer ") {
                return Some(token.to_owned());
            }
            let decoded = base64_decode(v.strip_prefix("Basic ")?.trim())?;
            let text = String::from_utf8(decoded).ok()?;
            Some(
                text.split_once(':')
                    .map_or(text.clone(), |(_, p)| p.to_owned()),
            )
        });
        match given {
            None => Err(ApiError::unauthorized(
                "this dashboard is served beyond loopback: every request needs the operator \
                 token (Authorization: Bearer <token>, or the token as the password)",
            )),
            Some(given) if same(&given, expected) => Ok(()),
            Some(_) => Err(ApiError::forbidden("token", "wrong operator token")),
        }
    }

    /// Checks an API request's bearer token.
    pub(crate) fn check_bearer(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        self.check_token(given)
    }

    /// Checks a form's token and CSRF value.
    pub(crate) fn check_form(
        &self,
        token: Option<&str>,
        csrf: Option<&str>,
    ) -> Result<(), ApiError> {
        self.check_token(token.filter(|t| !t.is_empty()))?;
        match csrf {
            Some(csrf) if same(csrf, &self.csrf) => Ok(()),
            _ => Err(ApiError::forbidden(
                "csrf",
                "the form's CSRF value is missing or stale: reload the page",
            )),
        }
    }

    fn check_token(&self, given: Option<&str>) -> Result<(), ApiError> {
        let Some(expected) = &self.token else {
            return Err(ApiError::forbidden(
                "read_only",
                "the dashboard is read-only: start it with --token or KEIRO_UI_TOKEN",
            ));
        };
        match given {
            None => Err(ApiError::unauthorized("an action needs the operator token")),
            Some(given) if same(given, expected) => Ok(()),
            Some(_) => Err(ApiError::forbidden("token", "wrong operator token")),
        }
    }
}

/// Standard base64 (RFC 4648, with or without padding), as Basic credentials carry them;
/// `None` for anything else.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut bits, mut len) = (0u32, 0u32);
    for c in text.bytes() {
        let value = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        bits = (bits << 6) | u32::from(value);
        len += 6;
        if len >= 8 {
            len -= 8;
            out.push(u8::try_from((bits >> len) & 0xff).ok()?);
        }
    }
    Some(out)
}

/// Compares without stopping at the first difference, so the time taken does not tell an
/// attacker how much of a guess was right.
fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut diff = u8::from(a.len() != b.len());
    for (i, x) in a.iter().enumerate() {
        diff |= x ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_compared_whole() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "ab"));
        assert!(!same("ab", "abc"));
        assert!(!same("", "a"));
    }

    #[test]
    fn basic_credentials_decode() {
        assert_eq!(
            base64_decode("b3BlcmF0b3I6czNjcmV0").as_deref(),
            Some(&b"operator:s3cret"[..])
        );
        assert_eq!(base64_decode("YQ==").as_deref(), Some(&b"a"[..]));
        assert_eq!(base64_decode("YWI").as_deref(), Some(&b"ab"[..]));
        assert_eq!(base64_decode("a*b"), None);
        let auth = Auth::new(Some("s3cret".into()));
        let mut headers = HeaderMap::new();
        assert_eq!(
            auth.check_reader(&headers).unwrap_err().status.as_u16(),
            401
        );
        headers.insert(
            header::AUTHORIZATION,
            "Basic b3BlcmF0b3I6czNjcmV0".parse().unwrap(),
        );
        assert!(auth.check_reader(&headers).is_ok());
        headers.insert(header::AUTHORIZATION, "Bearer s3cret".parse().unwrap());
        assert!(auth.check_reader(&headers).is_ok());
        headers.insert(header::AUTHORIZATION, "Bearer guess".parse().unwrap());
        assert_eq!(
            auth.check_reader(&headers).unwrap_err().status.as_u16(),
            403
        );
    }

    #[test]
    fn without_a_token_every_action_is_refused() {
        let auth = Auth::new(None);
        assert_eq!(
            auth.check_bearer(&HeaderMap::new())
                .unwrap_err()
                .status
                .as_u16(),
            403
        );
        let auth = Auth::new(Some("t".into()));
        assert_eq!(
            auth.check_bearer(&HeaderMap::new())
                .unwrap_err()
                .status
                .as_u16(),
            401
        );
        let csrf = auth.csrf().to_owned();
        assert!(auth.check_form(Some("t"), Some(&csrf)).is_ok());
        assert_eq!(
            auth.check_form(Some("t"), Some("x"))
                .unwrap_err()
                .status
                .as_u16(),
            403
        );
        assert_eq!(
            auth.check_form(Some("u"), Some(&csrf))
                .unwrap_err()
                .status
                .as_u16(),
            403
        );
    }
}
