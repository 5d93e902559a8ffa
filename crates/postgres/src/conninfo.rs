//! Connection strings: reading them (the driver's parser, plus the settings it does not know:
//! `sslmode=verify-ca|verify-full`, `sslrootcert`, and `PGPASSWORD`) and writing them back
//! for people, with the password hidden.
//!
//! `sslrootcert=system` follows libpq: it makes `verify-full` the mode when the string names
//! none, and any weaker mode it names is refused ([`Error::WeakSslMode`]), since trusting the
//! platform's roots for any server they vouch for means nothing unless the name is checked.
//!
//! The printable form is written from the parsed settings, never by editing the string: a
//! password spelled in any way the parser accepts (`password = x`, quoted with `\'` escapes,
//! percent-encoded in a URL, a query parameter, the environment) is a parsed password, and a
//! parsed password is printed as `***`. A string the parser refuses is not printed at all.

use std::fmt::Write as _;
use std::str::FromStr;

use tokio_postgres::config::Host;

use crate::error::Error;
use crate::tls::{RootCert, SslMode, TlsSettings};

/// The environment variable libpq reads a password from when the connection string has none.
pub(crate) const PASSWORD_ENV: &str = "PGPASSWORD";

/// What a connection string says.
#[derive(Debug, Clone)]
pub(crate) struct ConnInfo {
    /// The driver's settings, with the TLS mode it understands.
    pub(crate) driver: tokio_postgres::Config,
    /// keiro's TLS settings.
    pub(crate) tls: TlsSettings,
}

/// The two settings keiro reads itself; the driver refuses `verify-*` and `sslrootcert`.
const SSLMODE: &str = "sslmode";
const SSLROOTCERT: &str = "sslrootcert";

impl ConnInfo {
    /// Reads `url` (a `postgres://` URL or a `key=value` string), taking a missing password
    /// from `env(PGPASSWORD)`.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] on `url`, saying what is wrong without quoting any value but an
    /// `sslmode` or a file name; [`Error::WeakSslMode`] for `sslrootcert=system` with a mode
    /// other than `verify-full`.
    pub(crate) fn parse(url: &str, env: impl Fn(&str) -> Option<String>) -> Result<Self, Error> {
        let invalid = |problem: String| Error::Config {
            field: "url",
            problem,
        };
        let (rest, tls_params) = split_tls_params(url);
        let mut tls = TlsSettings::default();
        let mut mode = None;
        for (key, value) in tls_params {
            match key {
                SSLMODE => {
                    mode = Some(SslMode::from_str(&value).map_err(|e| invalid(e.to_string()))?);
                }
                _ => tls.root_cert = Some(RootCert::parse(&value)),
            }
        }
        tls.mode = match (mode, &tls.root_cert) {
            (None | Some(SslMode::VerifyFull), Some(RootCert::System)) => SslMode::VerifyFull,
            (Some(mode), Some(RootCert::System)) => return Err(Error::WeakSslMode { mode }),
            (mode, _) => mode.unwrap_or_default(),
        };
        let mut driver = tokio_postgres::Config::from_str(&rest)
            .map_err(|e| invalid(format!("is not a connection string keiro can read ({e})")))?;
        driver.ssl_mode(tls.mode.driver_mode());
        // The driver refuses TLS without a host name, where libpq connects by address alone.
        // The addresses stand in as the names (a certificate for an IP names that IP), one
        // per address, as the driver pairs hosts with addresses.
        if tls.mode != SslMode::Disable && driver.get_hosts().is_empty() {
            let addrs: Vec<String> = driver
                .get_hostaddrs()
                .iter()
                .map(ToString::to_string)
                .collect();
            for addr in addrs {
                driver.host(&addr);
            }
        }
        if driver.get_password().is_none() {
            if let Some(password) = env(PASSWORD_ENV).filter(|p| !p.is_empty()) {
                driver.password(password);
            }
        }
        Ok(Self { driver, tls })
    }

