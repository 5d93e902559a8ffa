//! `keiro ui` in a real browser: Debian's headless chromium driven through chromedriver
//! (WebDriver). A page whose DNS name was rebound to the dashboard's address is refused, and a
//! dashboard on a database without keiro's schema says how to migrate it. It opens the list, filters on failed, opens the failed instance, requeues it
//! with the token (accepting the confirmation), sees it complete, checks that a request
//! without the token is refused, opens a parked instance's page and finds its timers,
//! awakeable and signal wait listed (a token that is markup stays text), goes to the queues
//! from the menu, opens a queue, follows a key to its runs, pauses the queue with the token
//! (accepting the confirmation) and sees it paused; it finds the timeline drawn (a bar per
//! step, a parked run's waits open until now), the overview's charts drawn from the API (a
//! column per minute, a bar per status), and a stream followed live (an item written after the
//! page loaded appears, then the stream shows closed), and saves screenshots of the overview and
//! of an instance page: to the test's scratch directory, or to docs/ui-overview.png and
//! docs/ui-instance.png (shown in the README) when `KEIRO_UI_SCREENSHOT=docs` asks for the
//! README's copies to be refreshed.
//!
//! Skips, saying why, only when chromium or chromedriver is not installed and
//! `KEIRO_REQUIRE_BROWSER` is unset; CI (`.ci/run`) installs both and sets it.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::ui_support::{
    broken, registry, seed, seed_queue, seed_stream, seed_waits, Ui, QUEUE, STREAM_MARKUP, TOKEN,
    XSS_TOKEN,
};
use fantoccini::{ClientBuilder, Locator};
use keiro::Status;
use keiro_tests::{Harness, TestResult};
use serde_json::json;

