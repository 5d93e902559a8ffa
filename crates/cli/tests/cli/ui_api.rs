//! `keiro ui`'s JSON API and pages, driven over HTTP against a seeded schema: counts, the
//! list and its typed 400s, an instance, the actions and their token checks, the body limit,
//! a stored XSS payload rendered inert, and the queues (figures, limits reached, busiest keys,
//! pause and resume under the instance actions' rules).

use std::sync::atomic::Ordering;

use crate::ui_support::{
    broken, drive_until, registry, seed, seed_queue, seed_stream, seed_waits, Ui, MARKUP_KEY,
    QUEUE, STREAM_MARKUP, TOKEN, XSS, XSS_TOKEN,
};
use keiro::Status;
use keiro_tests::{Harness, TestResult};
use reqwest::StatusCode;
use serde_json::{json, Value};

async fn get_json(
    client: &reqwest::Client,
    url: &str,
) -> Result<(StatusCode, Value), reqwest::Error> {
    let response = client.get(url).send().await?;
    let status = response.status();
    Ok((status, response.json().await?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_reads_filters_and_refuses_bad_input() -> TestResult {
    let h = Harness::postgres().await;
    let registry = registry(broken());
    seed(&h, &registry).await?;
    let ui = Ui::start(&h, Some(TOKEN));
    let client = reqwest::Client::new();
    let api = format!("{}/api/v1", ui.base);

    let (status, counts) = get_json(&client, &format!("{api}/counts")).await?;
    assert_eq!(status, StatusCode::OK);
    let failed = counts["instances"]
        .as_array()
        .expect("instances")
        .iter()
        .find(|c| c["name"] == "charge" && c["status"] == "failed")
        .expect("the failed charge is counted");
    assert_eq!(failed["count"], 1);

    let (status, page) = get_json(&client, &format!("{api}/instances?status=failed")).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["instances"].as_array().map(Vec::len), Some(1));
    assert_eq!(page["instances"][0]["id"], "c-1");

    // Paging: the cursor of a one-row page leads to the next row.
    let (_, first) = get_json(&client, &format!("{api}/instances?name=greet&limit=1")).await?;
    let cursor = first["next_cursor"].as_str().expect("more than one greet");
    let (status, second) = get_json(
        &client,
        &format!("{api}/instances?name=greet&limit=1&cursor={cursor}"),
    )
    .await?;
    assert_eq!(status, StatusCode::OK);
    assert_ne!(second["instances"][0]["id"], first["instances"][0]["id"]);

    // An unknown filter, a bad value and a malformed cursor: 400 with a typed body.
    let (status, body) = get_json(&client, &format!("{api}/instances?colour=red")).await?;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"], "filter");
    assert!(
        body["message"].as_str().unwrap_or("").contains("colour"),
        "{body}"
    );
    let (status, body) = get_json(&client, &format!("{api}/instances?status=sleepy")).await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("filter"))
    );
    let (status, body) = get_json(&client, &format!("{api}/instances?cursor=not-a-cursor")).await?;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"], "cursor");
    let (status, body) = get_json(&client, &format!("{api}/instances?limit=0")).await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("filter"))
    );

    // An instance: row, timeline, remote tasks, children; 404 for an unknown one.
    let (status, charge) = get_json(&client, &format!("{api}/instances/charge/c-1")).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(charge["status"], "failed");
    assert_eq!(charge["input"], 42);
    let steps: Vec<&str> = charge["timeline"]
        .as_array()
        .expect("timeline")
        .iter()
        .filter_map(|t| t["step"].as_str())
        .collect();
    assert!(steps.contains(&"authorize"), "{steps:?}");
    assert!(charge["remote_tasks"].is_array() && charge["children"].is_array());
    let (status, body) = get_json(&client, &format!("{api}/instances/charge/nope")).await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );

    // Actions: no token 401, a wrong one 403, and nothing changed.
    let requeue = format!("{api}/instances/charge/c-1/requeue");
    let response = client.post(&requeue).send().await?;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let response = client.post(&requeue).bearer_auth("guess").send().await?;
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let response = client
        .post(&requeue)
        .header("authorization", format!("Basic {TOKEN}"))
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        keiro_tests::status(&h.keiro, "charge", "c-1").await?,
        Some(Status::Failed)
    );

    // An oversized retry-with-input body is refused before it is read whole.
    let huge = json!({"input": "x".repeat(200 * 1024)});
    let response = client
        .post(format!("{api}/instances/charge/c-1/retry-with-input"))
        .bearer_auth(TOKEN)
        .json(&huge)
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    // Malformed JSON is 400; a refused action (cancelling a completed run) 409.
    let response = client
        .post(format!("{api}/instances/charge/c-1/retry-with-input"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let response = client
        .post(format!("{api}/instances/greet/xss-1/cancel"))
        .bearer_auth(TOKEN)
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let response = client
        .post(format!("{api}/instances/charge/c-1/explode"))
        .bearer_auth(TOKEN)
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);

    // With the token, requeue runs (the next test sees the run complete).
    let response = client.post(&requeue).bearer_auth(TOKEN).send().await?;
    assert_eq!(response.status(), StatusCode::OK);
    let done: Value = response.json().await?;
    assert_eq!(done["action"], "requeue");
    Ok(())
}

/// Sends a request declaring a `len`-byte body over a raw connection: the headers and half
/// the body, then a pause until the server answers (1 s at most), then the rest in paced
/// chunks; then reads the status line. Errors name the step that failed.
fn send_paced(address: &str, path: &str, len: usize) -> Result<String, String> {
    use std::io::{BufRead, BufReader, Write};
    const CHUNK: usize = 16 * 1024;
    let mut stream = std::net::TcpStream::connect(address).map_err(|e| e.to_string())?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
    );
    stream
        .write_all(head.as_bytes())
        .map_err(|e| format!("sending the headers: {e}"))?;
    let chunk = vec![b'x'; CHUNK];
    let chunks = len / CHUNK;
    for _ in 0..chunks / 2 {
        stream
            .write_all(&chunk)
            .map_err(|e| format!("sending the first half: {e}"))?;
    }
    // A server that answers without reading the body answers now; the rest of the body is
    // then written after its answer, into a connection it closed with bytes unread (which
    // resets it). A server that reads the body first answers only once it has all of it.
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(1)))
        .map_err(|e| e.to_string())?;
    let _ = stream.peek(&mut [0_u8; 1]);
    for _ in chunks / 2..chunks {
        std::thread::sleep(std::time::Duration::from_millis(5));
        stream
            .write_all(&chunk)
            .map_err(|e| format!("sending the second half: {e}"))?;
    }
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(stream)
        .read_line(&mut line)
        .map_err(|e| format!("reading the status line: {e}"))?;
    Ok(line)
}