    /// The settings as a `key=value` string, the password as `***`: what logs and messages
    /// show. Values are quoted as the parser reads them back.
    pub(crate) fn redacted(&self) -> String {
        let driver = &self.driver;
        let mut out = String::new();
        let hosts: Vec<String> = driver
            .get_hosts()
            .iter()
            .map(|host| match host {
                Host::Tcp(name) => name.clone(),
                #[cfg(unix)]
                Host::Unix(path) => path.display().to_string(),
            })
            .collect();
        if !hosts.is_empty() {
            push(&mut out, "host", &hosts.join(","));
        }
        let addrs: Vec<String> = driver
            .get_hostaddrs()
            .iter()
            .map(ToString::to_string)
            .collect();
        if !addrs.is_empty() {
            push(&mut out, "hostaddr", &addrs.join(","));
        }
        let ports: Vec<String> = driver.get_ports().iter().map(ToString::to_string).collect();
        if !ports.is_empty() {
            push(&mut out, "port", &ports.join(","));
        }
        if let Some(user) = driver.get_user() {
            push(&mut out, "user", user);
        }
        if driver.get_password().is_some() {
            push(&mut out, "password", "***");
        }
        if let Some(dbname) = driver.get_dbname() {
            push(&mut out, "dbname", dbname);
        }
        if let Some(options) = driver.get_options() {
            push(&mut out, "options", options);
        }
        if let Some(name) = driver.get_application_name() {
            push(&mut out, "application_name", name);
        }
        push(&mut out, SSLMODE, self.tls.mode.as_str());
        match &self.tls.root_cert {
            Some(RootCert::File(path)) => push(&mut out, SSLROOTCERT, &path.display().to_string()),
            Some(RootCert::System) => push(&mut out, SSLROOTCERT, "system"),
            None => {}
        }
        out
    }
}

/// Appends ` key=value`, quoting the value when the parser needs it to.
fn push(out: &mut String, key: &str, value: &str) {
    if !out.is_empty() {
        out.push(' ');
    }
    let needs_quotes = value.is_empty()
        || value
            .chars()
            .any(|c| c.is_whitespace() || c == '\'' || c == '\\');
    if needs_quotes {
        let escaped = value.replace('\\', "\\\\").replace('\'', "\\'");
        let _ = write!(out, "{key}='{escaped}'");
    } else {
        let _ = write!(out, "{key}={value}");
    }
}

/// Splits `sslmode` and `sslrootcert` off `url`, returning the rest for the driver and the
/// settings split off (decoded), in order. A string whose shape this cannot follow is returned
/// whole, for the driver to refuse with its own message.
fn split_tls_params(url: &str) -> (String, Vec<(&'static str, String)>) {
    let found = if let Some(rest) = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
    {
        split_url(url, url.len() - rest.len())
    } else {
        split_key_value(url)
    };
    found.unwrap_or_else(|| (url.to_owned(), Vec::new()))
}

/// Which of keiro's settings `key` is.
fn tls_key(key: &str) -> Option<&'static str> {
    match key {
        SSLMODE => Some(SSLMODE),
        SSLROOTCERT => Some(SSLROOTCERT),
        _ => None,
    }
}

