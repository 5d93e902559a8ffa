//! TLS with libpq's `sslmode` semantics, against the local server's own certificate.
//!
//! The server's certificate is read from `SHOW ssl_cert_file` (the tests connect as a superuser
//! to the local server, which may read that setting and the file), never from a path written
//! here. Debian's `ssl = on` uses the self-signed "snakeoil" certificate, whose names are the
//! machine's host name and never an IP address, so:
//! - `verify-full` to `127.0.0.1` fails on the host name, whatever roots are trusted: the typed
//!   error case;
//! - `verify-ca` with the certificate as `sslrootcert` checks the chain alone and succeeds;
//! - `verify-full` succeeds with the certificate as `sslrootcert` when the connection names a
//!   host the certificate names (`host=<its DNS name>`) and still reaches the local server
//!   (`hostaddr=<the test server's address>`), so the test needs no DNS entry.
//!
//! A server with `ssl = off` skips these tests with a printed reason, unless `KEIRO_REQUIRE_TLS`
//! is set: then it fails them. `.ci/run` turns TLS on and sets it, so in CI they run or fail.

use std::str::FromStr;
use std::time::Duration;

use crate::common::TestResult;
use keiro_postgres::{Config, Error, PgStore, SslMode};
use keiro_resume::{Notifier, WakeFilter, WakeReason};
use keiro_tests::pg::test_database_url;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use tokio_postgres::config::Host;
use tokio_postgres::NoTls;
use x509_cert::der::Decode;
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::SubjectAltName;

/// Long enough for anything that should arrive; only reached when a test fails.
const PATIENCE: Duration = Duration::from_secs(10);

/// Set (to anything) where these tests must run: a server without TLS then fails them
/// instead of skipping them. `.ci/run` sets it.
const REQUIRE: &str = "KEIRO_REQUIRE_TLS";

/// Whether a test runs on a server whose `ssl` setting is `ssl`: `Ok(false)` skips it, an
/// error fails it (TLS is `required` but off).
fn tls_offered(ssl: &str, required: bool) -> Result<bool, String> {
    match (ssl == "on", required) {
        (true, _) => Ok(true),
        (false, false) => Ok(false),
        (false, true) => Err(format!(
            "{REQUIRE} is set but the test server has ssl = {ssl}: these tests cannot run"
        )),
    }
}

#[test]
fn a_server_without_tls_fails_the_tests_where_tls_is_required() {
    assert_eq!(tls_offered("on", false), Ok(true));
    assert_eq!(tls_offered("on", true), Ok(true));
    assert_eq!(tls_offered("off", false), Ok(false));
    let refused = tls_offered("off", true).expect_err("required");
    assert!(refused.contains("KEIRO_REQUIRE_TLS"), "{refused}");
}

/// What the test server says about TLS; `None` when `ssl = off`.
struct ServerTls {
    /// The server certificate's PEM file (`ssl_cert_file`).
    cert_file: String,
    /// The DNS names of its subjectAltName extension.
    dns_names: Vec<String>,
}

/// Reads `ssl` and `ssl_cert_file` over a plain connection; `None` (with the reason printed)
/// when the server does not offer TLS, an error when it does not and [`REQUIRE`] is set.
async fn server_tls() -> Result<Option<ServerTls>, Box<dyn std::error::Error + Send + Sync>> {
    let (client, connection) = tokio_postgres::connect(&test_database_url(), NoTls).await?;
    tokio::spawn(connection);
    let ssl: String = client.query_one("SHOW ssl", &[]).await?.get(0);
    if !tls_offered(&ssl, std::env::var_os(REQUIRE).is_some())? {
        println!("skipped: the test server has ssl = {ssl}; .ci/run turns it on");
        return Ok(None);
    }
    let cert_file: String = client.query_one("SHOW ssl_cert_file", &[]).await?.get(0);
    let der = CertificateDer::from_pem_file(&cert_file)
        .map_err(|e| format!("reading the server certificate {cert_file}: {e}"))?;
    let cert = x509_cert::Certificate::from_der(&der)?;
    let dns_names = match cert.tbs_certificate.get::<SubjectAltName>()? {
        Some((_, SubjectAltName(names))) => names
            .into_iter()
            .filter_map(|name| match name {
                GeneralName::DnsName(dns) => Some(dns.to_string()),
                _ => None,
            })
            .collect(),
        None => Vec::new(),
    };
    Ok(Some(ServerTls {
        cert_file,
        dns_names,
    }))
}