/// The first of `names` found on `PATH`.
fn which(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

/// chromedriver, killed when dropped.
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

async fn wait_for_port(port: u16) {
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("chromedriver did not listen on {port}");
}

/// The browser and its driver, when both are installed; `None` (the test skips, saying why)
/// only when `KEIRO_REQUIRE_BROWSER` is unset.
fn browser_tools() -> Option<(PathBuf, PathBuf)> {
    let browser = which(&["chromium", "chromium-browser", "google-chrome"]);
    let driver = which(&["chromedriver"]);
    let (Some(browser), Some(driver)) = (browser, driver) else {
        if std::env::var_os("KEIRO_REQUIRE_BROWSER").is_some() {
            panic!("KEIRO_REQUIRE_BROWSER is set but chromium or chromedriver is not installed");
        }
        println!("skipped: chromium and chromedriver are not installed (apt-get install chromium chromium-driver)");
        return None;
    };
    Some((browser, driver))
}

/// Starts chromedriver and a headless browser session with `args` added to the browser's.
async fn open_browser(
    (browser, driver): &(PathBuf, PathBuf),
    args: &[&str],
) -> Result<(Driver, fantoccini::Client), Box<dyn std::error::Error + Send + Sync>> {
    let port = free_port();
    let driver = Driver(
        Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    wait_for_port(port).await;
    // Root in CI has no user namespace sandbox; the page is our own, on loopback.
    let mut browser_args = vec![
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,1100",
    ];
    browser_args.extend_from_slice(args);
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".into(),
        json!({ "binary": browser, "args": browser_args }),
    );
    let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(capabilities)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await?;
    Ok((driver, client))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_requeues_a_failed_run_in_the_browser() -> TestResult {
    let Some(tools) = browser_tools() else {
        return Ok(());
    };

    let h = Harness::postgres().await;
    let broken = broken();
    let registry = registry(broken.clone());
    seed(&h, &registry).await?;
    seed_waits(&h, &registry).await?;
    seed_stream(&h, &registry).await?;
    seed_queue(&h).await?;
    let ui = Ui::start(&h, Some(TOKEN));

    // A worker for the requeued run: resume passes until the test ends.
    let worker = {
        let (store, registry, options) = (
            h.store.clone(),
            crate::ui_support::registry(broken.clone()),
            h.fast_options(),
        );
        tokio::spawn(async move {
            loop {
                let _ = keiro::worker::resume_once(&store, &registry, &options).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    let (_driver, client) = open_browser(&tools, &[]).await?;
    let mut result = drive_queue(&client, &ui.base, &h).await;
    if result.is_ok() {
        result = drive(&client, &ui.base, &h, &broken).await;
    }
    if result.is_ok() {
        result = drive_live(&client, &ui.base, &h).await;
    }
    let _ = client.close().await;
    worker.abort();
    result
}

async fn drive(
    client: &fantoccini::Client,
    base: &str,
    h: &Harness,
    broken: &std::sync::atomic::AtomicBool,
) -> TestResult {
    // The list, filtered on failed through the form.
    client.goto(&format!("{base}/instances")).await?;
    let rows = client.find_all(Locator::Css("#instances tbody tr")).await?;
    assert!(
        rows.len() >= 5,
        "the seeded instances are listed: {}",
        rows.len()
    );
    client
        .find(Locator::Css("#filters select[name=status]"))
        .await?
        .select_by_value("failed")
        .await?;
    client.find(Locator::Id("apply")).await?.click().await?;
    wait_for_url(client, "status=failed").await?;
    let rows = client.find_all(Locator::Css("#instances tbody tr")).await?;
    assert_eq!(rows.len(), 1, "only the failed charge");

    // Its page: failed, with the escaped reason.
    client.find(Locator::LinkText("c-1")).await?.click().await?;
    wait_for_url(client, "/instances/charge/c-1").await?;
    assert_eq!(
        client.find(Locator::Id("status")).await?.text().await?,
        "failed"
    );

    // Requeue with the token, through the confirmation dialog.
    broken.store(false, Ordering::SeqCst);
    client
        .find(Locator::Id("token"))
        .await?
        .send_keys(TOKEN)
        .await?;
    client
        .find(Locator::Id("action-requeue"))
        .await?
        .click()
        .await?;
    let confirm = client.get_alert_text().await?;
    assert!(confirm.contains("Requeue charge/c-1"), "{confirm}");
    client.accept_alert().await?;
    let notice = client.wait().for_element(Locator::Id("notice")).await?;
    assert!(notice.text().await?.contains("running again"));

    // It completes: the page shows it after a reload.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        client.goto(&format!("{base}/instances/charge/c-1")).await?;
        let status = client.find(Locator::Id("status")).await?.text().await?;
        if status == "completed" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "still {status}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(client
        .find(Locator::Id("output"))
        .await?
        .text()
        .await?
        .contains("auth-42 captured"));
    assert_eq!(
        h.keiro
            .instance(("charge", "c-1"))
            .await?
            .expect("row")
            .status,
        Status::Completed
    );

    // The browser's own tokenless request is refused.
    let refused = client
        .execute_async(
            "const done = arguments[arguments.length - 1];
             fetch('/api/v1/instances/charge/c-1/cancel', {method: 'POST'})
               .then(r => done(r.status)).catch(e => done(String(e)));",
            vec![],
        )
        .await?;
    assert_eq!(refused, json!(401));

    // The timeline: one bar per step row of the table, each with its tooltip.
    let steps = client
        .find_all(Locator::Css("#timeline tbody tr.step"))
        .await?;
    let bars = client
        .find_all(Locator::Css("#timeline-chart rect.bar"))
        .await?;
    assert!(!steps.is_empty());
    assert_eq!(bars.len(), steps.len(), "a bar per step");
    let authorize = client
        .find(Locator::Css(
            "#timeline-chart g.lane[data-step=authorize] rect.bar title",
        ))
        .await?
        .prop("textContent")
        .await?
        .unwrap_or_default();
    assert!(authorize.starts_with("authorize: ran"), "{authorize}");

    // A parked instance lists what it waits on; its markup token ran nowhere.
    client.goto(&format!("{base}/instances/waiter/w-1")).await?;
    // Its sleep, signal wait and awakeable are drawn open until now.
    let open = client
        .find_all(Locator::Css("#timeline-chart rect.open"))
        .await?;
    assert_eq!(
        open.len(),
        3,
        "the sleep, the signal wait and the awakeable"
    );
    let timers = client.find_all(Locator::Css("#timers tbody tr")).await?;
    assert_eq!(timers.len(), 2, "the sleep and the signal wait's timeout");
    let awakeables = client
        .find_all(Locator::Css("#awakeables tbody tr"))
        .await?;
    assert_eq!(awakeables.len(), 1);
    let waits = client
        .find_all(Locator::Css("#signal-waits tbody tr td:first-child"))
        .await?;
    assert_eq!(waits.len(), 1);
    assert_eq!(waits[0].text().await?, XSS_TOKEN);
    let pwned = client
        .execute("return window.keiroPwned === undefined;", vec![])
        .await?;
    assert_eq!(pwned, json!(true));
    Ok(())
}

/// Waits (5 s at most) until `css` matches at least `n` elements, and returns them.
async fn wait_for_all(
    client: &fantoccini::Client,
    css: &str,
    n: usize,
) -> Result<Vec<fantoccini::elements::Element>, Box<dyn std::error::Error + Send + Sync>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let found = client.find_all(Locator::Css(css)).await?;
        if found.len() >= n {
            return Ok(found);
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("{} of {n} {css} after 5 s", found.len()).into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Saves a screenshot: to the test's scratch directory, or to docs/ (shown in the README)
/// when `KEIRO_UI_SCREENSHOT=docs` asks for the README's copies to be refreshed.
async fn screenshot(client: &fantoccini::Client, name: &str) -> TestResult {
    let png = client.screenshot().await?;
    let path = if std::env::var("KEIRO_UI_SCREENSHOT").as_deref() == Ok("docs") {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../docs/{name}"))
    } else {
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(name)
    };
    std::fs::write(&path, &png)?;
    println!("saved {} ({} bytes)", path.display(), png.len());
    Ok(())
}

/// The overview's charts drawn from the API, and a stream followed live: an item written
/// after the page loaded appears, then the stream shows closed.
async fn drive_live(client: &fantoccini::Client, base: &str, h: &Harness) -> TestResult {
    client.goto(&format!("{base}/")).await?;
    let buckets = wait_for_all(client, "#throughput-chart rect.bucket", 60).await?;
    assert_eq!(buckets.len(), 60, "a column per minute of the last hour");
    let ended = client
        .find_all(Locator::Css("#throughput-chart rect.ended.completed"))
        .await?;
    assert!(!ended.is_empty(), "runs completed in the last hour");
    let bars = wait_for_all(client, "#status-chart rect.status-bar", 5).await?;
    assert_eq!(bars.len(), 5, "a bar per status");
    let failed = client
        .find(Locator::Css("#status-chart rect.status-bar.failed title"))
        .await?
        .prop("textContent")
        .await?;
    assert_eq!(
        failed.as_deref(),
        Some("failed: 0"),
        "c-1 was requeued and completed"
    );
    // Refreshed live: a run that completes after the page loaded is counted without a reload.
    let completed = |client: fantoccini::Client| async move {
        let title = client
            .find(Locator::Css(
                "#status-chart rect.status-bar.completed title",
            ))
            .await?
            .prop("textContent")
            .await?
            .unwrap_or_default();
        let n: u64 = title.trim_start_matches("completed: ").parse()?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(n)
    };
    let before = completed(client.clone()).await?;
    h.keiro.start("greet", "live-1", &"live").await?;
    // The status chart (every 2 s) and the per-minute chart (every 5 s) both come to count it:
    // every completion of this test is within the last hour.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let now = completed(client.clone()).await?;
        let per_minute = client
            .execute(
                "return Array.from(document.querySelectorAll('#throughput-chart rect.bucket title'))
                   .map(t => parseInt(t.textContent.split(': ')[1], 10)).reduce((a, b) => a + b, 0);",
                vec![],
            )
            .await?
            .as_u64()
            .unwrap_or(0);
        if now > before && per_minute == now {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{before} completed at load, {now} now, {per_minute} in the last hour's chart"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    screenshot(client, "ui-overview.png").await?;

    // The stream: its first item, as text; a second one written after the page loaded.
    client
        .goto(&format!("{base}/instances/streamer/s-1"))
        .await?;
    let items = wait_for_all(client, ".stream .stream-items li .value", 1).await?;
    assert_eq!(
        items[0].prop("textContent").await?,
        Some(serde_json::to_string(STREAM_MARKUP)?)
    );
    let phase = client
        .find(Locator::Css("#events-box #events tbody tr td:last-child"))
        .await?
        .text()
        .await?;
    assert_eq!(phase, "\"started\"");
    h.keiro.deliver(("streamer", "s-1"), "go", &"two").await?;
    let items = wait_for_all(client, ".stream .stream-items li .value", 2).await?;
    assert_eq!(items[1].text().await?, "\"two\"");
    wait_for_all(client, ".stream[data-ended=true]", 1).await?;
    assert_eq!(
        client
            .find(Locator::Css(".stream .stream-state"))
            .await?
            .text()
            .await?,
        "closed"
    );
    let pwned = client
        .execute("return window.keiroPwned === undefined;", vec![])
        .await?;
    assert_eq!(pwned, json!(true));
    // Its event's latest value, refreshed without a reload; then the refresh stops.
    wait_for_all(client, "#events-box[data-terminal=true]", 1).await?;
    let phase = client
        .find(Locator::Css("#events-box #events tbody tr td:last-child"))
        .await?
        .text()
        .await?;
    assert_eq!(phase, "\"done\"");

    // Completed: its timeline draws a bar per step; the README shows this page.
    client
        .goto(&format!("{base}/instances/streamer/s-1"))
        .await?;
    wait_for_all(client, ".stream[data-ended=true]", 1).await?;
    let steps = client
        .find_all(Locator::Css("#timeline tbody tr.step"))
        .await?;
    let bars = client
        .find_all(Locator::Css("#timeline-chart rect.bar"))
        .await?;
    assert_eq!(bars.len(), steps.len());
    assert!(!client
        .find_all(Locator::Css("#timeline-chart rect.parked.await"))
        .await?
        .is_empty());
    // The failed first attempt of its retried step: a bar and a tick on the step's lane.
    let fetch = client
        .find_all(Locator::Css(
            "#timeline-chart g.lane[data-step=fetch] rect.bar",
        ))
        .await?;
    assert_eq!(fetch.len(), 2, "the failed attempt and the success");
    assert_eq!(
        client
            .find_all(Locator::Css(
                "#timeline-chart g.lane[data-step=fetch] line.tick"
            ))
            .await?
            .len(),
        1
    );
    screenshot(client, "ui-instance.png").await?;
    Ok(())
}

/// The queues from the menu, a queue's page, a key's runs, and a pause through the form.
async fn drive_queue(client: &fantoccini::Client, base: &str, h: &Harness) -> TestResult {
    client.goto(&format!("{base}/")).await?;
    client
        .find(Locator::LinkText("Queues"))
        .await?
        .click()
        .await?;
    wait_for_url(client, "/queues").await?;
    let rows = client.find_all(Locator::Css("#queues tbody tr")).await?;
    assert_eq!(rows.len(), 1, "the seeded queue");
    let row = client
        .find(Locator::Css(&format!("#queues tr[data-queue={QUEUE}]")))
        .await?
        .text()
        .await?;
    assert!(
        row.contains("admitting") && row.contains("at concurrency"),
        "{row}"
    );

    // The queue's page: its keys, each a link to its runs.
    client.find(Locator::LinkText(QUEUE)).await?.click().await?;
    wait_for_url(client, &format!("/queues/{QUEUE}")).await?;
    let keys = client.find_all(Locator::Css("#keys tbody tr")).await?;
    assert_eq!(keys.len(), 3, "acme, the markup key and no key");
    client
        .find(Locator::LinkText("acme"))
        .await?
        .click()
        .await?;
    wait_for_url(client, "queue_key=acme").await?;
    let runs = client.find_all(Locator::Css("#instances tbody tr")).await?;
    assert_eq!(runs.len(), 2, "q-0 and q-1");
    client.back().await?;
    wait_for_url(client, &format!("/queues/{QUEUE}")).await?;

    // Pause with the token, through the confirmation dialog.
    client
        .find(Locator::Id("token"))
        .await?
        .send_keys(TOKEN)
        .await?;
    client
        .find(Locator::Id("action-pause"))
        .await?
        .click()
        .await?;
    let confirm = client.get_alert_text().await?;
    assert_eq!(confirm, format!("Pause queue {QUEUE}?"));
    client.accept_alert().await?;
    let notice = client.wait().for_element(Locator::Id("notice")).await?;
    assert!(notice.text().await?.contains("paused"));
    assert_eq!(
        client
            .find(Locator::Id("queue-state"))
            .await?
            .text()
            .await?,
        "paused"
    );
    assert!(client.find(Locator::Id("action-resume")).await.is_ok());
    assert!(h.keiro.queue(QUEUE).await?.expect("declared").paused);
    // For a look at the page; the README shows the instance page only.
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-queue.png");
    std::fs::write(&path, client.screenshot().await?)?;
    Ok(())
}

/// A page whose DNS name points at the dashboard (as a rebinding attack makes it) is refused,
/// page and API alike, while the dashboard's own name works; a dashboard on a database without
/// keiro's schema shows how to migrate it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_host_is_refused_and_an_empty_database_says_how_to_migrate() -> TestResult {
    let Some(tools) = browser_tools() else {
        return Ok(());
    };
    let h = Harness::postgres().await;
    seed(&h, &registry(broken())).await?;
    let ui = Ui::start(&h, Some(TOKEN));
    let empty = Harness::postgres().await;
    let db = empty.db.as_ref().expect("a Postgres harness");
    let schema = db.schema().to_owned();
    db.store()
        .pool()
        .get()
        .await?
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await?;
    let empty_ui = Ui::start(&empty, None);
    // attacker.example resolves to the dashboard's address, as a rebound DNS name does.
    let (_driver, client) = open_browser(
        &tools,
        &["--host-resolver-rules=MAP attacker.example 127.0.0.1"],
    )
    .await?;
    // On a task of its own, so that a failed assertion still closes the browser below.
    let (base, empty_base) = (ui.base.clone(), empty_ui.base.clone());
    let session = client.clone();
    let result = tokio::spawn(async move {
        let client = session;
        client.goto(&format!("{base}/instances")).await?;
        let rows = client.find_all(Locator::Css("#instances tbody tr")).await?;
        assert!(rows.len() >= 5, "its own name is served: {}", rows.len());

        let port = base.rsplit(':').next().expect("a port");
        client
            .goto(&format!("http://attacker.example:{port}/instances"))
            .await?;
        let body = client.find(Locator::Css("body")).await?.text().await?;
        assert!(body.contains("does not answer to that host"), "{body}");
        assert!(
            client
                .find_all(Locator::Css("#instances tbody tr"))
                .await?
                .is_empty(),
            "no instance is shown to another host"
        );
        // The rebound page's own script reads nothing either.
        let read = client
            .execute_async(
                "const done = arguments[arguments.length - 1];
                 fetch('/api/v1/instances/charge/c-1')
                   .then(r => done(r.status)).catch(e => done(String(e)));",
                vec![],
            )
            .await?;
        assert_eq!(read, json!(421));

        client.goto(&format!("{empty_base}/")).await?;
        let heading = client.find(Locator::Id("no-schema")).await?.text().await?;
        assert!(heading.contains(&schema), "{heading}");
        let command = client.find(Locator::Id("migrate")).await?.text().await?;
        assert!(
            command.contains(&format!("migrate --schema {schema}")),
            "{command}"
        );
        let body = client.find(Locator::Css("body")).await?.text().await?;
        assert!(
            body.contains("--schema") && body.contains("keiro ui"),
            "{body}"
        );
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    })
    .await;
    let _ = client.close().await;
    match result {
        Ok(result) => result,
        Err(failed) => std::panic::resume_unwind(failed.into_panic()),
    }
}

/// Waits (5 s at most) until the browser's URL contains `part`: a click's navigation.
async fn wait_for_url(client: &fantoccini::Client, part: &str) -> TestResult {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let now = client.current_url().await?;
        if now.as_str().contains(part) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("the browser is at {now}, not at {part}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