/// A URL: the query starts at the first `?` after the user info, which the driver ends at the
/// first `@`; its parameters are `&`-separated `key=value` pairs, percent-encoded.
fn split_url(url: &str, after_scheme: usize) -> Option<(String, Vec<(&'static str, String)>)> {
    let rest = &url[after_scheme..];
    let host_start = rest.find('@').map_or(0, |at| at + 1);
    let Some(question) = rest[host_start..].find('?') else {
        return Some((url.to_owned(), Vec::new()));
    };
    let query_start = after_scheme + host_start + question + 1;
    let mut kept: Vec<&str> = Vec::new();
    let mut found = Vec::new();
    for param in url[query_start..].split('&') {
        let (key, value) = param.split_once('=')?;
        match tls_key(&percent_decode(key)?) {
            Some(tls) => found.push((tls, percent_decode(value)?)),
            None => kept.push(param),
        }
    }
    let mut rest = url[..query_start - 1].to_owned();
    if !kept.is_empty() {
        rest.push('?');
        rest.push_str(&kept.join("&"));
    }
    Some((rest, found))
}

/// A `key=value` string, tokenized as the driver does: whitespace around `=` is allowed, a
/// value is `'quoted'` or plain, and `\` escapes the next character in either.
fn split_key_value(s: &str) -> Option<(String, Vec<(&'static str, String)>)> {
    let mut chars = s.char_indices().peekable();
    let mut rest = String::with_capacity(s.len());
    let mut found = Vec::new();
    let mut kept_from = 0;
    loop {
        while chars.next_if(|&(_, c)| c.is_whitespace()).is_some() {}
        let Some(&(start, _)) = chars.peek() else {
            break;
        };
        let mut key_end = start;
        while let Some((i, c)) = chars.next_if(|&(_, c)| !c.is_whitespace() && c != '=') {
            key_end = i + c.len_utf8();
        }
        let key = &s[start..key_end];
        if key.is_empty() {
            // The driver stops reading here too.
            return None;
        }
        while chars.next_if(|&(_, c)| c.is_whitespace()).is_some() {}
        chars.next_if(|&(_, c)| c == '=')?;
        while chars.next_if(|&(_, c)| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        let quoted = chars.next_if(|&(_, c)| c == '\'').is_some();
        let mut end = s.len();
        let mut closed = !quoted;
        while let Some(&(i, c)) = chars.peek() {
            if (quoted && c == '\'') || (!quoted && c.is_whitespace()) {
                if quoted {
                    chars.next();
                    closed = true;
                    end = i + 1;
                } else {
                    end = i;
                }
                break;
            }
            chars.next();
            if c == '\\' {
                if let Some((_, escaped)) = chars.next() {
                    value.push(escaped);
                }
            } else {
                value.push(c);
            }
        }
        if !closed || (!quoted && value.is_empty()) {
            return None;
        }
        if let Some(tls) = tls_key(key) {
            rest.push_str(&s[kept_from..start]);
            kept_from = end;
            found.push((tls, value));
        }
    }
    rest.push_str(&s[kept_from..]);
    Some((rest, found))
}

/// `%XX` decoding, as the driver applies it to URL parts; `None` for bytes that are not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn parse(url: &str) -> ConnInfo {
        ConnInfo::parse(url, no_env).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    #[test]
    fn tls_settings_are_read_from_both_forms() {
        let info = parse("postgres://u:pw@h:5433/db?sslmode=verify-full&sslrootcert=%2Fetc%2Fca%20x.pem&application_name=a");
        assert_eq!(info.tls.mode, SslMode::VerifyFull);
        assert_eq!(
            info.tls.root_cert,
            Some(RootCert::File("/etc/ca x.pem".into()))
        );
        assert_eq!(info.driver.get_application_name(), Some("a"));
        assert_eq!(info.driver.get_password(), Some(&b"pw"[..]));
        assert_eq!(
            info.driver.get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );

        let info = parse(r"host=h sslmode = verify-ca sslrootcert='/ca dir/it\'s.pem' user=u");
        assert_eq!(info.tls.mode, SslMode::VerifyCa);
        assert_eq!(
            info.tls.root_cert,
            Some(RootCert::File("/ca dir/it's.pem".into()))
        );
        assert_eq!(info.driver.get_user(), Some("u"));

        let info = parse("host=h");
        assert_eq!(info.tls, TlsSettings::default());
        assert_eq!(
            info.driver.get_ssl_mode(),
            tokio_postgres::config::SslMode::Prefer
        );
        let info = parse("postgres://u@h/db?sslmode=disable");
        assert_eq!(
            info.driver.get_ssl_mode(),
            tokio_postgres::config::SslMode::Disable
        );
    }

    #[test]
    fn a_question_mark_in_the_password_is_not_the_query() {
        let info = parse("postgres://u:p?ss@h/db?sslmode=require");
        assert_eq!(info.driver.get_password(), Some(&b"p?ss"[..]));
        assert_eq!(info.tls.mode, SslMode::Require);
    }

    #[test]
    fn addresses_name_the_hosts_the_driver_needs_for_tls() {
        let info = parse("hostaddr=10.0.0.1,10.0.0.2 user=u");
        assert_eq!(
            info.driver.get_hosts(),
            [Host::Tcp("10.0.0.1".into()), Host::Tcp("10.0.0.2".into())]
        );
        assert!(parse("hostaddr=10.0.0.1 sslmode=disable")
            .driver
            .get_hosts()
            .is_empty());
        assert_eq!(
            parse("host=db hostaddr=10.0.0.1").driver.get_hosts(),
            [Host::Tcp("db".into())]
        );
    }

    #[test]
    fn unknown_modes_are_refused_by_name() {
        let err = ConnInfo::parse("host=h sslmode=allow password=pw", no_env)
            .unwrap_err()
            .to_string();
        assert!(err.contains("allow") && !err.contains("pw"), "{err}");
    }

    #[test]
    fn sslrootcert_system_means_verify_full_and_refuses_a_weaker_mode() {
        for url in [
            "host=h sslrootcert=system",
            "postgres://u@h/db?sslrootcert=system",
            "host=h sslmode=verify-full sslrootcert=system",
            "host=h sslrootcert=system sslmode=verify-full",
        ] {
            let info = parse(url);
            assert_eq!(info.tls.mode, SslMode::VerifyFull, "{url}");
            assert_eq!(info.tls.root_cert, Some(RootCert::System), "{url}");
            assert_eq!(
                info.driver.get_ssl_mode(),
                tokio_postgres::config::SslMode::Require,
                "{url}"
            );
        }
        for (url, weak) in [
            (
                "host=h sslmode=require sslrootcert=system",
                SslMode::Require,
            ),
            (
                "host=h sslrootcert=system sslmode=require",
                SslMode::Require,
            ),
            (
                "postgres://u@h/db?sslmode=verify-ca&sslrootcert=system",
                SslMode::VerifyCa,
            ),
            ("host=h sslmode=prefer sslrootcert=system", SslMode::Prefer),
            (
                "host=h sslmode=disable sslrootcert=system",
                SslMode::Disable,
            ),
        ] {
            match ConnInfo::parse(url, no_env) {
                Err(Error::WeakSslMode { mode }) => assert_eq!(mode, weak, "{url}"),
                other => panic!("{url}: {other:?}"),
            }
        }
        // A file of roots keeps libpq's other rules: `require` with it checks the chain.
        let info = parse("host=h sslmode=require sslrootcert=/etc/ca.pem");
        assert_eq!(info.tls.mode, SslMode::Require);
    }

    #[test]
    fn pgpassword_fills_a_missing_password_only() {
        let env = |key: &str| (key == PASSWORD_ENV).then(|| "from-env".to_owned());
        let info = ConnInfo::parse("host=h user=u", env).unwrap();
        assert_eq!(info.driver.get_password(), Some(&b"from-env"[..]));
        assert_eq!(info.redacted(), "host=h user=u password=*** sslmode=prefer");
        let info = ConnInfo::parse("host=h password=given", env).unwrap();
        assert_eq!(info.driver.get_password(), Some(&b"given"[..]));
    }

    #[test]
    fn the_redacted_form_reads_back_to_the_same_settings() {
        for url in [
            "postgres://app:se%20cret@db.internal:6432,db2/app?application_name=my%20app&sslmode=verify-full",
            r"host=/var/run/postgresql user='o\'brien' password = 'x y' dbname=app options='-c statement_timeout=5s'",
            "host=h hostaddr=10.0.0.1 port=5433 sslmode=verify-full sslrootcert=system",
            "host=h hostaddr=10.0.0.1 port=5433 sslrootcert=system",
            "host=h sslmode=require sslrootcert=/etc/ca.pem",
        ] {
            let info = parse(url);
            let redacted = info.redacted();
            assert!(!redacted.contains("cret") && !redacted.contains("x y"), "{redacted}");
            let back = parse(&redacted);
            assert_eq!(back.driver.get_hosts(), info.driver.get_hosts(), "{redacted}");
            assert_eq!(back.driver.get_user(), info.driver.get_user(), "{redacted}");
            assert_eq!(back.driver.get_options(), info.driver.get_options());
            assert_eq!(back.tls, info.tls, "{redacted}");
            let hidden = info.driver.get_password().map(|_| &b"***"[..]);
            assert_eq!(back.driver.get_password(), hidden, "{redacted}");
        }
    }
}