/// A body declared over the limit (and at most 1 MiB) is read and dropped before the 413, so a
/// client still sending it gets the answer, not a reset connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_still_sending_an_oversized_body_gets_the_413() -> TestResult {
    let h = Harness::postgres().await;
    let ui = Ui::start(&h, Some(TOKEN));
    let address = ui
        .base
        .strip_prefix("http://")
        .ok_or("the base is http")?
        .to_owned();
    let line = tokio::task::spawn_blocking(move || {
        send_paced(
            &address,
            "/api/v1/instances/charge/c-1/retry-with-input",
            512 * 1024,
        )
    })
    .await??;
    assert!(line.starts_with("HTTP/1.1 413 "), "{line:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_shows_its_timers_awakeables_signal_waits_and_children() -> TestResult {
    let h = Harness::postgres().await;
    let registry = registry(broken());
    seed_waits(&h, &registry).await?;
    let ui = Ui::start(&h, Some(TOKEN));
    let client = reqwest::Client::new();
    let api = format!("{}/api/v1", ui.base);

    // The JSON: both timers scheduled (the sleep, the signal wait's timeout with its token),
    // the pending awakeable, the signal wait with its timeout.
    let (status, waiter) = get_json(&client, &format!("{api}/instances/waiter/w-1")).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(waiter["status"], "suspended");
    assert_eq!(waiter["open_refusals"], 0, "{waiter}");
    let timers = waiter["timers"].as_array().expect("timers");
    assert_eq!(timers.len(), 2, "{waiter}");
    let wait_step = format!("signal:{XSS_TOKEN}:1");
    let nap = timers
        .iter()
        .find(|t| t["step"] == "sleep:nap")
        .expect("the sleep");
    assert_eq!(
        (&nap["kind"], &nap["state"], &nap["attempts"]),
        (&json!("sleep"), &json!("scheduled"), &json!(0))
    );
    assert!(nap["fire_at"].is_string() && nap["fired_at"].is_null());
    let timeout = timers
        .iter()
        .find(|t| t["step"] == wait_step.as_str())
        .expect("the signal wait's timeout");
    assert_eq!(
        (&timeout["kind"], &timeout["token"]),
        (&json!("signal_timeout"), &json!(XSS_TOKEN))
    );
    let awakeables = waiter["awakeables"].as_array().expect("awakeables");
    assert_eq!(awakeables.len(), 1);
    assert_eq!(awakeables[0]["status"], "pending");
    let awakeable = awakeables[0]["id"].as_str().expect("an id").to_owned();
    let waits = waiter["signal_waits"].as_array().expect("signal waits");
    assert_eq!(waits.len(), 1);
    assert_eq!(
        (
            &waits[0]["token"],
            &waits[0]["step"],
            &waits[0]["timeout_at"]
        ),
        (&json!(XSS_TOKEN), &json!(wait_step), &timeout["fire_at"])
    );
    assert_eq!(waiter["waits_truncated"], false);

    // A parent lists its child with status and attempts.
    let (_, family) = get_json(&client, &format!("{api}/instances/family/f-1")).await?;
    let children = family["children"].as_array().expect("children");
    assert_eq!(children.len(), 1, "{family}");
    assert_eq!(
        (
            &children[0]["name"],
            &children[0]["id"],
            &children[0]["status"]
        ),
        (&json!("greet"), &json!("kid-1"), &json!("completed"))
    );
    assert_eq!(children[0]["attempts"], 0);

    // The page: a table each, the token escaped wherever it appears.
    let page = client
        .get(format!("{}/instances/waiter/w-1", ui.base))
        .send()
        .await?
        .text()
        .await?;
    for table in [
        "timers",
        "awakeables",
        "signal-waits",
        "remote-tasks",
        "children",
    ] {
        assert!(page.contains(&format!("id=\"{table}\"")), "no #{table}");
    }
    assert!(page.contains("sleep:nap") && page.contains("scheduled"));
    assert!(page.contains(&awakeable) && page.contains("pending"));
    assert!(page.contains("&lt;script&gt;window.keiroPwned=3&lt;/script&gt;"));
    assert!(!page.contains(XSS_TOKEN), "the token is markup on the page");
    let page = client
        .get(format!("{}/instances/family/f-1", ui.base))
        .send()
        .await?
        .text()
        .await?;
    assert!(page.contains("href=\"/instances/greet/kid-1\""), "{page}");

    // `keiro show` prints the same sections.
    let db = h.db.as_ref().expect("a Postgres harness");
    let show = |name: &str, id: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_keiro"))
            .env("DATABASE_URL", db.url())
            .env("KEIRO_SCHEMA", db.schema())
            .args(["show", name, id])
            .output()
    };
    let shown = show("waiter", "w-1")?;
    let text = String::from_utf8(shown.stdout)?;
    assert!(shown.status.success(), "{text}");
    for line in [
        "timers 2",
        "awakeables 1",
        "signal waits 1",
        "sleep:nap",
        "scheduled",
    ] {
        assert!(text.contains(line), "no {line:?} in {text}");
    }
    assert!(text.contains(&format!("token {XSS_TOKEN}")), "{text}");
    let shown = show("family", "f-1")?;
    let text = String::from_utf8(shown.stdout)?;
    assert!(
        text.contains("children 1") && text.contains("greet/kid-1"),
        "{text}"
    );

    // Once the awakeable is completed and the signal sent, the page says so.
    h.keiro
        .complete_awakeable(awakeable.parse()?, &"yes")
        .await?;
    h.keiro.signal(XSS_TOKEN, &"hi").await?;
    let (_, waiter) = get_json(&client, &format!("{api}/instances/waiter/w-1")).await?;
    assert_eq!(waiter["awakeables"][0]["status"], "completed");
    assert!(waiter["awakeables"][0]["settled_at"].is_string());
    assert_eq!(waiter["signal_waits"], json!([]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeue_through_the_api_lets_the_run_complete() -> TestResult {
    let h = Harness::postgres().await;
    let broken = broken();
    let registry = registry(broken.clone());
    seed(&h, &registry).await?;
    let ui = Ui::start(&h, Some(TOKEN));
    broken.store(false, Ordering::SeqCst);
    let response = reqwest::Client::new()
        .post(format!("{}/api/v1/instances/charge/c-1/requeue", ui.base))
        .bearer_auth(TOKEN)
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::OK);
    drive_until(&h, &registry, "charge", "c-1", Status::Completed).await?;
    let row = h.keiro.instance(("charge", "c-1")).await?.expect("row");
    assert_eq!(row.output, Some(json!("auth-42 captured")));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_the_dashboard_is_read_only() -> TestResult {
    let h = Harness::postgres().await;
    let registry = registry(broken());
    seed(&h, &registry).await?;
    let ui = Ui::start(&h, None);
    let client = reqwest::Client::new();
    let (status, _) = get_json(&client, &format!("{}/api/v1/counts", ui.base)).await?;
    assert_eq!(status, StatusCode::OK);
    for token in [None, Some(TOKEN), Some("")] {
        let mut request = client.post(format!("{}/api/v1/instances/charge/c-1/requeue", ui.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await?;
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        let body: Value = response.json().await?;
        assert_eq!(body["error"], "read_only");
    }
    // The page's action form: refused too, and the page shows no form.
    let response = client
        .post(format!("{}/instances/charge/c-1/requeue", ui.base))
        .form(&[("token", TOKEN), ("csrf", "x")])
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let page = client
        .get(format!("{}/instances/charge/c-1", ui.base))
        .send()
        .await?
        .text()
        .await?;
    assert!(page.contains("Read-only") && !page.contains("action-requeue"));
    assert_eq!(
        keiro_tests::status(&h.keiro, "charge", "c-1").await?,
        Some(Status::Failed)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_escape_stored_values_and_forms_need_the_csrf_value() -> TestResult {
    let h = Harness::postgres().await;
    let registry = registry(broken());
    seed(&h, &registry).await?;
    let ui = Ui::start(&h, Some(TOKEN));
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;

    let response = client
        .get(format!("{}/instances/greet/xss-1", ui.base))
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::OK);
    let csp = response
        .headers()
        .get("content-security-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    let page = response.text().await?;
    // The payload is there, as text: every `<` escaped, no live tag or handler.
    assert!(
        page.contains("&lt;script&gt;window.keiroPwned=1&lt;/script&gt;"),
        "{page}"
    );
    assert!(!page.contains(XSS) && !page.contains("<script>window"));
    assert!(!page.contains("<img src=x"));
    assert!(!page.contains("<i>operator</i>") && page.contains("&lt;i&gt;operator&lt;/i&gt;"));
    // The failure reason of the charge is escaped on the list page too.
    let list = client
        .get(format!("{}/instances?status=failed", ui.base))
        .send()
        .await?
        .text()
        .await?;
    assert!(list.contains("&lt;b&gt;gateway&lt;/b&gt;") && !list.contains("<b>gateway"));
    // A bad filter on the page: 400, with the error escaped.
    let response = client
        .get(format!("{}/instances?%3Cscript%3E=1", ui.base))
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let text = response.text().await?;
    assert!(
        !text.contains("<script>") || text.matches("<script").count() == 1,
        "{text}"
    );
    assert!(text.contains("&lt;script&gt;"));

    // The form: the token is never in the page; the CSRF value is, and is required.
    let page = client
        .get(format!("{}/instances/charge/c-1", ui.base))
        .send()
        .await?
        .text()
        .await?;
    assert!(!page.contains(TOKEN));
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a csrf field")
        .to_owned();
    let action = format!("{}/instances/charge/c-1/resurrect", ui.base);
    let refused = [
        (vec![("token", TOKEN)], StatusCode::FORBIDDEN),
        (
            vec![("token", TOKEN), ("csrf", "forged")],
            StatusCode::FORBIDDEN,
        ),
        (vec![("csrf", csrf.as_str())], StatusCode::UNAUTHORIZED),
        (
            vec![("token", "guess"), ("csrf", csrf.as_str())],
            StatusCode::FORBIDDEN,
        ),
    ];
    for (form, status) in refused {
        let response = client.post(&action).form(&form).send().await?;
        assert_eq!(response.status(), status, "{form:?}");
    }
    assert_eq!(
        keiro_tests::status(&h.keiro, "charge", "c-1").await?,
        Some(Status::Failed)
    );
    let response = client
        .post(&action)
        .form(&[("token", TOKEN), ("csrf", csrf.as_str())])
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        keiro_tests::status(&h.keiro, "charge", "c-1").await?,
        Some(Status::Running)
    );
    Ok(())
}

/// A request to `url` naming `host` as its `Host`.
async fn get_as(
    client: &reqwest::Client,
    url: &str,
    host: &str,
) -> Result<StatusCode, reqwest::Error> {
    Ok(client
        .get(url)
        .header(reqwest::header::HOST, host)
        .send()
        .await?
        .status())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_for_another_host_is_refused_on_every_route() -> TestResult {
    let h = Harness::postgres().await;
    let registry = registry(broken());
    seed(&h, &registry).await?;
    let ui = Ui::start_with(
        &h,
        Some(TOKEN),
        &["--listen", "127.0.0.1:0", "--public-host", "dash.example"],
    );
    let port = ui.base.rsplit(':').next().expect("a port").to_owned();
    let client = reqwest::Client::new();
    let reads = [
        "/",
        "/instances",
        "/instances/charge/c-1",
        "/assets/app.js",
        "/api/v1/counts",
        "/api/v1/instances",
        "/api/v1/instances/charge/c-1",
        "/queues",
        "/queues/llm",
        "/api/v1/queues",
        "/api/v1/queues/llm",
        "/api/v1/throughput",
        "/api/v1/instances/charge/c-1/streams/progress",
        "/instances/charge/c-1/streams/progress",
        "/instances/charge/c-1/events/phase",
        "/no/such/route",
    ];
    // A page whose DNS name was rebound to 127.0.0.1 still says its own name.
    for path in reads {
        let url = format!("{}{path}", ui.base);
        for host in ["attacker.example", &format!("attacker.example:{port}")] {
            let status = get_as(&client, &url, host).await?;
            assert!(
                status == StatusCode::MISDIRECTED_REQUEST || status == StatusCode::FORBIDDEN,
                "{path} as {host}: {status}"
            );
        }
    }
    let requeue = format!("{}/api/v1/instances/charge/c-1/requeue", ui.base);
    let status = client
        .post(&requeue)
        .header(reqwest::header::HOST, format!("attacker.example:{port}"))
        .bearer_auth(TOKEN)
        .send()
        .await?
        .status();
    assert_eq!(status, StatusCode::MISDIRECTED_REQUEST);
    assert_eq!(
        keiro_tests::status(&h.keiro, "charge", "c-1").await?,
        Some(Status::Failed),
        "nothing was done for another host"
    );
    // The bound address's names, and the public host, are served.
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        "dash.example".to_owned(),
        format!("dash.example:{port}"),
    ] {
        let status = get_as(&client, &format!("{}/api/v1/counts", ui.base), &host).await?;
        assert_eq!(status, StatusCode::OK, "{host}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_from_another_origin_are_refused() -> TestResult {
    let h = Harness::postgres().await;
    let registry = registry(broken());
    seed(&h, &registry).await?;
    let ui = Ui::start(&h, Some(TOKEN));
    let client = reqwest::Client::new();
    let requeue = format!("{}/api/v1/instances/charge/c-1/requeue", ui.base);
    for origin in ["http://attacker.example", "null", "http://localhost:1"] {
        let response = client
            .post(&requeue)
            .header(reqwest::header::ORIGIN, origin)
            .bearer_auth(TOKEN)
            .send()
            .await?;
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{origin}");
    }
    // The page's own form, posted from another origin with the right token and CSRF value.
    let page = client
        .get(format!("{}/instances/charge/c-1", ui.base))
        .send()
        .await?
        .text()
        .await?;
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the form carries the CSRF value")
        .to_owned();
    let form = client
        .post(format!("{}/instances/charge/c-1/requeue", ui.base))
        .header(reqwest::header::ORIGIN, "http://attacker.example")
        .form(&[("token", TOKEN), ("csrf", csrf.as_str())])
        .send()
        .await?;
    assert_eq!(form.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        keiro_tests::status(&h.keiro, "charge", "c-1").await?,
        Some(Status::Failed),
        "nothing was done for another origin"
    );
    // Its own origin may act.
    let response = client
        .post(&requeue)
        .header(reqwest::header::ORIGIN, ui.base.as_str())
        .bearer_auth(TOKEN)
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::OK);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bound_beyond_loopback_it_needs_a_token_for_reads_too() -> TestResult {
    let h = Harness::postgres().await;
    // Without a token it does not start, and says why.
    let mut child = crate::ui_support::ui_command(&h, None, &["--listen", "0.0.0.0:0"])
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let mut exited = None;
    for _ in 0..100 {
        if let Some(status) = child.try_wait()? {
            exited = Some(status);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let Some(status) = exited else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("keiro ui started on 0.0.0.0 without a token");
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("piped"), &mut stderr)?;
    assert!(!status.success());
    assert!(
        stderr.contains("0.0.0.0") && stderr.contains("--token") && stderr.contains("loopback"),
        "{stderr}"
    );

    // With one, every read needs it as well.
    let ui = Ui::start_with(&h, Some(TOKEN), &["--listen", "0.0.0.0:0"]);
    let port = ui.base.rsplit(':').next().expect("a port").to_owned();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    for path in ["/", "/instances", "/api/v1/counts", "/api/v1/instances"] {
        let url = format!("{base}{path}");
        let status = client.get(&url).send().await?.status();
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
        let status = client.get(&url).bearer_auth("guess").send().await?.status();
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}");
        let status = client.get(&url).bearer_auth(TOKEN).send().await?.status();
        assert_eq!(status, StatusCode::OK, "{path}");
        // A browser asks for it once and sends it as Basic credentials.
        let status = client
            .get(&url)
            .basic_auth("operator", Some(TOKEN))
            .send()
            .await?
            .status();
        assert_eq!(status, StatusCode::OK, "{path}");
    }
    let asked = client.get(format!("{base}/")).send().await?;
    assert!(
        asked
            .headers()
            .contains_key(reqwest::header::WWW_AUTHENTICATE),
        "a browser is asked for the token"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_without_keiros_schema_says_how_to_migrate() -> TestResult {
    let h = Harness::postgres().await;
    let db = h.db.as_ref().expect("a Postgres harness");
    let schema = db.schema().to_owned();
    db.store()
        .pool()
        .get()
        .await?
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await?;
    let ui = Ui::start(&h, None);
    let client = reqwest::Client::new();
    for path in [
        "/",
        "/instances",
        "/instances/charge/c-1",
        "/queues",
        "/queues/llm",
    ] {
        let response = client.get(format!("{}{path}", ui.base)).send().await?;
        let status = response.status();
        let page = response.text().await?;
        assert_ne!(status, StatusCode::INTERNAL_SERVER_ERROR, "{path}: {page}");
        assert!(
            page.contains(&schema) && page.contains("keiro migrate") && page.contains("--schema"),
            "{path}: {page}"
        );
    }
    let (status, body) = get_json(&client, &format!("{}/api/v1/counts", ui.base)).await?;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"], "schema_not_migrated", "{body}");
    Ok(())
}

/// The CSRF value a page's action form carries.
fn csrf_of(page: &str) -> String {
    page.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a csrf field")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_api_shows_figures_limits_reached_and_busiest_keys() -> TestResult {
    let h = Harness::postgres().await;
    seed_queue(&h).await?;
    let ui = Ui::start(&h, Some(TOKEN));
    let client = reqwest::Client::new();
    let api = format!("{}/api/v1", ui.base);

    let (status, all) = get_json(&client, &format!("{api}/queues")).await?;
    assert_eq!(status, StatusCode::OK);
    let all = all.as_array().expect("an array of queues");
    assert_eq!(all.len(), 1, "{all:?}");
    let (status, llm) = get_json(&client, &format!("{api}/queues/{QUEUE}")).await?;
    assert_eq!(status, StatusCode::OK);
    for queue in [&all[0], &llm] {
        assert_eq!(queue["name"], QUEUE);
        assert_eq!(queue["paused"], false);
        // Two admitted and parked holding their slots (one per key), three waiting.
        assert_eq!(
            (
                &queue["waiting"],
                &queue["delayed"],
                &queue["ready"],
                &queue["running"]
            ),
            (&json!(3), &json!(1), &json!(2), &json!(2)),
            "{queue}"
        );
        assert_eq!(
            queue["limits"],
            json!({
                "concurrency": 2, "worker_concurrency": null, "key_concurrency": 1,
                "rate": {"limit": 100, "period_ms": 60_000}, "key_rate": null,
                "priority": false, "fairness": "fifo", "dedup": null, "release_on_park": false,
            })
        );
        // At its concurrency and, for both keys with runs waiting, at the per-key limit; 2
        // of 100 starts a minute is not the rate.
        assert_eq!(
            queue["at_limit"],
            json!({"concurrency": true, "key_concurrency": true, "rate": false}),
            "{queue}"
        );
        assert_eq!(queue["admitted_recently"], 2);
        assert_eq!(queue["admitted_window_ms"], 60_000);
        let per_second = queue["admitted_per_second"].as_f64().expect("a number");
        assert!((per_second - 2.0 / 60.0).abs() < 1e-9, "{per_second}");
        assert!(queue["oldest_waiting"].is_string(), "{queue}");
        assert!(queue["oldest_waiting_ms"]
            .as_i64()
            .is_some_and(|ms| ms >= 0));
        // Each key: one waiting, one holding a slot (at its limit); the delayed run has none.
        let mut keys = queue["top_keys"].as_array().expect("top keys").clone();
        keys.sort_by_key(|k| k["key"].as_str().map(str::to_owned));
        assert_eq!(
            keys,
            [
                json!({"key": null, "waiting": 1, "running": 0, "at_key_concurrency": false}),
                json!({"key": MARKUP_KEY, "waiting": 1, "running": 1, "at_key_concurrency": true}),
                json!({"key": "acme", "waiting": 1, "running": 1, "at_key_concurrency": true}),
            ]
        );
    }

    // An undeclared queue: 404 with a typed body, read or acted on.
    let (status, body) = get_json(&client, &format!("{api}/queues/nope")).await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    assert!(body["message"].as_str().unwrap_or("").contains("nope"));
    let response = client
        .post(format!("{api}/queues/nope/pause"))
        .bearer_auth(TOKEN)
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let body: Value = response.json().await?;
    assert_eq!(body["error"], "not_found");

    // The list by queue and key.
    let (status, page) = get_json(
        &client,
        &format!("{api}/instances?queue={QUEUE}&queue_key=acme"),
    )
    .await?;
    assert_eq!(status, StatusCode::OK);
    let mut ids: Vec<&str> = page["instances"]
        .as_array()
        .expect("instances")
        .iter()
        .filter_map(|row| row["id"].as_str())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, ["q-0", "q-1"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_pause_and_resume_are_refused_and_allowed_as_instance_actions_are() -> TestResult {
    let h = Harness::postgres().await;
    seed_queue(&h).await?;
    let paused =
        || async { Ok::<_, keiro::Error>(h.keiro.queue(QUEUE).await?.expect("declared").paused) };
    let ui = Ui::start(&h, Some(TOKEN));
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let pause = format!("{}/api/v1/queues/{QUEUE}/pause", ui.base);

    // No token 401, a wrong one 403, Basic credentials are no bearer token, another origin
    // 403 even with the token; nothing paused.
    assert_eq!(
        client.post(&pause).send().await?.status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        client
            .post(&pause)
            .bearer_auth("guess")
            .send()
            .await?
            .status(),
        StatusCode::FORBIDDEN
    );
    let response = client
        .post(&pause)
        .header("authorization", format!("Basic {TOKEN}"))
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    for origin in ["http://attacker.example", "null"] {
        let response = client
            .post(&pause)
            .header(reqwest::header::ORIGIN, origin)
            .bearer_auth(TOKEN)
            .send()
            .await?;
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{origin}");
    }
    // The token is checked before the action is looked at.
    let response = client
        .post(format!("{}/api/v1/queues/{QUEUE}/explode", ui.base))
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert!(!paused().await?, "nothing was paused without the token");

    // The page's form: the CSRF value and the token, each required.
    let page = client
        .get(format!("{}/queues/{QUEUE}", ui.base))
        .send()
        .await?
        .text()
        .await?;
    assert!(!page.contains(TOKEN));
    let csrf = csrf_of(&page);
    let form_pause = format!("{}/queues/{QUEUE}/pause", ui.base);
    let refused = [
        (vec![("token", TOKEN)], StatusCode::FORBIDDEN),
        (
            vec![("token", TOKEN), ("csrf", "forged")],
            StatusCode::FORBIDDEN,
        ),
        (vec![("csrf", csrf.as_str())], StatusCode::UNAUTHORIZED),
        (
            vec![("token", "guess"), ("csrf", csrf.as_str())],
            StatusCode::FORBIDDEN,
        ),
    ];
    for (form, status) in refused {
        let response = client.post(&form_pause).form(&form).send().await?;
        assert_eq!(response.status(), status, "{form:?}");
    }
    let response = client
        .post(&form_pause)
        .header(reqwest::header::ORIGIN, "http://attacker.example")
        .form(&[("token", TOKEN), ("csrf", csrf.as_str())])
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert!(!paused().await?, "nothing was paused by a refused form");

    // With the token: paused, then resumed (idempotent both ways).
    for _ in 0..2 {
        let response = client.post(&pause).bearer_auth(TOKEN).send().await?;
        assert_eq!(response.status(), StatusCode::OK);
        let done: Value = response.json().await?;
        assert_eq!(done["action"], "pause");
        assert!(paused().await?);
    }
    let (_, llm) = get_json(&client, &format!("{}/api/v1/queues/{QUEUE}", ui.base)).await?;
    assert_eq!(llm["paused"], true);
    let response = client
        .post(format!("{}/api/v1/queues/{QUEUE}/resume", ui.base))
        .header(reqwest::header::ORIGIN, ui.base.as_str())
        .bearer_auth(TOKEN)
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(!paused().await?);
    let response = client
        .post(format!("{}/api/v1/queues/{QUEUE}/explode", ui.base))
        .bearer_auth(TOKEN)
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);

    // Through the form: a redirect back to the queue's page, which says so.
    let response = client
        .post(&form_pause)
        .form(&[("token", TOKEN), ("csrf", csrf.as_str())])
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let location = response
        .headers()
        .get(reqwest::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    assert!(
        location.starts_with(&format!("/queues/{QUEUE}?notice=")),
        "{location}"
    );
    assert!(paused().await?);
    let page = client
        .get(format!("{}{location}", ui.base))
        .send()
        .await?
        .text()
        .await?;
    assert!(
        page.contains("id=\"notice\"") && page.contains("paused"),
        "{page}"
    );
    assert!(page.contains("id=\"action-resume\"") && !page.contains("id=\"action-pause\""));
    let response = client
        .post(format!("{}/queues/nope/resume", ui.base))
        .form(&[("token", TOKEN), ("csrf", csrf.as_str())])
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);

    // Without a token the dashboard is read-only: refused whatever is sent, no form shown.
    let read_only = Ui::start(&h, None);
    for token in [None, Some(TOKEN)] {
        let mut request = client.post(format!("{}/api/v1/queues/{QUEUE}/resume", read_only.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await?;
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        let body: Value = response.json().await?;
        assert_eq!(body["error"], "read_only");
    }
    let response = client
        .post(format!("{}/queues/{QUEUE}/resume", read_only.base))
        .form(&[("token", TOKEN), ("csrf", "x")])
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let page = client
        .get(format!("{}/queues/{QUEUE}", read_only.base))
        .send()
        .await?
        .text()
        .await?;
    assert!(page.contains("Read-only") && !page.contains("action-resume"));
    assert!(paused().await?, "still paused");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_pages_show_limits_keys_and_runs_by_queue_and_key() -> TestResult {
    let h = Harness::postgres().await;
    seed_queue(&h).await?;
    let ui = Ui::start(&h, Some(TOKEN));
    let client = reqwest::Client::new();
    let get = |path: String| {
        let client = client.clone();
        async move { client.get(path).send().await?.text().await }
    };

    // The overview and every page's menu lead to the queues.
    let overview = get(format!("{}/", ui.base)).await?;
    assert!(overview.contains("href=\"/queues\""), "{overview}");

    let queues = get(format!("{}/queues", ui.base)).await?;
    assert!(
        queues.contains(&format!("href=\"/queues/{QUEUE}\"")),
        "{queues}"
    );
    assert!(queues.contains("concurrency 2, per key 1, rate 100/60s, keeps slots while parked"));
    assert!(queues.contains("at concurrency") && queues.contains("at key concurrency"));
    assert!(!queues.contains("at rate") && queues.contains("admitting"));
    assert!(queues.contains("<td class=\"waiting\">3</td>"), "{queues}");
    assert!(queues.contains("<td class=\"running\">2</td>"), "{queues}");

    let queue = get(format!("{}/queues/{QUEUE}", ui.base)).await?;
    assert!(queue.contains("3 (1 delayed, 2 ready)"), "{queue}");
    assert!(queue.contains("2 in the last 1m (0.03/s)"), "{queue}");
    // Each key links to its runs; the markup key is text, and encoded in its link.
    assert!(queue.contains(&format!(
        "href=\"/instances?queue={QUEUE}&amp;queue_key=acme\""
    )));
    assert!(queue.contains("href=\"/instances?queue=llm&amp;queue_key=%3Ci%3Eglobex%3C%2Fi%3E\""));
    assert!(queue.contains("&lt;i&gt;globex&lt;/i&gt;") && !queue.contains(MARKUP_KEY));
    assert!(queue.contains("(no key)") && queue.contains("id=\"action-pause\""));
    assert!(
        queue.contains("data-confirm=\"Pause queue llm?\""),
        "{queue}"
    );

    // The list by queue and key, through the form's fields, shows the queue and key.
    let list = get(format!(
        "{}/instances?queue={QUEUE}&queue_key=acme",
        ui.base
    ))
    .await?;
    assert!(list.contains("name=\"queue\" value=\"llm\""), "{list}");
    assert!(list.contains("name=\"queue_key\" value=\"acme\""), "{list}");
    assert!(list.contains(">q-0<") && list.contains(">q-1<") && !list.contains(">q-2<"));
    assert!(list.contains(&format!("href=\"/queues/{QUEUE}\"")));
    let list = get(format!("{}/instances?queue={QUEUE}", ui.base)).await?;
    assert_eq!(
        list.matches("delayed until ").count(),
        1,
        "only q-4: {list}"
    );

    let missing = client
        .get(format!("{}/queues/nope", ui.base))
        .send()
        .await?;
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throughput_and_streams_read_as_json_and_pages_show_charts_times_and_durations(
) -> TestResult {
    let h = Harness::postgres().await;
    let registry = registry(broken());
    seed(&h, &registry).await?;
    seed_stream(&h, &registry).await?;
    let ui = Ui::start(&h, Some(TOKEN));
    let client = reqwest::Client::new();
    let api = format!("{}/api/v1", ui.base);

    // The last hour by minute: greet/xss-1 completed and charge/c-1 failed in it.
    let (status, hour) = get_json(&client, &format!("{api}/throughput")).await?;
    assert_eq!(status, StatusCode::OK, "{hour}");
    let buckets = hour["buckets"].as_array().expect("buckets");
    assert_eq!((buckets.len(), &hour["bucket_secs"]), (60, &json!(60)));
    let sum = |field: &str| -> u64 { buckets.iter().filter_map(|b| b[field].as_u64()).sum() };
    // Every run that ended did so in this last hour: the counts' terminal totals.
    let counts = h.keiro.counts().await?;
    let total = |status: Status| -> u64 {
        counts
            .instances
            .iter()
            .filter(|c| c.status == status)
            .map(|c| c.count)
            .sum()
    };
    assert!(total(Status::Completed) >= 1);
    assert_eq!(
        (sum("completed"), sum("failed")),
        (total(Status::Completed), 1),
        "{hour}"
    );
    let (_, seconds) = get_json(&client, &format!("{api}/throughput?bucket=1&buckets=600")).await?;
    assert_eq!(seconds["buckets"].as_array().map(Vec::len), Some(600));
    for bad in [
        "buckets=0",
        "bucket=0",
        "bucket=x",
        "colour=red",
        "buckets=1441",
    ] {
        let (status, body) = get_json(&client, &format!("{api}/throughput?{bad}")).await?;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert_eq!(body["error"], "filter", "{bad}: {body}");
    }

    // The stream, page by page from an offset; the instance's status says it may go on.
    let stream = format!("{api}/instances/streamer/s-1/streams/progress");
    let (status, page) = get_json(&client, &stream).await?;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(
        page["items"],
        json!([{"offset": 0, "value": STREAM_MARKUP}])
    );
    assert_eq!(
        (
            &page["next"],
            &page["closed"],
            &page["ends"],
            &page["status"]
        ),
        (&json!(1), &json!(false), &json!(false), &json!("suspended"))
    );
    let (_, empty) = get_json(&client, &format!("{stream}?from=1")).await?;
    assert_eq!((&empty["items"], &empty["next"]), (&json!([]), &json!(1)));
    h.keiro.deliver(("streamer", "s-1"), "go", &"two").await?;
    drive_until(&h, &registry, "streamer", "s-1", Status::Completed).await?;
    let (_, rest) = get_json(&client, &format!("{stream}?from=1")).await?;
    assert_eq!(rest["items"], json!([{"offset": 1, "value": "two"}]));
    assert_eq!(
        (&rest["next"], &rest["closed"], &rest["ends"]),
        (&json!(2), &json!(true), &json!(true))
    );
    let (status, _) = get_json(
        &client,
        &format!("{api}/instances/streamer/nobody/streams/progress"),
    )
    .await?;
    assert_eq!(status, StatusCode::NOT_FOUND);
    for bad in ["?from=-1", "?from=x", "?colour=red"] {
        let (status, body) = get_json(&client, &format!("{stream}{bad}")).await?;
        assert_eq!(
            (status, &body["error"]),
            (StatusCode::BAD_REQUEST, &json!("invalid")),
            "{bad}"
        );
    }

    // The pages: the overview's charts (drawn by the script), instants relative with the
    // absolute time on hover, a duration per row, the stream to follow, and the timeline.
    let text = |path: String| {
        let client = client.clone();
        async move { client.get(path).send().await?.text().await }
    };
    let overview = text(format!("{}/", ui.base)).await?;
    assert!(overview.contains("id=\"status-chart\""), "{overview}");
    assert!(overview.contains("data-live=\"/api/v1/throughput?bucket=60&amp;buckets=60\""));
    let list = text(format!("{}/instances?status=failed", ui.base)).await?;
    assert!(list.contains("<th>took</th>"), "{list}");
    assert!(list.contains("<td class=\"took\">"), "{list}");
    assert!(
        list.contains("<time datetime=\"")
            && (list.contains(">just now</time>") || list.contains(" s ago</time>")),
        "created moments ago, the absolute time its title: {list}"
    );
    let page = text(format!("{}/instances/streamer/s-1", ui.base)).await?;
    assert!(
        page.contains("data-follow=\"/api/v1/instances/streamer/s-1/streams/progress\""),
        "{page}"
    );
    assert!(page.contains("id=\"timeline-chart\""));
    assert!(page.contains("href=\"/instances/streamer/s-1/streams/progress\""));
    // The stream's own page follows it too; an unknown instance's is a 404.
    let response = client
        .get(format!(
            "{}/instances/streamer/s-1/streams/progress",
            ui.base
        ))
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::OK);
    let stream_page = response.text().await?;
    assert!(stream_page.contains("data-follow=\"/api/v1/instances/streamer/s-1/streams/progress\""));
    let missing = client
        .get(format!(
            "{}/instances/streamer/nobody/streams/progress",
            ui.base
        ))
        .send()
        .await?;
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);

    // Every filter stays in the URL: the form keeps the order, the page size and the filters
    // it has no field for, and the next page's link keeps them all.
    let since = "2020-01-01T00:00:00Z";
    let kept = text(format!(
        "{}/instances?status=completed&order=oldest_first&limit=1&finished_since={since}",
        ui.base
    ))
    .await?;
    assert!(
        kept.contains("<option value=\"oldest_first\" selected>"),
        "{kept}"
    );
    assert!(kept.contains("name=\"limit\" size=\"4\" placeholder=\"50\" value=\"1\""));
    assert!(kept.contains(&format!(
        "<input type=\"hidden\" name=\"finished_since\" value=\"{since}\">"
    )));
    assert!(
        kept.contains("finished_since=2020-01-01T00%3A00%3A00Z&amp;cursor="),
        "{kept}"
    );
    assert!(
        !page.contains(STREAM_MARKUP) && page.contains("&quot;done&quot;"),
        "{page}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_shows_its_version_and_warns_when_no_live_worker_serves_it() -> TestResult {
    use keiro::versions::{Versions, WorkerBeat};
    let h = Harness::postgres().await;
    let v1 = h.versioned("v1").await;
    v1.keiro.start("wf", "r-1", &1).await?;
    let ui = Ui::start(&h, None);
    let client = reqwest::Client::new();
    let url = format!("{}/api/v1/instances/wf/r-1", ui.base);
    let (status, body) = get_json(&client, &url).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (&body["app_version"], &body["version_served"]),
        (&json!("v1"), &json!(false))
    );
    let page_url = format!("{}/instances/wf/r-1", ui.base);
    let page = client.get(&page_url).send().await?.text().await?;
    assert!(
        page.contains(r#"id="app-version""#) && page.contains(">v1<"),
        "{page}"
    );
    assert!(page.contains("No live worker serves version v1"), "{page}");

    // A live worker serving v1: no warning.
    v1.versions
        .worker_beat(&WorkerBeat {
            worker_id: "w-1".into(),
            app_version: "v1".into(),
            serves: Versions::only(["v1"]),
            queues: Vec::new(),
        })
        .await?;
    let (_, body) = get_json(&client, &url).await?;
    assert_eq!(body["version_served"], json!(true));
    let page = client.get(&page_url).send().await?.text().await?;
    assert!(!page.contains("No live worker serves"), "{page}");
    Ok(())
}

/// The updates sent to a run show on its page and in its API, with their state and answer; a
/// request's markup is escaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_shows_the_updates_sent_to_it() -> TestResult {
    let h = Harness::postgres().await;
    h.keiro.start("approve", "a-1", &json!(null)).await?;
    // No worker serves the run: the update waits, `requested`, past its caller's timeout.
    let request = json!({"note": "<b id=update-markup>x</b>"});
    let sent = h
        .keiro
        .update_with::<_, Value>(
            ("approve", "a-1"),
            keiro::workflow::UpdateCall::new("decide", &request)
                .id("u-1")
                .timeout(std::time::Duration::from_millis(50)),
        )
        .await;
    assert!(
        matches!(sent, Err(keiro::Error::UpdateTimeout { .. })),
        "{sent:?}"
    );
    let ui = Ui::start(&h, Some(TOKEN));
    let client = reqwest::Client::new();
    let (status, body) = get_json(
        &client,
        &format!("{}/api/v1/instances/approve/a-1", ui.base),
    )
    .await?;
    assert_eq!(status, StatusCode::OK, "{body}");
    let updates = body["updates"].as_array().ok_or("updates")?;
    assert_eq!(updates.len(), 1, "{body}");
    assert_eq!(
        (
            &updates[0]["id"],
            &updates[0]["name"],
            &updates[0]["state"],
            &updates[0]["request"],
            &updates[0]["answer"],
        ),
        (
            &json!("u-1"),
            &json!("decide"),
            &json!("requested"),
            &request,
            &Value::Null
        )
    );
    let page = client
        .get(format!("{}/instances/approve/a-1", ui.base))
        .send()
        .await?
        .text()
        .await?;
    assert!(page.contains("id=\"updates\""), "{page}");
    assert!(page.contains("u-1") && page.contains("requested"), "{page}");
    assert!(!page.contains("<b id=update-markup>"), "{page}");
    Ok(())
}

/// An event has a page of its own: its current value and every write of it from the journal,
/// linked from the instance page; an unknown instance is a 404, an event never set says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_page_shows_its_value_and_every_write() -> TestResult {
    let h = Harness::postgres().await;
    let registry = registry(broken());
    seed_stream(&h, &registry).await?;
    h.keiro.deliver(("streamer", "s-1"), "go", &"two").await?;
    drive_until(&h, &registry, "streamer", "s-1", Status::Completed).await?;
    let ui = Ui::start(&h, Some(TOKEN));
    let client = reqwest::Client::new();

    let instance = client
        .get(format!("{}/instances/streamer/s-1", ui.base))
        .send()
        .await?
        .text()
        .await?;
    assert!(
        instance.contains("href=\"/instances/streamer/s-1/events/phase\""),
        "{instance}"
    );
    let response = client
        .get(format!("{}/instances/streamer/s-1/events/phase", ui.base))
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::OK);
    let page = response.text().await?;
    assert!(page.contains("id=\"event-version\">2<"), "{page}");
    let started = page.find("&quot;started&quot;").ok_or("the first write")?;
    let done = page.rfind("&quot;done&quot;").ok_or("the second write")?;
    assert!(started < done, "oldest first: {page}");
    assert!(page.contains("event:phase#"), "{page}");

    let never = client
        .get(format!("{}/instances/streamer/s-1/events/other", ui.base))
        .send()
        .await?
        .text()
        .await?;
    assert!(never.contains("Never set."), "{never}");
    let missing = client
        .get(format!(
            "{}/instances/streamer/nobody/events/phase",
            ui.base
        ))
        .send()
        .await?;
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_filters_by_attribute_and_shows_chosen_attributes_as_columns() -> TestResult {
    let h = Harness::postgres().await;
    for (id, customer, amount) in [
        ("o-1", "acme", 1200),
        ("o-2", "acme", 300),
        ("o-3", "globex", 5000),
    ] {
        let options = keiro::queue::StartOptions::default()
            .attribute("customer", customer)
            .attribute("amount", amount);
        h.keiro.start_with("order", id, &1, &options).await?;
    }
    let ui = Ui::start(&h, None);
    let client = reqwest::Client::new();
    let api = format!("{}/api/v1", ui.base);

    // The API: one filter per `attr`, all of them holding; each row carries its attributes.
    let (status, page) = get_json(
        &client,
        &format!("{api}/instances?attr=customer%3Dacme&attr=amount%3E%3D1000"),
    )
    .await?;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<&str> = page["instances"]
        .as_array()
        .expect("instances")
        .iter()
        .filter_map(|row| row["id"].as_str())
        .collect();
    assert_eq!(ids, ["o-1"]);
    assert_eq!(
        page["instances"][0]["attributes"]["amount"],
        json!({"type": "int", "value": 1200})
    );
    let (status, body) =
        get_json(&client, &format!("{api}/instances?attr=customer%3Eacme")).await?;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (_, one) = get_json(&client, &format!("{api}/instances/order/o-3")).await?;
    assert_eq!(
        one["attributes"]["customer"],
        json!({"type": "text", "value": "globex"})
    );

    // The page: the filter in the form, the chosen attributes as columns.
    let page = client
        .get(format!(
            "{}/instances?attr=customer%3Dacme&columns=amount,customer",
            ui.base
        ))
        .send()
        .await?
        .text()
        .await?;
    assert!(
        page.contains(r#"<th class="attr">amount</th><th class="attr">customer</th>"#),
        "{page}"
    );
    assert!(
        page.contains(r#"<td class="attr">1200</td><td class="attr">acme</td>"#),
        "{page}"
    );
    assert!(page.contains(r#"<td class="attr">300</td>"#), "{page}");
    assert!(!page.contains("o-3"), "{page}");
    assert!(
        page.contains(r#"name="attr" value="customer=acme""#),
        "{page}"
    );
    // With no columns chosen, one column holds them all.
    let page = client
        .get(format!("{}/instances?attr=amount%3E%3D5000", ui.base))
        .send()
        .await?
        .text()
        .await?;
    assert!(
        page.contains(r#"<span class="attr">customer=globex</span>"#),
        "{page}"
    );
    // The instance page lists them, each linking to the runs with the same value.
    let page = client
        .get(format!("{}/instances/order/o-3", ui.base))
        .send()
        .await?
        .text()
        .await?;
    assert!(
        page.contains(r#"href="/instances?attr=customer%3Dglobex""#),
        "{page}"
    );
    Ok(())
}

/// A run a worker could not open (its payload sealed with a key the worker lacks) says why on
/// its page and in its API, naming the key, and when it is tried again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_a_worker_cannot_open_shows_why_and_its_next_attempt() -> TestResult {
    use std::sync::Arc;

    use keiro::codec::{AesGcmCodec, OPEN_REFUSED};
    let h = Harness::postgres().await;
    let db = h.db.as_ref().expect("a schema");
    let with = |kid: &str, key: u8| -> Result<keiro::Keiro, keiro::codec::KeyError> {
        Ok(keiro::Keiro::builder(db.store())
            .codec(Arc::new(AesGcmCodec::new(kid, [key; 32])?))
            .without_push()
            .build())
    };
    with("k2", 2)?.start("wf", "sealed-1", &1).await?;
    let keyless = with("k1", 1)?
        .worker()
        .register("wf", |_ctx: keiro::Ctx, n: u32| async move {
            Ok::<_, keiro::WorkflowError>(n)
        })
        .build()?;
    // The claim is refused (an error of the drain), and handed back with a backoff.
    let _ = keyless.drain().await;
    let ui = Ui::start(&h, None);
    let client = reqwest::Client::new();
    let (status, body) = get_json(
        &client,
        &format!("{}/api/v1/instances/wf/sealed-1", ui.base),
    )
    .await?;
    assert_eq!(status, StatusCode::OK);
    let error = body["last_error"].as_str().unwrap_or_default().to_owned();
    assert!(
        error.starts_with(OPEN_REFUSED) && error.contains("\"k2\""),
        "{body}"
    );
    assert!(body["next_attempt_at"].is_string(), "{body}");
    let page = client
        .get(format!("{}/instances/wf/sealed-1", ui.base))
        .send()
        .await?
        .text()
        .await?;
    assert!(page.contains(r#"id="next-attempt""#), "{page}");
    assert!(
        page.contains("payload cannot be opened by this worker"),
        "{page}"
    );
    assert!(page.contains("&quot;k2&quot;"), "{page}");
    Ok(())
}
