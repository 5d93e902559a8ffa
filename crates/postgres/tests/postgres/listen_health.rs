//! A LISTEN connection that goes silently dead (a NAT or load balancer dropping it without a
//! reset) is noticed by the listener's health check and replaced: the subscriptions hear
//! `Reconnected`, and the wakes sent afterwards arrive through the new connection.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::common::{key, start, TestResult};
use keiro_journal::JournalStore;
use keiro_postgres::{Config, PgStore};
use keiro_resume::{Notifier, WakeFilter, WakeReason};
use keiro_tests::pg::TestDb;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// Long enough for anything that should arrive; only reached when a test fails.
const PATIENCE: Duration = Duration::from_secs(10);
/// The health check's period and its timeout in this test: short, so the test is.
const CHECK_INTERVAL: Duration = Duration::from_millis(200);
const CHECK_TIMEOUT: Duration = Duration::from_millis(200);
/// How long after the connection died the listener must have replaced it: a check that starts
/// at most one interval later, its timeout, the first reconnect delay (100 ms, +10%) and a
/// local connect, with room for a loaded machine.
const NOTICED_WITHIN: Duration = Duration::from_millis(2_000);
/// A notification on a healthy local connection arrives well within this.
const PROMPT: Duration = Duration::from_millis(1_000);

/// A TCP proxy on 127.0.0.1 to the test database that can black-hole the connections it
/// carries: they stop forwarding bytes either way while both sockets stay open, as when a NAT
/// forgets a connection. Connections made later are forwarded as usual.
struct Proxy {
    addr: SocketAddr,
    /// The switch of each connection made so far.
    connections: Arc<Mutex<Vec<Arc<AtomicBool>>>>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let connections: Arc<Mutex<Vec<Arc<AtomicBool>>>> = Arc::default();
        let registry = connections.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let holed = Arc::new(AtomicBool::new(false));
                registry
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(holed.clone());
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(forward(client_read, server_write, holed.clone()));
                tokio::spawn(forward(server_read, client_write, holed));
            }
        });
        Ok(Self { addr, connections })
    }

    /// Black-holes every connection made so far.
    fn black_hole(&self) {
        for holed in self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            holed.store(true, Ordering::SeqCst);
        }
    }

    fn connections(&self) -> usize {
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// Copies `from` to `to` until either closes; once `holed`, holds both open and moves nothing.
async fn forward(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, holed: Arc<AtomicBool>) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        if holed.load(Ordering::SeqCst) {
            // Keeps `from` and `to` alive, and silent, for the rest of the test.
            std::future::pending::<()>().await;
        }
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if holed.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

/// The test database's address, and a connection string for the same database through `proxy`.
async fn through(
    db: &TestDb,
) -> Result<(SocketAddr, String), Box<dyn std::error::Error + Send + Sync>> {
    let direct: tokio_postgres::Config = db.url().parse()?;
    let host = match direct.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        _ => return Err("the test database is not reached over TCP".into()),
    };
    let port = direct.get_ports().first().copied().unwrap_or(5432);
    let upstream = tokio::net::lookup_host((host.as_str(), port))
        .await?
        .next()
        .ok_or("the test database's host does not resolve")?;
    let quote = |v: &str| format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"));
    let mut url = String::from("host=127.0.0.1 port=PORT");
    if let Some(user) = direct.get_user() {
        url.push_str(&format!(" user={}", quote(user)));
    }
    if let Some(dbname) = direct.get_dbname() {
        url.push_str(&format!(" dbname={}", quote(dbname)));
    }
    if let Some(password) = direct.get_password() {
        url.push_str(&format!(
            " password={}",
            quote(&String::from_utf8_lossy(password))
        ));
    }
    Ok((upstream, url))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_listen_connection_is_noticed_and_replaced() -> TestResult {
    let db = TestDb::new().await;
    let (upstream, url) = through(&db).await?;
    let proxy = Proxy::start(upstream).await?;
    let proxied = PgStore::connect_lazy(Config {
        url: url.replace("PORT", &proxy.addr.port().to_string()),
        listen_check_interval: CHECK_INTERVAL,
        listen_check_timeout: CHECK_TIMEOUT,
        ..db.config()
    })?;
    // Wakes are sent on a direct connection: only the listener goes through the proxy.
    let direct = db.store();
    let mut wakes = proxied.subscribe(WakeFilter::Instances);
    assert_eq!(wakes.wait(PATIENCE).await, WakeReason::Reconnected);
    assert_eq!(proxy.connections(), 1, "the listener's connection");
    direct
        .instance_start(&start(&key("order", "before"), json!(null)))
        .await?;
    assert_eq!(wakes.wait(PROMPT).await, WakeReason::Notified);

    proxy.black_hole();
    let cut = Instant::now();
    assert_eq!(
        wakes.wait(NOTICED_WITHIN).await,
        WakeReason::Reconnected,
        "the dead connection was noticed and replaced"
    );
    eprintln!("replaced {:?} after the cut", cut.elapsed());
    assert_eq!(
        proxy.connections(),
        2,
        "one new connection, through the proxy"
    );

    direct
        .instance_start(&start(&key("order", "after"), json!(null)))
        .await?;
    assert_eq!(
        wakes.wait(PROMPT).await,
        WakeReason::Notified,
        "a wake sent after the cut arrives through the new connection"
    );
    Ok(())
}

#[tokio::test]
async fn a_healthy_listener_checks_without_reconnecting() -> TestResult {
    let db = TestDb::new().await;
    let store = PgStore::connect_lazy(Config {
        listen_check_interval: Duration::from_millis(50),
        ..db.config()
    })?;
    let mut wakes = store.subscribe(WakeFilter::Timers);
    assert_eq!(wakes.wait(PATIENCE).await, WakeReason::Reconnected);
    // Ten checks pass, none of them a reason to wake anyone.
    assert_eq!(
        wakes.wait(Duration::from_millis(500)).await,
        WakeReason::Timeout
    );
    assert_eq!(store.round_trips(), 0, "the checks are the listener's own");
    Ok(())
}