/// The test database's settings, to rebuild connection strings from.
fn test_server() -> tokio_postgres::Config {
    tokio_postgres::Config::from_str(&test_database_url()).expect("TEST_DATABASE_URL parses")
}

/// The test database in key/value form, on `host`, with `extra` settings: the port, user and
/// database of `TEST_DATABASE_URL`.
fn key_value(host: &str, extra: &str) -> String {
    let server = test_server();
    let port = server.get_ports().first().copied().unwrap_or(5432);
    let user = server.get_user().unwrap_or("postgres");
    let dbname = server.get_dbname().unwrap_or(user);
    format!("host={host} port={port} user={user} dbname={dbname} {extra}")
}

/// The test database's URL with `params` added to its query.
fn url_with(params: &str) -> String {
    let url = test_database_url();
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{params}")
}

/// A store on `url` whose connections report `application_name`, so the test finds them in
/// `pg_stat_activity`.
fn config(url: String, application_name: &str) -> Config {
    Config {
        application_name: application_name.to_owned(),
        schema: "keiro_tls_test".to_owned(),
        pool_size: 2,
        ..Config::new(url)
    }
}

/// A unique `application_name` for one test.
fn unique_name(test: &str) -> String {
    format!(
        "{test}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// Whether the session of the pooled connection `store` hands out is encrypted, by
/// `pg_stat_ssl` for the backend's own pid.
async fn pooled_session_is_encrypted(
    store: &PgStore,
) -> Result<bool, Box<dyn std::error::Error + Send + Sync>> {
    let client = store.pool().get().await?;
    let row = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

#[tokio::test]
async fn require_encrypts_the_pool_and_the_listen_connection() -> TestResult {
    if server_tls().await?.is_none() {
        return Ok(());
    }
    let name = unique_name("tls_require");
    let store = PgStore::connect(config(url_with("sslmode=require"), &name)).await?;
    assert!(
        pooled_session_is_encrypted(&store).await?,
        "a pooled session is not encrypted"
    );

    // The first subscription starts the LISTEN connection; it says `Reconnected` once listening.
    let mut wakes = store.subscribe(WakeFilter::Instances);
    assert_eq!(wakes.wait(PATIENCE).await, WakeReason::Reconnected);
    let (client, connection) = tokio_postgres::connect(&test_database_url(), NoTls).await?;
    tokio::spawn(connection);
    let sessions = client
        .query(
            "SELECT a.query, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.application_name = $1",
            &[&name],
        )
        .await?;
    let listen: Vec<bool> = sessions
        .iter()
        .filter(|row| row.get::<_, String>(0).starts_with("LISTEN"))
        .map(|row| row.get(1))
        .collect();
    assert_eq!(listen, [true], "the LISTEN connection is not encrypted");
    assert!(
        sessions.iter().all(|row| row.get::<_, bool>(1)),
        "every session of the store is encrypted"
    );
    Ok(())
}

#[tokio::test]
async fn prefer_connects_and_uses_tls_when_the_server_offers_it() -> TestResult {
    if server_tls().await?.is_none() {
        return Ok(());
    }
    // libpq's default, and so the default of a URL without sslmode.
    for url in [url_with("sslmode=prefer"), test_database_url()] {
        let store = PgStore::connect(config(url, &unique_name("tls_prefer"))).await?;
        assert!(pooled_session_is_encrypted(&store).await?);
    }
    Ok(())
}

#[tokio::test]
async fn disable_is_not_encrypted() -> TestResult {
    let store =
        PgStore::connect(config(url_with("sslmode=disable"), &unique_name("tls_off"))).await?;
    assert!(!pooled_session_is_encrypted(&store).await?);
    Ok(())
}

#[tokio::test]
async fn require_connects_by_address_alone() -> TestResult {
    if server_tls().await?.is_none() {
        return Ok(());
    }
    // No host name to send or check: `require` and `prefer` need none.
    let server = test_server();
    let address = match host_of_test_server().parse::<std::net::IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => "127.0.0.1".to_owned(),
    };
    for mode in ["require", "prefer"] {
        let url = format!(
            "hostaddr={address} port={} user={} dbname={} sslmode={mode}",
            server.get_ports().first().copied().unwrap_or(5432),
            server.get_user().unwrap_or("postgres"),
            server.get_dbname().unwrap_or("postgres"),
        );
        let store = PgStore::connect(config(url, &unique_name("tls_addr"))).await?;
        assert!(pooled_session_is_encrypted(&store).await?, "{mode}");
    }
    Ok(())
}

#[tokio::test]
async fn verify_full_refuses_a_certificate_that_does_not_name_the_host() -> TestResult {
    let Some(server) = server_tls().await? else {
        return Ok(());
    };
    // The key/value form, with the root given: the chain is trusted, the name is not.
    let url = key_value(
        "127.0.0.1",
        &format!("sslmode=verify-full sslrootcert='{}'", server.cert_file),
    );
    let err = match PgStore::connect(config(url, &unique_name("tls_full_bad"))).await {
        Ok(_) => panic!("verify-full accepted a certificate that does not name 127.0.0.1"),
        Err(err) => err,
    };
    assert!(matches!(err, Error::Tls { .. }), "not a TLS error: {err:?}");
    assert!(
        !err.is_retryable(),
        "a refused certificate is refused again"
    );
    let chain = keiro_journal::error_chain(&err);
    assert!(chain.contains("verify-full"), "{chain}");
    assert!(chain.contains("127.0.0.1"), "{chain}");
    Ok(())
}

#[tokio::test]
async fn verify_ca_checks_the_chain_against_sslrootcert() -> TestResult {
    let Some(server) = server_tls().await? else {
        return Ok(());
    };
    let url = url_with(&format!(
        "sslmode=verify-ca&sslrootcert={}",
        server.cert_file
    ));
    let store = PgStore::connect(config(url, &unique_name("tls_ca"))).await?;
    assert!(pooled_session_is_encrypted(&store).await?);
    Ok(())
}

#[tokio::test]
async fn verify_full_succeeds_for_a_host_the_certificate_names() -> TestResult {
    let Some(server) = server_tls().await? else {
        return Ok(());
    };
    let name = server
        .dns_names
        .first()
        .ok_or("the server certificate names no DNS host")?;
    let address = match host_of_test_server().parse::<std::net::IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => "127.0.0.1".to_owned(),
    };
    let url = key_value(
        name,
        &format!(
            "hostaddr={address} sslmode=verify-full sslrootcert='{}'",
            server.cert_file
        ),
    );
    let store = PgStore::connect(config(url, &unique_name("tls_full"))).await?;
    assert!(pooled_session_is_encrypted(&store).await?);
    Ok(())
}

#[tokio::test]
async fn an_unreadable_sslrootcert_is_a_config_error() -> TestResult {
    let url = url_with("sslmode=verify-full&sslrootcert=/nonexistent/keiro/root.crt");
    let err = match PgStore::connect_lazy(config(url, "tls_missing_root")) {
        Ok(_) => panic!("a missing sslrootcert was accepted"),
        Err(err) => err,
    };
    assert!(matches!(err, Error::Config { field: "url", .. }), "{err:?}");
    assert!(
        err.to_string().contains("/nonexistent/keiro/root.crt"),
        "{err}"
    );
    Ok(())
}

/// The host of `TEST_DATABASE_URL` (`127.0.0.1` unless told otherwise).
fn host_of_test_server() -> String {
    match test_server().get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        _ => "127.0.0.1".to_owned(),
    }
}

#[tokio::test]
async fn sslrootcert_system_refuses_a_weaker_sslmode_before_connecting() -> TestResult {
    for (params, weak) in [
        ("sslmode=require&sslrootcert=system", SslMode::Require),
        ("sslmode=verify-ca&sslrootcert=system", SslMode::VerifyCa),
    ] {
        let url = url_with(params);
        match PgStore::connect_lazy(config(url, "tls_system_weak")) {
            Err(Error::WeakSslMode { mode }) => assert_eq!(mode, weak, "{params}"),
            Err(other) => panic!("{params}: {other:?}"),
            Ok(_) => panic!("{params} was accepted"),
        }
    }
    // Alone it means verify-full, so the connector verifies the host name.
    let lazy = PgStore::connect_lazy(config(url_with("sslrootcert=system"), "tls_system"))?;
    assert_eq!(lazy.tls_connector().mode(), SslMode::VerifyFull);
    Ok(())
}
