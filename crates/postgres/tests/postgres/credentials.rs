//! A connection string's password never shows: not in `Debug`, not in `Display`, not in
//! [`Config::url_redacted`], not in the errors of connecting, in every form a connection string
//! takes (URL user info, percent-encoded, a URL query parameter, key/value, `password = x` with
//! spaces, a quoted value with `\'` escapes). The printable forms are built from the parsed
//! settings, so an unusual spelling cannot slip a password past a pattern.

use crate::common::TestResult;
use keiro_postgres::{Config, PgStore};

/// A port nothing listens on: bound, then released.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    listener.local_addr().expect("a bound address").port()
}

/// Every form of a connection string to `port`, each with the secret it carries (as the
/// driver decodes it) and the spellings of it that must not show either.
fn forms(port: u16) -> Vec<(String, Vec<&'static str>)> {
    vec![
        (
            format!("postgres://app:Hx7urlsecret@127.0.0.1:{port}/app"),
            vec!["Hx7urlsecret"],
        ),
        (
            format!("postgresql://app:Pc%40t9enc@127.0.0.1:{port}/app?sslmode=disable"),
            vec!["Pc%40t9enc", "Pc@t9enc", "t9enc"],
        ),
        (
            format!("postgres://app@127.0.0.1:{port}/app?sslmode=prefer&password=Qp3query&application_name=x"),
            vec!["Qp3query"],
        ),
        (
            format!("host=127.0.0.1 port={port} user=app password=Kv4plain dbname=app"),
            vec!["Kv4plain"],
        ),
        (
            format!("host=127.0.0.1 port={port} user=postgres password = Sp5spaced"),
            vec!["Sp5spaced"],
        ),
        (
            format!(r"host=127.0.0.1 port={port} password='Qx9 Vz\'Kp7 ok' user=app"),
            vec!["Qx9", "Vz'Kp7", r"Vz\'Kp7", "Kp7 ok"],
        ),
        (
            format!(r"host=127.0.0.1 port={port} password=Es6\ cape\'d user=app"),
            vec!["Es6", "cape'd", r"cape\'d"],
        ),
    ]
}

fn assert_hidden(what: &str, text: &str, secrets: &[&str]) {
    for secret in secrets {
        assert!(!text.contains(secret), "{what} shows {secret:?}: {text}");
    }
}

#[test]
fn debug_display_and_the_redacted_url_hide_the_password() {
    for (url, secrets) in forms(5432) {
        let config = Config::new(url.clone());
        config.validate().unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_hidden("Debug", &format!("{config:?}"), &secrets);
        assert_hidden("Display", &format!("{config}"), &secrets);
        assert_hidden("url_redacted", &config.url_redacted(), &secrets);
        assert!(
            config.url_redacted().contains("password=***"),
            "the redacted form says a password is set: {}",
            config.url_redacted()
        );
    }
}

#[test]
fn an_unreadable_connection_string_is_not_echoed() {
    for url in [
        "host=127.0.0.1 password=Un1readable port=notaport",
        "host=127.0.0.1 password='Un1readable",
        "postgres://app:Un1readable@127.0.0.1:5432/app?sslmode=bogus",
        "host=127.0.0.1 password=Un1readable sslmode=verify-full sslrootcert=/nonexistent/root.crt",
    ] {
        let config = Config::new(url);
        assert_hidden("Debug", &format!("{config:?}"), &["Un1readable"]);
        assert_hidden("Display", &format!("{config}"), &["Un1readable"]);
        let err = config.validate().expect_err(url);
        assert_hidden(
            "the config error",
            &format!("{err} {err:?}"),
            &["Un1readable"],
        );
    }
}

#[tokio::test]
async fn connecting_errors_hide_the_password() -> TestResult {
    for (url, secrets) in forms(closed_port()) {
        let err = match PgStore::connect(Config::new(url.clone())).await {
            Ok(_) => panic!("{url} connected to a closed port"),
            Err(err) => err,
        };
        let mut text = format!("{err} {err:?}");
        let mut source = std::error::Error::source(&err);
        while let Some(cause) = source {
            text.push_str(&format!(" {cause} {cause:?}"));
            source = cause.source();
        }
        assert_hidden("the connect error", &text, &secrets);
    }
    Ok(())
}
